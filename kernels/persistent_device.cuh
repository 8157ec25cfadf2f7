// Persistent toy decode: device helpers shared by the kernel versions (persistent.cu holds
// the first version, persistent_v2.cuh the second): geometry constants, the state-exchange
// barriers, the cluster primitives (guarded so sm_75 builds compile), argmax and the run clock.
#pragma once
#include "persistent.cuh"

#include <cooperative_groups.h>

#include <climits>

namespace cg = cooperative_groups;

namespace toyk {
constexpr int kKMax = 32;  // most inputs per lane: H <= 1024 (lanes_for gives K = 8 up to H = 256)
constexpr unsigned kFull = 0xffffffffu;

// Shapes compiled with their weights in registers (block variant, 512 threads): see reg_kernel.
constexpr int kRegThreads = 512;

__host__ __device__ constexpr int lanes_for(int h) {
    int p = 1;
    while (p * 2 <= 32 && p * 2 * 8 <= h && h % (p * 2) == 0) p *= 2;
    return p;
}
__host__ __device__ constexpr int rounds_for(int cols, int h, int threads) {
    return (cols * lanes_for(h) + threads - 1) / threads;
}
__host__ __device__ constexpr int round4(int n) { return (n + 3) & ~3; }

// Float offsets of the shared-memory sections and where each weight lives.
struct Layout {
    int group;                 // blocks per row
    int ring, cand, bias, e, w, wout;
    int w_place, wout_place, e_place;
};

// ---- architecture-guarded cluster primitives (sm_75 builds compile them as traps) ----------
__device__ __forceinline__ void cluster_barrier() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cg::this_cluster().sync();
#else
    __trap();
#endif
}
__device__ __forceinline__ int cluster_rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return static_cast<int>(cg::this_cluster().block_rank());
#else
    return 0;
#endif
}
template <class T>
__device__ __forceinline__ T* cluster_map(T* p, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return cg::this_cluster().map_shared_rank(p, rank);
#else
    return p;
#endif
}

template <int X>
__device__ __forceinline__ void stage_barrier() {
    if constexpr (X == kBlock) __syncthreads();
    else if constexpr (X == kGrid) cg::this_grid().sync();
    else cluster_barrier();
}

// Order-preserving float -> uint (larger float <=> larger uint); 0 is below every real value.
__device__ __forceinline__ unsigned ordered(float v) {
    unsigned u = __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Warp-wide argmax of (key, idx): largest key, smallest idx among equal keys; result in all lanes.
__device__ __forceinline__ void warp_argmax(unsigned& key, unsigned& idx) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned kmax = __reduce_max_sync(kFull, key);
    idx = __reduce_min_sync(kFull, key == kmax ? idx : UINT_MAX);
    key = kmax;
#else
    for (int off = 16; off > 0; off >>= 1) {
        unsigned ok = __shfl_xor_sync(kFull, key, off), oi = __shfl_xor_sync(kFull, idx, off);
        if (ok > key || (ok == key && oi < idx)) { key = ok; idx = oi; }
    }
#endif
}

template <int X>
__device__ __forceinline__ float4 load4(const float* p) {
    if constexpr (X == kGrid) return __ldcg(reinterpret_cast<const float4*>(p));
    else return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ float4 load4_const(const float* p, bool global) {
    return global ? __ldg(reinterpret_cast<const float4*>(p)) : *reinterpret_cast<const float4*>(p);
}

// The run clock of a kernel: SM cycles (clock64) and nanoseconds (%globaltimer) between two
// reads by thread 0 of block 0, written as (cycles, ns) so the host can tell the SM clock.
__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
struct RunClock {
    long long cycles;
    unsigned long long ns;
    __device__ __forceinline__ static RunClock now() { return RunClock{clock64(), global_ns()}; }
    __device__ __forceinline__ void record(long long* out) const {
        if (out != nullptr && threadIdx.x == 0 && blockIdx.x == 0) {
            out[0] = clock64() - cycles;
            out[1] = static_cast<long long>(global_ns() - ns);
        }
    }
};

}  // namespace toyk
