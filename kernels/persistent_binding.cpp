// Torch binding of the persistent toy kernels (persistent.cu). Built at run time by
// decodelab.kernel_build (torch.utils.cpp_extension.load) together with persistent.cu.
// The kernels themselves include no torch header, so CI compiles them with plain nvcc.
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include "persistent.cuh"

namespace {

py::dict info_dict(const toyk::LaunchInfo& info) {
    static const char* places[] = {"registers", "shared", "global"};
    py::dict d;
    d["ok"] = bool(info.ok);
    d["why"] = std::string(info.why);
    d["group"] = info.group;
    d["blocks"] = info.blocks;
    d["threads"] = info.threads;
    d["smem_bytes"] = info.smem_bytes;
    if (info.ok) {
        d["w_place"] = places[info.w_place];
        d["wout_place"] = places[info.wout_place];
        d["e_place"] = places[info.e_place];
    }
    return d;
}

void check_f32(const torch::Tensor& t, const char* name, int dims) {
    TORCH_CHECK(t.is_cuda() && t.scalar_type() == torch::kFloat32 && t.is_contiguous() && t.dim() == dims,
                name, " must be a contiguous float32 CUDA tensor with ", dims, " dimensions");
}

toyk::ToyArgs shape_args(int64_t H, int64_t L, int64_t V, int64_t B, int64_t N, int64_t stop) {
    toyk::ToyArgs a{};
    a.H = int(H); a.L = int(L); a.V = int(V); a.B = int(B); a.N = int(N); a.stop = int(stop);
    return a;
}

py::dict plan(int64_t H, int64_t L, int64_t V, int64_t B, int64_t variant, int64_t threads, int64_t group) {
    return info_dict(toyk::toy_plan(shape_args(H, L, V, B, 1, -1), int(variant), int(threads), int(group)));
}

// Runs N steps; tokens (N, B) int64 (-1 where a row had stopped), steps (B,) int32,
// x_final (B, H), states (N, B, H) when record_states else an empty tensor, clock (2,) int64:
// SM cycles (clock64) and ns (%globaltimer) of block 0's step loop.
py::tuple run(torch::Tensor w, torch::Tensor b, torch::Tensor w_out, torch::Tensor embed,
              torch::Tensor x0, int64_t n_steps, int64_t stop, int64_t variant, int64_t threads,
              int64_t group, bool record_states) {
    check_f32(w, "w", 3); check_f32(b, "b", 2); check_f32(w_out, "w_out", 2);
    check_f32(embed, "embed", 2); check_f32(x0, "x0", 2);
    const c10::cuda::CUDAGuard guard(x0.device());
    const int64_t L = w.size(0), H = w.size(1), V = w_out.size(1), B = x0.size(0);
    TORCH_CHECK(w.size(2) == H && b.size(0) == L && b.size(1) == H && w_out.size(0) == H &&
                embed.size(0) == V && embed.size(1) == H && x0.size(1) == H, "inconsistent shapes");
    auto opts = x0.options();
    auto tokens = torch::full({n_steps, B}, -1, opts.dtype(torch::kInt64));
    auto steps = torch::zeros({B}, opts.dtype(torch::kInt32));
    auto x_final = torch::empty({B, H}, opts);
    auto states = record_states ? torch::empty({n_steps, B, H}, opts) : torch::empty({0}, opts);
    auto clock = torch::zeros({2}, opts.dtype(torch::kInt64));
    toyk::ToyArgs a = shape_args(H, L, V, B, n_steps, stop);
    torch::Tensor scratch, done;
    if (toyk::variant_kind(int(variant)) == toyk::kGrid) {
        auto info = toyk::toy_plan(a, int(variant), int(threads), int(group));
        TORCH_CHECK(info.ok, "persistent kernel: ", info.why);
        scratch = torch::empty({B * toyk::grid_scratch_floats(int(H), info.group, int(threads))}, opts);
        done = torch::zeros({1}, opts.dtype(torch::kInt32));
        a.scratch = scratch.data_ptr<float>();
        a.rows_done = done.data_ptr<int>();
    }
    a.w = w.data_ptr<float>(); a.b = b.data_ptr<float>(); a.w_out = w_out.data_ptr<float>();
    a.embed = embed.data_ptr<float>(); a.x0 = x0.data_ptr<float>();
    a.x_final = x_final.data_ptr<float>();
    a.states = record_states ? states.data_ptr<float>() : nullptr;
    a.tokens = tokens.data_ptr<int64_t>();
    a.steps = steps.data_ptr<int>();
    a.clock = reinterpret_cast<long long*>(clock.data_ptr<int64_t>());
    auto info = toyk::toy_launch(a, int(variant), int(threads), int(group),
                                 c10::cuda::getCurrentCUDAStream());
    TORCH_CHECK(info.ok, "persistent kernel: ", info.why);
    return py::make_tuple(tokens, steps, x_final, states, clock, info_dict(info));
}

// `clock`: (2,) int64 CUDA tensor receiving the cycles and ns of block 0's barrier loop.
void barrier(int64_t kind, int64_t threads, int64_t blocks, int64_t iters, torch::Tensor sink,
             torch::Tensor clock) {
    TORCH_CHECK(sink.is_cuda() && sink.scalar_type() == torch::kInt32, "sink: int32 CUDA tensor");
    TORCH_CHECK(clock.is_cuda() && clock.scalar_type() == torch::kInt64 && clock.numel() == 2,
                "clock: (2,) int64 CUDA tensor");
    int err = toyk::barrier_bench(int(kind), int(threads), int(blocks), int(iters),
                                  sink.data_ptr<int>(),
                                  reinterpret_cast<long long*>(clock.data_ptr<int64_t>()),
                                  c10::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == 0, "barrier benchmark: ", cudaGetErrorString(cudaError_t(err)));
}

py::dict device_attrs() {
    int dev = 0, clock_khz = 0, sms = 0, smem = 0, major = 0, minor = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    py::dict d;
    d["clock_khz"] = clock_khz; d["sms"] = sms; d["smem_optin"] = smem;
    d["cc"] = major * 10 + minor;
    return d;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("plan", &plan, "launch plan (group, placements, shared memory) without running");
    m.def("run", &run, "run N toy steps in one persistent kernel");
    m.def("barrier", &barrier, "barrier microbenchmark kernel");
    m.def("device_attrs", &device_attrs, "clock, SM count, shared-memory limit, compute capability");
}
