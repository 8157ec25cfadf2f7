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
# # 04b · The runtime loop: what serving costs on top of the forward pass
#
# Phase 4a (notebook `04_model`) built a Llama-shaped decoder over a paged KV cache, captured as
# one CUDA graph per batch bucket. This notebook drives it with a real serving loop, `decodelab.engine.Engine`:
#
# ```
# while requests remain:
#     plan   = scheduler.schedule(running, waiting, free_blocks)  # admit / decode / preempt
#     inputs = batch.prepare(rows)          # pinned mirrors -> static device buffers, no alloc
#     logits = graphs.run(inputs)           # the graph of the batch's bucket (or eager)
#     tokens = sample(logits, row_params)   # per-row parameters on the device, no sync
#     update(tokens)                        # last-token table on device; async copy to host
#     emit(previous step's tokens)          # stop checks once per step, stream, retire
# ```
#
# The host learns each token one step after it was sampled, so it never stalls the device to
# decide anything. Each technique can be switched off on its own (`EngineConfig`): CUDA graphs
# (`use_graphs`), deferred output processing (`async_output`), preallocated inputs
# (`static_inputs`). The bench `python -m decodelab bench runtime` measures the engine's
# steady decode step against the bare forward step of phase 4a, the sampler alone, the
# per-step breakdown, host overhead against batch size and a workload with Poisson arrivals;
# `python -m decodelab bench serve` measures it as a server (the serving chapters).

# %% tags=["parameters"]
profile = "auto"  # auto: gpu with a CUDA device, else cpu; smoke: tiny sizes
interactive = True  # sliders and widgets (False under papermill: static figures)
dtype = "auto"  # model dtype; auto: bfloat16 from sm_80, float16 below, float32 on the CPU
run_bench = True  # measure this machine (False: stored results only)

# %%
from IPython.display import Markdown, display

from decodelab import plots
from decodelab.engine import notebook as nb
from decodelab.engine import notebook_gpu
from decodelab.engine.notebook import NotebookParams
from decodelab.plots import runtime as figs
from decodelab.plots import serving, show_table

params = NotebookParams.from_cell(globals())
plots.use_style()

# %% [markdown]
# ## The engine at work, failures included
#
# A mixed batch on the tiny model: five requests with different sampling parameters, and three
# that fail in the ways a multi-tenant runtime has to contain: a streaming callback that
# raises, logits that turn non-finite (injected through the engine's `logits_hook`), and an
# abort from the client. Each ends with its own status and reason; the others finish as if
# alone. Malformed requests are rejected at admission with the field and its allowed range,
# before anything of them enters a batch. At the end every cache block is back in the pool.

# %%
outcomes, rejected, pool = nb.demo()
display(show_table(outcomes))
display(Markdown("Rejected at admission:\n\n" + "\n".join(f"- `{r}`" for r in rejected)))
display(Markdown(f"Cache blocks free at the end: **{pool['free']} of {pool['total']}**."))

# %% [markdown]
# ## Measure this machine
#
# On a CPU this runs the tiny model for real (seconds); on a GPU with the `gpu` profile, the
# Llama-3.2-1B shapes in `dtype` (auto: bf16 from sm_80, fp16 on a T4). Results go to
# `data/local/` and are shown next to the shipped H200 reference (`data/reference/h200/`), each
# labelled by origin. The bench's progress lines show while the cell runs; failures and skips
# it reports are listed below it.

# %%
written, problems = nb.run_local_bench(params)
tables = nb.load_tables()
if problems:
    display(Markdown("**The local run reported:**\n\n" + "\n".join(f"- {p}" for p in problems)))
display(Markdown(nb.summary(tables)))

# %% [markdown]
# ## Each technique on its own
#
# Wall time per steady decode step (one synchronisation per chunk of steps), every row of the
# batch decoding with its own temperature, top-k and top-p. `bare_forward` is the phase-4a
# step alone (graph replay with its input copies); `engine` adds scheduling, input
# preparation, sampling, the last-token update and streaming; the other bars switch one
# technique off. The label is the ratio to the bare forward step. On a CPU there is no device
# to overlap with: the "forward" and the sampler are host work too, so every phase adds up and
# the ratio says how much the loop costs when nothing hides it.

