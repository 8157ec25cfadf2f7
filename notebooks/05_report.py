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
# # 05 · The layered model: where one decode step's time goes
#
# Every phase measured one layer of the decode stack. Here the measurements are put together:
# for each regime (eager, single-step graph, multi-step graph, persistent kernel, the runtime
# loop, a real-shaped transformer eager and graph-captured, the same transformer split over two
# GPUs) one decode step is split into
#
#     T_step = T_dispatch + T_replay + T_node + T_orchestration + T_compute  (+ T_comm)
#
# computed from the shipped H200 result tables, and the dominant layer of each regime is the
# largest term: computed, not typed. The seed study's regime table and headline numbers are then
# checked against ours.

# %% tags=["parameters"]
profile = "auto"  # auto: gpu with a CUDA device, else cpu; smoke: tiny sizes
interactive = True  # sliders and widgets (False under papermill: static figures)
reference = "h200"  # the results decomposed: a reference folder, or local (this machine's)
toy_config = "ultra-light"  # toy configuration of the toy regimes
model_batch = 1  # batch of the transformer-decode regimes
runtime_batch = 32  # batch of the runtime-loop regime
context = 512  # tokens of context of the transformer-decode regimes

# %%
from IPython.display import Markdown, display

from decodelab import notebooks, plots
from decodelab.analysis import compute_view as cv
from decodelab.analysis import notebook as nb
from decodelab.analysis.compute_floor import ceiling_note, copy_stands_in
from decodelab.analysis.compute_split import split_compute
from decodelab.analysis.conclusions import conclusions
from decodelab.analysis.decompose import regime_markdown
from decodelab.analysis.findings import findings
from decodelab.analysis.load import LOAD_LABELS, load_table, load_text, loads
from decodelab.analysis.notebook import NotebookParams
from decodelab.analysis.regimes import serial_transformer_us
from decodelab.analysis.seed_table import AGREE_FACTOR, seed_table
from decodelab.core import paths
from decodelab.core.results import stored_tables
from decodelab.core.seed import SEED_SOURCE
from decodelab.plots import origin_label, show_table
from decodelab.plots.report import decomposition_figure, empty_figure
from decodelab.toy.step import NAMED_CONFIGS, named

params = NotebookParams.from_cell(globals())
plots.use_style()
ours = nb.load(params)
tables, regimes, missing, terms, table = (ours.tables, ours.regimes, ours.missing, ours.terms,
                                          ours.table)
origin_name = origin_label(params.origin)
seeds = seed_table(tables, regimes, params.headline)

# %% [markdown] tags=["report-summary"]
# ## Summary
#
# Where one decode step's time goes, regime by regime: each technique removes one layer and the
# next one shows. Left: each regime's step split into layers (shares of the step); right: the
# step itself on a log scale, coloured by its dominant layer. The table below it is the same
# decomposition in numbers (the dominant layer is the largest term, computed, never typed), and
# the findings after it are computed from the same tables, each with its number and the rows
# it comes from. Definitions: "How each term is measured", in chapter 05.
#
# Each layer is named for what it is. The device time of a step's kernels (the seed study's
# "Compute") is split, wherever the tables allow, into the **floor** the work needs at the
# measured ceilings and what sits above it: for the toy step the **kernel fixed cost** (what
# each of its kernels costs with no work in it) and its **latency chains** (each stage waiting
# on the one before); for the transformer the **matmuls above their weights' floor**, the
# **small kernels** (norms, rotary, copies: their whole time), **attention above its K/V
# floor** and the **gaps or overlap** between kernels; for the tensor-parallel step, which has
# no kernel profile, the floor and what sits **above it, not split**; for the runtime loop,
# whose table gives no floor, its **forward pass**. The word "compute" appears only where a
# regime could not be split, and in the seed's own claims, where it is quoted as the seed's
# word (the seed table says what it covers).

# %% tags=["report-summary"]
if regimes:
    fig = decomposition_figure(terms, table, f"One decode step, layer by layer: {origin_name}")
    if params.is_headline:  # the README's copies come from the default configuration only
        plots.save(fig, "headline_decomposition")
        (paths.figures_dir() / "headline_regimes.md").write_text(
            regime_markdown(table, params.origin))
else:
    fig = empty_figure(f"No decomposition yet: no phase tables from {origin_name}.")

# %% tags=["report-summary"]
if not table.empty:
    display(show_table(nb.regime_view(table), nb.REGIME_LABELS,
                       caption=f"Computed from {origin_name} (the tensor-parallel row from "
                               "its two-GPU folder)."))
found = findings(tables, regimes, params.headline)
display(Markdown(f"**Findings** ({len(found)} computed from the tables):\n\n" + "\n".join(
    f"{i}. {f.text} **{f.number}** (from `{f.source}`)" for i, f in enumerate(found, 1))
    if found else "No finding can be computed yet: no phase tables."))

