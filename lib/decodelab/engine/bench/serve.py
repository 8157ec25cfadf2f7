"""``python -m decodelab bench serve``: the engine as a server, under the field's workloads.

Workloads (:mod:`.serve_workload`, seeded, defined exactly there): ``offline``, nano-vllm's
benchmark (256 requests, prompt and output lengths uniform in [100, 1024], temperature 0.6,
``ignore_eos``, all submitted at once); ``long_prompts`` (prompts 2,048-8,192, outputs
128-512); ``online``, workload ``offline``'s requests arriving as a Poisson process at
fractions of the offline run's request rate, up to and past saturation, open-loop (the bench's
loop submits each request at its arrival time between engine steps: :mod:`.serve_run`). The
cpu and smoke profiles run the tiny model on smaller workloads of the same shape.

Tables (rows: :mod:`.serve_rows`): ``serve_offline`` (one row per variant and offline
workload: throughput, latency percentiles, the decode and prefill graphs' capture time and
memory, the warm-up, how prefill ran), ``serve_online`` (one row per variant and rate; the
rates are fractions of the first variant's offline request rate for every variant, so their
latencies compare at one offered load; the lowest rate whose TTFT p99 exceeds 1 s in every
row), ``serve_steps`` (every step
of every measured run: kind, rows, prefill tokens, wall, floor). Every run row carries its
floor, the sum of its steps' floors (:mod:`.serve_floor`) at the ceilings measured at the
start of this run (:mod:`.serve_ceilings`), and measured / floor.

The engine: ``max_num_seqs`` rows (256 on the GPU, decode graphs captured up to it, prefill
graphs per token bucket up to ``token_budget``, ``model.prefill_graphs``), a KV cache
sized from the free device memory after the weights less ``kv_margin_gib`` (on a CPU: what the
rows need at the longest context), ``token_budget`` tokens per step. One engine per variant
(:data:`.serve_config.VARIANTS`: whole prompts, ``engine``; chunked prefill, ``chunked``,
under a small token budget, ``chunked_small``, and paced while the server keeps up, ``paced``;
chunked on the batch-invariant model,
``invariant``, GPU only, sharing the weights and the KV pool of the first) serves a warm-up
run (every graph bucket's first use), then every measured run (``invariant`` not the long
prompts: :data:`.serve_config.SHORT_PROMPTS_ONLY` says why).
Before a run's row is written, every request must have finished with exactly its output length.
The tables are written again after every variant, so a run stopped later keeps what it finished.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import time
from pathlib import Path

import torch

from decodelab.core.device import gpu_memory, run_dtype, sizing_device
from decodelab.core.profiles import on_bench_device
from decodelab.core.results import stamped, write_table
from decodelab.engine.bench import serve_ceilings
from decodelab.engine.bench.config import SPARE_BLOCKS, graph_buckets
from decodelab.engine.bench.serve_config import (
    SHORT_PROMPTS_ONLY,
    ServeBenchConfig,
    engine_config,
)
from decodelab.engine.bench.serve_rows import (
    OfflineRow,
    OnlineRow,
    RunTrace,
    ServeStepRow,
    run_name,
)
from decodelab.engine.bench.serve_run import ServeEngine, floor_of
from decodelab.engine.bench.serve_stats import TTFT_LIMIT_S, first_rate_over
from decodelab.engine.bench.serve_workload import ServeRequest, warmup_requests
from decodelab.engine.config import EngineConfig
from decodelab.model.block_pool import blocks_needed
from decodelab.model.config import named_config
from decodelab.model.graphs import DecodeGraphs
from decodelab.model.kv_cache import PagedKVCache
from decodelab.model.llama import PagedLlama
from decodelab.model.prefill_graphs import DEFAULT_BUCKETS as PREFILL_BUCKETS
from decodelab.model.prefill_graphs import PrefillGraphs
from decodelab.model.weights import random_weights

NAN = math.nan
# Chunks a step's prefill graph holds (more run eagerly): the H200 online runs prefilled 1-4
# chunks a step, the offline run's first steps 8-12 (of ~4,000 tokens: past the buckets anyway).
PREFILL_CHUNKS = 16


def bench(profile: str, out_dir: Path, dtype: str = "auto") -> list[Path]:
    """``dtype``: ``core.precision``'s choice for the device it runs on (``auto``: bf16 from
    sm_80, fp16 below, fp32 on the CPU)."""
    cfg = ServeBenchConfig.for_profile(profile)

    def body(dev: torch.device) -> list[Path]:
        return _bench(dataclasses.replace(cfg, dtype=run_dtype(dtype, dev.type, "serve.dtype")),
                      dev, out_dir)

    return on_bench_device(cfg.profile, body)


def _kv_blocks(cfg: ServeBenchConfig, mcfg, dtype: torch.dtype, dev: torch.device) -> int:
    """On a GPU what the free memory holds after the weights, less the margin; on a CPU what
    ``max_num_seqs`` rows at the longest context need."""
    if dev.type != "cuda":
        return cfg.max_num_seqs * blocks_needed(cfg.max_model_len, cfg.block_size) + SPARE_BLOCKS
    torch.cuda.empty_cache()  # memory the allocator holds unused counts as free
    free, _ = gpu_memory(dev)  # DECODELAB_GPU_MEMORY_GIB's limit, where set
    blocks = PagedKVCache.blocks_for_memory(mcfg, cfg.block_size, dtype,
                                            free - int(cfg.kv_margin_gib * 2**30))
    want = cfg.max_num_seqs * blocks_needed(cfg.max_model_len, cfg.block_size)
    if blocks < want:  # a smaller GPU: the scheduler preempts where the pool runs out
        print(f"[serve] sized to {sizing_device(dev).describe()}: a KV pool of {blocks:,} "
              f"blocks ({blocks * cfg.block_size:,} tokens, {blocks / want:.0%} of what "
              f"{cfg.max_num_seqs} rows at {cfg.max_model_len:,} tokens need), the free memory "
              f"less a {cfg.kv_margin_gib:g} GiB margin", flush=True)
    return blocks


def _setup(cfg: ServeBenchConfig, dev: torch.device, like: PagedLlama | None = None):
    """The model and its graphs. ``like``: a model whose weights and KV pool the new,
    batch-invariant model shares (the same random weights; one pool, sized once, so the second
    model never depends on the first one's memory coming back)."""
    mcfg = named_config(cfg.model)
    if like is None:
        dtype = getattr(torch, cfg.dtype)
        weights = random_weights(mcfg, 0, dtype=dtype, device=dev)
        cache = PagedKVCache(mcfg, _kv_blocks(cfg, mcfg, dtype, dev), cfg.block_size,
                             dtype=dtype, device=dev)
    else:
        weights, cache = like.weights, like.cache
    model = PagedLlama(mcfg, weights, cache, batch_invariant=like is not None)
    if dev.type != "cuda":
        return model, None
    width = blocks_needed(cfg.max_model_len, cfg.block_size)
    decode = DecodeGraphs(model, buckets=graph_buckets((*cfg.graph_batches, cfg.max_num_seqs)),
                          max_blocks_per_seq=width)
    prefill = PrefillGraphs(model, [b for b in PREFILL_BUCKETS if b <= cfg.token_budget],
                            max_chunks=PREFILL_CHUNKS, max_blocks_per_seq=width)
    return model, ServeGraphs(decode, prefill)


@dataclasses.dataclass(frozen=True)
class ServeGraphs:
    """The engine's decode graphs and prefill graphs, captured for one model."""

    decode: DecodeGraphs
    prefill: PrefillGraphs

    @property
    def capture_s(self) -> float:
        return self.decode.capture_s + self.prefill.capture_s

    @property
    def graph_mem_mib(self) -> float:
        return self.decode.graph_mem_mib + self.prefill.graph_mem_mib


def _check(name: str, trace: RunTrace, reqs: list[ServeRequest]) -> None:
    """Every request finished with exactly its output length (``ignore_eos``)."""
    want = sorted(r.output_len for r in reqs)
    got = sorted(r.output_tokens for r in trace.requests)
    bad = [r for r in trace.requests if r.status != "finished"]
    if bad or got != want:
        raise RuntimeError(f"serve run {name}: {len(bad)} requests did not finish "
                           f"({bad[:1]}), or output lengths differ from those asked for")


def _serve_variant(variant: str, ecfg: EngineConfig, cfg: ServeBenchConfig, model, graphs,
                   floor, offline: list[ServeRequest], long: list[ServeRequest],
                   base_rate: float | None):
    """The warm-up, the offline runs and the online sweep of one engine variant, at fractions
    of ``base_rate`` (None: this variant's own offline request rate)."""
    served = ServeEngine(model, ecfg, graphs and graphs.decode, floor,
                         graphs and graphs.prefill)
    short = variant in SHORT_PROMPTS_ONLY
    t0 = time.perf_counter()
    served.run(f"{variant}-warmup", warmup_requests(
        cfg.max_num_seqs, cfg.warmup_prompt, model.config.vocab_size,
        longest=(cfg.offline if short else cfg.long_prompts).prompt_len[1]),
        cfg.offline.temperature)
    warmup_s = time.perf_counter() - t0
    print(f"[bench] serve: {variant}: warm-up {warmup_s:.1f} s", flush=True)
    graph = dict(capture_s=getattr(graphs, "capture_s", NAN),
                 graph_mem_mib=getattr(graphs, "graph_mem_mib", NAN),
                 prefill_buckets=len(graphs.prefill.buckets) if graphs is not None else 0,
                 warmup_s=warmup_s)
    offline_rows, traces = [], []
    for wl, reqs in ((cfg.offline, offline),) + (() if short else ((cfg.long_prompts, long),)):
        trace = served.run(f"{variant}-{wl.name}", reqs, wl.temperature)
        _check(wl.name, trace, reqs)
        offline_rows.append(OfflineRow.of(variant, wl.name, trace, **graph))
        traces.append((wl.name, trace))
        _say(variant, offline_rows[-1])
    online_rows = _online(served, variant, cfg, offline, base_rate or offline_rows[0].request_rate,
                          traces)
    steps = [ServeStepRow.of(variant, run, i, s) for run, tr in traces
             for i, s in enumerate(tr.steps)]
    return offline_rows, online_rows, steps


def _online(served: ServeEngine, variant: str, cfg: ServeBenchConfig,
            offline: list[ServeRequest], base_rate: float, traces: list) -> list[OnlineRow]:
    """The online sweep; its traces are appended to ``traces``."""
    rows = []
    for fraction in cfg.online.rate_fractions:
        reqs = cfg.online.requests(offline, fraction * base_rate)
        name = run_name("online", fraction)
        trace = served.run(f"{variant}-{name}", reqs, cfg.offline.temperature)
        _check(name, trace, reqs)
        rows.append(OnlineRow.of(variant, "online", trace, rate_fraction=fraction,
                                 offered_rate=fraction * base_rate,
                                 arrival_span_s=reqs[-1].arrival_s))
        traces.append((name, trace))
        _say(variant, rows[-1])
    knee = first_rate_over([r.offered_rate for r in rows], [r.ttft_p99_ms * 1e-3 for r in rows],
                           TTFT_LIMIT_S)
    return [dataclasses.replace(r, rate_ttft_p99_over_limit=knee) for r in rows]


def _say(variant: str, row) -> None:
    print(f"[bench] serve: {variant} {row.run}: {row.requests} requests in {row.duration_s:.2f} s"
          f", {row.output_tok_s:,.0f} output tok/s ({row.request_rate:.2f} req/s); TTFT p50/p99 "
          f"{row.ttft_p50_ms:.0f}/{row.ttft_p99_ms:.0f} ms, TPOT p50 {row.tpot_p50_ms:.1f} ms; "
          f"busy {row.busy_s:.2f} s = {row.ratio_to_floor:.2f}x its floor", flush=True)


def _bench(cfg: ServeBenchConfig, dev: torch.device, out_dir: Path) -> list[Path]:
    t_start = time.perf_counter()
    dtype = getattr(torch, cfg.dtype)
    ceilings, measured = serve_ceilings.measure(dev, cfg.profile, dtype)
    print(f"[bench] serve: ceilings {measured}; the floor uses the {ceilings.bandwidth} "
          f"bandwidth, {ceilings.gb_s:,.1f} GB/s", flush=True)
    model, graphs = _setup(cfg, dev)
    if graphs is not None:
        for kind, g in (("decode", graphs.decode), ("prefill", graphs.prefill)):
            print(f"[bench] serve: {kind} graphs {g.buckets} captured in {g.capture_s:.1f} s, "
                  f"{g.graph_mem_mib:.0f} MiB", flush=True)
    vocab = model.config.vocab_size
    offline, long = cfg.offline.requests(vocab), cfg.long_prompts.requests(vocab)
    floor = floor_of(model.config, torch.tensor([], dtype=dtype).element_size(), ceilings)
    tables: dict[str, list] = {"serve_offline": [], "serve_online": [], "serve_steps": []}
    paths: list[Path] = []
    for variant in cfg.variants:
        ecfg = engine_config(variant, cfg.token_budget, cfg.small_budget,
                             max_num_seqs=cfg.max_num_seqs,
                             max_model_len=cfg.max_model_len, use_graphs=graphs is not None)
        if getattr(ecfg, "batch_invariant", False) and not model.batch_invariant:
            del graphs  # their memory pools go before the invariant model's graphs
            gc.collect()  # with any cycle that holds them
            model, graphs = _setup(cfg, dev, like=model)
        # every variant's sweep at the same offered rates: the first variant's offline rate's
        base_rate = tables["serve_offline"][0].request_rate if tables["serve_offline"] else None
        for name, rows in zip(tables, _serve_variant(variant, ecfg, cfg, model, graphs, floor,
                                                     offline, long, base_rate), strict=True):
            tables[name] += rows
        # the tables after every variant: a run stopped later keeps the variants it finished
        run = dict(model=cfg.model, dtype=cfg.dtype, block_size=cfg.block_size,
                   max_num_seqs=cfg.max_num_seqs, kv_blocks=model.cache.num_blocks,
                   gb_s=ceilings.gb_s, bandwidth=ceilings.bandwidth, tflop_s=ceilings.tflop_s,
                   bench_s=round(time.perf_counter() - t_start, 1))
        steps_run = {k: run[k] for k in ("model", "dtype", "block_size", "bench_s")}
        paths = [write_table(name, stamped(rows, **(steps_run if name == "serve_steps" else run)),
                             out_dir=out_dir, config=cfg, profile=cfg.profile)
                 for name, rows in tables.items()]
    return paths
