// Persistent toy decode: N chained steps of the toy decode step in ONE kernel launch.
//
// What: the step of decodelab.toy (L layers of x = tanh(x @ W[l] + b[l]), logits = x @ W_out,
// greedy token = first argmax, x = 0.5 * (x + E[token])) run N times on the device, stopping
// on the device when a row emits the stop token. fp32 throughout. Returns tokens (N, B) and
// the steps each row ran.
//
// One kernel body (persistent_body.cuh) with policies (persistent_policies.cuh):
//   state exchange: block (one block per row, __syncthreads), grid (G blocks per row under a
//     cooperative launch, the state through L2, grid.sync), cluster (G blocks of a thread-block
//     cluster, sm_90 only: stores into the peers' shared memory, cluster.sync);
//   design: fixed (lanes per column set by H: the first design), wide (one round per stage),
//     narrow (fewest lanes per column: long FMA chains, few shuffles), and wide_fold /
//     narrow_fold (the embedding folded into the first layer, which then overlaps the output
//     stage). Variant code = design * 3 + exchange (persistent.cuh).
// Weights in registers for compile-time shapes (persistent_block.cu, persistent_cluster.cu),
// else packed in shared memory when they fit, else read from global memory (L2). Every launch
// reads its run clock (clock64 and %globaltimer around the step loop); the diagnostic build of
// the same body adds the stage clock (cycles of work and barrier wait per stage).
//
// This file: the planner (work split, shared-memory layout, blocks per row), the launcher, the
// barrier microbenchmarks and the C interface that decodelab.persistent loads through ctypes.
//
// Build (decodelab.core.kernel_build does this, cached by source hash, arch and flags):
//   nvcc -O3 -std=c++17 -shared -Xcompiler -fPIC -gencode=arch=compute_90,code=sm_90 \
//        -o libtoyk.so kernels/persistent.cu kernels/persistent_{block,grid,cluster}.cu
// Standalone check, timing and stage clock (also used under compute-sanitizer and ncu):
//   nvcc -O3 -std=c++17 -lineinfo -gencode=arch=compute_90,code=sm_90 -o persistent_check \
//        kernels/persistent.cu kernels/persistent_{block,grid,cluster}.cu kernels/persistent_check.cu
//   add -Xptxas -v to see registers and spills per instance
#include "persistent.cuh"

#include "persistent_kernels.cuh"

#include <cstdio>
#include <cstring>