# %% [markdown] tags=["report-summary"]
# ### The kernels' device time, split
#
# The measured device time of each regime's kernels ("compute" in the regime builders, the
# seed's word) and the parts the regime table ranks in its place: its **floor** (the larger of
# the bytes the step must move at the measured bandwidth and its FLOPs at the measured matmul
# rate), the toy step's **kernel fixed cost** and **latency chains**, the transformer's
# **matmuls above their weights' floor**, **small kernels** (norm, rotary, copy, embedding:
# their whole time), **attention above its floor**, and the **remainder** (the last column
# says what it holds). The rows and derivation of every part are listed under "Every term",
# below.

# %% tags=["report-summary"]
splits, split_notes = split_compute(tables, regimes, params.headline)
if splits:
    display(show_table(cv.split_table(splits), cv.SPLIT_LABELS, caption=(
        f"Computed from {origin_name}." + (" Not split: " + "; ".join(split_notes) + "."
                                           if split_notes else ""))))
serial_us = serial_transformer_us(tables, params.headline)
verdict = cv.transformer_verdict(splits, regimes, serial_us, copy_stands_in(tables))
display(Markdown("\n\n".join(filter(None, [ceiling_note(tables), cv.toy_lines(splits),
                                             verdict]))))

# %% [markdown]
# ## How each term is measured
#
# One configuration per regime, so that the rows are comparable (the headline choice below).
# All times are µs per decode step; "GPU-busy" is the union of kernel intervals recorded by the
# profiler in phase 1. A term marked *remainder* is the measured step minus the terms measured
# directly, so the terms always add up to the measured step.
#
# | regime | step measured by | terms |
# |---|---|---|
# | eager | phase 1, wall per step | compute = GPU-busy; dispatch = wall − GPU-busy (the GPU waits while the host issues kernels) |
# | graph (one step per replay) | phase 1, wall per step | compute = GPU-busy; node = fitted per-step time with replay amortised away (phase 2, K→∞) − GPU-busy; replay = remainder |
# | multi-step graph (largest K) | phase 2, wall per step | replay = fitted replay cost / K; compute = GPU-busy; node = remainder |
# | persistent kernel (fastest kernel variant) | phase 3, µs per step | node = barriers per step × measured latency of that variant's barrier; compute = remainder |
# | runtime loop | phase 4b, engine wall per step | orchestration = engine step − bare graph-captured forward (same run, same batch); compute = that forward (its replay is split out in the transformer row) |
# | transformer decode, eager | phase 4a, eager wall per step | compute = device span of the same step graph-captured; dispatch = remainder |
# | transformer decode (graph) | phase 4a, wall per step | compute = summed kernel time (profiler); node = device span (CUDA events) − summed kernel time; replay = wall − device span (graph launch, input copies) |
# | tensor parallel (graph, largest TP size) | phase 5, TP=n wall per step, two-GPU reference | comm = step − the same step with its collectives replaced by local stand-ins; replay = wall − device span; compute = remainder |
#
# "compute" in this table is the measured device time of the step's kernels; the regime table
# ranks its parts in its place (toy: floor + kernel fixed cost + latency chains; transformer:
# floor + matmul above floor + small kernels + attention above floor + gaps or overlap; tensor
# parallel: floor + above floor, not split; runtime loop: the forward pass, not split), each
# derived under "The kernels' device time, split" and listed with its rows under "Every term".
#
# Uncertainty: the interquartile range of the step where a term is a remainder, the 95%
# confidence interval where a term is fitted; the profiler's GPU-busy time is one window and
# carries none.

# %%
toy = named(params.toy_config)
display(Markdown(
    f"**Headline configuration.** Toy regimes: `{params.toy_config}` (H={toy.hidden}, "
    f"L={toy.layers}, B={toy.batch}, V={toy.vocab}, {toy.dtype})"
    + (", the seed study's own headline regime" if params.toy_config == "ultra-light" else "")
    + ", a config phases 1-3 all measure. Model regimes: Llama-3.2-1B shapes, the bare "
    f"transformer decode at batch {params.model_batch} and context {params.context} (latency), "
    f"the runtime loop at batch {params.runtime_batch} (serving, at the context of phase 4b's "
    "steady-decode run), the tensor-parallel step at the transformer's batch and context."))
if missing:
    display(Markdown("**Not in the decomposition yet** (the report fills in as the phases' "
                     "tables arrive):\n\n" + "\n".join(f"- {m}" for m in missing)))
display(Markdown(f"Source: {origin_name}; {len(regimes)} of "
                 f"{len(regimes) + len(missing)} regimes have data."))

# %% [markdown]
# ## Your GPU against ours
#
# When this machine measured any regime on a GPU (`make bench-gpu` writes `data/local/`), its
# own decomposition is computed the same way and set beside the reference's: the same layers,
# another device. A CPU-only machine has no GPU regime to compare; its CPU runs are in the
# phase chapters.