# %%
if "runtime" in tables:
    fig = figs.techniques(tables["runtime"])
    plots.save(fig, "runtime_techniques")
    display(Markdown(nb.technique_costs(tables["runtime"])))

# %% [markdown]
# ## The per-step breakdown
#
# Host time of each phase, step by step (stacked), with the wall time per step on top. In the
# `engine` run the phases are host time only: the device works on the previous step's graph
# while the host prepares the next one, and `forward` is just the time to issue the replay.
# With `sync_phases` the engine synchronises after every phase, so each band includes its
# device time: the forward pass dominates, as it should.

# %%
if "runtime_steps" in tables:
    fig = figs.step_breakdown(tables["runtime_steps"])
    plots.save(fig, "runtime_step_breakdown")
    display(show_table(nb.step_medians(tables["runtime_steps"]),
                       caption="Median µs per step of each phase; the sync wait (the host "
                               "blocked on the device) is part of emit and shown apart, so "
                               "the columns add up to the wall."))

# %% [markdown]
# ## Host overhead against batch size
#
# A decode step's host work grows with the number of rows (per-row bookkeeping, stop checks,
# streaming) while a graph replay costs the same at any batch. As long as the host's time per
# step stays below the device's, it is hidden: the engine step tracks the bare forward step.

# %%
if "runtime_batch" in tables:
    fig = figs.host_overhead_vs_batch(tables["runtime_batch"])
    plots.save(fig, "runtime_host_vs_batch")
    display(show_table(tables["runtime_batch"], {
        "origin": "source", "batch": "batch", "engine_wall_us": "engine step (µs)",
        "bare_wall_us": "bare forward (µs)", "ratio_to_bare": "engine / bare",
        "engine_host_us": "engine host time (µs)", "orchestration_us": "host outside forward (µs)"}))

# %% [markdown]
# ## The sampler
#
# The same mixed rows sampled from candidates found by partial selection (`torch.topk` with
# the batch's largest top-k rounded up to a power of two; for a large vocabulary in two stages:
# the chunks of 64 tokens with the largest maxima, then the best tokens inside them, while
# `partial_topk_direct` is one `topk` over the whole vocabulary) and by a full-vocabulary sort;
# the bench first checks that they sample the same tokens. Each variant is the engine's whole
# sample step (with its last-token scatter and packed output); `device_us` is its kernels back
# to back (captured and replayed, as the engine runs it), its share of the engine step is in
# the summary above.

# %%
if "runtime_sampler" in tables:
    fig = figs.sampler(tables["runtime_sampler"])
    plots.save(fig, "runtime_sampler")
    display(Markdown(nb.sampler_ratios(tables["runtime_sampler"])))

# %% [markdown]
# ### Every sampler setting, beside FlashInfer
#
# The grid bench (table `sampler_grid`, GPU only) times each row kind alone and the mix of
# all of them: the fused sampler, the plain-torch one, a full `torch.sort` with the same
# filters and FlashInfer's matching call where it is installed, on the same bf16 logits at
# every batch and vocabulary, each replayed in a CUDA graph. The table shows batch 128 over
# Llama-3's 128,256 tokens; `fused / best other` below 1 means the fused sampler is the
# fastest, and the line under each table names the settings where it is not. Top-p alone is
# its hardest setting: on flat logits the nucleus holds tens of thousands of tokens, and the
# threshold search narrows them to a few hundred candidates that it then sorts.

# %%
grids = notebook_gpu.load_tables()
if "sampler_grid" in grids:
    for origin, grid in grids["sampler_grid"].groupby("origin", sort=False):
        display(Markdown(f"**{plots.origin_label(origin)}**, batch 128, vocabulary 128,256 "
                         "(device µs per call):"))
        view = notebook_gpu.sampler_grid_view(grid, 128, 128256)
        display(show_table(view, units={**dict.fromkeys(view.columns[1:], "us"),
                                        "fused / best other": "ratio"}))
        display(Markdown(notebook_gpu.sampler_grid_losses(view)))
