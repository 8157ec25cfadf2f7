// Persistent toy decode: device helpers of the kernel body (persistent_body.cuh): the cluster
// primitives (guarded so sm_75 builds compile), the argmax key, the run clock and the stage
// clock of the diagnostic build.
#pragma once
#include "persistent.cuh"

#include <cooperative_groups.h>

#include <climits>

namespace cg = cooperative_groups;

namespace toyk {
constexpr unsigned kFull = 0xffffffffu;

// ---- architecture-guarded cluster primitives (sm_75 builds compile them as traps) ----------
__device__ __forceinline__ void cluster_barrier() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cg::this_cluster().sync();
#else
    __trap();
#endif
}
// This thread's prior stores (remote ones too) visible to the whole cluster.
__device__ __forceinline__ void cluster_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.acq_rel.cluster;" ::: "memory");
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

// The stage clock of the diagnostic build. Stage i < L is layer i, stage L the output
// projection with its local argmax, stage L+1 the token (the row's argmax over the candidates,
// the token and stop bookkeeping, up to the next step). For a stage that ends in a barrier:
// work = from the previous boundary to the LAST warp's arrival at the barrier (the stage's
// critical path), wait = from that arrival to thread 0 leaving the barrier (the barrier's own
// latency, plus, across blocks, the other blocks' lag). Arrivals are the low 32 bits of clock64
// (a native shared-memory atomicMax; a 64-bit one is a compare-and-swap loop that itself
// distorts the stage), differences taken modulo 2^32. Summed over steps in shared memory by
// thread 0; block 0's sums are written out. `kOn = false` compiles to nothing.
template <bool kOn>
struct StageClock {
    __device__ StageClock(unsigned*, int) {}
    __device__ __forceinline__ void arrive(int) {}
    __device__ __forceinline__ void leave(int) {}
    __device__ __forceinline__ void step() {}
    __device__ __forceinline__ void write(long long*) {}
};
template <>
struct StageClock<true> {
    unsigned* last;  // (stages,) latest warp arrival at each barrier this step, low 32 bits
    long long* sums; // (2 * stages,) work, wait per stage; thread 0 only
    int n;           // stages = L + 2
    long long prev;  // thread 0: the previous boundary (0 = none yet)
    __device__ StageClock(unsigned* smem, int stages)
        : last(smem), sums(reinterpret_cast<long long*>(smem + 2 * ((stages + 1) / 2))), n(stages), prev(0) {
        if (threadIdx.x == 0) {
            for (int i = 0; i < n; ++i) { last[i] = 0; sums[2 * i] = 0; sums[2 * i + 1] = 0; }
        }
    }
    __device__ __forceinline__ void arrive(int i) {
        __syncwarp();
        if ((threadIdx.x & 31) == 0) atomicMax(last + i, static_cast<unsigned>(clock64()));
    }
    // After the barrier of stage i every warp's arrival is visible; the slot is reset for the
    // next step (its next write follows at least one more barrier).
    __device__ __forceinline__ void leave(int i) {
        if (threadIdx.x == 0) {
            const long long now = clock64();
            const unsigned work = last[i] - static_cast<unsigned>(prev);
            sums[2 * i] += work;
            sums[2 * i + 1] += static_cast<unsigned>(now) - last[i];
            last[i] = 0;
            prev = now;
        }
    }
    // Top of a step: the token stage of the previous step ends here.
    __device__ __forceinline__ void step() {
        if (threadIdx.x == 0) {
            const long long now = clock64();
            if (prev != 0) sums[2 * (n - 1)] += now - prev;
            prev = now;
        }
    }
    __device__ __forceinline__ void write(long long* out) {
        if (out != nullptr && threadIdx.x == 0 && blockIdx.x == 0)
            for (int i = 0; i < 2 * n; ++i) out[i] = sums[i];
    }
};

}  // namespace toyk