# %%
yours = nb.local_gpu(params)
if yours is None:
    display(Markdown("This machine has no GPU results in `data/local/`: only the reference is "
                     "decomposed."))
else:
    decomposition_figure(yours.terms, yours.table, "One decode step, layer by layer: this machine")
    display(show_table(nb.side_by_side(table, yours.table, origin_name, "this machine"),
                       units=nb.side_by_side_units(origin_name, "this machine")))

# %% [markdown]
# In JupyterLab (`interactive=True`), choose the toy config the toy regimes are read at; the
# report shows the static figures of this section instead.

# %%
if params.interactive:
    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    def _explore(config: str) -> None:
        view = nb.explore_view(tables, params, config)
        if view is None:
            display(Markdown(f"No data yet for the {config} toy config."))
        else:
            decomposition_figure(*view, config)
            plt.show()

    widgets.interact(_explore, config=list(NAMED_CONFIGS))

# %% [markdown]
# The same toy regimes with more arithmetic per step (the h256 toy config, where the seed saw
# compute take over), when the phases measured it:

# %%
alt_config = "h256" if params.toy_config != "h256" else "ultra-light"
alt_view = nb.explore_view(tables, params, alt_config, toy_only=True)
if alt_view is None:
    display(Markdown(f"No data yet for the {alt_config} toy config."))
else:
    decomposition_figure(*alt_view, alt_config)

# %% [markdown]
# ## The Poisson workload: offered load against capacity
#
# Chapter 04b runs a Poisson workload on each machine: its time to first token is seconds on
# the H200 and milliseconds on a CPU's tiny model, although an H200 decode step is a
# millisecond. The latencies measure how far the offer exceeds what the engine serves at that
# mix of prompts and outputs, per origin (requests / the workload's wall time):

# %%
workloads = stored_tables(["runtime_requests", "runtime"])
if "runtime_requests" in workloads:
    display(show_table(load_table(workloads), LOAD_LABELS))
    display(Markdown("\n".join(f"- **{origin_label(o)}**: {load_text(x)}"
                                for o, x in loads(workloads).items())))
else:
    display(Markdown("No workload was run yet (chapter 04b's bench writes `runtime_requests`)."))

# %% [markdown]
# ## Every term
#
# The dominant layer is the largest term of each regime, and the runner-up shows what an
# optimisation of the dominant one would reveal next. A `check` other than "ok" flags a
# remainder that came out negative: its sources (different runs or measurement windows) then
# over-explain the step. Every term, with the rows it comes from and how it is derived, then
# every part of the compute split:

# %%
if not terms.empty:
    display(show_table(terms, nb.TERM_LABELS))
if splits:
    display(show_table(cv.parts_frame(splits), cv.PART_LABELS,
                       caption="The compute split: every part, its rows and its derivation."))

# %% [markdown]
# ## The seed study's claims against our measurements
#
# The seed study ran on one SM75 (Turing) GPU; ours is the H200 reference. Its numbers are
# quotations (one constant, `decodelab.core.seed.SEED_CLAIMS`); ours are computed from the
# tables above. The rule for "agrees?" is stated in the table and below.

# %%
display(Markdown(f"Seed: {SEED_SOURCE}. A number agrees when ours is within a factor of "
                 f"{AGREE_FACTOR:g} of the seed's; a regime row agrees when our computed "
                 "dominant layer is one the seed names."))
display(show_table(seeds))

# %% [markdown]
# ## What the data says

# %%
moves = nb.transitions(regimes, tables, params.headline)
display(Markdown("\n".join([*nb.regime_lines(regimes), *moves, f"- {nb.seed_tally(seeds)}"])
                 if regimes else "No regime has data yet."))

# %% [markdown]
# ## Where each layer is measured

# %%
SECTIONS = {"00_environment": "the ceilings (launch latency, read ceiling and copy bandwidth, "
                              "matmul rate)",
            "01_dispatch": "dispatch: eager vs graph vs torch.compile",
            "02_replay": "replay and node costs, multi-step capture and its fit",
            "03_persistent": "the persistent kernel and its barrier costs",
            "04_model": "the real-shaped model: step time against the HBM roofline, the kernels",
            "04_runtime": "the runtime loop: orchestration on top of the forward pass",
            "06_multi_gpu": "across GPUs: tensor parallelism and T_comm, the communication "
                            "layer (two-GPU reference)"}
display(Markdown("\n".join(f"- [{name}](#{name}): {SECTIONS.get(name, '')}"
                           for name in notebooks.available() if name != "05_report")))

# %% [markdown] tags=["report-conclusions"]
# ## Conclusions
#
# Read off the seed table and the regime table above, by the stated rule; then what the last
# regimes say comes next.

# %% tags=["report-conclusions"]
display(Markdown("\n\n".join(conclusions(regimes, seeds, tables, params.headline))
                 or "No conclusion yet: no regime has data."))
