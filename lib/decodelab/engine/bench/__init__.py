"""``python -m decodelab bench runtime``: what the engine loop costs on top of the forward pass.

Tables:
- ``runtime``: steady decode (every row decoding, mixed top-k/top-p rows) at the bench batch,
  one row per variant: ``bare_forward`` (the phase-4a step alone: ``DecodeGraphs.run`` on a GPU,
  eager ``decode`` on a CPU, at the engine run's mean context), ``engine`` (everything on), and
  the engine with one technique switched off: ``no_graphs``, ``no_async_output``,
  ``no_static_inputs``. Wall per step (one sync per chunk of steps), host time per step from
  the engine's own breakdown, the ratio to ``bare_forward``, the sampler's device time alone
  and its share of the step (``sampler_share``), the host time of the sample phase inside the
  loop over the step (``sample_phase_share``: on a CPU, where the sampler's work is host work
  and runs with cold caches after the forward, this is the share that counts), kernels and
  launches per step (profiler; NaN where unavailable).
- ``runtime_steps``: the per-step breakdown (µs per phase) of the ``engine`` run and of a run
  with ``sync_phases`` (each phase then includes its device time).
- ``runtime_sampler``: the engine's sample step alone on the bench logits (the sampler with
  its last-token scatter and packed output): partial selection (two-stage over chunks of the
  vocabulary where that applies), ``partial_topk_direct`` (one ``topk`` over the whole
  vocabulary), the full sort, all-greedy, and with penalties, on the same mixed rows.
  ``device_us``: its kernels back to back (captured in a CUDA graph, replayed, as the engine
  runs it); ``issued_us``: CUDA-event time when issued op by op (the host's launch rate can
  stretch it); ``host_us``: host time to issue it eagerly.
- ``runtime_batch``: engine vs bare forward step at several batch sizes (host overhead).
- ``runtime_requests``: a Poisson-arrival workload: per-request status, reason, TTFT, TPOT,
  tokens; the workload's throughput is in every row. Every tenth request fails in one way
  (its callback raises, it is aborted, its logits turn non-finite) and two malformed ones
  are rejected at admission.
- ``runtime_errors``: that workload's outcomes and errors by class (counts).
- ``sampler_grid`` (GPU only): the samplers at every setting, batch and vocabulary;
  ``sampler_kernels`` (GPU only): the fused sampler's device time per kernel, by row kind.
- ``batch_invariance``, ``batch_invariance_cost`` (profile gpu only): the batch-invariant
  switch checked bit for bit and its step time against the default kernels (``invariance``),
  in the run's dtype, its cost batches fitted to the GPU's free memory. Its matmul's tiles
  are the ``tiles`` phase's (``invariance_tiles``).

Validated before timing: the engine's greedy tokens with graphs equal those of the eager
engine on a full bucket; on a GPU, the engine's captured sampler equals its eager body token
for token (and in its table updates) at every decode step of a mixed run; partial selection
(both ways) samples the same tokens as the full sort.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import replace
from pathlib import Path

import torch

from decodelab.core.device import sized
from decodelab.core.profiles import on_bench_device
from decodelab.core.results import stamped, write_table
from decodelab.engine.bench import (
    checks,
    invariance,
    sampler_grid,
    sampler_kernels,
    sampler_timing,
    step_timing,
    workload,
)
from decodelab.engine.bench.config import RuntimeBenchConfig, graph_buckets
from decodelab.engine.bench.invariance_config import InvarianceConfig
from decodelab.engine.bench.rows import BatchRow, RuntimeRow, StepRow
from decodelab.engine.config import EngineConfig
from decodelab.engine.sampler import use_fused
from decodelab.model.block_pool import blocks_needed
from decodelab.model.config import named_config
from decodelab.model.graphs import DecodeGraphs
from decodelab.model.kv_cache import PagedKVCache
from decodelab.model.llama import PagedLlama
from decodelab.model.weights import random_weights


def _setup(cfg: RuntimeBenchConfig, dev: torch.device):
    mcfg = named_config(cfg.model)
    dtype = getattr(torch, cfg.dtype)
    weights = random_weights(mcfg, 0, dtype=dtype, device=dev)
    per_seq = blocks_needed(cfg.max_model_len, cfg.block_size)
    cache = PagedKVCache(mcfg, cfg.num_blocks, cfg.block_size, dtype=dtype, device=dev)
    model = PagedLlama(mcfg, weights, cache)
    graphs = None
    if dev.type == "cuda":
        graphs = DecodeGraphs(model, buckets=graph_buckets(cfg.batches),
                              max_blocks_per_seq=per_seq)
    return model, graphs


def bench(profile: str, out_dir: Path, dtype: str = "auto") -> list[Path]:
    """``dtype``: ``core.precision``'s choice; the batches fit the GPU's free memory
    (``RuntimeBenchConfig.on_device``)."""
    cfg = RuntimeBenchConfig.for_profile(profile)
    return on_bench_device(cfg.profile,
                           lambda dev: _bench(sized(cfg, dev, dtype), dev, out_dir))


def _bench(cfg: RuntimeBenchConfig, dev: torch.device, out_dir: Path) -> list[Path]:
    profile = cfg.profile
    t_start = time.perf_counter()
    model, graphs = _setup(cfg, dev)
    base = EngineConfig(max_num_seqs=max(cfg.batches), max_model_len=cfg.max_model_len,
                        use_graphs=graphs is not None)
    agreement = checks.validate_engine(model, graphs, base)  # raises on a disagreement
    if graphs is not None:
        n = checks.validate_step_graphs(model, graphs, base, cfg.batch)  # raises likewise
        print(f"[bench] runtime: captured sampler equals the eager sampler on {n} steps",
              flush=True)
    logits = sampler_timing.bench_logits(model, cfg.batch)
    sampler_rows = sampler_timing.sampler_rows(logits, dev)  # validates partial vs sort first
    # kernels back to back (captured); the eager-issued time if capture was not possible.
    # With graphs the engine captures the faster of two-stage and direct selection (it times
    # both at its first step of each bucket), so its sampler is the faster of the two rows.
    engine_selections = (("fused",) if use_fused(base.sampler, dev)
                         else ("partial_topk", "partial_topk_direct") if graphs is not None
                         else ("partial_topk",))
    mixed_sampler_s = min(r.best_s for r in sampler_rows if r.variant in engine_selections)

    variants = {"engine": base, "no_async_output": replace(base, async_output=False),
                "no_static_inputs": replace(base, static_inputs=False)}
    if graphs is not None:
        variants["no_graphs"] = replace(base, use_graphs=False)
    context = cfg.prompt_len + cfg.warmup_steps + cfg.chunk_steps * cfg.chunks // 2
    bare = step_timing.time_bare_forward(model, graphs, cfg.batch, context, cfg)
    rows = [RuntimeRow.of("bare_forward", cfg.batch, bare, bare, mixed_sampler_s)]
    step_rows: list[StepRow] = []
    for name, ecfg in variants.items():
        res = _optional(name, lambda ecfg=ecfg: step_timing.time_engine(model, graphs, ecfg, cfg.batch,
                                                                  cfg), required=name == "engine")
        if res is not None:
            rows.append(RuntimeRow.of(name, cfg.batch, res, bare, mixed_sampler_s))
            if name == "engine":
                step_rows += [StepRow.of(r, name) for r in res.records]
    eng = next(r for r in rows if r.variant == "engine")
    print(f"[bench] runtime: batch {cfg.batch}: engine {eng.wall_us:.0f} us/step vs bare "
          f"forward {eng.wall_us / eng.ratio_to_bare:.0f} us = {eng.ratio_to_bare:.3f}x "
          f"(target <= {eng.target_ratio:.2f}x); sampler {eng.sampler_device_us:.0f} us = "
          f"{eng.sampler_share:.1%} of the step (target <= {eng.target_sampler_share:.0%})",
          flush=True)
    # the serving workload's plain-temperature rows (sampler share not measured alone: NaN)
    res = _optional("engine_plain", lambda: step_timing.time_engine(
        model, graphs, base, cfg.batch, cfg, mix=step_timing.PLAIN))
    if res is not None:
        rows.append(RuntimeRow.of("engine_plain", cfg.batch, res, bare, float("nan")))
        print(f"[bench] runtime: batch {cfg.batch}: engine on plain-temperature rows "
              f"{rows[-1].wall_us:.0f} us/step = {rows[-1].ratio_to_bare:.3f}x the bare forward",
              flush=True)
    res = _optional("sync_phases", lambda: step_timing.time_engine(
        model, graphs, replace(base, sync_phases=True), cfg.batch, cfg, ops=False))
    if res is not None:
        step_rows += [StepRow.of(r, "engine_sync_phases") for r in res.records]

    def sweep():
        ctx = cfg.prompt_len + cfg.steady_steps // 2
        return [BatchRow.of(b, step_timing.time_engine(model, graphs, base, b, cfg, ops=False),
                            step_timing.time_bare_forward(model, graphs, b, ctx, cfg, ops=False))
                for b in cfg.batches]

    batch_rows = _optional("batch sweep", sweep) or []
    request_rows, error_rows = _optional(
        "workload", lambda: workload.poisson_workload(model, graphs, base, cfg)) or ([], [])
    run = dict(model=cfg.model, dtype=cfg.dtype, block_size=cfg.block_size,
               graph_tokens_agree=agreement, bench_s=round(time.perf_counter() - t_start, 1))
    tables = (("runtime", rows), ("runtime_steps", step_rows), ("runtime_sampler", sampler_rows),
              ("runtime_batch", batch_rows), ("runtime_requests", request_rows),
              ("runtime_errors", error_rows))
    written = [write_table(name, stamped(table, **run), out_dir=out_dir, config=cfg,
                           profile=profile) for name, table in tables if table]
    if dev.type == "cuda":
        written += sampler_grid.write_grid(dev, out_dir, profile)
        written += _optional("sampler_kernels",
                             lambda: sampler_kernels.write_kernels(out_dir, profile)) or []
        if profile == "gpu":  # the switch at the H200's sizes: minutes, not for smoke runs
            del model, graphs
            torch.cuda.empty_cache()
            written += _optional("batch_invariance", lambda: invariance.write_invariance(
                out_dir, profile, sized(InvarianceConfig(), dev, cfg.dtype))) or []
    return written


def _optional(name: str, fn, *, required: bool = False):
    """Run one measurement; a failure of a secondary one is reported and skipped so that the
    main comparison is still written (validation failures are raised before any of these)."""
    try:
        return fn()
    except Exception:  # noqa: BLE001
        if required:
            raise
        print(f"[bench] runtime: {name} FAILED, skipped:\n{traceback.format_exc()}", flush=True)
        return None
