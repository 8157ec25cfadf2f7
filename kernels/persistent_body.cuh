// Persistent toy decode: THE kernel body. Every variant is this template with a work split, a
// state exchange and a shape policy (persistent_policies.cuh), with or without the embedding
// fold, and with or without the stage clock (the diagnostic build).
//
// One step, for the row this block works on (G blocks per row, block g owns a slice of CL
// layer columns and CO vocabulary columns):
//   layer l < L : y = tanh(x @ W[l][:, slice] + b[l][slice]); publish y; barrier
//   output      : logits of the slice, this warp's argmax; publish the candidate; barrier
//   token       : every warp reduces all candidates of the row (no further barrier)
// The layer input ping-pongs between two buffers of the ring, so a buffer is never written in
// the stage that reads it; candidates are read after the output barrier and written again only
// after the next step's layer barriers. One barrier per stage: L + 1 per step.
//
// The embedding update x = 0.5 * (x_L + E[tok]) is fused into the first layer's input. With
// the fold (kFold), it is folded into the first layer's weights instead:
//   (0.5 * (x_L + E[tok])) @ W[0] = 0.5 * (x_L @ W[0]) + EW[tok],  EW = 0.5 * (E @ W[0])
// (EW computed once per launch, the 0.5 exact in binary floating point), and x_L @ W[0] is
// computed in the output stage, next to the logits, from the same x_L: after the token is
// known the first layer needs one table read, not a matrix-vector product. The state itself
// is formed only where it is recorded (states, x_final).
#pragma once
#include "persistent_policies.cuh"

namespace toyk {

// Float offsets of the shared-memory sections, where each weight lives and the work split:
// computed by the host (persistent.cu, layout_for) and passed by value.
struct Layout {
    int group, cols_l, cols_o;  // G; columns per block of the layers and the output (ceil)
    Geo gl, go;                 // split of a layer stage and of the output stage
    int hp;                     // ring length: H padded to every lane chunk
    int scratch;                // grid: floats of global scratch per row
    int ring, cand, bias, e, ew, w, wout, clk;
    int w_place, wout_place, e_place;
};
constexpr int kPeers = 3;  // e_place: E's rows spread over the cluster's shared memory
constexpr int kFoldRounds = 2;  // most layer rounds the fold carries in registers (carry0, carry1)

// Four floats of column `col` of a row-major matrix (leading dimension ld), rows r0..r0+3;
// zero past `rows` (padding) or for an invalid column.
__device__ __forceinline__ float4 gather4(const float* m, int ld, int r0, int rows, int col, bool ok) {
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (ok && r0 < rows) {  // rows is a multiple of 4: the four rows are in or out together
        v.x = __ldg(m + (size_t)r0 * ld + col);
        v.y = __ldg(m + (size_t)(r0 + 1) * ld + col);
        v.z = __ldg(m + (size_t)(r0 + 2) * ld + col);
        v.w = __ldg(m + (size_t)(r0 + 3) * ld + col);
    }
    return v;
}

// Lane p's chunk of a vector, interleaved: its j-th float4 is the vector's float4 j * P + p,
// so the lanes of a column read consecutive 16-byte words (one shared-memory wavefront per
// quarter warp; contiguous K-float chunks put 4 lanes on one bank at K = 16). `ld4(i)` reads
// v[i, i + 4); the weights are packed to match (row4()).
__host__ __device__ constexpr int row4(int k4, int p, int P) { return 4 * (k4 * P + p); }
template <int KM, class Ld>
__device__ __forceinline__ void load_chunk(float (&xr)[KM], int K, int p, int P, Ld ld4) {
#pragma unroll
    for (int k = 0; k < KM; k += 4)
        if (k < K) {
            const float4 v = ld4(row4(k / 4, p, P));
            xr[k] = v.x; xr[k + 1] = v.y; xr[k + 2] = v.z; xr[k + 3] = v.w;
        }
}

// Dot product of a lane's chunk with its weights `w(k4)` (float4 of rows 4*k4..4*k4+3): eight
// independent FMA chains, then the sum over the P lanes of the column by xor-shuffles.
template <int KM, int PM, class W>
__device__ __forceinline__ float dot_reduce(const float (&xr)[KM], int K, int P, W w) {
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int k = 0; k < KM; k += 4)
        if (k < K) {
            const float4 v = w(k / 4);
            float* a = acc + ((k / 4) & 1) * 4;
            a[0] = fmaf(xr[k], v.x, a[0]); a[1] = fmaf(xr[k + 1], v.y, a[1]);
            a[2] = fmaf(xr[k + 2], v.z, a[2]); a[3] = fmaf(xr[k + 3], v.w, a[3]);
        }
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    if constexpr (PM > 0) {
#pragma unroll
        for (int off = PM / 2; off > 0; off >>= 1) s += __shfl_xor_sync(kFull, s, off);
    } else {
        for (int off = P / 2; off > 0; off >>= 1) s += __shfl_xor_sync(kFull, s, off);
    }
    return s;
}

