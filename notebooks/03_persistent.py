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
# stops on the device when a row emits the stop token. Three variants of the kernel
# (`kernels/persistent.cu`) differ only in how the blocks working on one row exchange the state
# between stages:
#
# - **block**: one thread block per row, `__syncthreads` between stages, weights in registers or
#   shared memory when they fit;
# - **grid**: several blocks per row under a cooperative launch, `grid.sync()` between stages,
#   weight slices in each block's shared memory, the state through L2;
# - **cluster** (Hopper, sm_90): the blocks of a row form a thread-block cluster, each writes its
#   slice of the state straight into every peer's shared memory, `cluster.sync()` between stages.
#
# Each has a second version (`block_v2`, `grid_v2`, `cluster_v2`, `kernels/persistent_v2.cuh`)
# with the same state exchange and a different work split inside a stage: the first version
# gives every output column a fixed number of lanes set by H alone, so a stage with many
# columns runs several rounds, each ending in a chain of shuffles; the second picks the lanes per
# column for each stage so that the columns fit in one round. The first versions stay as the
# proven baseline; a second version that fails validation is recorded as such and not timed.
#
# Every variant is checked against the eager torch reference before it is timed: identical
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
from decodelab.persistent.analysis import clock_summary, seed_comparison
from decodelab.persistent.bench import bench
from decodelab.persistent.notebook import NotebookParams
from decodelab.plots import persistent as persistent_plots

params = NotebookParams.from_cell(globals())
plots.use_style()

# %% [markdown]
# ## Measurements
#
# With a CUDA GPU the sweeps run now (profile-sized; results go to `data/local/`): hidden sizes
# at L=4, B=1; layer counts; a few larger batches. In the same run the single-step graph replay
# and the best multi-step graph of phase 2 are measured on the same shapes, so the ratio is
# measured side by side, and microbenchmarks time each kind of barrier.

# %%
if has_cuda():
    written = bench(params.profile, paths.local_dir())
    display(Markdown(f"Measured on this machine: {', '.join(p.name for p in written)}."))
else:
    display(Markdown("No CUDA GPU here: the persistent kernels cannot run on this machine, so "
                     "the figures below use the stored results only."))

frame = load_table("persistent") if has_table("persistent") else None
barriers = load_table("persistent_barriers") if has_table("persistent_barriers") else None
if frame is None:
    display(Markdown("No stored results for table `persistent` yet (neither shipped reference "
                     "nor local): run `make bench-gpu` on a GPU machine to produce them."))

# %% [markdown]
# ## Steps per second against hidden size
#
# Solid lines are the persistent variants, dashed lines the phase-2 graph replays on the same
# shapes. At small H the step is a handful of tiny matrix-vector products: the graph pays its
# replay and kernel boundaries on every step, the persistent kernel pays only its barriers.

# %%
if frame is not None:
    fig = persistent_plots.steps_vs_hidden(frame)
    plots.save(fig, "03_steps_vs_hidden")

# %% [markdown]
# ## The seed's numbers, ours, and the targets
#
# The seed study ran on one SM75 GPU (a T4-class part: fewer SMs, lower clocks, less shared
# memory per block, no thread-block clusters); the reference rows here are an H200. The
# comparison says how far the same idea goes on other hardware; it is not a like-for-like
# kernel comparison, since the seed's kernel (and its exact toy step) is not reproduced here.

# %%
if frame is not None:
    table = seed_comparison(frame)
    display(table)
    for row in table.itertuples():
        verdict = "meets" if row.meets_target else "does not meet"
        display(Markdown(
            f"**{row.config}** ({plots.origin_label(row.origin)}): {row.best_variant} runs "
            f"{row.steps_per_s:,.0f} steps/s, {row.x_graph_k1:.1f}× the single-step graph "
            f"replay, against the seed's {row.seed_steps_per_s:,.0f} — it {verdict} the target."))

# %% [markdown]
# ## A latency model of one step
#
# With the host loop gone, a step is a chain of stages (L layers and the output projection with
# its argmax), each ended by a barrier. The model is `stages × measured barrier cost +
# arithmetic at the peak FMA rate of the SMs in use`, counted in SM cycles: every kernel reads
# its own clock (`clock64` and the global nanosecond timer, by one thread around the step loop),
# so the measured side is cycles per step and the barriers are in cycles too. Comparing cycles
# keeps the question "is the SM clock low?" apart from "is the step long?"; the clock the SMs
# actually ran at is printed below. Points above the diagonal are slower than the model: the
# rest is latency the model leaves out (shared-memory loads, shuffles, `tanh`).

# %%
if frame is not None:
    fig = persistent_plots.model_vs_measured(frame)
    plots.save(fig, "03_model_vs_measured")
    display(Markdown(clock_summary(frame, barriers)))
if barriers is not None:
    fig = persistent_plots.barrier_costs(barriers)
    plots.save(fig, "03_barrier_costs")
    display(barriers)

# %% [markdown]
# ## The regime shift: replay gone, compute left
#
# For each hidden size, the fastest variant's step split into barrier time, arithmetic and the
# rest, next to the single-step graph replay. Where the graph line sits far above the bars, the
# replay boundary was the cost; as H grows the bars reach the graph line and the arithmetic
# (and the on-chip latency around it) is what remains.

# %%
if frame is not None:
    fig = persistent_plots.regime_shift(frame)
    plots.save(fig, "03_regime_shift")
    kernels = persistent_plots.timed(frame)
    host = kernels["host_fraction"].median()
    display(Markdown(f"Host CPU time during a persistent run: median {host:.1%} of the run's "
                     "wall time (one launch per N steps: the host loop is gone)."))