else:
    display(Markdown("No sampler grid is stored yet: `python -m decodelab bench runtime "
                     "--profile gpu` writes it on a GPU."))

# %% [markdown]
# ## A workload with Poisson arrivals
#
# Requests arrive at random (exponential gaps), with prompts and output lengths drawn from a
# range and mixed sampling parameters. Time to first token includes the wait for admission
# and the prefill; time per output token is the steady decode rate each request saw. Every
# tenth request fails in one of the three ways of the demo above, and two malformed requests
# are rejected: the counts by class are the engine's own error metrics.

# %%
if "runtime_requests" in tables:
    fig = figs.workload_latency(tables["runtime_requests"])
    plots.save(fig, "runtime_workload")
    req = tables["runtime_requests"]
    display(show_table(req.groupby(["origin", "status"])[["ttft_ms", "tpot_ms", "throughput_tok_s"]]
                       .median(), {"origin": "source", "status": "status",
                                   "ttft_ms": "time to first token (ms)",
                                   "tpot_ms": "time per output token (ms)",
                                   "throughput_tok_s": "throughput (tokens/s)"},
                       caption="Medians per status."))
if "runtime_errors" in tables:
    errors = tables["runtime_errors"].pivot_table(index=["kind", "name"], columns="origin",
                                                  values="count", aggfunc="sum")
    errors = errors.rename(columns=plots.origin_label)
    display(show_table(errors, caption="The engine's error counts by class and origin.",
                       units=dict.fromkeys(errors.columns, "count")))

# %% [markdown]
# ## Serving: the engine under the field's workloads
#
# `python -m decodelab bench serve` runs the engine as a server. **Offline**, nano-vllm's
# benchmark: 256 requests with prompt and output lengths uniform in [100, 1024] (the very
# numbers its `bench.py` draws with seed 0), temperature 0.6, `ignore_eos`, all submitted at
# once; and a second offline run of **long prompts** (2,048 to 8,192 tokens, outputs 128 to
# 512). **Online**, the same requests arriving as a Poisson process at fractions of the
# offline run's request rate, submitted by the bench's own loop at their arrival times
# (open loop: a slow engine does not slow the arrivals down). On a GPU this is Llama-3.2-1B in
# `dtype` with 256 rows and a KV cache sized from the free memory; on a CPU the tiny model on
# smaller workloads of the same shape. Each runs on engines one line of the bench's config
# apart: `engine` prefills whole prompts, `chunked` splits them into chunks that fill the
# step's token budget left by the decode rows (`EngineConfig.chunked_prefill`; 4,096 tokens on
# a GPU), `chunked_small` does the same under a small budget (512 tokens on a GPU: a step
# prefills at most that less its decode rows, the setting vLLM and Sarathi-Serve lower for
# inter-token latency, at the cost of time to first token and offline throughput), `paced` is
# `chunked` paced to that many prefill tokens a step while rows decode and the prompts still to
# prefill fit in one step's budget, the whole budget under a larger backlog
# (`EngineConfig.steady_prefill_tokens`, on by default), and on a GPU `invariant` is `chunked`
# on the batch-invariant model (its section below; not on the long
# prompts, whose prefill it would read a prompt's prefix once per 16 tokens for); every sweep
# runs at the same offered rates (fractions of the first one's offline rate). Every run is compared with **its own floor**: for each
# of its steps, the weights and K/V it read at the measured bandwidth, or its FLOPs at the
# measured matmul rate where those take longer, summed over the run's steps.

# %%
serve_written, serve_problems = nb.run_local_serve(params)
serve = nb.load_serve_tables()
if serve_problems:
    display(Markdown("**The local run reported:**\n\n" + "\n".join(f"- {p}" for p in serve_problems)))
display(Markdown(nb.serve_summary(serve)))

# %% [markdown]
# ### Offline throughput against the floor
#
# Output tokens per second of each offline run beside the throughput its steps would reach if
# each ran at its floor. The label is the run's busy time over its floor: what the engine and
# its kernels add above it, over all steps. The tail of an offline run lowers both bars: as
# requests finish the batch shrinks, and a step of a few rows still reads every weight; costs
# of a step that do not shrink with its rows (launches, the sampler, the host's work) weigh
# most there.

