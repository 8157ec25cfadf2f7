"""``python -m decodelab bench tp`` (under ``torchrun --nproc-per-node N``): tensor-parallel
decode, where its time goes, and what the collectives cost.

Started by torchrun with N processes, it measures TP=1 (rank 0 alone, the same code with a group
of one) and TP=N, for each model shape, eager and CUDA graph. Started plainly, it is a world of
one and measures TP=1 only. Rank 0 writes the tables:

``tp``, one row per model x tp x mode x batch (context ``context`` tokens per sequence):
- ``ms_per_step``: wall time of one decode step (one new token per sequence), the slowest rank;
- ``ms_no_comm``: the same step with every collective replaced by a local stand-in of the same
  shape (``TPGroup.without_comm``: wrong numbers, the same compute), so
  ``comm_ms = ms_per_step - ms_no_comm`` is what communication adds to the step;
- ``ms_comm_alone``: the step's collectives alone (2 L + 1 all-reduces of (bucket, d), one
  all-gather of (bucket, V / tp)), same mode, on static buffers; the difference between it and
  ``comm_ms`` is how much of the communication the step hides or serialises;
- validation before timing: graph tokens equal eager tokens, and TP=N's logits (teacher-forced
  on TP=1's greedy tokens) within ``TP_BF16_RTOL`` of TP=1's; free-running token equality is
  recorded (``tokens_equal_tp1``).
``tp_collectives``: all-reduce latency and bus bandwidth against message size, eager and graph.
``tp_profile`` (GPUs only): per-operation host and device time of one TP=N step (first model
measured at TP=N, batch 1), eager and graph, on every rank (``torch.profiler``, run last).
``tp_skipped`` (only when something was skipped): each model x tp configuration whose estimated
memory per rank exceeds what the tightest GPU has free (``parallel.memory``), with the numbers;
a line is printed for each, and the tables' metadata lists them too.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

import torch

from decodelab.core.device import run_dtype
from decodelab.core.profiles import measured_device
from decodelab.core.results import stamped, write_table
from decodelab.core.timing import TimingConfig, copy_bandwidth_gb_s, median_times
from decodelab.model.block_pool import blocks_needed
from decodelab.model.config import named_config
from decodelab.model.graphs import DecodeGraphs
from decodelab.model.kv_cache import decode_inputs
from decodelab.model.weights import random_weights
from decodelab.parallel import collectives as coll
from decodelab.parallel.check import build_model, validate_tp
from decodelab.parallel.config import TPBenchConfig
from decodelab.parallel.group import NO_MULTICAST_ENV, TPGroup, init_world, shutdown, sub_group
from decodelab.parallel.memory import GIB, Fit, decide, free_bytes, rank_memory
from decodelab.parallel.profile import gather_rows, profile_step
from decodelab.parallel.progress import log
from decodelab.parallel.rows import NAN, ProfileRow, R, SkipRow, TPChecks, TPRow
from decodelab.parallel.shard import check_tp

# Blocks beyond the timed batches' own: validation's greedy runs (4 prompts of
# model.compare.PROMPT_LENS plus check_tokens) must fit where the timed batches are small.
VALIDATION_BLOCKS = 64
SPARE_BLOCKS = 8  # beyond the one batch-1 sequence of the profiled step


def bench(profile: str, out_dir: Path, dtype: str = "auto") -> list[Path]:
    """``dtype``: ``core.precision``'s choice for the GPU (``auto``: bf16 from sm_80, fp16
    below); what does not fit is skipped per model and TP size (``parallel.memory``)."""
    # gpu without CUDA and a dtype the GPU lacks: refused before any process group starts
    backend = measured_device(profile)
    cfg = replace(TPBenchConfig.for_profile(profile), dtype=run_dtype(dtype, backend, "tp.dtype"))
    if os.environ.get("DECODELAB_STACK_DUMP_S"):  # diagnosis: every thread's stack, once
        faulthandler.dump_traceback_later(int(os.environ["DECODELAB_STACK_DUMP_S"]))
    for m in cfg.models:  # refuse before any process group or device is touched
        check_tp(named_config(m), int(os.environ.get("WORLD_SIZE", "1")))
    return run(cfg, init_world(), out_dir)


def run(cfg: TPBenchConfig, world: TPGroup, out_dir: Path) -> list[Path]:
    """The bench on an initialised world (every rank calls it); rank 0 returns the tables."""
    for m in cfg.models:
        check_tp(named_config(m), world.size)  # refuse before any GPU work
    try:
        paths = _bench(cfg, world, out_dir)
    except Exception:
        if world.size == 1:
            raise
        # The other ranks wait in a collective that will never complete, and tearing the
        # group down would wait for them: report, then leave (torchrun stops the rest).
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    shutdown(world)
    return paths


def _bench(cfg: TPBenchConfig, world: TPGroup, out_dir: Path) -> list[Path]:
    t0 = time.perf_counter()
    cuda = world.device.type == "cuda"
    dtype = getattr(torch, cfg.dtype)
    bw = copy_bandwidth_gb_s(world.device, (1 << 30) if cuda else (64 << 20), cfg.timing)
    rows: list[TPRow] = []
    meta = dict(config=cfg, world_size=world.size, backend="nccl" if cuda else "gloo",
                nccl=".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
                multicast_env={k: os.environ.get(k) for k in NO_MULTICAST_ENV})
    paths: list[Path] = []
    skipped: list[SkipRow] = []

    def write(name: str, table: list[R]) -> list[R]:  # after each part: a stall loses no more
        table = stamped(table, bench_s=round(time.perf_counter() - t0, 1),
                        world_size=world.size)
        if world.rank == 0 and table:
            path = write_table(name, table, out_dir=out_dir, config=meta, profile=cfg.profile)
            if path not in paths:
                paths.append(path)
        return table

    profiled = None  # the first model measured at TP=world
    for name in cfg.models:
        new = _bench_model(cfg, world, name, dtype, bw, skipped)
        if profiled is None and any(r.tp == world.size for r in new):
            profiled = name
        meta["skipped"] = [f"{s.model} tp={s.tp}: {s.reason}" for s in skipped]
        rows = write("tp", rows + new)
        skipped = write("tp_skipped", skipped)
    if world.size > 1:
        modes = ("eager", "graph") if cuda else ("eager",)
        log(world, "all-reduce sweep")
        write("tp_collectives", coll.all_reduce_sweep(world, cfg.sweep_bytes, modes, dtype,
                                                      cfg.sweep_ops, cfg.sweep_samples))
    if world.size > 1 and cuda and profiled is None:
        _say(world, f"profile skipped: no model ran at tp={world.size}")
    elif world.size > 1 and cuda:  # on gloo a collective blocks the host: nothing to split
        log(world, "profiling one step per mode")  # last: the profiler stays attached
        write("tp_profile", _profile_rows(cfg, world, profiled, dtype))
    log(world, "done")
    return paths


def _profile_rows(cfg: TPBenchConfig, world: TPGroup, name: str, dtype: torch.dtype
                  ) -> list[ProfileRow]:
    """Per-op host and device time of one TP=world step of model ``name``, batch 1, eager and
    graph, on every rank (gathered on rank 0)."""
    config = named_config(name)
    width = blocks_needed(cfg.context, cfg.block_size) + 1
    full = random_weights(config, seed=0, dtype=dtype, device=world.device)
    model = build_model(config, full, world, num_blocks=width + SPARE_BLOCKS,
                        block_size=cfg.block_size)
    del full
    tables, inputs = decode_inputs(model.cache, 1, cfg.context, torch.Generator().manual_seed(0))
    steps = {"eager": model.decode}
    if world.device.type == "cuda":
        steps["graph"] = DecodeGraphs(model, (1,), width).run
    rows = []
    for mode, step in steps.items():
        for op in profile_step(lambda step=step: step(*inputs), world):
            rows.append(ProfileRow.of(config.name, world.size, mode, 1, cfg.context, op))
    for t in tables:
        model.cache.pool.free(t)
    return gather_rows(world, rows)


def _bench_model(cfg: TPBenchConfig, world: TPGroup, name: str, dtype: torch.dtype,
                 bw: float, skipped: list[SkipRow]) -> list[TPRow]:
    """TP=1 (rank 0 alone), then TP=world, for one model shape; rows on rank 0. A TP size
    whose estimated memory does not fit is skipped (appended to ``skipped``, with a line)."""
    config = named_config(name)
    width = blocks_needed(cfg.context, cfg.block_size) + 1
    fits = _fits(cfg, world, config, dtype, width)
    for f in fits:
        if not f.runs:
            skipped.append(SkipRow(name, f.tp, f.need / GIB, NAN if f.free is None
                                   else f.free / GIB, f.reason))
            _say(world, f"{name} tp={f.tp} skipped: {f.reason}")
    run_tps = [f.tp for f in fits if f.runs]  # the same on every rank: decided on the minimum
    if not run_tps:
        return []
    full = random_weights(config, seed=0, dtype=dtype, device=world.device)
    rows: list[TPRow] = []
    reference: list = [None]  # TP=1's teacher-forcing tokens and logits, shared by broadcast
    for tp in run_tps:
        group = sub_group(world, tp)
        log(world, f"{name} tp={tp}: " + ("starting" if group else "waiting for rank 0"))
        if group is not None:
            rows += _bench_tp(cfg, group, config, full, width, bw, reference)
        world.barrier()
    return rows


def _fits(cfg: TPBenchConfig, world: TPGroup, config, dtype: torch.dtype, width: int
          ) -> list[Fit]:
    """Which of TP=1 and TP=world fit every rank's free device memory (all ranks call this)."""
    cuda = world.device.type == "cuda"
    num_blocks = max(cfg.graph_batches + cfg.eager_batches) * width + VALIDATION_BLOCKS
    esize = torch.tensor([], dtype=dtype).element_size()
    needs = {tp: rank_memory(config, tp, esize, num_blocks, cfg.block_size,
                             cfg.graph_batches if cuda else ()).need
             for tp in sorted({1, world.size})}
    free = free_bytes(world.device)
    if free is not None:  # the tightest rank decides for all, so every rank skips alike
        free = int(-coll.group_max(world, -float(free)))
    return decide(needs, free)