namespace toyk {

struct DeviceCaps { int cc_major, sms, smem_optin, coop; };

static DeviceCaps device_caps() {
    DeviceCaps c{0, 0, 0, 0};
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&c.cc_major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&c.sms, cudaDevAttrMultiProcessorCount, dev);
    cudaDeviceGetAttribute(&c.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    cudaDeviceGetAttribute(&c.coop, cudaDevAttrCooperativeLaunch, dev);
    return c;
}

static LaunchInfo fail(LaunchInfo info, const char* why) {
    info.ok = 0;
    snprintf(info.why, sizeof(info.why), "%s", why);
    return info;
}

static Geo split_geo(int design, int threads, int cols, int h) {
    switch (design) {
        case kFixed: return SplitFixed::geo(threads, cols, h);
        case kNarrow: case kNarrowFold: return SplitNarrow::geo(threads, cols, h);
        default: return SplitWide::geo(threads, cols, h);
    }
}

int scratch_floats(int H, int group, int threads) {
    // The ring's padding is under 4 floats per lane (at most 32 lanes).
    return round4(2 * (H + 128) + 2 * group * (threads / 32));
}

static KernelFn pick(int variant, int threads, bool clocked, bool regs, const ToyArgs& a, int G) {
    const int design = variant_design(variant);
    switch (variant_exchange(variant)) {
        case kBlock: return pick_block(design, threads, clocked, regs, a.H, a.L, a.V);
        case kGrid: return regs ? nullptr : pick_grid(design, threads, clocked);
        default: return pick_cluster(design, threads, clocked, regs, a.H, a.L, a.V, G);
    }
}

// Sections of one block's shared memory for G blocks per row; false (with `why`) if the
// minimum (ring, candidates, bias, clock, fold table) won't fit.
static bool layout_for(const ToyArgs& a, int variant, int threads, int G, bool regs, int limit,
                       Layout& lay, int& bytes, const char*& why) {
    const int H = a.H, L = a.L, V = a.V, T = threads;
    const int x = variant_exchange(variant), design = variant_design(variant);
    lay = Layout{};
    lay.group = G;
    lay.cols_l = (H + G - 1) / G;
    lay.cols_o = (V + G - 1) / G;
    lay.gl = split_geo(design, T, lay.cols_l, H);
    lay.go = split_geo(design, T, lay.cols_o, H);
    int hp = H;
    if (lay.gl.p * lay.gl.k > hp) hp = lay.gl.p * lay.gl.k;
    if (lay.go.p * lay.go.k > hp) hp = lay.go.p * lay.go.k;
    lay.hp = round4(hp);
    lay.scratch = scratch_floats(H, G, T);
    lay.w_place = lay.wout_place = lay.e_place = kGlobal;
    if (design_folds(design) && lay.gl.r > kFoldRounds) {
        why = "the fold carries at most 2 rounds of a layer: use more threads or blocks";
        return false;
    }
    int off = 0;
    auto take = [&](int n) { int at = off; off += round4(n); return at; };
    if (x != kGrid) {
        lay.ring = take(2 * lay.hp);
        lay.cand = take(2 * G * (T / 32));
    }
    lay.clk = take(2 * ((L + 3) / 2) + 4 * (L + 2));  // (L + 2) 4-byte arrivals, 2 (L + 2) 8-byte sums
    if (!regs) lay.bias = take(L * lay.cols_l);
    if (design_folds(design)) lay.ew = take(V * lay.cols_l);
    if (off * 4 > limit) {
        why = "the state, bias and fold table of a row do not fit in one block's shared memory";
        return false;
    }
    auto fits = [&](int n) { return (off + round4(n)) * 4 <= limit; };
    if (x != kGrid && fits(V * H)) {
        lay.e = take(V * H);
        lay.e_place = kShared;
    } else if (x == kCluster && fits(lay.cols_o * H)) {
        lay.e = take(lay.cols_o * H);
        lay.e_place = kPeers;
    }
    if (regs) {
        lay.w_place = lay.wout_place = kRegisters;
    } else {
        const int tal = T < lay.cols_l * lay.gl.p ? T : lay.cols_l * lay.gl.p;
        const int tao = T < lay.cols_o * lay.go.p ? T : lay.cols_o * lay.go.p;
        const int nw = L * lay.gl.r * lay.gl.k * tal, nwo = lay.go.r * lay.go.k * tao;
        if (fits(nw)) { lay.w = take(nw); lay.w_place = kShared; }
        if (fits(nwo)) { lay.wout = take(nwo); lay.wout_place = kShared; }
    }
    bytes = off * 4;
    return true;
}

static bool on_chip(const Layout& lay, int x) {
    return lay.w_place != kGlobal && lay.wout_place != kGlobal && (x == kGrid || lay.e_place != kGlobal);
}

static LaunchInfo plan(const ToyArgs& a, int variant, int threads, int group, bool clocked,
                       Layout& lay, KernelFn& fn) {
    LaunchInfo info{};
    info.variant = variant;
    info.threads = threads;
    info.ok = 1;
    fn = nullptr;
    if (variant < 0 || variant >= kVariants) return fail(info, "unknown variant code");
    const int x = variant_exchange(variant);
    const DeviceCaps caps = device_caps();
    if (a.H < 4 || a.H > kMaxHidden || a.H % 4 != 0)
        return fail(info, "hidden must be a multiple of 4 in [4, 1024] (float4 loads of the state)");
    if (a.L < 1 || a.V < 2 || a.B < 1 || a.N < 1) return fail(info, "layers, batch, steps >= 1, vocab >= 2");
    if (threads != 256 && threads != 512) return fail(info, "threads must be 256 or 512");
    if (x == kCluster && caps.cc_major < 9)
        return fail(info, "the cluster exchange needs compute capability 9.0 or newer");
    if (x == kGrid && !caps.coop) return fail(info, "this GPU has no cooperative launch");
    if (x == kBlock && group > 1) return fail(info, "the block exchange has group 1");
    if (x == kCluster && group > 16) return fail(info, "a cluster holds at most 16 blocks");
    if (group > a.H) return fail(info, "more blocks per row than hidden columns");
    int candidates[8] = {1, 0, 0, 0, 0, 0, 0, 0}, n = 1;
    if (group > 0) candidates[0] = group;
    else if (x == kCluster) { int c[] = {2, 4, 8, 16}; memcpy(candidates, c, sizeof c); n = 4; }
    else if (x == kGrid) { int c[] = {1, 2, 4, 8, 16, 32, 64, 128}; memcpy(candidates, c, sizeof c); n = 8; }
    // Prefer a group whose weights sit in registers, then the first with everything on chip,
    // then the last that fits at all.
    int chosen = -1, bytes = 0;
    bool chosen_regs = false, chosen_on_chip = false;
    const char* why = "no group size fits";
    for (int i = 0; i < n; ++i) {
        const int G = candidates[i];
        if (G > a.H) continue;
        const bool regs = pick(variant, threads, clocked, true, a, G) != nullptr;
        Layout l{};
        int b = 0;
        if (!layout_for(a, variant, threads, G, regs, caps.smem_optin, l, b, why)) continue;
        const bool better = chosen < 0 || (regs && !chosen_regs) ||
                            (!chosen_regs && !chosen_on_chip && (on_chip(l, x) || i == n - 1));
        if (better) { chosen = G; lay = l; bytes = b; chosen_regs = regs; chosen_on_chip = on_chip(l, x); }
    }
    if (chosen < 0) return fail(info, why);
    fn = pick(variant, threads, clocked, chosen_regs, a, chosen);
    if (fn == nullptr) return fail(info, "no compiled kernel for this launch");
    info.group = chosen;
    info.blocks = a.B * chosen;
    info.smem_bytes = bytes;
    info.w_place = lay.w_place;
    info.wout_place = lay.wout_place;
    info.e_place = lay.e_place;
    info.lanes_layer = lay.gl.p;
    info.rounds_layer = lay.gl.r;
    info.lanes_out = lay.go.p;
    info.rounds_out = lay.go.r;
    if (cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) != cudaSuccess)
        return fail(info, "the kernel cannot use this much shared memory");
    if (x == kGrid) {
        int per_sm = 0;
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, threads, bytes);
        if (per_sm * caps.sms < info.blocks)
            return fail(info, "grid exchange: batch x group blocks exceed what can be co-resident");
    }
    return info;
}

