// Persistent toy decode, version 2 (variants block_v2, grid_v2, cluster_v2): the kernel of
// persistent.cu with a work split chosen per stage so that each output column is reduced in
// one round.
//
// Version 1 uses P = lanes per column fixed by H alone (about H/8), so a stage with C columns
// takes R = C*P/T rounds, each ending in log2(P) dependent xor-shuffles (at H=256 with 8 blocks
// of 256 threads: 4 rounds of 5 shuffles per layer). Version 2 picks, per stage, the widest P
// with C*P <= T: one round when the columns fit, each lane then accumulating K = H/P inputs
// (K a multiple of 4, at most kKMax; P widened past one round only to keep K <= kKMax), with
// four independent FMA chains. The state exchange, barriers, argmax and stop handling are those
// of version 1 unchanged. Included by persistent.cu (host side there); built and checked with it.
#pragma once
#include "persistent_device.cuh"

namespace toyk {

// Geometry of one stage (H inputs, `cols` output columns, `threads` threads): P lanes per
// column (the widest with cols * P <= threads, so one round when possible; K = H/P kept a
// multiple of 4 and <= kKMax), K inputs per lane, R rounds of threads/P columns.
struct Geo { int p, k, r; };
__host__ __device__ constexpr bool lanes_ok(int h, int p) { return h % p == 0 && (h / p) % 4 == 0; }
__host__ __device__ constexpr Geo geo(int threads, int cols, int h) {
    int p = 1;
    while (p * 2 <= 32 && cols * p * 2 <= threads && lanes_ok(h, p * 2)) p *= 2;
    while (h / p > kKMax && p * 2 <= 32 && lanes_ok(h, p * 2)) p *= 2;
    return Geo{p, h / p, (cols * p + threads - 1) / threads};
}

// T threads; KM = most inputs per lane (8, 16 or 32: sizes the register chunk of x);
// CH/CL/CV > 0: compile-time shape with the weights in registers (block variant only).
template <int T, int X, int KM, int CH = 0, int CL = 0, int CV = 0>
__global__ void __launch_bounds__(T, 1) toy_kernel_v2(ToyArgs a, Layout lay) {
    constexpr bool kRegs = CH > 0;
    constexpr Geo kGL = geo(T, kRegs ? CH : 1, kRegs ? CH : 4), kGO = geo(T, kRegs ? CV : 1, kRegs ? CH : 4);
    constexpr int kKL = kRegs ? kGL.k : KM, kKO = kRegs ? kGO.k : KM;  // register chunk sizes
    constexpr int kK = kKL > kKO ? kKL : kKO;
    constexpr int kRL = kRegs ? kGL.r : 1, kRO = kRegs ? kGO.r : 1;
    constexpr int kNW = T / 32;
    constexpr int kUnrollL = kRegs ? CL : 1;   // full unrolls only where weights sit in registers
    constexpr int kUnrollRL = kRegs ? kRL : 1;
    constexpr int kUnrollRO = kRegs ? kRO : 1;
    extern __shared__ float4 smem4[];
    float* smem = reinterpret_cast<float*>(smem4);

    const int H = kRegs ? CH : a.H, L = kRegs ? CL : a.L, V = kRegs ? CV : a.V;
    const int G = kRegs ? 1 : lay.group;
    const int CLc = H / G, COc = V / G;  // columns of this block's slice: layers, output
    const Geo gl = kRegs ? kGL : geo(T, CLc, H), go = kRegs ? kGO : geo(T, COc, H);
    const int PL = gl.p, KL = gl.k, RL = gl.r, PO = go.p, KO = go.k, RO = go.r;
    const int t = threadIdx.x, lane = t % 32, warp = t / 32;
    const int pl = t % PL, tql = t / PL, po = t % PO, tqo = t / PO;  // lane part, column in round
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
    constexpr int kWL = kRegs ? CL * kRL * kKL : 0;  // register words of the layers
    float wreg[kRegs ? kWL + kRO * kKO : 1];
#pragma unroll
    for (int l = 0; l < (kRegs ? CL : 1); ++l)
#pragma unroll
        for (int r = 0; r < kRL; ++r)
#pragma unroll
            for (int k = 0; k < kKL; ++k) {
                if constexpr (kRegs) {
                    int col = r * (T / PL) + tql;
                    wreg[(l * kRL + r) * kKL + k] =
                        col < CH ? a.w[(size_t)l * CH * CH + (pl * kKL + k) * CH + col] : 0.f;
                }
            }
#pragma unroll
    for (int r = 0; r < kRO; ++r)
#pragma unroll
        for (int k = 0; k < kKO; ++k) {
            if constexpr (kRegs) {
                int col = r * (T / PO) + tqo;
                wreg[kWL + r * kKO + k] = col < CV ? a.w_out[(po * kKO + k) * CV + col] : 0.f;
            }
        }
    if (!kRegs && lay.w_place == kShared)
        for (int l = 0; l < L; ++l)
            for (int r = 0; r < RL; ++r)
                for (int k = 0; k < KL; ++k) {
                    int col = r * (T / PL) + tql;
                    smem[lay.w + ((l * RL + r) * KL + k) * T + t] =
                        col < CLc ? a.w[(size_t)l * H * H + (size_t)(pl * KL + k) * H + g * CLc + col]
                                  : 0.f;
                }
    if (!kRegs && lay.wout_place == kShared)
        for (int r = 0; r < RO; ++r)
            for (int k = 0; k < KO; ++k) {
                int col = r * (T / PO) + tqo;
                smem[lay.wout + (r * KO + k) * T + t] =
                    col < COc ? a.w_out[(size_t)(po * KO + k) * V + g * COc + col] : 0.f;
            }
    for (int i = t; i < L * CLc; i += T) bias[i] = a.b[(i / CLc) * H + g * CLc + i % CLc];
    if (lay.e_place == kShared) {
        const int rows = (X == kCluster) ? COc : V;
        for (int i = t; i < rows * H; i += T) smem[lay.e + i] = a.embed[(size_t)e_row0 * H + i];
    }
    // Every block of a cluster must have started (and loaded) before remote stores begin.
    if constexpr (X == kCluster) cluster_barrier(); else __syncthreads();

    auto w_layer = [&](int l, int r, int k, int col) -> float {
        if constexpr (kRegs) return wreg[(l * kRL + r) * kKL + k];
        else if (lay.w_place == kShared) return smem[lay.w + ((l * RL + r) * KL + k) * T + t];
        else return col < CLc ? __ldg(a.w + (size_t)l * H * H + (size_t)(pl * KL + k) * H + g * CLc + col) : 0.f;
    };
    auto w_output = [&](int r, int k, int col) -> float {
        if constexpr (kRegs) return wreg[kWL + r * kKO + k];
        else if (lay.wout_place == kShared) return smem[lay.wout + (r * KO + k) * T + t];
        else return col < COc ? __ldg(a.w_out + (size_t)(po * KO + k) * V + g * COc + col) : 0.f;
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

    float xr[kK];       // this lane's chunk x[p*K, (p+1)*K) of the stage input (K = KL or KO)
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
                for (int k = 0; k < kKL; k += 4)
                    if (k < KL) {
                        float4 v = __ldg(reinterpret_cast<const float4*>(xrow0 + pl * KL + k));
                        xr[k] = v.x; xr[k + 1] = v.y; xr[k + 2] = v.z; xr[k + 3] = v.w;
                    }
            } else if (l == 0) {  // x = 0.5 * (x_L + E[tok]), fused into the first layer's input
                const float* e = e_row(tok);
#pragma unroll
                for (int k = 0; k < kKL; k += 4)
                    if (k < KL) {
                        float4 v = load4<X>(in + pl * KL + k), u = load4_const(e + pl * KL + k, e_global);
                        xr[k] = 0.5f * (v.x + u.x); xr[k + 1] = 0.5f * (v.y + u.y);
                        xr[k + 2] = 0.5f * (v.z + u.z); xr[k + 3] = 0.5f * (v.w + u.w);
                    }
            } else {
#pragma unroll
                for (int k = 0; k < kKL; k += 4)
                    if (k < KL) {
                        float4 v = load4<X>(in + pl * KL + k);
                        xr[k] = v.x; xr[k + 1] = v.y; xr[k + 2] = v.z; xr[k + 3] = v.w;
                    }
            }
#pragma unroll kUnrollRL
            for (int r = 0; r < RL; ++r) {
                const int col = r * (T / PL) + tql;
                float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
#pragma unroll
                for (int k = 0; k < kKL; k += 4)
                    if (k < KL) {
                        a0 = fmaf(xr[k], w_layer(l, r, k, col), a0);
                        a1 = fmaf(xr[k + 1], w_layer(l, r, k + 1, col), a1);
                        a2 = fmaf(xr[k + 2], w_layer(l, r, k + 2, col), a2);
                        a3 = fmaf(xr[k + 3], w_layer(l, r, k + 3, col), a3);
                    }
                float acc = (a0 + a1) + (a2 + a3);
                for (int off = PL / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(kFull, acc, off);
                if (col < CLc) {
                    const float y = tanhf(acc + bias[l * CLc + col]);
                    float* dst = out + g * CLc + col;
                    if constexpr (X == kCluster) {
                        for (int rank = pl; rank < G; rank += PL) *cluster_map(dst, rank) = y;
                    } else if constexpr (X == kGrid) {
                        if (pl == 0) __stcg(dst, y);
                    } else {
                        if (pl == 0) *dst = y;
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
        for (int k = 0; k < kKO; k += 4)
            if (k < KO) {
                float4 v = load4<X>(xl + po * KO + k);
                xr[k] = v.x; xr[k + 1] = v.y; xr[k + 2] = v.z; xr[k + 3] = v.w;
            }
        unsigned best_key = 0, best_idx = UINT_MAX;
#pragma unroll kUnrollRO
        for (int r = 0; r < RO; ++r) {
            const int col = r * (T / PO) + tqo;
            float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
#pragma unroll
            for (int k = 0; k < kKO; k += 4)
                if (k < KO) {
                    a0 = fmaf(xr[k], w_output(r, k, col), a0);
                    a1 = fmaf(xr[k + 1], w_output(r, k + 1, col), a1);
                    a2 = fmaf(xr[k + 2], w_output(r, k + 2, col), a2);
                    a3 = fmaf(xr[k + 3], w_output(r, k + 3, col), a3);
                }
            float acc = (a0 + a1) + (a2 + a3);
            for (int off = PO / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(kFull, acc, off);
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

}  // namespace toyk
