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
# # 04a · The real-shaped model: memory bandwidth sets the floor
#
# Phases 1-3 used a toy step of a few tiny kernels, where launching them is the whole cost.
# A real decoder step is different: every step must read every weight of the model (and the
# K/V cache of every sequence) from device memory, so the step cannot be shorter than
#
#     T_floor = bytes that must move / measured read ceiling     (the roofline)
#
# (the read ceiling: a reduction's bytes read per second, notebook 00; the copy bandwidth,
# which counts a read and a write of every byte, stands in where no read ceiling was measured,
# and then a read-only kernel can beat the floor)
#
# `decodelab.model` is a Llama-family decoder (grouped-query attention, Llama-3 rotary
# scaling, tied embedding) over a paged KV cache (`block_table: [seq, logical_block] ->
# physical block`), with Triton kernels on a GPU (split-K paged attention, a batch-1 gemv
# whose tile is chosen per weight shape, fused norm + residual, fused rotary + cache write)
# and the whole step captured as one CUDA graph per batch bucket. Before anything is timed
# the bench checks the Triton attention against the reference, the graph against eager
# (token for token) and our logits against `transformers` on the same weights.
#
# This notebook reads table `paged_model` (step time per mode, batch and context, with the
# bytes each step must move and the copy bandwidth measured in the same run),
# `paged_model_kernels` (one profiled graph step, kernel by kernel), `paged_model_linear` and
# `paged_model_gemm` (the candidates for each matmul shape, at one row and at each captured
# batch of 2 to 64 rows, and which one the model uses). The layered model
# (notebook 05) uses it for its two transformer-decode regimes.

# %% tags=["parameters"]
profile = "auto"  # auto: gpu with a CUDA device, else cpu; smoke: tiny sizes
interactive = True  # sliders and widgets (False under papermill: static figures)
dtype = "auto"  # model dtype; auto: bfloat16 from sm_80, float16 below, float32 on the CPU
run_bench = True  # measure this machine (GPU: Llama-3.2-1B shapes, sized to its memory; CPU: the tiny model)
batch = 1  # batch the prose reads the step at
context = 512  # tokens of context the prose reads the step at

# %%
from IPython.display import Markdown, display

from decodelab import plots
from decodelab.model import analysis, floors
from decodelab.model import notebook as nb
from decodelab.model.attention_view import attention_view
from decodelab.model.notebook import NotebookParams
from decodelab.plots import model as figs
from decodelab.plots import show_table

params = NotebookParams.from_cell(globals())
plots.use_style()

# %% [markdown]
# ## Measure this machine
#
# On a GPU with the `gpu` profile: the Llama-3.2-1B shapes (random weights) in `dtype` (auto:
# bf16 from sm_80, fp16 on a T4), batches 1-128 at two contexts, plus the kernel profile; a
# GPU with less memory than that needs runs fewer batches or contexts, said in one line. On a CPU: the tiny model in fp32, eager only
# (CUDA graphs need a GPU); its numbers say what the CPU backend costs per op, not what HBM
# allows. Results go to `data/local/` and appear next to the shipped H200 reference.

# %%
written = nb.run_local_bench(params)
tables = nb.load_tables()
# floors at each origin's read ceiling (or a kernel's faster read), or its run's copy bandwidth
# standing in (said below)
pm = (floors.with_ceiling(tables["paged_model"], tables.get("environment"), tables)
      if "paged_model" in tables else None)
display(Markdown(f"Local run: profile `{params.profile}`, "
                 + (f"wrote {', '.join(f'`{p.name}`' for p in written)}." if written
                    else "skipped.")))
if pm is None:
    display(Markdown("No paged-model results are stored yet: run `make bench-gpu` on a CUDA "
                     "machine, or this notebook with `run_bench=True`."))

# %% [markdown]
# ## Step time against batch and context, and % of roofline
#
# Left: ms per decode step (every sequence gets one new token) against batch, graph (teal) and
# eager (wine), one line style per context; the grey line of the same style is the memory floor,
# the bytes the step must move (weights, `batch` embedding rows, the K/V attended) at the read
# ceiling (a decode step's bytes are reads; where no read ceiling was measured, the copy
# bandwidth of the same run stands in, which a read-only kernel can beat: the line under the
# table says which). Right: the floor as a share of the measured step, the
# **% of roofline**. Eager pays the host's dispatch on top of the graph's step. As batch and
# context grow, the K/V read grows with them while the weights are read once; the prose below
# says, from the rows, how far above its floor each step sits.

# %%
if pm is not None:
    view = analysis.step_view(pm)
    plots.save(figs.step_vs_batch(view), "model_step_vs_batch")
    display(Markdown(nb.step_prose(pm, params.batch, params.context) + "\n\n"
                     + "\n".join(f"- {line}." for line in floors.ceiling_lines(pm))))
    display(show_table(view, {
        "origin": "source", "mode": "mode", "batch": "batch", "context": "context",
        "ms_per_step": "step (ms)", "floor_ms": "memory floor (ms)",
        "above_floor_ms": "above the floor (ms)", "roofline_fraction": "of roofline",
        "achieved_gb_s": "achieved (GB/s)", "tokens_per_s": "tokens/s"}))