def _say(world: TPGroup, msg: str) -> None:
    """A line for the reader of the run (rank 0's stdout), besides the progress log."""
    log(world, msg)
    if world.rank == 0:
        print(f"[bench] tp: {msg}", flush=True)


def _bench_tp(cfg, group: TPGroup, config, full, width: int, bw: float, reference: list
              ) -> list[TPRow]:
    cuda = group.device.type == "cuda"
    max_batch = max(cfg.graph_batches + cfg.eager_batches)
    model = build_model(config, full, group, num_blocks=max_batch * width + VALIDATION_BLOCKS,
                        block_size=cfg.block_size)
    twin = model.with_group(group.without_comm()) if group.size > 1 else None
    graphs = twin_graphs = None
    if cuda and cfg.graph_batches:
        graphs = DecodeGraphs(model, cfg.graph_batches, width)
        if twin is not None:
            twin_graphs = DecodeGraphs(twin, cfg.graph_batches, width)
    log(group, "model and graphs ready; validating")
    checks = validate_tp(group, model, graphs, reference, cfg.check_tokens)
    gen = torch.Generator().manual_seed(0)  # the same token ids on every rank
    model.cache.k.normal_()  # the attended K/V: finite, non-zero values (timing never on zeros)
    model.cache.v.normal_()
    rows = []
    for mode, batches in cfg.modes(cuda).items():
        for batch in batches:
            tables, inputs = decode_inputs(model.cache, batch, cfg.context, gen)
            if mode == "graph":
                step, no_comm = graphs.run, twin_graphs.run if twin_graphs else None
            else:
                step, no_comm = model.decode, twin.decode if twin else None
            msgs = _messages(model, graphs.bucket_for(batch) if mode == "graph" else batch)
            log(group, f"timing {mode} batch {batch}")
            times = _measure(cfg, group, mode, step, no_comm, inputs, msgs)
            for t in tables:
                model.cache.pool.free(t)
            rows.append(_row(cfg, model, group, mode, batch, msgs, *times, bw, checks, graphs))
    del graphs, twin_graphs, model, twin
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return rows


