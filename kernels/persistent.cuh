// Persistent toy decode: the declarations shared by the kernels, the C interface that Python
// loads through ctypes (persistent.cu) and the standalone check (persistent_check.cu).
// Plain structs and the CUDA runtime API only: no torch headers, so one nvcc command builds
// the shared library and CI compiles every file on its own.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace toyk {

// One run of N chained toy steps for B independent rows (fp32, row-major, contiguous):
//   for l < L: x = tanh(x @ W[l] + b[l]);  logits = x @ W_out;  tok = argmax (first on ties);
//   x = 0.5 * (x + E[tok])
// Mirrored field by field by decodelab.persistent.kernel (ctypes): change both together and
// bump kAbiVersion.
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
    float* scratch;      // grid exchange only: B * scratch_floats(...) floats, else nullptr
    int* rows_done;      // grid exchange only: one int, zeroed by the caller, else nullptr
    long long* clock;    // optional (2,): SM cycles (clock64) and ns (%globaltimer) of block 0's
                         // step loop, read by its thread 0; nullptr = not recorded
    long long* stages;   // clocked build only: (2 * (L + 2),) work and barrier-wait cycles per
                         // stage summed over the steps (see StageClock), else nullptr
    int H, L, V, B, N;
    int stop;            // stop token id, -1 = none
};
constexpr int kAbiVersion = 3;

// A variant is a design (how a stage's matrix-vector product is split over the threads, and
// whether the embedding is folded into the first layer) times a state exchange (how the blocks
// working on one row share the state between stages): code = design * 3 + exchange.
enum Exchange : int { kBlock = 0, kGrid = 1, kCluster = 2 };
enum Design : int { kFixed = 0, kWide = 1, kNarrow = 2, kWideFold = 3, kNarrowFold = 4 };
constexpr int kExchanges = 3, kDesigns = 5, kVariants = kExchanges * kDesigns;
__host__ __device__ constexpr int variant_exchange(int v) { return v % kExchanges; }
__host__ __device__ constexpr int variant_design(int v) { return v / kExchanges; }
__host__ __device__ constexpr bool design_folds(int d) { return d == kWideFold || d == kNarrowFold; }

// Where a launch keeps its weights: all in registers (compile-time shapes), packed in shared
// memory, or read from global memory (L2) in their natural layout.
enum Placement : int { kRegisters = 0, kShared = 1, kGlobal = 2 };

// The launch plan. Mirrored by decodelab.persistent.kernel (ctypes).
struct LaunchInfo {
    int variant, threads, group, blocks;
    int smem_bytes;
    int w_place, wout_place, e_place;  // Placement of W, W_out, E
    int lanes_layer, rounds_layer, lanes_out, rounds_out;  // work split of the two stage kinds
    int ok;
    char why[160];  // reason when !ok
};

// Plan (without launching) and launch. `group` = blocks per row (1 for block; 0 = automatic).
// `clocked` runs the diagnostic build of the same kernel (stage clock into ToyArgs::stages).
LaunchInfo toy_plan(const ToyArgs& a, int variant, int threads, int group);
LaunchInfo toy_launch(const ToyArgs& a, int variant, int threads, int group, bool clocked,
                      cudaStream_t stream);

// Floats of global scratch per row for the grid exchange: ring (2, Hp) + candidates.
int scratch_floats(int H, int group, int threads);

// Barrier microbenchmarks: `iters` back-to-back barriers of one kind inside one kernel.
// kind: 0 = __syncthreads (1 block of `threads`), 1 = grid.sync (`blocks` blocks),
// 2 = cluster.sync (one cluster of `blocks` blocks). `clock` (2,) or nullptr: cycles and ns of
// block 0's barrier loop (as ToyArgs::clock). Returns a CUDA error code.
int barrier_bench(int kind, int threads, int blocks, int iters, int* sink, long long* clock,
                  cudaStream_t stream);

}  // namespace toyk