# %%
if "serve_offline" in serve:
    fig = serving.offline_vs_floor(serve["serve_offline"])
    plots.save(fig, "serve_offline_vs_floor")

# %% [markdown]
# ### Where a run's time went
#
# The offline run step by step: wall time per step (black) against that step's floor (grey),
# the step's own device time (green: two CUDA events around its launch) and the host's time
# issuing the step (indigo: plan, inputs, forward, sampler; runs measured before these columns
# were recorded lack them). Where the indigo line meets the black one, the step is bound by its
# host launch, not by the GPU. The host learns a step's tokens one step later, so the wall of a
# step that issues a large prefill is short and the step after it waits for that prefill: its
# wall holds the prefill's time, its device time does not. Per-step statistics of the tables
# (the median decode step, the steps over 3x their kind's median) use the device time.
# Steps that prefill (alone, or mixed with the decode rows of that step) are marked. In the
# `engine` run a step that admits new prompts runs their whole prefill, and the decode rows of
# that step wait for it: the tall steps while the offline run admits its requests and, online,
# wherever requests arrive (the inter-token latency's tail). With `chunked` no step computes
# more than its token budget, so a long prompt spreads over several steps of bounded length.
# On a GPU the bench gives the engine prefill graphs (`model.prefill_graphs`): a step's prefill
# replays the CUDA graph of its token bucket, so a step that prefills a few hundred tokens costs
# the GPU's time for them. Issued eagerly, its hundred and more kernel launches hold the host
# longer than the GPU computes, and such a step shows its indigo line at its black one. The
# summary above says, for each run, which way its prefill ran.

# %%
if "serve_steps" in serve:
    fig = serving.step_walls(serve["serve_steps"])
    plots.save(fig, "serve_step_walls")

# %% [markdown]
# ### Offered load against capacity
#
# An engine serves at most some rate of requests, its capacity: at a full batch, so many
# tokens per step and so many steps per second. While the **offered** rate of arrivals stays
# below it, requests rarely wait: time to first token is one prefill plus the wait for the
# next step, and the **achieved** rate equals the offered one (the diagonal on the left). As
# the offered rate approaches capacity, arrivals bunch up and wait behind each other (the
# wait grows like 1 / (1 − offered / capacity)); once it passes capacity a queue builds for
# as long as requests keep arriving: the achieved rate flattens at capacity and time to first
# token grows with the length of the run, no longer with the work of one request. The dashed
# line is the TTFT limit; the summary above names the first rate whose TTFT p99 passes it.
# The offline request rate is not the capacity: it includes the offline run's tail with few
# rows left, so the sweep goes past it (up to 2x on a GPU). Inter-token latency grows with
# the load too: more rows per step, and more prefills interrupting the decode steps. Its p99
# over the run's median decode-only step says how far the tail stands from a bare step; the
# steps over 3x the median of their kind are its causes (a cold shape, a collection), and
# `jit_compiles` counts the Triton kernels compiled during the run (after the warm-up, each is a
# cold shape: a compile of up to a second at one step). Under the 4,096-token budget a step
# that admits a prompt of a few hundred tokens prefills all of it: the decode rows of that step
# wait for it, and that sets the ITL p99; `chunked_small` bounds that step's prefill instead,
# and pays for it in time to first token once a backlog forms, where `paced` takes the whole
# budget again: compare their TTFT p99 at the highest rates.

# %%
if "serve_online" in serve:
    fig = serving.online_latency(serve["serve_online"])
    plots.save(fig, "serve_online_latency")
    display(show_table(serve["serve_online"], {
        "origin": "source", "variant": "engine", "rate_fraction": "x offline rate",
        "offered_rate": "offered (req/s)", "request_rate": "achieved (req/s)",
        "output_tok_s": "output tok/s", "ttft_p50_ms": "TTFT p50 (ms)",
        "ttft_p99_ms": "TTFT p99 (ms)", "tpot_p50_ms": "TPOT p50 (ms)",
        "itl_p99_ms": "ITL p99 (ms)", "itl_p99_x_decode": "ITL p99 / decode step",
        "steps_over_3x": "steps > 3x their median", "jit_compiles": "Triton compiles",
        "ratio_to_floor": "busy / floor"}))

