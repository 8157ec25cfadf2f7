"""Phase-3 measurements on the GPU: barrier costs, a launch's steps/s with its run clock and
stage clock, and the phase-2 graph replay of the same shape. Each returns rows (rows.py)."""

from __future__ import annotations

import torch

from decodelab.core.timing import TimingConfig, time_cuda
from decodelab.persistent import kernel
from decodelab.persistent.rows import BarrierRow, Clock, Timing
from decodelab.toy import graphs
from decodelab.toy import step as toy


def measure_barriers(sms: int) -> list[BarrierRow]:
    """µs per barrier from two launches of the same kernel (many vs few iterations); cycles per
    barrier and the SM clock from the kernel's own run clock over the many-iteration loop."""
    sink = torch.zeros(1, dtype=torch.int32, device="cuda")
    clock = torch.zeros(2, dtype=torch.int64, device="cuda")
    sizes = [("syncthreads", 0, t, 1) for t in (256, 512)]
    sizes += [("grid_sync", 1, 256, b) for b in sorted({1, 2, 8, 16, 32, sms})]
    if kernel.cluster_available():
        sizes += [("cluster_sync", 2, 256, b) for b in (2, 4, 8, 16)]
    rows = []
    for name, kind, threads, blocks in sizes:
        few, many = 100, 20_100
        try:
            per = [time_cuda(lambda n=n, k=kind, t=threads, b=blocks:
                             kernel.barrier(k, t, b, n, sink, clock),
                             TimingConfig(warmup=2, repeats=5, inner=1)).device_stats().median
                   for n in (few, many)]
            cycles, ns = (int(v) for v in clock.cpu())  # the last launch: `many` iterations
        except RuntimeError as exc:  # e.g. a 16-block cluster refused on this part
            print(f"[persistent] barrier {name} x{blocks}: not measured ({exc})", flush=True)
            continue
        rows.append(BarrierRow(name, threads, blocks, (per[1] - per[0]) / (many - few) * 1e6,
                               cycles / many, cycles / ns if ns > 0 else float("nan")))
    return rows


def warm_up(seconds: float = 0.3) -> dict:
    """Keep the GPU busy for about ``seconds`` with one persistent launch before anything is
    timed (clocks ramp up under load; nothing is set), and report the SM clock it ran at."""
    cfg = toy.named("ultra-light")
    w, x0 = toy.make_weights(cfg, "cuda"), toy.initial_state(cfg, "cuda")
    kcfg = kernel.KernelConfig("block_wide")
    _, ns = (int(v) for v in kernel.run(w, x0, 20_000, kcfg=kcfg).clock.cpu())
    n_steps = int(min(5_000_000, max(20_000, seconds / max(ns * 1e-9 / 20_000, 1e-9))))
    cycles, ns = (int(v) for v in kernel.run(w, x0, n_steps, kcfg=kcfg).clock.cpu())
    return {"steps": n_steps, "seconds": ns * 1e-9,
            "sm_clock_ghz": cycles / ns if ns > 0 else float("nan")}


def time_launches(fn, n_steps: int, repeats: int) -> Timing:
    t = time_cuda(fn, TimingConfig(warmup=1, repeats=repeats, inner=1))
    dev, wall, host = t.device_stats(), t.wall_stats(), t.host_stats()
    return Timing(n_steps, n_steps / dev.median, dev.median / n_steps * 1e6,
                  dev.q1 / n_steps * 1e6, dev.q3 / n_steps * 1e6, wall.median / n_steps * 1e6,
                  host.median * 1e6, host.median / n_steps * 1e6, host.median / wall.median)


def steps_for(w, x0, kcfg: kernel.KernelConfig, target_s: float) -> int:
    """Steps per launch so that one launch runs about ``target_s`` (from a short probe)."""
    probe_n = 200
    probe = time_cuda(lambda: kernel.run(w, x0, probe_n, kcfg=kcfg),
                      TimingConfig(warmup=1, repeats=2, inner=1)).device_stats().median
    return int(min(500_000, max(probe_n, target_s / (probe / probe_n))))


def measure_variant(w, x0, kcfg: kernel.KernelConfig, n_steps: int,
                    repeats: int) -> tuple[Timing, Clock, torch.Tensor]:
    """Device time per step of the plain build, its run clock (one more launch of the same
    length, read by thread 0 of block 0: a row never stops, no stop token here), and the
    diagnostic build's run clock and stage clock: (L + 2, 2) work/wait cycles per step."""
    timing = time_launches(lambda: kernel.run(w, x0, n_steps, kcfg=kcfg), n_steps, repeats)
    cycles, ns = (int(v) for v in kernel.run(w, x0, n_steps, kcfg=kcfg).clock.cpu())
    clocked = kernel.run(w, x0, n_steps, kcfg=kcfg, clocked=True)
    c_cycles = int(clocked.clock[0].cpu())
    stages = clocked.stages.cpu().double() / n_steps
    return (timing, Clock(cycles / n_steps, cycles / ns if ns > 0 else float("nan"),
                          c_cycles / n_steps), stages)


def measure_graph(w, x0, ref: toy.Trajectory, k: int, repeats: int) -> Timing:
    """Phase 2's captured K-step graph on the same shape, checked against the reference first."""
    cap = graphs.CapturedSteps(w, x0, k)
    cap.replay()
    torch.cuda.synchronize()
    if not torch.equal(cap.state.tokens.cpu(), ref.tokens[:k].cpu()):
        raise AssertionError(f"graph k={k}: tokens differ from the eager reference")
    replays = max(4, 2000 // k)
    return time_launches(lambda: [cap.replay() for _ in range(replays)], replays * k, repeats)