template <class Split, class X, int T, class S, bool kFold, bool kClocked>
__global__ void __launch_bounds__(T, 1) toy_kernel(ToyArgs a, Layout lay) {
    constexpr bool kRegs = S::kRegs;
    constexpr int kNW = T / 32;
    constexpr int kCL = kRegs ? (S::H + S::G - 1) / S::G : 1, kCO = kRegs ? (S::V + S::G - 1) / S::G : 1;
    constexpr Geo kGL = Split::geo(T, kCL, kRegs ? S::H : 4), kGO = Split::geo(T, kCO, kRegs ? S::H : 4);
    constexpr int kKL = kRegs ? kGL.k : kKMax, kKO = kRegs ? kGO.k : kKMax;
    constexpr int kK = kKL > kKO ? kKL : kKO;
    constexpr int kRL = kRegs ? kGL.r : 1, kRO = kRegs ? kGO.r : 1;
    constexpr int kPL = kRegs ? kGL.p : 0, kPO = kRegs ? kGO.p : 0;  // 0: run-time lanes
    constexpr int kUnrollL = kRegs ? S::L : 1, kUnrollRL = kRegs ? kRL : 1, kUnrollRO = kRegs ? kRO : 1;
    extern __shared__ float4 smem4[];
    float* smem = reinterpret_cast<float*>(smem4);

    const int H = kRegs ? S::H : a.H, L = kRegs ? S::L : a.L, V = kRegs ? S::V : a.V;
    const int G = kRegs ? S::G : lay.group;
    const int CL = kRegs ? kCL : lay.cols_l, CO = kRegs ? kCO : lay.cols_o;
    const Geo gl = kRegs ? kGL : lay.gl, go = kRegs ? kGO : lay.go;
    const int PL = gl.p, KL = gl.k, RL = gl.r, PO = go.p, KO = go.k, RO = go.r;
    const int Hp = lay.hp;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int pl = t % PL, cl = t / PL, po = t % PO, co = t / PO;  // lane in column, column in round
    const int g = X::rank(G), row = X::row(G);
    const int nl = min(CL, H - g * CL), no = min(CO, V - g * CO);  // valid columns here (may be <= 0)
    // Threads that hold a column of the stage (packed weights are stored for these only).
    const int TAl = min(T, CL * PL), TAo = min(T, CO * PO);

    // ---- the state exchange: ring (2, Hp) and candidates (G * kNW), in smem or (grid) global
    float* ring = smem + lay.ring;
    uint2* cand = reinterpret_cast<uint2*>(smem + lay.cand);
    if constexpr (X::kKind == kGrid) {
        float* mine = a.scratch + (size_t)row * lay.scratch;
        ring = mine;
        cand = reinterpret_cast<uint2*>(mine + 2 * Hp);
    }
    StageClock<kClocked> clk(reinterpret_cast<unsigned*>(smem + lay.clk), L + 2);

    // ---- load this block's weights once ------------------------------------------------------
    // Layer weights of round r, chunk k4: rows row4(k4, pl, PL).., column g*CL + r*(T/PL) + cl.
    float4 wl[kRegs ? S::L * kRL * kKL / 4 : 1];
    float4 wo[kRegs ? kRO * kKO / 4 : 1];
    float breg[kRegs ? S::L * kRL : 1];
    if constexpr (kRegs) {
#pragma unroll
        for (int l = 0; l < S::L; ++l)
#pragma unroll
            for (int r = 0; r < kRL; ++r) {
                const int col = r * (T / kGL.p) + cl;
                breg[l * kRL + r] = col < nl ? a.b[l * H + g * CL + col] : 0.f;
#pragma unroll
                for (int k4 = 0; k4 < kKL / 4; ++k4)
                    wl[(l * kRL + r) * (kKL / 4) + k4] =
                        gather4(a.w + (size_t)l * H * H, H, row4(k4, pl, kGL.p), H, g * CL + col, col < nl);
            }
#pragma unroll
        for (int r = 0; r < kRO; ++r)
#pragma unroll
            for (int k4 = 0; k4 < kKO / 4; ++k4) {
                const int col = r * (T / kGO.p) + co;
                wo[r * (kKO / 4) + k4] = gather4(a.w_out, V, row4(k4, po, kGO.p), H, g * CO + col, col < no);
            }
    } else {
        float4* w4 = reinterpret_cast<float4*>(smem + lay.w);
        if (lay.w_place == kShared && t < TAl)
            for (int l = 0; l < L; ++l)
                for (int r = 0; r < RL; ++r)
                    for (int k4 = 0; k4 < KL / 4; ++k4) {
                        const int col = r * (T / PL) + cl;
                        w4[((l * RL + r) * (KL / 4) + k4) * TAl + t] =
                            gather4(a.w + (size_t)l * H * H, H, row4(k4, pl, PL), H, g * CL + col, col < nl);
                    }
        float4* o4 = reinterpret_cast<float4*>(smem + lay.wout);
        if (lay.wout_place == kShared && t < TAo)
            for (int r = 0; r < RO; ++r)
                for (int k4 = 0; k4 < KO / 4; ++k4) {
                    const int col = r * (T / PO) + co;
                    o4[(r * (KO / 4) + k4) * TAo + t] =
                        gather4(a.w_out, V, row4(k4, po, PO), H, g * CO + col, col < no);
                }
        for (int i = t; i < L * CL; i += T)
            smem[lay.bias + i] = (i % CL) < nl ? a.b[(i / CL) * H + g * CL + i % CL] : 0.f;
    }
    // E: all rows (block), this block's rows of the cluster's spread (peers), or global.
    if (lay.e_place == kShared || lay.e_place == kPeers) {
        const int first = lay.e_place == kPeers ? g * CO : 0, rows = lay.e_place == kPeers ? max(no, 0) : V;
        for (int i = t; i < rows * H; i += T) smem[lay.e + i] = a.embed[(size_t)first * H + i];
    }
    // Fold: EW[v][c] = 0.5 * (E[v] @ W[0][:, g*CL + c]) for this block's columns.
    if constexpr (kFold)
        for (int i = t; i < V * CL; i += T) {
            const int v = i / CL, c = i % CL;
            float s = 0.f;
            if (c < nl)
                for (int k = 0; k < H; ++k)
                    s = fmaf(__ldg(a.embed + (size_t)v * H + k), __ldg(a.w + (size_t)k * H + g * CL + c), s);
            smem[lay.ew + i] = 0.5f * s;
        }
    // The ring's padding past H is read as zeros by the last lanes and never written.
    if constexpr (X::kKind == kGrid) {
        for (int i = H + t; i < Hp; i += T) { ring[i] = 0.f; ring[Hp + i] = 0.f; }
    } else {
        for (int i = t; i < 2 * Hp; i += T) ring[i] = 0.f;
    }
    // Every block of a cluster must have started (and loaded) before remote stores begin.
    if constexpr (X::kKind == kCluster) cluster_barrier(); else __syncthreads();

    auto w_layer = [&](int l, int r, int k4, int col) -> float4 {
        if constexpr (kRegs) return wl[(l * kRL + r) * (kKL / 4) + k4];
        else if (lay.w_place == kShared)
            return t < TAl ? reinterpret_cast<const float4*>(smem + lay.w)[((l * RL + r) * (KL / 4) + k4) * TAl + t]
                           : make_float4(0.f, 0.f, 0.f, 0.f);
        else return gather4(a.w + (size_t)l * H * H, H, row4(k4, pl, PL), H, g * CL + col, col < nl);
    };
    auto w_output = [&](int r, int k4, int col) -> float4 {
        if constexpr (kRegs) return wo[r * (kKO / 4) + k4];
        else if (lay.wout_place == kShared)
            return t < TAo ? reinterpret_cast<const float4*>(smem + lay.wout)[(r * (KO / 4) + k4) * TAo + t]
                           : make_float4(0.f, 0.f, 0.f, 0.f);
        else return gather4(a.w_out, V, row4(k4, po, PO), H, g * CO + col, col < no);
    };
    auto bias = [&](int l, int r, int col) -> float {
        if constexpr (kRegs) return breg[l * kRL + r];
        else return smem[lay.bias + l * CL + (col < CL ? col : 0)];
    };
    // Row `tok` of E as a generic pointer (this block's smem, a cluster peer's smem, or global).
    auto e_row = [&](unsigned tok) -> const float* {
        if (lay.e_place == kShared) return smem + lay.e + (size_t)tok * H;
        if (lay.e_place == kPeers) {
            const int owner = tok / CO;
            return cluster_map(smem + lay.e, owner) + (size_t)(tok - owner * CO) * H;
        }
        return a.embed + (size_t)tok * H;
    };
    auto in_h = [&](const float* p, int i) -> float4 {  // a global/generic H-long vector, padded
        return i < H ? *reinterpret_cast<const float4*>(p + i) : make_float4(0.f, 0.f, 0.f, 0.f);
    };

    float xr[kK];                 // this lane's chunk of the stage input
    float carry0 = 0.f, carry1 = 0.f;  // fold: 0.5 * (x_L @ W[0]) of this thread's layer columns (rounds 0, 1)
    unsigned tok = 0;             // token of the previous step (same value in every thread of the row)
    int c = 0;                    // layer stages so far: ring[c & 1] is written by the current layer
    int n_run = 0;
    bool alive = true;            // grid only: a stopped row keeps joining the barriers
    const float* xrow0 = a.x0 + (size_t)row * H;
    const RunClock clock0 = RunClock::now();  // the run clock starts with the step loop

    for (int s = 0; s < a.N; ++s) {
        clk.step();
#pragma unroll kUnrollL
        for (int l = 0; l < L; ++l, ++c) {
            float* out = ring + (c & 1) * Hp;
            const float* in = ring + ((c & 1) ^ 1) * Hp;
            const bool folded = kFold && l == 0 && s > 0;
            if (!folded) {
                if (l == 0 && s == 0) {
                    load_chunk(xr, KL, pl, PL, [&](int i) { return in_h(xrow0, i); });
                } else if (l == 0) {  // x = 0.5 * (x_L + E[tok]), fused into the first layer's input
                    const float* e = e_row(tok);
                    load_chunk(xr, KL, pl, PL, [&](int i) {
                        const float4 v = X::ld4(in + i), u = in_h(e, i);
                        return make_float4(0.5f * (v.x + u.x), 0.5f * (v.y + u.y),
                                           0.5f * (v.z + u.z), 0.5f * (v.w + u.w));
                    });
                } else {
                    load_chunk(xr, KL, pl, PL, [&](int i) { return X::ld4(in + i); });
                }
            }
#pragma unroll kUnrollRL
            for (int r = 0; r < RL; ++r) {
                const int col = r * (T / PL) + cl;
                const float b = bias(l, r, col);  // issued before the sum: off the critical path
                float sum;
                if (folded) {
                    sum = (r == 0 ? carry0 : carry1) + (col < nl ? smem[lay.ew + tok * CL + col] : 0.f);
                } else {
                    sum = dot_reduce<kK, kPL>(xr, KL, PL, [&](int k4) { return w_layer(l, r, k4, col); });
                }
                if (col < nl) X::put(out + g * CL + col, tanhf(sum + b), pl, PL, G);
            }
            if constexpr (kClocked) X::fence();
            clk.arrive(l);
            X::sync();
            clk.leave(l);
            if constexpr (X::kKind == kGrid) {
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
        const float* xl = ring + ((c & 1) ^ 1) * Hp;
        load_chunk(xr, KO, po, PO, [&](int i) { return X::ld4(xl + i); });
        unsigned best_key = 0, best_idx = UINT_MAX;
#pragma unroll kUnrollRO
        for (int r = 0; r < RO; ++r) {
            const int col = r * (T / PO) + co;
            const float acc = dot_reduce<kK, kPO>(xr, KO, PO, [&](int k4) { return w_output(r, k4, col); });
            const unsigned key = ordered(acc), idx = g * CO + col;
            if (col < no && (key > best_key || (key == best_key && idx < best_idx))) {
                best_key = key;
                best_idx = idx;
            }
        }
        warp_argmax(best_key, best_idx);
        X::cand_put(cand + g * kNW + warp, make_uint2(best_key, best_idx), lane, G);
        if constexpr (kFold) {  // next step's first layer, from the same x_L
            load_chunk(xr, KL, pl, PL, [&](int i) { return X::ld4(xl + i); });
            carry0 = 0.5f * dot_reduce<kK, kPL>(xr, KL, PL, [&](int k4) { return w_layer(0, 0, k4, cl); });
            if (RL > 1)
                carry1 = 0.5f * dot_reduce<kK, kPL>(xr, KL, PL, [&](int k4) { return w_layer(0, 1, k4, T / PL + cl); });
        }
        if constexpr (kClocked) X::fence();
        clk.arrive(L);
        X::sync();
        clk.leave(L);
        // Every warp reduces all candidates of the row itself: no extra barrier.
        unsigned k_best = 0, i_best = UINT_MAX;
        for (int j = lane; j < G * kNW; j += 32) {
            const uint2 cj = X::ld_cand(cand + j);
            if (cj.x > k_best || (cj.x == k_best && cj.y < i_best)) { k_best = cj.x; i_best = cj.y; }
        }
        warp_argmax(k_best, i_best);
        tok = i_best;
        if (!alive) continue;
        n_run = s + 1;
        const bool stop = (int)tok == a.stop;
        const bool last = stop || n_run == a.N;
        if (t == 0 && g == 0) a.tokens[(size_t)s * a.B + row] = tok;
        if (a.states != nullptr || last) {  // the state, for this block's columns
            const float* e = e_row(tok);
            for (int i = t; i < nl; i += T) {
                const int col = g * CL + i;
                const float xn = 0.5f * (X::ld(xl + col) + e[col]);
                if (a.states != nullptr) a.states[((size_t)s * a.B + row) * H + col] = xn;
                if (last) a.x_final[(size_t)row * H + col] = xn;
            }
        }
        if (stop) {
            if constexpr (X::kKind == kGrid) {
                alive = false;
                if (t == 0 && g == 0) atomicAdd(a.rows_done, 1);
            } else {
                break;
            }
        }
    }
    clk.step();
    clk.write(a.stages);
    if (t == 0 && g == 0) a.steps[row] = n_run;
    clock0.record(a.clock);
    // Peers may still read this block's shared memory (E rows, remote stores): leave together.
    if constexpr (X::kKind == kCluster) cluster_barrier();
}

}  // namespace toyk
