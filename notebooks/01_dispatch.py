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
# # 01 · Dispatch: how much of a decode step is the host issuing kernels?
#
# One toy decode step (L layers of `x = tanh(x W + b)`, an output projection, a greedy token
# and a token-dependent state update, see `decodelab.toy.step`) runs in four dispatch modes through
# one switch, `decodelab.dispatch.make_step`:
#
# - `eager`: plain PyTorch, one kernel launch per operation;
# - `cuda_graph`: the step captured once as a CUDA graph over static buffers, one replay per step;
# - `compile`: `torch.compile` default (Inductor fuses the elementwise work, no graphs);
# - `compile_graphs`: `torch.compile(mode="reduce-overhead")` (fusion plus CUDA graphs).
#
# Every mode is first checked against eager over 100 chained steps and again after re-seeding
# the state (exact tokens, states within a tolerance scaled to their magnitude); only then is it
# timed. Per step we report **wall** time (host clock, one sync per sample), **host CPU** time of
# the issuing thread, **device-busy** time (the union of kernel and copy intervals the profiler
# records) and **kernels per step**; the GPU **idle fraction** is 1 − device-busy / wall.

# %% tags=["parameters"]
profile = "auto"  # auto: gpu with a CUDA device, else cpu; smoke: tiny sizes
interactive = True  # sliders and widgets (False under papermill: static figures)
measure_live = True  # measure this machine (without CUDA: eager on the CPU backend)

# %%
from IPython.display import Markdown, display

from decodelab import plots
from decodelab.core.interact import interact
from decodelab.dispatch import SEED_CPU_REDUCTION, crossovers, graph_ratios, nearest_point
from decodelab.dispatch import notebook as nb
from decodelab.dispatch.analysis import sweep_base
from decodelab.dispatch.notebook import NotebookParams
from decodelab.plots import dispatch as figs
from decodelab.plots import origin_label, show_table

params = NotebookParams.from_cell(globals())
plots.use_style()

# %% [markdown]
# ## Measure on this machine
#
# The `gpu` profile (it needs CUDA) measures every mode; `cpu` and `smoke` measure the CPU, where
# only `eager` is real (CUDA graphs need a GPU), so the CPU backend's per-operator host cost is
# measured instead. A progress bar counts the points (each is timed, then profiled). Results go
# to `data/local/dispatch.csv` and are merged below with the shipped H200 reference.

# %%
failures = nb.measure_and_store(params.profile) if params.measure_live else []
if failures:
    display(Markdown("**Points that failed validation or measurement:**\n\n"
                     + "\n".join(f"- {f}" for f in failures)))
table = nb.load()
gpu, cpu = nb.by_backend(table)
gpu_origins = nb.origins(gpu)
if table.empty:
    display(Markdown("No dispatch results yet: run with `measure_live=True`, or "
                     "`python -m decodelab bench dispatch` on a GPU."))
else:
    display(show_table(nb.sources(table), caption="Rows of table `dispatch` per source."))
if not gpu_origins:
    display(Markdown("**No GPU results are available here** (no shipped reference and no "
                     "CUDA device): the GPU sections below are skipped; the CPU measurement "
                     "further down is real."))
else:
    display(Markdown("GPU results below come from: "
                     + ", ".join(origin_label(o) for o in gpu_origins) + "."))

# %% [markdown]
# ## Where the time of one step goes, per mode
#
# For each named config, the left bar of each mode is the GPU's view of a step: green is
# device-busy time, grey is the rest of the wall time, when the GPU sat idle waiting for work.
# The indigo bar beside it is the host CPU time spent issuing the step. A host-bound step has an
# indigo bar as tall as the wall time and a mostly grey GPU bar; a device-bound step is mostly
# green. These colours mean the same quantities in every figure of the report.

# %%
for origin in gpu_origins:
    fig = figs.stacked_bars(gpu[gpu["origin"] == origin])
    plots.save(fig, f"dispatch_stacked_{nb.slug(origin)}")

# %%
if gpu_origins:
    display(show_table(gpu[gpu["config"] != "sweep"], [
        "origin", "config", "mode", "wall_us_per_step", "host_us_per_step",
        "device_us_per_step", "kernels_per_step", "launches_per_step", "idle_fraction",
        "setup_s"]))

# %% [markdown]
# `kernels per step` counts device kernels executed per step; `launches per step` counts the
# host's launch calls (a graph replay is one launch however many kernels it holds). `capture /
# compile` is the one-time setup cost, kept apart from the steady state.
#
# ## The host-bound → device-bound crossover
#
# The sweep varies one factor at a time (hidden size H, layers L, batch B) around a base
# config (printed below). A step is host-bound while the host needs longer to issue it than the
# GPU is busy running it. Indigo lines: host CPU per step; green lines: device-busy per step;
# solid: eager, dashed: CUDA graph. Grey vertical lines mark the crossover, interpolated on the
# log axis.