LaunchInfo toy_plan(const ToyArgs& a, int variant, int threads, int group) {
    Layout lay{};
    KernelFn fn = nullptr;
    return plan(a, variant, threads, group, false, lay, fn);
}

LaunchInfo toy_launch(const ToyArgs& a, int variant, int threads, int group, bool clocked,
                      cudaStream_t stream) {
    Layout lay{};
    KernelFn fn = nullptr;
    LaunchInfo info = plan(a, variant, threads, group, clocked, lay, fn);
    if (!info.ok) return info;
    const int x = variant_exchange(variant);
    cudaError_t err = cudaSuccess;
    if (x == kBlock) {
        fn<<<info.blocks, threads, info.smem_bytes, stream>>>(a, lay);
        err = cudaGetLastError();
    } else if (x == kGrid) {
        ToyArgs a_copy = a;
        void* params[] = {&a_copy, &lay};
        err = cudaLaunchCooperativeKernel((void*)fn, info.blocks, threads, params, info.smem_bytes,
                                          stream);
    } else {
        if (info.group > 8) cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
        cudaLaunchConfig_t cfg{};
        cfg.gridDim = dim3(info.blocks);
        cfg.blockDim = dim3(threads);
        cfg.dynamicSmemBytes = info.smem_bytes;
        cfg.stream = stream;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = info.group;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        err = cudaLaunchKernelEx(&cfg, fn, a, lay);
    }
    if (err != cudaSuccess) {
        info.ok = 0;
        snprintf(info.why, sizeof(info.why), "launch failed: %s", cudaGetErrorString(err));
    }
    return info;
}

