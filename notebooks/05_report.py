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
# loop, a real-shaped transformer eager and graph-captured) one decode step is split into
#
#     T_step = T_dispatch + T_replay + T_node + T_orchestration + T_compute
#
# computed from the shipped H200 result tables, and the dominant layer of each regime is the
# largest term: computed, not typed. The seed study's regime table and headline numbers are then
# checked against ours.

# %% tags=["parameters"]
profile = "auto"  # auto: gpu with a CUDA device, else cpu; smoke: tiny sizes
interactive = True  # sliders and widgets (False under papermill: static figures)
reference = "h200"  # the reference results decomposed
toy_config = "ultra-light"  # toy configuration of the toy regimes
model_batch = 1  # batch of the transformer-decode regimes
runtime_batch = 32  # batch of the runtime-loop regime
context = 512  # tokens of context of the transformer-decode regimes

# %%
from dataclasses import replace

import pandas as pd
from IPython.display import Markdown, display

from decodelab import notebooks, plots
from decodelab.analysis.decompose import decompose, regime_markdown, regime_table, terms_frame
from decodelab.analysis.layers import fmt_us, load_tables
from decodelab.analysis.notebook import NotebookParams
from decodelab.analysis.seed_table import AGREE_FACTOR, seed_table
from decodelab.core import paths
from decodelab.core.seed import SEED_SOURCE
from decodelab.plots.report import decomposition_figure, empty_figure
from decodelab.toy.step import NAMED_CONFIGS, named

params = NotebookParams.from_cell(globals())
plots.use_style()
tables = load_tables(params.origin)
regimes, missing = decompose(tables, params.headline)
terms = terms_frame(regimes)
table = regime_table(regimes)

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
    "steady-decode run)."))
origin_name = plots.origin_label(params.origin)
if missing:
    display(Markdown("**Not in the decomposition yet** (the report fills in as the phases' "
                     "tables arrive):\n\n" + "\n".join(f"- {m}" for m in missing)))
display(Markdown(f"Source: {origin_name}; {len(regimes)} of "
                 f"{len(regimes) + len(missing)} regimes have data."))

# %% [markdown]
# ## The decomposition across regimes
#
# Left: each regime's step split into layers, as shares of the step. Right: the step itself on a
# log scale, coloured by its dominant layer. Removing one layer does not make a step free: it
# shows the next one. With the default parameters the figure and the regime table below are
# also written to `figures/headline_decomposition.png` and `figures/headline_regimes.md`, the
# README's copies.

# %%
if regimes:
    fig = decomposition_figure(terms, table, f"One decode step, layer by layer: {origin_name}")
    if params.is_headline:  # the README's copies come from the default configuration only
        plots.save(fig, "headline_decomposition")
        (paths.figures_dir() / "headline_regimes.md").write_text(
            regime_markdown(table, params.origin))
else:
    fig = empty_figure(f"No decomposition yet: no phase tables from {origin_name}.")

# %% [markdown]
# In JupyterLab (`interactive=True`), choose the toy config the toy regimes are read at; the
# report shows the static figures of this section instead.

# %%
if params.interactive:
    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    def _explore(config: str) -> None:
        picked = decompose(tables, replace(params.headline, toy_config=config))[0]
        if picked:
            decomposition_figure(terms_frame(picked), regime_table(picked), config)
            plt.show()
        else:
            display(Markdown(f"No data yet for the {config} toy config."))

    widgets.interact(_explore, config=list(NAMED_CONFIGS))

# %% [markdown]
# The same toy regimes with more arithmetic per step (the h256 toy config, where the seed saw
# compute take over), when the phases measured it:

# %%
TOY_REGIMES = ("eager", "graph", "multi-step graph", "persistent kernel")
alt_config = "h256" if params.toy_config != "h256" else "ultra-light"
alt = [r for r in decompose(tables, replace(params.headline, toy_config=alt_config))[0]
       if r.name in TOY_REGIMES]
if alt:
    decomposition_figure(terms_frame(alt), regime_table(alt),
                         f"Toy step {alt_config}: {origin_name}")
else:
    display(Markdown(f"No data yet for the {alt_config} toy config."))

# %% [markdown]
# ## The regime table, computed
#
# The dominant layer is the largest term of each regime, and the runner-up shows what an
# optimisation of the dominant one would reveal next. `check` flags a remainder that came out
# negative: its sources (different runs or measurement windows) then over-explain the step.

# %%
def _regime_view(frame: pd.DataFrame) -> pd.DataFrame:
    view = frame[["regime", "config", "step_us", "dominant", "dominant_share", "runner_up",
                  "runner_up_share", "check"]].copy()
    view["step_us"] = view["step_us"].map(fmt_us)
    for col in ("dominant_share", "runner_up_share"):
        view[col] = view[col].map(lambda v: f"{v:.0%}" if pd.notna(v) else "")
    return view.rename(columns={"config": "measured at", "step_us": "µs per step",
                                "dominant_share": "share",
                                "runner_up": "next layer", "runner_up_share": "its share"}
                       ).set_index("regime")


