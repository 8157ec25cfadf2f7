// Persistent toy decode: N chained steps of the toy decode step in ONE kernel launch.
//
// What: the step of decodelab.toy (L layers of x = tanh(x @ W[l] + b[l]), logits = x @ W_out,
// greedy token = first argmax, x = 0.5 * (x + E[token])) run N times on the device, stopping
// on the device when a row emits the stop token. fp32 throughout. Returns tokens (N, B) and
// the steps each row ran.
//
// Variants (one kernel body, three ways of exchanging the state between stages):
//   block   - one thread block per row; stages separated by __syncthreads; weights in
//             registers (compile-time shapes listed in kRegShapes), else packed in shared memory
//             when they fit, else read from global memory/L2.
//   grid    - G blocks per row, cooperative launch, stages separated by grid.sync(); each block
//             holds a column slice of every weight matrix in its shared memory; the state goes
//             through global memory (L2).
//   cluster - G blocks per row in one thread-block cluster (sm_90+ only); weight slices in each
//             block's shared memory; each block writes its slice of the state straight into
//             every block's shared memory (distributed shared memory); cluster.sync() between
//             stages. Compiled for sm_90 only (#if __CUDA_ARCH__ >= 900); on older GPUs the
//             launcher refuses it.
//   block_v2, grid_v2, cluster_v2 - the second version of the kernel (persistent_v2.cuh, same
//             state exchange, one reduction round per output column); the host side here
//             plans and launches both versions (variant codes 3..5, see persistent.cuh).
// Every variant reads its run clock: clock64 and %globaltimer by thread 0 of block 0 around the
// step loop, returned through ToyArgs::clock so the host can tell cycles per step and SM clock.
//
// Work split of one stage (a matrix-vector product with H inputs and C output columns in this
// block): P = lanes per column (power of two <= 32, about H/8), each lane owns a contiguous
// chunk of K = H/P inputs and the P partial sums are combined with xor-shuffles; T/P columns
// per round, R rounds. One barrier per stage: layer outputs ping-pong between two buffers
// (selected by a counter over all layer stages), so a buffer is never written in the stage
// that reads it; the argmax candidates of the output stage are read in the next step's first
// layer, after one more barrier has passed, before they are written again.
//
// Build and run (standalone check with a CPU reference, also used under compute-sanitizer):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -o persistent_check \
//        kernels/persistent.cu kernels/persistent_check.cu && ./persistent_check
//   nvcc -O3 -std=c++17 -arch=sm_75 -c kernels/persistent.cu    (portable variants only)
//   add -Xptxas -v to see registers and spills per instantiation
// From Python: decodelab.persistent (built by decodelab.kernel_build with the torch binding).
#include "persistent.cuh"

#include "persistent_device.cuh"
#include "persistent_v2.cuh"

#include <cstdio>
#include <cstring>