def _measure(cfg, group: TPGroup, mode: str, step, no_comm, inputs, msgs: coll.StepMessages
             ) -> tuple[float, ...]:
    """(wall, host, device, wall without collectives, collectives alone) seconds per step."""
    wall, host, dev = _time(group, lambda: step(*inputs), cfg.timing)
    if no_comm is None:  # a group of one: nothing to communicate
        return wall, host, dev, float("nan"), float("nan")
    t_no_comm = _time(group, lambda: no_comm(*inputs), cfg.timing)[0]
    ops, refill = coll.step_collectives(group, msgs)
    t_alone = coll.time_ops(group, ops, refill, 1, mode, cfg.repeats * 2, cfg.warmup).wall_s
    return wall, host, dev, t_no_comm, t_alone


def _time(group: TPGroup, fn, cfg: TimingConfig) -> tuple[float, float, float]:
    """(wall, host, device) seconds per call, medians, each the slowest rank's."""
    group.barrier()
    vals = median_times(fn, group.device.type == "cuda", cfg)
    return tuple(coll.group_max(group, v) for v in vals)


def _messages(model, rows: int) -> coll.StepMessages:
    cfg = model.full_config
    return coll.StepMessages(rows, cfg.hidden_size, cfg.vocab_size // model.group.size,
                             2 * cfg.num_layers + 1, model.dtype)