display(_regime_view(table) if not table.empty else Markdown("No regime has data yet."))

# %% [markdown]
# Every term, with the rows it comes from and how it is derived:

# %%
if not terms.empty:
    with pd.option_context("display.max_colwidth", None):
        display(terms.assign(**{c: terms[c].map(fmt_us) for c in ("us", "low", "high")},
                             share=terms["share"].map("{:.1%}".format)
                             ).set_index(["regime", "layer"]))

# %% [markdown]
# ## The seed study's claims against our measurements
#
# The seed study ran on one SM75 (Turing) GPU; ours is the H200 reference. Its numbers are
# quotations (one constant, `decodelab.core.seed.SEED_CLAIMS`); ours are computed from the
# tables above. The rule for "agrees?" is stated in the table and below.

# %%
seeds = seed_table(tables, regimes, params.headline)
display(Markdown(f"Seed: {SEED_SOURCE}. A number agrees when ours is within a factor of "
                 f"{AGREE_FACTOR:g} of the seed's; a regime row agrees when our computed "
                 "dominant layer is one the seed names."))
with pd.option_context("display.max_colwidth", None):
    display(seeds.set_index("claim"))

# %% [markdown]
# ## What the data says


# %%
def _term(regime, layer: str) -> float:
    return next((t.us for t in regime.terms if t.layer == layer), 0.0)


def _transitions(by_name: dict) -> list[str]:
    """What removing each layer revealed, read off consecutive regimes."""
    lines = []
    if "eager" in by_name and "graph" in by_name:
        e, g = by_name["eager"], by_name["graph"]
        replay = _term(g, "replay")
        lines.append(f"- A graph removes dispatch: the step goes from {fmt_us(e.step_us)} µs to "
                     f"{fmt_us(g.step_us)} µs ({e.step_us / g.step_us:.1f}x). What remains is "
                     f"{fmt_us(replay)} µs of replay ({replay / g.step_us:.0%}) next to "
                     f"{fmt_us(_term(g, 'compute'))} µs of kernel time: {g.dominant.layer} "
                     "dominates the single-step graph.")
    if "graph" in by_name and "persistent kernel" in by_name:
        g, p = by_name["graph"], by_name["persistent kernel"]
        lines.append(f"- A persistent kernel removes replay and the kernel boundaries: its step "
                     f"is {g.step_us / p.step_us:.1f}x shorter than the single-step graph's, "
                     f"and {p.dominant.layer} is {p.dominant.us / p.step_us:.0%} of it.")
    if "runtime loop" in by_name:
        rt = by_name["runtime loop"]
        orch = _term(rt, "orchestration")
        lines.append(f"- The runtime loop ({rt.config}) adds {fmt_us(orch)} µs of orchestration "
                     f"to the forward pass, {orch / rt.step_us:.0%} of its step.")
    return lines


def _summary() -> str:
    by_name = {r.name: r for r in regimes}
    lines = []
    for r in regimes:
        top = r.dominant
        lines.append(f"- **{r.name}** ({r.config}): {fmt_us(r.step_us)} µs per step; "
                     f"{top.layer} dominates with {top.us / r.step_us:.0%} ({fmt_us(top.us)} µs).")
    lines += _transitions(by_name)
    agreed = seeds[seeds["agrees?"] != "n/a"]
    if not agreed.empty:
        yes = int((agreed["agrees?"] == "yes").sum())
        lines.append(f"- Of the seed's {len(agreed)} claims we could check, {yes} agree by the "
                     f"rule above and {len(agreed) - yes} do not: "
                     + "; ".join(f"{c} ({w})" for c, w in
                                 agreed.loc[agreed["agrees?"] == "no", ["claim", "rule applied"]]
                                 .itertuples(index=False)) + ".")
    return "\n".join(lines) if lines else "No regime has data yet."


display(Markdown(_summary()))

# %% [markdown]
# ## Where each layer is measured

# %%
SECTIONS = {"00_environment": "the ceilings (launch latency, copy bandwidth, matmul rate)",
            "01_dispatch": "dispatch: eager vs graph vs torch.compile",
            "02_replay": "replay and node costs, multi-step capture and its fit",
            "03_persistent": "the persistent kernel and its barrier costs",
            "04_runtime": "the paged transformer and the runtime loop",
            "06_multi_gpu": "across GPUs: tensor parallelism and T_comm, the communication "
                            "layer (two-GPU reference)"}
display(Markdown("\n".join(f"- [{name}](#{name}): {SECTIONS.get(name, '')}"
                           for name in notebooks.available() if name != "05_report")))
