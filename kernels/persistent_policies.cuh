// Persistent toy decode: the policies of the one kernel body (persistent_body.cuh).
//
// Split (how one stage, a matrix-vector product with H inputs and `cols` output columns in
// this block, is spread over T threads): P lanes per column (a power of two <= 32, the lanes
// of a column adjacent in one warp), each lane owning K inputs (a multiple of 4, at most kKMax,
// as K/4 float4 words interleaved with the other lanes' words; the last words may lie past H,
// in zero padding) and accumulating them in eight independent FMA chains; the P partial sums
// are added by log2(P) xor-shuffles; T/P columns per round, R rounds.
//   SplitFixed  - P set by H alone (about H/8): the first design; a stage with many columns
//                 runs several rounds, each ending in a chain of shuffles.
//   SplitWide   - the widest P with cols * P <= T: one round per stage where the columns fit,
//                 the fewest inputs per lane.
//   SplitNarrow - the fewest lanes that still give each of the SM's four schedulers a warp
//                 (cols * P >= 128): long FMA chains, few or no shuffles (P = 1 is one thread
//                 per output column, reading the whole input vector as shared-memory
//                 broadcasts).
// Exchange (how the G blocks of one row share the state between stages):
//   BlockX   - one block per row: shared memory and __syncthreads.
//   GridX    - G blocks under a cooperative launch: global memory (L2) and grid.sync().
//   ClusterX - G blocks of one thread-block cluster (sm_90): each block stores its columns into
//              every peer's shared memory (distributed shared memory), then cluster.sync().
// Shape: Dyn (run-time H, L, V; weights packed in shared memory or read from L2) or
// Fixed<H, L, V, G> (compile-time; weights held in registers across all steps).
#pragma once
#include "persistent_device.cuh"

namespace toyk {
constexpr int kKMax = 32;     // most inputs per lane (sizes the register chunk of the input)
constexpr int kMaxHidden = 1024;

struct Geo { int p, k, r; };  // lanes per column, inputs per lane, rounds

__host__ __device__ constexpr int round4(int n) { return (n + 3) & ~3; }
// K for P lanes over H inputs: ceil(H / P) rounded up to a multiple of 4 (float4 loads).
__host__ __device__ constexpr int chunk(int h, int p) { return round4((h + p - 1) / p); }
// Lanes past ceil(H/4) would own padding only.
__host__ __device__ constexpr bool lanes_useful(int h, int p) { return p <= 32 && p * 4 < h + 4; }
__host__ __device__ constexpr Geo make_geo(int threads, int cols, int h, int p) {
    while (p < 32 && chunk(h, p) > kKMax) p *= 2;  // at most kKMax inputs per lane
    return Geo{p, chunk(h, p), (cols * p + threads - 1) / threads};
}

struct SplitFixed {
    static constexpr int kDesign = kFixed;
    __host__ __device__ static constexpr Geo geo(int threads, int cols, int h) {
        int p = 1;
        while (p * 2 <= 32 && p * 2 * 8 <= h) p *= 2;
        return make_geo(threads, cols, h, p);
    }
};
struct SplitWide {
    static constexpr int kDesign = kWide;
    __host__ __device__ static constexpr Geo geo(int threads, int cols, int h) {
        int p = 1;
        while (lanes_useful(h, p * 2) && cols * p * 2 <= threads) p *= 2;
        return make_geo(threads, cols, h, p);
    }
};
struct SplitNarrow {
    static constexpr int kDesign = kNarrow;
    __host__ __device__ static constexpr Geo geo(int threads, int cols, int h) {
        const int busy = threads < 128 ? threads : 128;  // one warp per scheduler
        int p = 1;
        while (lanes_useful(h, p * 2) && cols * p < busy) p *= 2;
        return make_geo(threads, cols, h, p);
    }
};

// ---- shapes ---------------------------------------------------------------------------------
struct Dyn {
    static constexpr bool kRegs = false;
    static constexpr int H = 0, L = 0, V = 0, G = 0;
};
template <int H_, int L_, int V_, int G_>
struct Fixed {
    static constexpr bool kRegs = true;
    static constexpr int H = H_, L = L_, V = V_, G = G_;
};

// ---- state exchanges ------------------------------------------------------------------------
// put(): publish one output column `v` at `dst` (an address in this block's view of the row's
// ring) from the P lanes that hold it; cand_put(): one warp's argmax candidate from every lane
// of the warp (all hold it); ld4/ld_cand: read what the peers published. fence(): make this
// thread's published stores visible to the peers now (the diagnostic build calls it before a
// warp's arrival is stamped, so the stores' drain counts as the stage's work, not as the
// barrier's; the barrier itself orders them anyway).
struct BlockX {
    static constexpr int kKind = kBlock;
    __device__ static void sync() { __syncthreads(); }
    __device__ static void fence() {}
    __device__ static int rank(int) { return 0; }
    __device__ static int row(int) { return blockIdx.x; }
    __device__ static float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }
    __device__ static float ld(const float* p) { return *p; }
    __device__ static void put(float* dst, float v, int lane_in_col, int, int) {
        if (lane_in_col == 0) *dst = v;
    }
    __device__ static void cand_put(uint2* slot, uint2 v, int lane, int) {
        if (lane == 0) *slot = v;
    }
    __device__ static uint2 ld_cand(const uint2* p) { return *p; }
};
struct GridX {
    static constexpr int kKind = kGrid;
    __device__ static void sync() { cg::this_grid().sync(); }
    __device__ static void fence() { __threadfence(); }
    __device__ static int rank(int G) { return blockIdx.x % G; }
    __device__ static int row(int G) { return blockIdx.x / G; }
    // L2 reads: the state changes every stage, so it must not be served from L1.
    __device__ static float4 ld4(const float* p) { return __ldcg(reinterpret_cast<const float4*>(p)); }
    __device__ static float ld(const float* p) { return __ldcg(p); }
    __device__ static void put(float* dst, float v, int lane_in_col, int, int) {
        if (lane_in_col == 0) __stcg(dst, v);
    }
    __device__ static void cand_put(uint2* slot, uint2 v, int lane, int) {
        if (lane == 0) __stcg(slot, v);
    }
    __device__ static uint2 ld_cand(const uint2* p) { return __ldcg(p); }
};
struct ClusterX {
    static constexpr int kKind = kCluster;
    __device__ static void sync() { cluster_barrier(); }
    __device__ static void fence() { cluster_fence(); }
    __device__ static int rank(int) { return cluster_rank(); }
    __device__ static int row(int G) { return blockIdx.x / G; }
    __device__ static float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }
    __device__ static float ld(const float* p) { return *p; }
    // The P lanes of a column share the G remote stores.
    __device__ static void put(float* dst, float v, int lane_in_col, int P, int G) {
        for (int r = lane_in_col; r < G; r += P) *cluster_map(dst, r) = v;
    }
    __device__ static void cand_put(uint2* slot, uint2 v, int lane, int G) {
        for (int r = lane; r < G; r += 32) *cluster_map(slot, r) = v;
    }
    __device__ static uint2 ld_cand(const uint2* p) { return *p; }
};

}  // namespace toyk