// ---------------------------------------------------------------- barrier microbenchmarks ---
// Each records its own run clock (cycles and ns of block 0's loop) when `clock` is given.
__global__ void bar_block(int iters, int* sink, long long* clock) {
    const RunClock clock0 = RunClock::now();
    for (int i = 0; i < iters; ++i) __syncthreads();
    clock0.record(clock);
    if (threadIdx.x == 0 && blockIdx.x == 0) *sink = iters;
}
__global__ void bar_grid(int iters, int* sink, long long* clock) {
    const RunClock clock0 = RunClock::now();
    for (int i = 0; i < iters; ++i) cg::this_grid().sync();
    clock0.record(clock);
    if (threadIdx.x == 0 && blockIdx.x == 0) *sink = iters;
}
__global__ void bar_cluster(int iters, int* sink, long long* clock) {
    const RunClock clock0 = RunClock::now();
    for (int i = 0; i < iters; ++i) cluster_barrier();
    clock0.record(clock);
    if (threadIdx.x == 0 && blockIdx.x == 0) *sink = iters;
}

int barrier_bench(int kind, int threads, int blocks, int iters, int* sink, long long* clock,
                  cudaStream_t stream) {
    if (kind == 0) {
        bar_block<<<1, threads, 0, stream>>>(iters, sink, clock);
        return cudaGetLastError();
    }
    if (kind == 1) {
        void* params[] = {&iters, &sink, &clock};
        return cudaLaunchCooperativeKernel((void*)bar_grid, blocks, threads, params, 0, stream);
    }
    if (device_caps().cc_major < 9) return cudaErrorNotSupported;
    if (blocks > 8) cudaFuncSetAttribute(bar_cluster, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(threads);
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = blocks;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, bar_cluster, iters, sink, clock);
}

}  // namespace toyk

// ---------------------------------------------------------------- C interface (ctypes) -------
// decodelab.persistent.kernel mirrors ToyArgs and LaunchInfo; it checks the ABI version and the
// two struct sizes before the first call. `device` is made current here: this library has its
// own CUDA runtime state (linked statically), which shares the device's primary context with
// the caller's.
extern "C" {
int toyk_abi_version() { return toyk::kAbiVersion; }
void toyk_sizes(int* out) {
    out[0] = static_cast<int>(sizeof(toyk::ToyArgs));
    out[1] = static_cast<int>(sizeof(toyk::LaunchInfo));
}
int toyk_scratch_floats(int H, int group, int threads) { return toyk::scratch_floats(H, group, threads); }
void toyk_plan(const toyk::ToyArgs* a, int variant, int threads, int group, int device,
               toyk::LaunchInfo* out) {
    cudaSetDevice(device);
    *out = toyk::toy_plan(*a, variant, threads, group);
}
void toyk_launch(const toyk::ToyArgs* a, int variant, int threads, int group, int clocked,
                 void* stream, int device, toyk::LaunchInfo* out) {
    cudaSetDevice(device);
    *out = toyk::toy_launch(*a, variant, threads, group, clocked != 0,
                            static_cast<cudaStream_t>(stream));
}
int toyk_barrier(int kind, int threads, int blocks, int iters, int* sink, long long* clock,
                 void* stream, int device) {
    cudaSetDevice(device);
    return toyk::barrier_bench(kind, threads, blocks, iters, sink, clock,
                               static_cast<cudaStream_t>(stream));
}
const char* toyk_error_string(int err) { return cudaGetErrorString(static_cast<cudaError_t>(err)); }
// clock_khz, sms, smem_optin, compute capability (major * 10 + minor)
void toyk_device_attrs(int device, int* out) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&out[0], cudaDevAttrClockRate, device);
    cudaDeviceGetAttribute(&out[1], cudaDevAttrMultiProcessorCount, device);
    cudaDeviceGetAttribute(&out[2], cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    out[3] = major * 10 + minor;
}
}
