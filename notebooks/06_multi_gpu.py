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
# # 06 · Tensor parallelism: the communication layer
#
# When one GPU's memory bandwidth is not enough, the decode step is split across GPUs. With
# tensor parallelism (`decodelab.parallel`) each of n ranks holds 1/n of every layer: its own
# query and KV heads (so each rank caches only its KV heads), 1/n of the MLP's columns, and
# 1/n of the vocabulary. The price is communication inside every layer:
#
#     T_step(TP=n) = T_compute / ~n  +  T_comm
#     T_comm = (2 L + 1) all-reduces of (B, d)  +  1 all-gather of (B, V / n)
#
# two all-reduces per layer (after the attention output projection and after the MLP's down
# projection, whose partial sums live on different ranks), one for the vocabulary-split
# embedding, and the gather of the logits. Every collective is NCCL through `torch.distributed`,
# one process per GPU, NVLink multicast off; the decode step, collectives included, is
# captured as one CUDA graph per batch bucket.
#
# The measurements (`make bench-gpu-tp`, which runs `python -m decodelab bench tp` under
# `torchrun`) time, for the Llama-3.2-1B and Llama-3.1-8B shapes (bf16 on H200s, random weights,
# 512 tokens of context per sequence): the step at TP=1 and TP=2, eager and graph; the TP=2
# step with its collectives replaced by local stand-ins of the same shape (what is left is
# compute); the same collectives alone; and an all-reduce sweep over message sizes.
# Before anything is timed, TP=2's logits are checked against TP=1's on the same weights.

# %% tags=["parameters"]
profile = "auto"  # auto: gpu with a CUDA device, else cpu; smoke: tiny sizes
interactive = True  # sliders and widgets (False under papermill: static figures)
dtype = "auto"  # model dtype; auto: bfloat16 from sm_80, float16 below, float32 on the CPU
run_bench = True  # run the two-rank bench here (False: stored results only)

# %%
from IPython.display import Markdown, display

from decodelab import plots
from decodelab.analysis.layers import HEADLINE_REFERENCE, Headline, load_tables
from decodelab.analysis.tp_regime import one_gpu_note
from decodelab.core import paths
from decodelab.parallel import analysis
from decodelab.parallel import notebook as nb
from decodelab.parallel.notebook import NotebookParams
from decodelab.plots import parallel as figs
from decodelab.plots import show_table

params = NotebookParams.from_cell(globals())
HEADLINE_ORIGIN = "reference/h200x2"
plots.use_style()

# %% [markdown]
# ## Measure this machine
#
# The notebook starts its own ranks. On a machine with two or more GPUs and the `gpu` profile
# that is the full bench over NCCL. Elsewhere two CPU processes run the tiny model over gloo:
# the same sharding, the same collectives and the same check that TP=2's logits equal TP=1's,
# but the timings then say what gloo over local sockets costs, not what NVLink does. The
# shipped reference (`data/reference/h200x2/`) comes from two H200s in one host.

# %%
bench_profile, backend = nb.local_plan(params.profile)
written = nb.run_local_bench(params)
tables, cpu_runs = nb.split_timed(nb.load_tables())
display(Markdown(
    f"Local run: profile `{bench_profile}`, backend `{backend}`"
    + (f", wrote {', '.join(f'`{p.name}`' for p in written)}." if written else ", skipped.")))
if "tp" in cpu_runs:
    display(Markdown(
        "**What the CPU run establishes** (this machine, gloo):\n\n"
        + nb.local_check_prose(cpu_runs["tp"])
        + "\n\nIts timings are left out of every figure and table below: two processes "
        "exchanging tensors over loopback sockets on a CPU measure the socket path and two "
        "processes sharing a few cores, so a speed-up or a T_comm computed from them (one can "
        "even come out negative, when the local stand-in costs more than the collective) says "
        "nothing about a GPU interconnect. They stay in `data/local/` for inspection."))

# %% [markdown]
# ## Decode time against batch size
#
# Milliseconds per decode step (every sequence gets one new token) at TP=1 and TP=2. A step
# at small batch is bound by reading the weights: splitting them over two GPUs halves that
# read, but adds the collectives, whose cost barely depends on the batch. So TP pays off
# where the halved weight read is worth more than the communication: at once for a model
# whose weights take milliseconds to read, only at larger batches for a small one. Graph mode
# is drawn in teal, eager in wine; TP=1 solid, TP=2 dashed. Eager is host-bound either way,
# and the eager collectives make TP=2 slower still; its figures also move far more from run to
# run than the graph's (the host path of a shared machine is noisy), so read eager crossovers
# as rough.

# %%
if "tp" in tables:
    tp = tables["tp"]
    plots.save(figs.decode_vs_batch(tp), "tp_decode_vs_batch")
    display(Markdown("**Where TP=2 starts to pay off** (the smallest batch from which it is "
                     "faster at every larger measured batch, by more than the run-to-run spread "
                     "of two reference runs):\n\n" + nb.crossover_prose(tp)))