def _row(cfg, model, group: TPGroup, mode: str, batch: int, msgs: coll.StepMessages,
         wall, host, dev, t_no_comm, t_alone, bw: float, checks: TPChecks, graphs) -> TPRow:
    kv_token = model.config.kv_bytes_per_token(model.cache.k.element_size())
    nbytes = model.weights.nbytes_per_step(batch) + batch * cfg.context * kv_token
    nan = float("nan")
    graph = mode == "graph"
    comm = group.size > 1
    return TPRow(
        model=model.full_config.name, tp=group.size, mode=mode, batch=batch,
        bucket=msgs.batch if graph else nan, context=cfg.context, dtype=cfg.dtype,
        ms_per_step=wall * 1e3, device_ms_per_step=dev * 1e3, host_ms_per_step=host * 1e3,
        tokens_per_s=batch / wall, ms_no_comm=t_no_comm * 1e3,
        comm_ms=(wall - t_no_comm) * 1e3, ms_comm_alone=t_alone * 1e3,
        all_reduces_per_step=msgs.all_reduces if comm else 0,
        all_reduce_bytes=msgs.all_reduce_bytes if comm else 0,
        all_gather_bytes=msgs.all_gather_bytes if comm else 0,
        bytes_per_rank=nbytes, copy_gb_s=bw, roofline_fraction=nbytes / (bw * 1e9) / wall,
        capture_s=graphs.capture_s if graph else nan,
        graph_mem_mib=graphs.graph_mem_mib if graph else nan,
        graph_equals_eager=checks.graph_equals_eager,
        max_rel_err_vs_tp1=checks.max_rel_err_vs_tp1, tokens_equal_tp1=checks.tokens_equal_tp1)
