# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · Persistent execution: the decode loop inside one kernel
#
# Phase 2 amortised the graph replay over K captured steps, but a replay boundary (and the host
# that issues it) remained. Here the whole loop moves onto the device: one kernel launch runs N
# chained toy steps — L layers, the output projection, the greedy token, the state update — and
# stops on the device when a row emits the stop token.
#
# Every variant is ONE kernel body (`kernels/persistent_body.cuh`) with two policies:
#
# - **the state exchange** between the stages of a step: `block` (one thread block per row,
#   `__syncthreads`), `grid` (G blocks per row under a cooperative launch, the state through L2,
#   `grid.sync()`), `cluster` (Hopper, sm_90: the G blocks of a thread-block cluster store their
#   columns straight into every peer's shared memory, `cluster.sync()`);
# - **the design** of a stage (a matrix-vector product spread over the threads: P lanes per
#   output column, each summing a chunk of K inputs in independent FMA chains, then log2(P)
#   shuffles): `fixed` (P set by the hidden size alone, the first design: a stage with many
#   columns runs several rounds of shuffle chains), `wide` (the widest P that still fits the
#   columns in one round), `narrow` (the fewest lanes that keep each of the SM's four schedulers
#   busy: long FMA chains, few shuffles, up to one thread per column with the input broadcast
#   from shared memory), and `wide_fold` / `narrow_fold`: the embedding update folded into the
#   first layer — `(0.5 (x_L + E[tok])) W_0 = 0.5 x_L W_0 + EW[tok]` with `EW = 0.5 E W_0` computed
#   once per launch — so the first layer's matrix-vector product runs in the output stage, next
#   to the logits, and after the token is known the first layer is one table read.
#
# Every launch is checked against the eager torch reference before it is timed: identical
# tokens over the validation run, states within a tolerance scaled to their magnitude, and the
# stop token handled exactly. The kernels need a CUDA GPU: on a CPU machine this notebook shows
# the shipped H200 reference results (labelled by origin) and measures nothing.

# %% tags=["parameters"]
profile = "auto"  # auto: gpu with a CUDA device, else cpu; smoke: tiny sizes
interactive = True  # sliders and widgets (False under papermill: static figures)

# %%
from IPython.display import Markdown, display

from decodelab import plots
from decodelab.core import paths
from decodelab.core.device import has_cuda
from decodelab.core.results import has_table, load_table
from decodelab.persistent import analysis
from decodelab.persistent.bench import bench
from decodelab.persistent.notebook import NotebookParams
from decodelab.plots import persistent as persistent_plots

params = NotebookParams.from_cell(globals())
plots.use_style()


def stored(name):
    return load_table(name) if has_table(name) else None


# %% [markdown]
# ## Measurements
#
# With a CUDA GPU the sweeps run now (profile-sized; results go to `data/local/`): every variant
# on the seed's two named configs (ultra-light: H=64, L=4, V=256; h256: H=256), and the
# one-round designs over hidden sizes, layer counts and batches. In the same run the single-step
# graph replay and the best multi-step graph of phase 2 are measured on the same shapes, so the
# ratio is measured side by side; microbenchmarks time each kind of barrier. On the `gpu`
# profile the standalone check also runs under compute-sanitizer and Nsight Compute.

# %%
if has_cuda():
    written = bench(params.profile, paths.local_dir())
    display(Markdown(f"Measured on this machine: {', '.join(p.name for p in written)}."))
else:
    display(Markdown("No CUDA GPU here: the persistent kernels cannot run on this machine, so "
                     "the figures below use the stored results only."))

frame, stages, barriers = stored("persistent"), stored("persistent_stages"), stored("persistent_barriers")
ncu, sanitizer = stored("persistent_ncu"), stored("persistent_sanitizer")
if frame is None:
    display(Markdown("No stored results for table `persistent` yet (neither shipped reference "
                     "nor local): run `make bench-gpu` on a GPU machine to produce them."))

# %% [markdown]
# ## The named configs: every variant, the seed's numbers and the targets
#
# The seed study ran on one SM75 GPU (a T4-class part: fewer SMs, lower clocks, no thread-block
# clusters); the reference rows here are an H200. The table's last columns hold this project's
# targets: on ultra-light the seed's figure and a multiple of the single-step graph replay, on
# h256 a floor in steps/s.