# %% [markdown]
# ## Tokens per second against `transformers`
#
# The peer is `LlamaForCausalLM.generate` (greedy) on the same weights, with its default
# dynamic cache and with its static cache (its compilation left off: compiling alone would take
# longer than the whole bench), timed decode-only: (time of N new tokens − time of one) /
# (N − 1). Both run at their best in the same process as ours. It is the peer a user of
# `transformers` gets by default, not the strongest one: that is `torch.compile` over a static
# cache, in the next section, and the report's summary leads with it.

# %%
if pm is not None:
    vs = analysis.vs_transformers(pm)
    if not vs.empty:
        plots.save(figs.tokens_vs_transformers(vs), "model_vs_transformers")
        display(show_table(vs, {
            "origin": "source", "model": "model", "batch": "batch", "context": "context",
            **{m: f"{m} (tokens/s)" for m in ("eager", "graph", "hf_dynamic", "hf_static")
               if m in vs.columns}, "best_peer": "faster peer", "speedup": "ours / peer"}))
    display(Markdown(nb.peers_prose(vs)))

# %% [markdown]
# ## Against `torch.compile`
#
# The peer a PyTorch user gets without us: the same model and weights over a static
# contiguous cache, `torch.compile(mode="max-autotune", fullgraph=True)` (autotuned GEMMs,
# fused element-wise kernels, a CUDA graph), checked against our step before it is timed. Its
# compilation is a one-time cost reported apart; max-autotune spends minutes per batch size, so
# the bench times it at the points its configuration names.

# %%
if pm is not None:
    compiled = analysis.vs_compiled(pm)
    if not compiled.empty:
        display(show_table(compiled, {
            "origin": "source", "model": "model", "batch": "batch", "context": "context",
            "ms_per_step": "ours, graph (ms)", "compile_static_ms": "compile_static (ms)",
            "speedup": "compile_static / ours", "compile_s": "its compilation (s)"}))
    display(Markdown(nb.compiled_prose(compiled, nb.table_edits("paged_model"))))

# %% [markdown]
# ## The kernel-boundary layer
#
# Inside a graph, each kernel waits for the one before to finish: the last thread blocks of
# one drain while most SMs idle, then the next launches and starts its loads from nothing.
# With programmatic dependent launch (sm_90+) each Triton kernel becomes resident while its
# predecessor drains, waits only where it reads that predecessor's output, and the matmuls
# stream their first weight tile before that wait. The bench times the same kernels both
# ways (`graph_no_pdl` and `graph`): the difference is the boundary cost PDL removes. Steps of
# more than 32 tokens launch serially (a few long kernels fill them, and there PDL cost time):
# where a table timed such a step twice, the difference is the spread between two runs.

# %%
if pm is not None:
    effect = analysis.boundary_effect(pm)
    if not effect.empty:
        display(show_table(effect, {
            "origin": "source", "model": "model", "batch": "batch", "context": "context",
            "graph_no_pdl_ms": "without PDL (ms)", "ms_per_step": "with PDL (ms)",
            "pdl": "PDL used", "saved_us": "saved (µs)", "roofline_before": "of roofline, without",
            "roofline_after": "of roofline, with"}))
    display(Markdown(nb.boundary_prose(effect)))

# %% [markdown]
# ## Where the step's time goes, kernel by kernel
#
# One graph step at batch 1, profiled (GPU only), launched without PDL so that no kernel's
# time includes waiting for another. For the kernels whose traffic the model's
# shapes determine, the bytes per step and the rate reached: the matmuls read their weights
# (plus the batch's input and output rows), attention reads the K/V of the context. Which
# matmul runs where comes from `paged_model_linear`: per weight shape, the fastest of cuBLAS
# and the Triton gemv tiles, timed in the bench (at batch 2 to 64, `paged_model_gemm`: cuBLAS
# against Triton "skinny" tiles that read each weight once for all rows). The small kernels
# (norms, rotary, merges) move kilobytes and are bound by their latency: no rate is claimed
# for them. Last, each batch-1 matmul against its floor, the time its weight needs at the
# ceiling: what the matmuls' starts, tails and slower streaming add to the step.

# %%
kernels = tables.get("paged_model_kernels")
if kernels is not None and pm is not None:
    profile = analysis.kernel_profile(kernels, tables.get("paged_model_linear"), pm)
    plots.save(figs.kernel_profile(profile), "model_kernels")
    display(Markdown(nb.kernel_prose(profile)))
    display(show_table(profile, {
        "origin": "source", "name": "kernel", "role": "role", "calls_per_step": "calls per step",
        "us_per_step": "µs per step", "share": "share of the step",
        "bytes_per_step": "bytes per step", "tb_s": "TB/s", "of_ceiling": "of the ceiling",
        "ceiling": "ceiling"}))