else:
    display(Markdown("No tensor-parallel table from GPUs yet: run `make bench-gpu-tp` on a "
                     "multi-GPU machine."))

# %% [markdown]
# ## The step, decomposed: T_comm
#
# Each TP=2 bar is split in two: the step with every collective replaced by a local stand-in
# of the same shape (compute: kernels on half the weights) and what the collectives add
# (T_comm = step − step without them). The black tick is the same collectives run alone,
# back to back, from a graph: where the tick sits above the orange band, part of the
# communication's time was already hidden in the step (the next kernel's launch, the
# stand-in's own copy); where below, the collectives cost more inside the step than alone.

# %%
if "tp" in tables:
    plots.save(figs.step_decomposition(tp, "graph"), "tp_decomposition")
    if HEADLINE_ORIGIN in set(tp["origin"]):  # the README's table, from the shipped reference
        headline = analysis.headline_table(tp, HEADLINE_ORIGIN)
        (paths.figures_dir() / "headline_tp.md").write_text(headline + "\n")
        display(Markdown(f"Graph mode, {plots.origin_label(HEADLINE_ORIGIN)}:\n\n{headline}"))
        # TP=1 here is this run's own step; chapter 04a's one-GPU step is another run's
        display(Markdown(one_gpu_note(load_tables(f"reference/{HEADLINE_REFERENCE}"),
                                      Headline())))
    dec = analysis.decomposition(tp)
    display(show_table(dec[dec["tp"] > 1], {
        "origin": "source", "model": "model", "mode": "mode", "batch": "batch", "tp": "TP",
        "ms_per_step": "step (ms)", "compute_ms": "compute (ms)", "comm_ms": "T_comm (ms)",
        "comm_alone_ms": "collectives alone (ms)", "comm_share": "T_comm share"}))

# %% [markdown]
# ## What a CUDA graph does to the collectives
#
# An eager `torch.distributed.all_reduce` goes through the process group's host path for
# every call: a work object, events, stream ordering, the watchdog's bookkeeping. Captured in
# a graph, only the NCCL kernel stays. Left: latency per all-reduce against message size,
# wall (solid) and host time (dotted); right: bus bandwidth, the rate each NVLink direction
# carries (nccl-tests' convention: algorithm bandwidth × 2(n−1)/n). Small messages, the
# decode case (a (B, d) bf16 hidden state is 4 KiB at batch 1 of the 1B shapes), are bound
# by a fixed latency; large ones by the links.

# %%
if "tp_collectives" in tables:
    coll = tables["tp_collectives"]
    plots.save(figs.all_reduce_sweep(coll), "tp_all_reduce_sweep")
    display(Markdown(nb.collectives_prose(coll)))
    saving = analysis.graph_saving(coll)
    display(show_table(saving[saving["nbytes"] <= 1 << 20], {
        "origin": "source", "nbytes": "message (bytes)", "us_per_op_eager": "eager (µs)",
        "us_per_op_graph": "graph (µs)", "host_us_per_op_eager": "eager host (µs)",
        "host_us_per_op_graph": "graph host (µs)", "saved_us": "saved by the graph (µs)",
        "ratio": "eager / graph"}))
if "tp" in tables:
    per = analysis.per_collective_us(tp)
    display(show_table(per.groupby(["origin", "model", "mode"])[["in_step_us", "alone_us"]]
                       .median(), {"origin": "source", "model": "model", "mode": "mode",
                                   "in_step_us": "in the step (µs)", "alone_us": "alone (µs)"},
                       caption="Per collective inside the decode step (T_comm / collectives "
                               "per step) and alone, median over batches."))

# %% [markdown]
# ## Inside the step: one collective, host and device
#
# `torch.profiler` on every rank over a few TP=2 steps at batch 1 (after all timings, since the
# profiler's hooks slow later launches): the process group's host call (`c10d::…`, eager only:
# a graph replay makes no such call) and NCCL's kernel, whose device time includes waiting for
# the peer rank to arrive. A collective that costs more in the step than alone, with a long
# kernel, is waiting for the other rank; with a long host call, it is the host path itself.

# %%
if "tp_profile" in tables:
    display(Markdown(nb.profile_prose(tables["tp_profile"], tables.get("tp"))))
    display(show_table(analysis.collective_ops(tables["tp_profile"])))

# %% [markdown]
# ## Explore
#
# The decomposition in eager mode: the same split, with the host path of every collective
# inside the step.

# %%
try:
    import ipywidgets as widgets
except ImportError:  # the report runs without widgets
    widgets = None
if "tp" in tables:
    modes = sorted(tables["tp"]["mode"].unique())
    if params.interactive and widgets is not None:
        widgets.interact(lambda mode: display(figs.step_decomposition(tp, mode)), mode=modes)
    elif "eager" in modes:
        plots.save(figs.step_decomposition(tp, "eager"), "tp_decomposition_eager")