namespace toyk {

// T threads; KM = most inputs per lane (8 or 32: sizes the register chunk of x);
// CH/CL/CV > 0: compile-time shape with the weights in registers (block variant only).
template <int T, int X, int KM, int CH = 0, int CL = 0, int CV = 0>
__global__ void __launch_bounds__(T, 1) toy_kernel(ToyArgs a, Layout lay) {
    constexpr bool kRegs = CH > 0;
    constexpr int kK = kRegs ? CH / lanes_for(CH) : KM;
    constexpr int kRL = kRegs ? rounds_for(CH, CH, T) : 1;
    constexpr int kRO = kRegs ? rounds_for(CV, CH, T) : 1;
    constexpr int kNW = T / 32;
    constexpr int kUnrollL = kRegs ? CL : 1;   // full unrolls only where weights sit in registers
    constexpr int kUnrollRL = kRegs ? kRL : 1;
    constexpr int kUnrollRO = kRegs ? kRO : 1;
    extern __shared__ float4 smem4[];
    float* smem = reinterpret_cast<float*>(smem4);

    const int H = kRegs ? CH : a.H, L = kRegs ? CL : a.L, V = kRegs ? CV : a.V;
    const int G = kRegs ? 1 : lay.group;
    const int P = lanes_for(H), K = H / P;
    const int CLc = H / G, COc = V / G;  // columns of this block's slice: layers, output
    const int RL = kRegs ? kRL : rounds_for(CLc, H, T), RO = kRegs ? kRO : rounds_for(COc, H, T);
    const int t = threadIdx.x, p = t % P, tq = t / P, lane = t % 32, warp = t / 32;
    int g, row;
    if constexpr (X == kBlock) { g = 0; row = blockIdx.x; }
    else if constexpr (X == kCluster) { g = cluster_rank(); row = blockIdx.x / G; }
    else { g = blockIdx.x % G; row = blockIdx.x / G; }

    // The state exchange: ring[2][H] and cand[G * kNW] (key, idx), in smem or (grid) global.
    float* ring = smem + lay.ring;
    unsigned* cand = reinterpret_cast<unsigned*>(smem + lay.cand);
    if constexpr (X == kGrid) {
        float* mine = a.scratch + (size_t)row * grid_scratch_floats(H, G, T);
        ring = mine;
        cand = reinterpret_cast<unsigned*>(mine + 2 * H);
    }
    float* bias = smem + lay.bias;  // (L, CLc) this block's slice
    const float* E = lay.e_place == kShared ? smem + lay.e : a.embed;
    const int e_row0 = (X == kCluster) ? g * COc : 0;  // first E row held here (cluster)

    // ---- load this block's weights once: packed so that lane t reads word t of each row ----
    float wreg[kRegs ? CL * kRL * kK + kRO * kK : 1];
#pragma unroll
    for (int l = 0; l < (kRegs ? CL : 1); ++l)
#pragma unroll
        for (int r = 0; r < kRL; ++r)
#pragma unroll
            for (int k = 0; k < kK; ++k) {
                if constexpr (kRegs) {
                    int col = r * (T / P) + tq;
                    wreg[(l * kRL + r) * kK + k] =
                        col < CH ? a.w[(size_t)l * CH * CH + (p * kK + k) * CH + col] : 0.f;
                }
            }
#pragma unroll
    for (int r = 0; r < kRO; ++r)
#pragma unroll
        for (int k = 0; k < kK; ++k) {
            if constexpr (kRegs) {
                int col = r * (T / P) + tq;
                wreg[CL * kRL * kK + r * kK + k] =
                    col < CV ? a.w_out[(p * kK + k) * CV + col] : 0.f;
            }
        }
    if (!kRegs && lay.w_place == kShared)
        for (int l = 0; l < L; ++l)
            for (int r = 0; r < RL; ++r)
                for (int k = 0; k < K; ++k) {
                    int col = r * (T / P) + tq;
                    smem[lay.w + ((l * RL + r) * K + k) * T + t] =
                        col < CLc ? a.w[(size_t)l * H * H + (size_t)(p * K + k) * H + g * CLc + col]
                                  : 0.f;
                }
    if (!kRegs && lay.wout_place == kShared)
        for (int r = 0; r < RO; ++r)
            for (int k = 0; k < K; ++k) {
                int col = r * (T / P) + tq;
                smem[lay.wout + (r * K + k) * T + t] =
                    col < COc ? a.w_out[(size_t)(p * K + k) * V + g * COc + col] : 0.f;
            }
    for (int i = t; i < L * CLc; i += T) bias[i] = a.b[(i / CLc) * H + g * CLc + i % CLc];
    if (lay.e_place == kShared) {
        const int rows = (X == kCluster) ? COc : V;
        for (int i = t; i < rows * H; i += T) smem[lay.e + i] = a.embed[(size_t)e_row0 * H + i];
    }
    // Every block of a cluster must have started (and loaded) before remote stores begin.
    if constexpr (X == kCluster) cluster_barrier(); else __syncthreads();

    auto w_layer = [&](int l, int r, int k, int col) -> float {
        if constexpr (kRegs) return wreg[(l * kRL + r) * kK + k];
        else if (lay.w_place == kShared) return smem[lay.w + ((l * RL + r) * K + k) * T + t];
        else return col < CLc ? __ldg(a.w + (size_t)l * H * H + (size_t)(p * K + k) * H + g * CLc + col) : 0.f;
    };
    auto w_output = [&](int r, int k, int col) -> float {
        if constexpr (kRegs) return wreg[CL * kRL * kK + r * kK + k];
        else if (lay.wout_place == kShared) return smem[lay.wout + (r * K + k) * T + t];
        else return col < COc ? __ldg(a.w_out + (size_t)(p * K + k) * V + g * COc + col) : 0.f;
    };
    // Row of E for `tok` (local smem, a cluster peer's smem, or global).
    auto e_row = [&](unsigned tok) -> const float* {
        if constexpr (X == kCluster) {
            if (lay.e_place == kShared) {
                int owner = tok / COc;
                return cluster_map(const_cast<float*>(E), owner) + (size_t)(tok - owner * COc) * H;
            }
        }
        return E + (size_t)tok * H;
    };
    const bool e_global = lay.e_place != kShared;

    float xr[kK];       // this lane's chunk x[p*K, (p+1)*K) of the stage input
    unsigned tok = 0;   // token of the previous step (same value in every thread of the row)
    int c = 0;          // layer stages so far: ring[c & 1] is written by the current layer
    int n_run = 0;
    bool alive = true;  // grid only: a stopped row keeps joining the barriers
    const float* xrow0 = a.x0 + (size_t)row * H;
    const RunClock clock0 = RunClock::now();  // the run clock starts with the step loop

    for (int s = 0; s < a.N; ++s) {
#pragma unroll kUnrollL
        for (int l = 0; l < L; ++l, ++c) {
            float* out = ring + (c & 1) * H;
            const float* in = ring + ((c & 1) ^ 1) * H;
            if (l == 0 && s == 0) {
#pragma unroll
                for (int k = 0; k < kK; k += 4)
                    if (k < K) {
                        float4 v = __ldg(reinterpret_cast<const float4*>(xrow0 + p * K + k));
                        xr[k] = v.x; xr[k + 1] = v.y; xr[k + 2] = v.z; xr[k + 3] = v.w;
                    }
            } else if (l == 0) {  // x = 0.5 * (x_L + E[tok]), fused into the first layer's input
                const float* e = e_row(tok);
#pragma unroll
                for (int k = 0; k < kK; k += 4)
                    if (k < K) {
                        float4 v = load4<X>(in + p * K + k), u = load4_const(e + p * K + k, e_global);
                        xr[k] = 0.5f * (v.x + u.x); xr[k + 1] = 0.5f * (v.y + u.y);
                        xr[k + 2] = 0.5f * (v.z + u.z); xr[k + 3] = 0.5f * (v.w + u.w);
                    }
            } else {
#pragma unroll
                for (int k = 0; k < kK; k += 4)
                    if (k < K) {
                        float4 v = load4<X>(in + p * K + k);
                        xr[k] = v.x; xr[k + 1] = v.y; xr[k + 2] = v.z; xr[k + 3] = v.w;
                    }
            }
#pragma unroll kUnrollRL
            for (int r = 0; r < RL; ++r) {
                const int col = r * (T / P) + tq;
                float a0 = 0.f, a1 = 0.f;
#pragma unroll
                for (int k = 0; k < kK; k += 2)
                    if (k < K) {
                        a0 = fmaf(xr[k], w_layer(l, r, k, col), a0);
                        a1 = fmaf(xr[k + 1], w_layer(l, r, k + 1, col), a1);
                    }
                float acc = a0 + a1;
                for (int off = P / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(kFull, acc, off);
                if (col < CLc) {
                    const float y = tanhf(acc + bias[l * CLc + col]);
                    float* dst = out + g * CLc + col;
                    if constexpr (X == kCluster) {
                        for (int rank = p; rank < G; rank += P) *cluster_map(dst, rank) = y;
                    } else if constexpr (X == kGrid) {
                        if (p == 0) __stcg(dst, y);
                    } else {
                        if (p == 0) *dst = y;
                    }
                }
            }
            stage_barrier<X>();
            if constexpr (X == kGrid) {
                // rows_done counts rows stopped before this step; it only changes after the
                // output barrier, so every block reads the same value here.
                if (l == 0 && s > 0 && *reinterpret_cast<volatile int*>(a.rows_done) == a.B) {
                    s = a.N;
                    break;
                }
            }
        }
        if (s >= a.N) break;
        // ---- output projection + argmax over this block's vocabulary slice ----
        const float* xl = ring + ((c & 1) ^ 1) * H;
#pragma unroll
        for (int k = 0; k < kK; k += 4)
            if (k < K) {
                float4 v = load4<X>(xl + p * K + k);
                xr[k] = v.x; xr[k + 1] = v.y; xr[k + 2] = v.z; xr[k + 3] = v.w;
            }
        unsigned best_key = 0, best_idx = UINT_MAX;
#pragma unroll kUnrollRO
        for (int r = 0; r < RO; ++r) {
            const int col = r * (T / P) + tq;
            float a0 = 0.f, a1 = 0.f;
#pragma unroll
            for (int k = 0; k < kK; k += 2)
                if (k < K) {
                    a0 = fmaf(xr[k], w_output(r, k, col), a0);
                    a1 = fmaf(xr[k + 1], w_output(r, k + 1, col), a1);
                }
            float acc = a0 + a1;
            for (int off = P / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(kFull, acc, off);
            const unsigned key = ordered(acc), idx = g * COc + col;
            if (col < COc && (key > best_key || (key == best_key && idx < best_idx))) {
                best_key = key;
                best_idx = idx;
            }
        }
        warp_argmax(best_key, best_idx);
        if (lane == 0) {
            unsigned* slot = cand + 2 * (g * kNW + warp);
            if constexpr (X == kCluster) {
                for (int rank = 0; rank < G; ++rank) {
                    unsigned* d = cluster_map(slot, rank);
                    d[0] = best_key; d[1] = best_idx;
                }
            } else if constexpr (X == kGrid) {
                __stcg(reinterpret_cast<uint2*>(slot), make_uint2(best_key, best_idx));
            } else {
                slot[0] = best_key; slot[1] = best_idx;
            }
        }
        stage_barrier<X>();
        // Every warp reduces all candidates of the row itself: no extra barrier.
        unsigned k_best = 0, i_best = UINT_MAX;
        for (int j = lane; j < G * kNW; j += 32) {
            uint2 cj;
            if constexpr (X == kGrid) cj = __ldcg(reinterpret_cast<const uint2*>(cand) + j);
            else cj = reinterpret_cast<const uint2*>(cand)[j];
            if (cj.x > k_best || (cj.x == k_best && cj.y < i_best)) { k_best = cj.x; i_best = cj.y; }
        }
        warp_argmax(k_best, i_best);
        tok = i_best;
        if (!alive) continue;
        n_run = s + 1;
        const bool stop = (int)tok == a.stop;
        const bool last = stop || n_run == a.N;
        if (t == 0 && g == 0) a.tokens[(size_t)s * a.B + row] = tok;
        if (a.states != nullptr || last) {
            const float* e = e_row(tok);
            for (int i = t; i < CLc; i += T) {
                const int col = g * CLc + i;
                const float xv = (X == kGrid) ? __ldcg(xl + col) : xl[col];
                const float xn = 0.5f * (xv + (e_global ? __ldg(e + col) : e[col]));
                if (a.states != nullptr) a.states[((size_t)s * a.B + row) * H + col] = xn;
                if (last) a.x_final[(size_t)row * H + col] = xn;
            }
        }
        if (stop) {
            if constexpr (X == kGrid) {
                alive = false;
                if (t == 0 && g == 0) atomicAdd(a.rows_done, 1);
            } else {
                break;
            }
        }
    }
    if (t == 0 && g == 0) a.steps[row] = n_run;
    clock0.record(a.clock);
    // Peers may still read this block's shared memory (E rows, remote stores): leave together.
    if constexpr (X == kCluster) cluster_barrier();
}

// ---------------------------------------------------------------- host side ----------------
using KernelFn = void (*)(ToyArgs, Layout);

template <int X>
static KernelFn generic_kernel(int threads, int H) {
    const bool small = H / lanes_for(H) <= 8;
    if (threads == 256) return small ? toy_kernel<256, X, 8> : toy_kernel<256, X, kKMax>;
    if (threads == 512) return small ? toy_kernel<512, X, 8> : toy_kernel<512, X, kKMax>;
    return nullptr;
}

static KernelFn reg_kernel(int H, int L, int V) {
    if (V != 256) return nullptr;
    if (H == 64 && L == 4) return toy_kernel<kRegThreads, kBlock, 8, 64, 4, 256>;
    if (H == 32 && L == 4) return toy_kernel<kRegThreads, kBlock, 8, 32, 4, 256>;
    if (H == 64 && L == 2) return toy_kernel<kRegThreads, kBlock, 8, 64, 2, 256>;
    return nullptr;
}

// Version 2: the larger K of the two stages (layers, output) when a row is split over G blocks.
static int k_needed_v2(const ToyArgs& a, int threads, int G) {
    const int kl = geo(threads, a.H / G, a.H).k, ko = geo(threads, a.V / G, a.H).k;
    return kl > ko ? kl : ko;
}

template <int X, int T>
static KernelFn generic_kernel_v2(int k_need) {
    if (k_need <= 8) return toy_kernel_v2<T, X, 8>;
    if (k_need <= 16) return toy_kernel_v2<T, X, 16>;
    return toy_kernel_v2<T, X, kKMax>;
}

static KernelFn reg_kernel_v2(int H, int L, int V) {
    if (V != 256) return nullptr;
    if (H == 64 && L == 4) return toy_kernel_v2<kRegThreads, kBlock, 8, 64, 4, 256>;
    if (H == 32 && L == 4) return toy_kernel_v2<kRegThreads, kBlock, 8, 32, 4, 256>;
    if (H == 64 && L == 2) return toy_kernel_v2<kRegThreads, kBlock, 8, 64, 2, 256>;
    return nullptr;
}

static KernelFn pick_kernel(int variant, int threads, const ToyArgs& a, bool regs, int G) {
    const int kind = variant_kind(variant);
    if (variant_version(variant) == 2) {
        if (regs) return reg_kernel_v2(a.H, a.L, a.V);
        const int k = k_needed_v2(a, threads, G);
        if (threads != 256 && threads != 512) return nullptr;
        const bool t256 = threads == 256;
        if (kind == kBlock) return t256 ? generic_kernel_v2<kBlock, 256>(k) : generic_kernel_v2<kBlock, 512>(k);
        if (kind == kGrid) return t256 ? generic_kernel_v2<kGrid, 256>(k) : generic_kernel_v2<kGrid, 512>(k);
        return t256 ? generic_kernel_v2<kCluster, 256>(k) : generic_kernel_v2<kCluster, 512>(k);
    }
    if (regs) return reg_kernel(a.H, a.L, a.V);
    if (kind == kBlock) return generic_kernel<kBlock>(threads, a.H);
    if (kind == kGrid) return generic_kernel<kGrid>(threads, a.H);
    return generic_kernel<kCluster>(threads, a.H);
}

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

// Packed floats of one stage's weights in shared memory (rounds x K x threads) per version.
static int packed_floats(int version, int threads, int cols, int H) {
    if (version == 2) {
        const Geo g = geo(threads, cols, H);
        return g.r * g.k * threads;
    }
    return rounds_for(cols, H, threads) * (H / lanes_for(H)) * threads;
}

// Sections of one block's shared memory for `G` blocks per row; false if the minimum won't fit.
static bool layout_for(const ToyArgs& a, int variant, int threads, int G, bool regs, int limit,
                       Layout& lay, int& bytes) {
    const int H = a.H, L = a.L, V = a.V;
    const int kind = variant_kind(variant), version = variant_version(variant);
    const int cl = H / G, co = V / G;
    int off = 0;
    auto take = [&](int n) { int at = off; off += round4(n); return at; };
    lay = Layout{G, 0, 0, 0, 0, 0, 0, kGlobal, kGlobal, kGlobal};
    if (kind != kGrid) {
        lay.ring = take(2 * H);
        lay.cand = take(2 * G * (threads / 32));
    }
    lay.bias = take(L * cl);
    if (off * 4 > limit) return false;
    auto try_place = [&](int n, int& at, int& place) {
        if ((off + round4(n)) * 4 <= limit) { at = take(n); place = kShared; }
    };
    if (kind != kGrid) try_place((kind == kCluster ? co : V) * H, lay.e, lay.e_place);
    if (regs) {
        lay.w_place = lay.wout_place = kRegisters;
    } else {
        try_place(L * packed_floats(version, threads, cl, H), lay.w, lay.w_place);
        try_place(packed_floats(version, threads, co, H), lay.wout, lay.wout_place);
    }
    bytes = off * 4;
    return true;
}

static LaunchInfo plan(const ToyArgs& a, int variant, int threads, int group, Layout& lay) {
    LaunchInfo info{};
    info.variant = variant;
    info.threads = threads;
    info.ok = 1;
    if (variant < kBlock || variant > kClusterV2) return fail(info, "unknown variant code");
    const int kind = variant_kind(variant), version = variant_version(variant);
    const DeviceCaps caps = device_caps();
    const int H = a.H, V = a.V;
    if (version == 1 &&
        (H < 4 || H > 1024 || H % 4 != 0 || (H / lanes_for(H)) % 4 != 0 || H / lanes_for(H) > kKMax))
        return fail(info, "hidden must be a multiple of 4 in [4, 1024] with H/lanes a multiple of 4");
    // Version 2: K <= kKMax is reachable for every stage iff it is for the full width (the
    // widening loop of geo() depends on H only).
    if (version == 2 && (H < 4 || H > 1024 || H % 4 != 0 || geo(threads, H, H).k > kKMax))
        return fail(info, "hidden must be a multiple of 4 in [4, 1024] with H/lanes a multiple of 4");
    if (threads != 256 && threads != 512) return fail(info, "threads must be 256 or 512");
    if (kind == kCluster && caps.cc_major < 9)
        return fail(info, "the cluster variant needs compute capability 9.0 or newer");
    if (kind == kGrid && !caps.coop) return fail(info, "this GPU has no cooperative launch");
    const bool regs = kind == kBlock && threads == kRegThreads &&
                      (version == 2 ? reg_kernel_v2(a.H, a.L, a.V) : reg_kernel(a.H, a.L, a.V));
    int candidates[8] = {1, 0, 0, 0, 0, 0, 0, 0}, n = 1;
    if (group > 0) candidates[0] = group;
    else if (kind == kCluster) { int c[] = {2, 4, 8, 16}; memcpy(candidates, c, sizeof c); n = 4; }
    else if (kind == kGrid) { int c[] = {1, 2, 4, 8, 16, 32, 64, 128}; memcpy(candidates, c, sizeof c); n = 8; }
    if (kind == kBlock && candidates[0] != 1) return fail(info, "the block variant has group 1");
    if (kind == kCluster && (candidates[0] > 16 || candidates[0] < 1))
        return fail(info, "cluster group must be in [1, 16]");
    int bytes = 0;
    for (int i = 0; i < n; ++i) {
        const int G = candidates[i];
        if (H % G != 0 || V % G != 0 || (H / G) < 1) continue;
        if (!layout_for(a, variant, threads, G, regs, caps.smem_optin, lay, bytes)) continue;
        const bool all_shared = lay.w_place != kGlobal && lay.wout_place != kGlobal &&
                                (kind == kGrid || lay.e_place == kShared);
        if (group > 0 || all_shared || i == n - 1) break;
    }
    if (bytes == 0) return fail(info, "no group size divides hidden and vocab with the state in shared memory");
    info.group = lay.group;
    info.blocks = a.B * lay.group;
    info.smem_bytes = bytes;
    info.w_place = lay.w_place;
    info.wout_place = lay.wout_place;
    info.e_place = lay.e_place;
    if (kind == kGrid) {
        KernelFn fn = pick_kernel(variant, threads, a, false, info.group);
        cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
        int per_sm = 0;
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, threads, bytes);
        if (per_sm * caps.sms < info.blocks)
            return fail(info, "grid variant: batch x group blocks exceed what can be co-resident");
    }
    return info;
}

LaunchInfo toy_plan(const ToyArgs& a, int variant, int threads, int group) {
    Layout lay{};
    return plan(a, variant, threads, group, lay);
}

LaunchInfo toy_launch(const ToyArgs& a, int variant, int threads, int group, cudaStream_t stream) {
    Layout lay{};
    LaunchInfo info = plan(a, variant, threads, group, lay);
    if (!info.ok) return info;
    const int kind = variant_kind(variant);
    KernelFn fn = pick_kernel(variant, threads, a, info.w_place == kRegisters, info.group);
    if (fn == nullptr) return fail(info, "no compiled kernel for this launch");
    cudaError_t err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           info.smem_bytes);
    if (err == cudaSuccess && kind == kBlock) {
        fn<<<info.blocks, threads, info.smem_bytes, stream>>>(a, lay);
        err = cudaGetLastError();
    } else if (err == cudaSuccess && kind == kGrid) {
        ToyArgs a_copy = a;
        void* params[] = {&a_copy, &lay};
        err = cudaLaunchCooperativeKernel((void*)fn, info.blocks, threads, params, info.smem_bytes,
                                          stream);
    } else if (err == cudaSuccess) {
        if (info.group > 8)
            cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
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