else:
    display(Markdown("No kernel profile stored (it is measured on a GPU only)."))
linear = tables.get("paged_model_linear")
if linear is not None:
    display(show_table(analysis.linear_choices(linear), {
        "origin": "source", "n": "n (out)", "k": "k (in)", "swiglu": "SwiGLU fused",
        "candidate": "chosen", "us": "µs", "weight_gb_s": "weights (GB/s)",
        "cublas_us": "cuBLAS (µs)", "vs_cublas": "cuBLAS / chosen"},
        caption="Each batch-1 matmul shape: the fastest candidate, which the model uses."))
    if pm is not None:
        headroom = analysis.matmul_headroom(linear, pm)
        display(Markdown(nb.headroom_prose(headroom, profile if kernels is not None else None)))
        display(show_table(headroom, {
            "origin": "source", "weight": "weight", "n": "n (out)", "k": "k (in)",
            "calls_per_step": "calls per step", "candidate": "kernel", "us": "µs per call",
            "floor_us": "floor per call (µs)", "above_us": "above the floor, per step (µs)"},
            caption="Each batch-1 matmul against its weight's floor (bytes at the ceiling "
                    "named above)."))
gemm = tables.get("paged_model_gemm")
if gemm is not None:
    display(show_table(analysis.linear_choices(gemm), {
        "origin": "source", "n": "n (out)", "k": "k (in)", "swiglu": "SwiGLU fused",
        "rows": "rows (batch)", "candidate": "chosen", "us": "µs",
        "weight_gb_s": "weights (GB/s)", "cublas_us": "cuBLAS (µs)",
        "vs_cublas": "cuBLAS / chosen"},
        caption="Each matmul shape at each captured batch of 2 to 64 rows: cuBLAS against the "
                "Triton skinny tiles, the fastest kept (table paged_model_gemm)."))

# %% [markdown]
# ## Attention at long context
#
# Between the shortest and the longest measured context at one batch, the step reads the same
# weights and more K/V: the extra device time divided into the extra bytes is the rate at
# which attention streams the cache, read off the real step (not a microbenchmark).

# %%
if pm is not None:
    marginal = analysis.attention_marginal(pm)
    if not marginal.empty:
        plots.save(figs.attention_bandwidth(marginal), "model_attention_bandwidth")
        display(show_table(marginal, {
            "origin": "source", "batch": "batch", "context_short": "context from",
            "context_long": "context to", "extra_kv_bytes": "extra K/V bytes",
            "extra_ms": "extra device time (ms)", "kv_tb_s": "K/V read (TB/s)",
            "of_ceiling": "of the ceiling", "ceiling": "ceiling",
            "kv_share_long": "K/V share of bytes, long"}))
    display(Markdown(nb.attention_prose(marginal)))

# %% [markdown]
# ### Attention alone, beside its peers
#
# The same kernel timed on its own, one layer's K/V per call, at two spreads of context. With
# every row at the context, SDPA on a contiguous copy of the K/V shows what reading through a
# block table costs. With the contexts of a serving batch (each row anywhere from 1 to twice the
# context), the longest rows decide when a step's attention ends: the column without the split
# cap shows what sharing them out in capped splits gains, the column in batch order what
# starting the longest rows first gains (once a batch fills the GPU without splits, the model
# sorts its rows once a step, longest first), and FlashInfer's paged decode, planned on the
# host for the batch's actual lengths, is the serving peer. The last column is ours over the
# fastest peer on that line: below 1, ours is ahead.

# %%
if "paged_attention" in tables:
    display(show_table(attention_view(tables["paged_attention"]), {
        "origin": "source", "batch": "batch", "context": "context", "lens": "contexts",
        "paged_us": "ours (µs)", "paged_uncapped_us": "ours, no split cap (µs)",
        "paged_batch_order_us": "ours, rows in batch order (µs)",
        "flashinfer_us": "FlashInfer (µs)", "sdpa_contiguous_us": "SDPA, contiguous (µs)",
        "paged_vs_best_peer": "ours ÷ fastest peer"},
        caption="Decode attention alone, µs per layer (table paged_attention, where each "
                "row's K/V bandwidth and the SDPA backend or FlashInfer kernel that ran are "
                "listed). \"uniform\": every row at the context, where SDPA reads a contiguous "
                "copy of the same K/V; \"mixed\": a serving batch's contexts, each row's drawn "
                "from 1 to twice the context, beside the same kernel without its split cap "
                "and with its rows in batch order. "
                "FlashInfer's paged decode reads our pool where it was installed."))

# %% [markdown]
# ## What a graph costs to have
#
# Capturing one graph per batch bucket is a one-time cost, paid before the first step, and
# the graphs keep their memory pool: both are reported apart from the steady state.

# %%
if pm is not None:
    capture = analysis.capture_cost(pm)
    display(Markdown(nb.capture_prose(capture)))