# %% [markdown]
# ## What is guaranteed about determinism
#
# A request with a fixed `seed` draws its randomness from a counter-based hash of
# (seed, index of the token in its output), computed on the host with the step's inputs: no
# generator state is shared between requests, so which other requests share the batch, how
# they are ordered, and whether the request was preempted and recomputed do not change its
# random numbers. Greedy rows are an exact argmax. The sampler's filters are prefix masks of
# one cumulative sum whose prefix values do not depend on how many candidates follow, so a
# row's draw does not depend on the batch either. **Guaranteed**: identical tokens for
# identical logits — tested with the tiny model on CPU in fp32, where the forward pass is
# row-independent, alone and in different batch mixes, with and without preemption.
# **Not guaranteed on a GPU by default**: the forward pass itself is not batch-invariant
# there (a different batch bucket runs other matrix-multiply tiles, and recompute after
# preemption runs prefill instead of decode kernels), so logits can differ in the last bits
# and a near tie can then pick another token.
#
# ### The batch-invariant switch
#
# `PagedLlama(..., batch_invariant=True)` with `EngineConfig(batch_invariant=True)` runs every
# reduction in one order whatever the batch: one matmul kernel for every row count (no cuBLAS,
# no split K; its tile grows with the rows, each tile walking K in the same order), attention in fixed 256-position splits merged in order,
# prefill and decode attention in one kernel, so a request's tokens depend on its prompt,
# parameters and seed alone. Its checks (table `batch_invariance`): a probe's logits alone and
# at a random row of batches of 1 to 256, in every graph bucket, from one prefill, two chunks
# and a decode step; 64 requests of 256 tokens served alone and together with preemption. Its
# cost (table `batch_invariance_cost`): the decode step's graph replay and one prompt's
# prefill, invariant against default kernels. The serving chapter above has its cost end to
# end (the `invariant` variant).

# %%
display(Markdown(notebook_gpu.invariance_summary(grids)))

# %% [markdown]
# The matmul's tile may follow the rows only because no tile changes a row's bits. Table
# `batch_invariance_tiles` is the evidence: every candidate tile on each weight, a sample of
# rows of a large batch compared bit for bit with those rows computed alone, and each tile
# timed against cuBLAS at each row count. Below, per weight and row count, the tile the rule
# picks against the fastest tile whose rows were the same bits, and against cuBLAS (the
# default kernels' matmul, which is what the switch gives up).

# %%
if "batch_invariance_tiles" in grids:
    for origin, sweep in grids["batch_invariance_tiles"].groupby("origin", sort=False):
        display(Markdown(f"**{plots.origin_label(origin)}** (device µs per call):"))
        view = notebook_gpu.tile_rule_view(sweep)
        display(show_table(view, units={**{c: "us" for c in view.columns if "µs" in c},
                                        "picked / fastest": "ratio",
                                        "picked / cuBLAS": "ratio"}))
else:
    display(Markdown("No tile sweep is stored yet: `python -m decodelab bench tiles` writes it "
                     "on a GPU."))

# %% [markdown]
# ## Problems this engine handles (the runtime page's table)
#
# | problem | what the engine does | where it shows |
# |---|---|---|
# | host overhead dominating | graph per bucket, preallocated inputs | techniques figure |
# | latency spikes from allocation | static buffers, pinned mirrors, reusable events | `no_static_inputs` bar |
# | device stalls between steps | tokens processed one step late; one wait per step | `sync_wait` in the breakdown |
# | wrong output for some requests | per-row parameters in device tensors; mixed-batch statistical test | `tests/test_sampling.py` |
# | memory leak from failed requests | one retire path frees blocks on every exit | demo: pool full at the end |
# | nondeterministic output | per-request counter-based randomness | the statement above |
# | sampling dominates | partial selection instead of a full sort | sampler figure |
