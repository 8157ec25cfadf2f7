// Persistent toy decode: the declarations shared by the kernels (persistent.cu), the torch
// binding (persistent_binding.cpp) and the standalone check (persistent_check.cu).
// Pure CUDA runtime API: no torch headers, so CI compiles the kernels on their own.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace toyk {

// One run of N chained toy steps for B independent rows (fp32, row-major, contiguous):
//   for l < L: x = tanh(x @ W[l] + b[l]);  logits = x @ W_out;  tok = argmax (first on ties);
//   x = 0.5 * (x + E[tok])
struct ToyArgs {
    const float* w;      // (L, H, H), used as x @ w[l]
    const float* b;      // (L, H)
    const float* w_out;  // (H, V)
    const float* embed;  // (V, H)
    const float* x0;     // (B, H) initial state
    float* x_final;      // (B, H) state after each row's last step
    float* states;       // (N, B, H) state after every step, or nullptr (timing runs)
    int64_t* tokens;     // (N, B); steps a row did not run are left untouched (caller fills -1)
    int* steps;          // (B,) steps each row ran (stops after emitting `stop`)
    float* scratch;      // grid variant only: B * grid_scratch_floats(H, G) floats, else nullptr
    int* rows_done;      // grid variant only: one int, zeroed by the caller, else nullptr
    int H, L, V, B, N;
    int stop;            // stop token id, -1 = none
    long long* clock;    // optional (2,): SM cycles (clock64) and ns (%globaltimer) of block 0's
                         // step loop, read by its thread 0; nullptr = not recorded
};

// Variant codes: version 1 (persistent.cu) is 0..2, version 2 (persistent_v2.cuh) is 3..5 with
// the same state exchange: kind = code % 3, version = code / 3 + 1.
enum Variant : int { kBlock = 0, kGrid = 1, kCluster = 2, kBlockV2 = 3, kGridV2 = 4, kClusterV2 = 5 };
__host__ __device__ inline int variant_kind(int variant) { return variant % 3; }
__host__ __device__ inline int variant_version(int variant) { return variant / 3 + 1; }

// Where a launch keeps its weights: all in registers (compile-time shapes), packed in shared
// memory, or read from global memory (L2) in their natural layout.
enum Placement : int { kRegisters = 0, kShared = 1, kGlobal = 2 };

struct LaunchInfo {
    int variant, threads, group, blocks;
    int smem_bytes;
    int w_place, wout_place, e_place;  // Placement of W, W_out, E
    int ok;
    char why[160];  // reason when !ok
};

// Plan (without launching) and launch. `group` = blocks per row (1 for block; 0 = automatic).
LaunchInfo toy_plan(const ToyArgs& a, int variant, int threads, int group);
LaunchInfo toy_launch(const ToyArgs& a, int variant, int threads, int group, cudaStream_t stream);
// Floats of global scratch per row for the grid variant: ring (2, H) + candidates (G * warps, 2).
__host__ __device__ inline int grid_scratch_floats(int H, int G, int threads) {
    return (2 * H + 2 * G * (threads / 32) + 3) & ~3;
}

// Barrier microbenchmarks: `iters` back-to-back barriers of one kind inside one kernel.
// kind: 0 = __syncthreads (1 block of `threads`), 1 = grid.sync (`blocks` blocks),
// 2 = cluster.sync (one cluster of `blocks` blocks). `clock` (2,) or nullptr: cycles and ns of
// block 0's barrier loop (as ToyArgs::clock). Returns a CUDA error code.
int barrier_bench(int kind, int threads, int blocks, int iters, int* sink, long long* clock,
                  cudaStream_t stream);

}  // namespace toyk