# %%
marks = crossovers(gpu) if gpu_origins else None
for origin in gpu_origins:
    base = sweep_base(gpu[gpu["origin"] == origin])
    display(Markdown(f"{origin_label(origin)}: sweep base H={base['hidden']}, "
                     f"L={base['layers']}, B={base['batch']}."))
    fig = figs.crossover_figure(gpu[gpu["origin"] == origin],
                                marks[marks["origin"] == origin])
    plots.save(fig, f"dispatch_crossover_{nb.slug(origin)}")
if marks is not None and not marks.empty:
    display(show_table(marks, caption="Crossover: the axis value where device-busy time "
                                      "first exceeds host CPU time per step."))

# %% [markdown]
# ## Eager / graph: host CPU and wall time, against the seed's figure
#
# The layered study this project follows reported how many times a CUDA graph cut host CPU time
# per step on one SM75 GPU (its figure, a quotation kept in `decodelab.core.seed`, is the dashed
# line and is repeated under the figure). The ratio depends on how many launches a step makes,
# on the host's per-launch cost (CPU and driver speed) and on what the graph replay itself costs;
# the wall ratio additionally shrinks as soon as the GPU's own work dominates.

# %%
ratios = graph_ratios(gpu) if gpu_origins else None
if ratios is not None and not ratios.empty:
    fig = figs.ratio_figure(ratios, SEED_CPU_REDUCTION)
    plots.save(fig, "dispatch_graph_ratios")
    display(show_table(ratios))
    display(Markdown(nb.ratio_lines(ratios, SEED_CPU_REDUCTION)))

# %% [markdown]
# Why ours differs from the seed: eager issues one launch per operation (about 2L + 5 for this
# step) and pays the PyTorch dispatcher, the caching allocator and the driver for each; a replay
# is one launch whose host cost barely depends on the step's size. So the host-CPU ratio grows
# with the number of kernels per step and with the per-launch cost of the host at hand, and is
# bounded by the fixed cost of a replay call. The wall ratio only follows it while the step is
# host-bound: past the crossover both modes wait for the same kernels.
#
# ## On this CPU: the eager per-operator host cost
#
# Without a GPU the host *is* the device, so there is no idle time to recover: what remains
# measurable is how much a step costs per ATen operator call. These rows come from this machine;
# the figure draws the wall clock as an outline (there is no device-busy time to split it).

# %%
if not cpu.empty:
    display(show_table(nb.per_op(cpu), {
        "origin": "source", "config": "config", "hidden": "H", "layers": "L", "batch": "B",
        "wall_us_per_step": "wall (µs/step)", "host_us_per_step": "host CPU (µs/step)",
        "kernels_per_step": "ops per step", "us_per_op": "host per op (µs)"}))
    fig = figs.stacked_bars(cpu[cpu["config"] != "sweep"])
    plots.save(fig, "dispatch_cpu_backend")
else:
    display(Markdown("No CPU-backend rows: run with `measure_live=True` on a CPU."))

# %% [markdown]
# ## Explorer
#
# Pick H, L and B: the nearest measured configuration (in log distance) is shown for every mode,
# in the colours above. Under a batch run (`interactive=False`) or without ipywidgets, the
# sweep's base configuration is shown as a static figure, unless a named config above already
# shows it.

# %%
rows, first = nb.explorer_rows(gpu, cpu)
if first is None:
    display(Markdown("Nothing to explore yet."))
else:
    try:
        import ipywidgets as widgets
    except ImportError:
        widgets = None
    if params.interactive and widgets is not None:
        def choice(name):
            return widgets.SelectionSlider(options=sorted(rows[name].unique()),
                                           value=first[name], description=name)

        def show(hidden, layers, batch):
            nb.show_point(rows, hidden, layers, batch, figs.point_figure)

        interact(show, hidden=choice("hidden"), layers=choice("layers"), batch=choice("batch"))
    elif (named := nb.shown_as(rows, first)) is not None:
        display(Markdown(f"The sweep's base (H={first['hidden']}, L={first['layers']}, "
                         f"B={first['batch']}) is the `{named}` config shown above; the "
                         "explorer is interactive in JupyterLab."))
    else:
        fig = figs.point_figure(nearest_point(rows, first["hidden"], first["layers"],
                                              first["batch"]))
        plots.save(fig, "dispatch_point")
