// Standalone check of the persistent toy kernels (persistent.cu) against a CPU reference.
//
// What: random weights scaled like decodelab.toy.make_weights, every variant run for N steps,
// tokens compared with a float64 CPU reference (a differing token is reported with the CPU
// logit margin of the two candidates), steps and stop-token handling checked. Exit code 1 on
// any mismatch. Small enough to run under compute-sanitizer (memcheck, racecheck).
// Build and run:
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -o persistent_check \
//        kernels/persistent.cu kernels/persistent_check.cu
//   ./persistent_check [variant: block|grid|cluster|block_v2|grid_v2|cluster_v2|all] [steps]
//   compute-sanitizer --tool racecheck ./persistent_check block 64
#include "persistent.cuh"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); exit(2); } } while (0)

static unsigned long long rng_state = 88172645463325252ull;
static double randn() {  // Box-Muller over xorshift64
    auto u = [] { rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
                  return ((rng_state >> 11) + 0.5) / 9007199254740992.0; };
    double a = u(), b = u();
    return std::sqrt(-2.0 * std::log(a)) * std::cos(6.283185307179586 * b);
}

struct Model { int H, L, V; std::vector<float> w, b, wo, e; };

static Model make_model(int H, int L, int V) {
    Model m{H, L, V, std::vector<float>((size_t)L * H * H), std::vector<float>((size_t)L * H),
            std::vector<float>((size_t)H * V), std::vector<float>((size_t)V * H)};
    for (auto& v : m.w) v = (float)(randn() * 1.5 / std::sqrt((double)H));
    for (auto& v : m.b) v = (float)(randn() * 0.1);
    for (auto& v : m.wo) v = (float)(randn() / std::sqrt((double)H));
    for (auto& v : m.e) v = (float)randn();
    return m;
}

// One float64 step of one row; returns the token, fills margin info.
static int ref_step(const Model& m, std::vector<double>& x, std::vector<double>& logits) {
    std::vector<double> y(m.H);
    for (int l = 0; l < m.L; ++l) {
        for (int j = 0; j < m.H; ++j) {
            double s = m.b[(size_t)l * m.H + j];
            for (int i = 0; i < m.H; ++i) s += x[i] * m.w[((size_t)l * m.H + i) * m.H + j];
            y[j] = std::tanh(s);
        }
        x = y;
    }
    int best = 0;
    for (int v = 0; v < m.V; ++v) {
        double s = 0;
        for (int i = 0; i < m.H; ++i) s += x[i] * m.wo[(size_t)i * m.V + v];
        logits[v] = s;
        if (s > logits[best]) best = v;
    }
    for (int i = 0; i < m.H; ++i) x[i] = 0.5 * (x[i] + m.e[(size_t)best * m.H + i]);
    return best;
}

static int check(const char* name, int variant, int threads, const Model& m, int B, int N, int stop) {
    const int H = m.H, V = m.V;
    std::vector<float> x0((size_t)B * H);
    for (auto& v : x0) v = (float)randn();
    float *dw, *db, *dwo, *de, *dx0, *dxf, *dst, *dscr;
    int64_t* dtok;
    int *dsteps, *ddone;
    CK(cudaMalloc(&dw, m.w.size() * 4)); CK(cudaMalloc(&db, m.b.size() * 4));
    CK(cudaMalloc(&dwo, m.wo.size() * 4)); CK(cudaMalloc(&de, m.e.size() * 4));
    CK(cudaMalloc(&dx0, x0.size() * 4)); CK(cudaMalloc(&dxf, x0.size() * 4));
    CK(cudaMalloc(&dst, (size_t)N * B * H * 4)); CK(cudaMalloc(&dtok, (size_t)N * B * 8));
    CK(cudaMalloc(&dsteps, B * 4)); CK(cudaMalloc(&ddone, 4));
    CK(cudaMalloc(&dscr, (size_t)B * toyk::grid_scratch_floats(H, 128, threads) * 4));
    CK(cudaMemcpy(dw, m.w.data(), m.w.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db, m.b.data(), m.b.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dwo, m.wo.data(), m.wo.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(de, m.e.data(), m.e.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dx0, x0.data(), x0.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(dtok, 0xff, (size_t)N * B * 8));
    CK(cudaMemset(ddone, 0, 4));
    toyk::ToyArgs a{dw, db, dwo, de, dx0, dxf, dst, dtok, dsteps, dscr, ddone, H, m.L, V, B, N, stop,
                    nullptr};
    toyk::LaunchInfo info = toyk::toy_launch(a, variant, threads, 0, 0);
    if (!info.ok) { printf("%-8s H=%d L=%d B=%d: not run (%s)\n", name, H, m.L, B, info.why); return 0; }
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<int64_t> tok((size_t)N * B);
    std::vector<int> steps(B);
    CK(cudaMemcpy(tok.data(), dtok, tok.size() * 8, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(steps.data(), dsteps, B * 4, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int r = 0; r < B; ++r) {
        std::vector<double> x(x0.begin() + (size_t)r * H, x0.begin() + (size_t)(r + 1) * H), lg(V);
        int expect_steps = N;
        for (int s = 0; s < N; ++s) {
            int t = ref_step(m, x, lg);
            int got = (int)tok[(size_t)s * B + r];
            if (got != t) {
                double margin = (got >= 0 && got < V) ? lg[t] - lg[got] : NAN;
                printf("  row %d step %d: token %d, reference %d (reference logit margin %.3g)\n", r, s, got, t, margin);
                ++bad;
                break;  // the trajectories diverge from here on
            }
            if (t == stop) { expect_steps = s + 1; break; }
        }
        if (steps[r] != expect_steps) { printf("  row %d: steps %d, expected %d\n", r, steps[r], expect_steps); ++bad; }
        for (int s = expect_steps; s < N && !bad; ++s)
            if (tok[(size_t)s * B + r] != -1) { printf("  row %d: token written after stop\n", r); ++bad; }
    }
    printf("%-8s H=%d L=%d V=%d B=%d N=%d stop=%d group=%d smem=%d place=%d/%d/%d: %s\n", name, H,
           m.L, V, B, N, stop, info.group, info.smem_bytes, info.w_place, info.wout_place,
           info.e_place, bad ? "MISMATCH" : "ok");
    cudaFree(dw); cudaFree(db); cudaFree(dwo); cudaFree(de); cudaFree(dx0); cudaFree(dxf);
    cudaFree(dst); cudaFree(dtok); cudaFree(dsteps); cudaFree(ddone); cudaFree(dscr);
    return bad;
}

int main(int argc, char** argv) {
    const char* which = argc > 1 ? argv[1] : "all";
    const int N = argc > 2 ? atoi(argv[2]) : 200;
    const char* names[] = {"block", "grid", "cluster", "block_v2", "grid_v2", "cluster_v2"};
    int bad = 0;
    const int shapes[][3] = {{64, 4, 256}, {32, 2, 64}, {256, 2, 256}};
    for (auto& sh : shapes) {
        Model m = make_model(sh[0], sh[1], sh[2]);
        for (int v = 0; v < 6; ++v) {
            if (strcmp(which, "all") != 0 && strcmp(which, names[v]) != 0) continue;
            bad += check(names[v], v, 512, m, 2, N, -1);
            bad += check(names[v], v, 256, m, 1, N, 7);  // stop token: some row stops early or not
        }
    }
    printf(bad ? "FAILED\n" : "ALL OK\n");
    return bad ? 1 : 0;
}