# %%
if frame is not None:
    fig = persistent_plots.named_configs(frame)
    plots.save(fig, "03_named_configs")
    display(plots.show_table(analysis.seed_comparison(frame)))
    display(Markdown(analysis.findings(frame, stages, ncu)))

# %% [markdown]
# ## Where the cycles go, stage by stage
#
# The diagnostic build of the same kernel body stamps `clock64()` at each stage boundary: for
# each layer, the output projection (with this block's argmax) and the token (the row's argmax
# over the candidates, the token and stop bookkeeping), the **work** from the previous barrier
# to the last warp's arrival at the stage's barrier (its stores made visible), and the **wait**
# from there to the barrier's release. The embedding update is fused into the first layer's input
# (or, with the fold, into the output stage). The stamps cost cycles of their own: the
# diagnostic build's total is shown beside the plain build's in the model table below.

# %%
if stages is not None:
    for name in analysis.NAMED:
        table = analysis.stage_table(stages, name)
        if len(table):
            fig = persistent_plots.stage_breakdown(stages, name)
            plots.save(fig, f"03_stages_{name}")
            display(plots.show_table(table, caption=f"{name}: cycles per step by stage.",
                                     units=dict.fromkeys(table.columns, "cycles")))

# %% [markdown]
# ## What the SM waits on (Nsight Compute)
#
# Warp-state statistics of the candidate launches: per issued instruction, how many cycles a
# warp spends stalled, by reason. `short_scoreboard` is waiting on shared memory (and shuffles,
# special functions); `mio_throttle` is the shared-memory pipe being full; `barrier` is waiting at
# `__syncthreads` / `cluster.sync`. Shared-memory wavefronts per step count the shared-memory
# pipe's work: at most one wavefront per SM cycle, so they bound a step from below; bank
# conflicts are the wavefronts spent because several lanes hit one bank. (Both are summed over
# the SMs a launch uses.)

# %%
if ncu is not None:
    display(plots.show_table(analysis.stall_table(ncu)))

# %% [markdown]
# ## A latency model that explains the kernel
#
# The step is its stages: `model = sum(stage work) + (L + 1) x (the barrier's cost measured
# alone)`, in SM cycles, with the stage work from the diagnostic build above and the barrier from
# the microbenchmarks. Against it, the first model (barriers plus the FMAs at the SMs' peak
# rate), kept for contrast: the arithmetic is a small part of a step. A stage model far off the
# measurement says the barriers cost more inside the kernel than alone (skew across blocks),
# or that the stamps themselves moved the step.

# %%
if frame is not None:
    fig = persistent_plots.model_vs_measured(frame)
    plots.save(fig, "03_model_vs_measured")
    display(plots.show_table(analysis.model_check(frame)))
    display(Markdown(analysis.clock_summary(frame, barriers)))
if barriers is not None:
    fig = persistent_plots.barrier_costs(barriers)
    plots.save(fig, "03_barrier_costs")
    display(plots.show_table(barriers))

# %% [markdown]
# ## Correctness under the CUDA tools
#
# compute-sanitizer's memcheck (out-of-bounds and misaligned accesses) and racecheck (shared
# memory hazards between threads) over every variant of the standalone check, on the
# ultra-light, h256 and a tiny odd shape, with the check's own verdict on the tokens.

# %%
if sanitizer is not None:
    display(plots.show_table(sanitizer))

# %% [markdown]
# ## Across hidden sizes, and which shapes run
#
# Every hidden size that is a multiple of 4 up to 1024 runs in every design: a lane's chunk of
# inputs is padded to a multiple of 4 (the state is read as `float4`), so the lanes per column
# no longer have to divide the hidden size, and a row's columns split over any number of blocks
# (the last blocks' slices may be short). The limits that remain: the hidden size a multiple of
# 4 (those `float4` loads of the state and of E's rows) and at most 1024 (a lane holds at most 32
# inputs in registers and a column at most 32 lanes, one warp); a grid launch must fit on the
# GPU at once (cooperative launch); the fold needs its table (V x the block's columns) in shared
# memory; clusters need sm_90.

# %%
if frame is not None:
    fig = persistent_plots.steps_vs_hidden(frame)
    plots.save(fig, "03_steps_vs_hidden")
    timed = analysis.kernels(frame)
    host = timed["host_fraction"].median()
    display(Markdown(f"Host CPU time during a persistent run: median {host:.1%} of the run's "
                     "wall time (one launch per N steps: the host loop is gone)."))
