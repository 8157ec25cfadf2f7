"""Phase-3 measurements: persistent variants against graph replay, barrier costs, latency model.

Tables written by :func:`run_bench`:
- ``persistent``: one row per (sweep, variant, shape): steps/s and µs/step (device time of one
  launch of N steps / N), host CPU time per launch, the launch plan, validation outcome
  (``validated``, ``error``: a variant that fails validation or raises gets a row without
  timings and the others go on), the in-kernel run clock (``cycles_per_step`` from clock64 of
  block 0's step loop, ``sm_clock_ghz`` = those cycles / %globaltimer ns) and the latency model
  in µs and in cycles; the single-step graph (``graph_k1``) and the best multi-step graph
  (``graph_best``) of phase 2 measured in the same run on the same shapes.
- ``persistent_barriers``: µs per barrier (__syncthreads, grid.sync, cluster.sync) by size, and
  cycles per barrier with the SM clock from the same in-kernel run clock.

The proven (first-version) variants and the graphs are measured over all shapes first; the
second versions (``*_v2``) follow in a second pass, so a fault there cannot lose the first.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from decodelab.core.device import require_cuda
from decodelab.core.profiles import PROFILES
from decodelab.core.results import write_table
from decodelab.core.timing import TimingConfig, time_cuda
from decodelab.core.validate import check_choice
from decodelab.persistent import kernel as persistent
from decodelab.toy import graphs
from decodelab.toy import step as toy

V = 256  # vocabulary of every sweep (the seed's ultra-light and h256 configs)


@dataclass(frozen=True, slots=True)
class SweepPlan:
    shapes: tuple[tuple[str, toy.ToyConfig], ...]  # (sweep name, shape)
    n_validate: int
    graph_ks: tuple[int, ...]
    target_launch_s: float  # device time aimed for per timed launch
    repeats: int
    budget_s: float  # proven pass: shapes left when this much time has passed are skipped
    budget_v2_s: float  # second-version pass: the same, counted from the start of the bench


def sweep_plan(profile: str) -> SweepPlan:
    def cfg(h: int, n_layers: int, b: int) -> toy.ToyConfig:
        return toy.ToyConfig(hidden=h, layers=n_layers, batch=b, vocab=V)

    if profile != "gpu":
        shapes = (("hidden", cfg(64, 4, 1)), ("batch", cfg(64, 2, 2)))
        return SweepPlan(shapes, 200, (8,), 2e-3, 3, 60.0, 90.0)
    # The named shapes first (ultra-light, h256), so a budget cut never loses them.
    shapes = [("hidden", cfg(h, 4, 1)) for h in (64, 256, 16, 32, 128, 512, 1024)]
    shapes += [("layers", cfg(h, n, 1)) for h in (64, 256) for n in (1, 2, 8)]
    shapes += [("batch", cfg(h, 4, b)) for h in (64, 256) for b in (8, 32)]
    # Launch alternatives (threads, blocks per row) on the two named shapes.
    shapes[2:2] = [("tune", cfg(64, 4, 1)), ("tune", cfg(256, 4, 1))]
    return SweepPlan(tuple(shapes), 1000, (16, 64), 5e-3, 5, 66.0, 88.0)


def latency_model_cycles(stages: int, barrier_cycles: float, flops: float, blocks: int,
                         flop_per_clk_per_sm: float = 256.0) -> float:
    """The same model in SM cycles (no clock assumed): barriers in measured cycles plus the FMAs
    at 256 flop per clock per SM."""
    if stages < 0 or barrier_cycles < 0 or flops < 0 or blocks < 1:
        raise ValueError("latency_model_cycles: stages, barrier_cycles, flops >= 0; blocks >= 1")
    return stages * barrier_cycles + flops / (blocks * flop_per_clk_per_sm)


def latency_model_us(stages: int, barrier_us: float, flops: float, blocks: int, clock_hz: float,
                     flop_per_clk_per_sm: float = 256.0) -> float:
    """Per-step time: ``stages`` barriers plus the FMAs spread over ``blocks`` SMs (fp32 FMA rate
    of one SM: 128 lanes x 2 flop per clock)."""
    if stages < 0 or barrier_us < 0 or flops < 0 or blocks < 1 or clock_hz <= 0:
        raise ValueError("latency_model_us: stages, barrier_us, flops >= 0; blocks >= 1; clock > 0")
    return stages * barrier_us + flops / (blocks * flop_per_clk_per_sm * clock_hz) * 1e6


def barrier_for(barriers: list[dict], variant: str, threads: int, blocks: int,
                column: str = "us") -> float:
    """Measured µs (or ``column``) of the barrier a variant uses, at the nearest measured size."""
    kind = {"block": "syncthreads", "grid": "grid_sync",
            "cluster": "cluster_sync"}[persistent.kind_of(variant)]
    size = threads if kind == "syncthreads" else blocks
    rows = [r for r in barriers if r["barrier"] == kind]
    if not rows:
        return float("nan")
    key = "threads" if kind == "syncthreads" else "blocks"
    return min(rows, key=lambda r: abs(r[key] - size)).get(column, float("nan"))


def measure_barriers(ext, sms: int) -> list[dict]:
    """µs per barrier from two launches of the same kernel (many vs few iterations); cycles per
    barrier and the SM clock from the kernel's own run clock over the many-iteration loop."""
    sink = torch.zeros(1, dtype=torch.int32, device="cuda")
    clock = torch.zeros(2, dtype=torch.int64, device="cuda")
    sizes = [("syncthreads", 0, t, 1) for t in (256, 512)]
    sizes += [("grid_sync", 1, 256, b) for b in sorted({1, 2, 8, 32, sms})]
    if persistent.cluster_available():
        sizes += [("cluster_sync", 2, 256, b) for b in (2, 4, 8, 16)]
    rows = []
    for name, kind, threads, blocks in sizes:
        few, many = 100, 20_100
        try:
            per = [time_cuda(lambda n=n, k=kind, t=threads, b=blocks:
                             ext.barrier(k, t, b, n, sink, clock),
                             TimingConfig(warmup=2, repeats=5, inner=1)).device_stats().median
                   for n in (few, many)]
            cycles, ns = (int(v) for v in clock.cpu())  # the last launch: `many` iterations
        except RuntimeError as exc:  # e.g. a 16-block cluster refused on this part
            print(f"[persistent] barrier {name} x{blocks}: not measured ({exc})", flush=True)
            continue
        rows.append({"barrier": name, "threads": threads, "blocks": blocks,
                     "us": (per[1] - per[0]) / (many - few) * 1e6, "cycles": cycles / many,
                     "sm_clock_ghz": cycles / ns if ns > 0 else float("nan")})
    return rows


def warm_up(seconds: float = 0.3) -> dict:
    """Keep the GPU busy for about ``seconds`` with one persistent launch before anything is
    timed (clocks ramp up under load; nothing is set), and report the SM clock it ran at."""
    cfg = toy.named("ultra-light")
    w, x0 = toy.make_weights(cfg, "cuda"), toy.initial_state(cfg, "cuda")
    kcfg = persistent.KernelConfig("block")
    probe = persistent.run(w, x0, 20_000, kcfg=kcfg)
    _, ns = (int(v) for v in probe.clock.cpu())
    n_steps = int(min(5_000_000, max(20_000, seconds / max(ns * 1e-9 / 20_000, 1e-9))))
    cycles, ns = (int(v) for v in persistent.run(w, x0, n_steps, kcfg=kcfg).clock.cpu())
    return {"steps": n_steps, "seconds": ns * 1e-9,
            "sm_clock_ghz": cycles / ns if ns > 0 else float("nan")}


def _time_launches(fn, n_steps: int, repeats: int) -> dict:
    t = time_cuda(fn, TimingConfig(warmup=1, repeats=repeats, inner=1))
    dev, wall, host = t.device_stats(), t.wall_stats(), t.host_stats()
    return {"steps_per_launch": n_steps, "steps_per_s": n_steps / dev.median,
            "us_per_step": dev.median / n_steps * 1e6, "us_per_step_q1": dev.q1 / n_steps * 1e6,
            "us_per_step_q3": dev.q3 / n_steps * 1e6, "wall_us_per_step": wall.median / n_steps * 1e6,
            "host_us_total": host.median * 1e6, "host_us_per_step": host.median / n_steps * 1e6,
            "host_fraction": host.median / wall.median}


def _measure_variant(w, x0, kcfg: persistent.KernelConfig, plan: SweepPlan) -> dict:
    probe_n = 200
    probe = time_cuda(lambda: persistent.run(w, x0, probe_n, kcfg=kcfg),
                      TimingConfig(warmup=1, repeats=2, inner=1)).device_stats().median
    n_steps = int(min(500_000, max(probe_n, plan.target_launch_s / (probe / probe_n))))
    row = _time_launches(lambda: persistent.run(w, x0, n_steps, kcfg=kcfg), n_steps, plan.repeats)
    # One more launch of the same length read by its own clock: thread 0 of block 0 reads
    # clock64 and %globaltimer around the step loop (a row never stops: no stop token here).
    cycles, ns = (int(v) for v in persistent.run(w, x0, n_steps, kcfg=kcfg).clock.cpu())
    return {**row, "cycles_per_step": cycles / n_steps,
            "sm_clock_ghz": cycles / ns if ns > 0 else float("nan")}


def _measure_graph(w, x0, ref: toy.Trajectory, k: int, plan: SweepPlan) -> dict:
    cap = graphs.CapturedSteps(w, x0, k)
    cap.replay()
    torch.cuda.synchronize()
    if not torch.equal(cap.state.tokens.cpu(), ref.tokens[:k].cpu()):
        raise AssertionError(f"graph k={k}: tokens differ from the eager reference")
    replays = max(4, 2000 // k)
    return _time_launches(lambda: [cap.replay() for _ in range(replays)], replays * k,
                          plan.repeats)


def _shape_cols(sweep: str, cfg: toy.ToyConfig) -> dict:
    return {"sweep": sweep, "hidden": cfg.hidden, "layers": cfg.layers, "batch": cfg.batch,
            "vocab": cfg.vocab, "flops_per_step": cfg.flops_per_step}


def launch_configs(sweep: str, cluster: bool, version: int) -> list[persistent.KernelConfig]:
    """The default launch per variant of one version; for ``tune``, a few alternatives."""
    K = persistent.KernelConfig  # noqa: N806
    sfx = "" if version == 1 else "_v2"
    if sweep != "tune":
        out = [K("block" + sfx, 512), K("grid" + sfx, 256)]
        return out + ([K("cluster" + sfx, 256)] if cluster else [])
    out = [K("block" + sfx, 256), K("grid" + sfx, 512)] + ([K("grid", 256, 4)] if version == 1 else [])
    if cluster:
        out += [K("cluster" + sfx, 256, g) for g in ((4, 8, 16) if version == 1 else (4, 16))]
        out += [K("cluster" + sfx, 512, 8)]
    return out


def _validated_timing(w, x0, ref, kcfg, plan, stop) -> tuple[dict, persistent.Check]:
    """Validate (with and without the stop token), then time; raises on any failure."""
    check = persistent.validate(w, x0, ref, kcfg)
    stop_check = persistent.validate(w, x0, ref, kcfg, stop=stop) if check.ok else check
    if not (check.ok and stop_check.ok):
        raise AssertionError(f"{check.describe()}; with stop token {stop}: {stop_check.describe()}")
    return _measure_variant(w, x0, kcfg, plan), check


_NO_TIMING = ("steps_per_launch", "steps_per_s", "us_per_step", "us_per_step_q1", "us_per_step_q3",
              "wall_us_per_step", "host_us_total", "host_us_per_step", "host_fraction",
              "cycles_per_step", "sm_clock_ghz")


def _variant_rows(sweep, cfg, w, x0, ref, plan, barriers, attrs, build_s, version) -> list[dict]:
    rows = []
    stop = persistent.stop_token_for(ref)
    for kcfg in launch_configs(sweep, persistent.cluster_available(), version):
        variant = kcfg.variant
        info = persistent.plan(cfg, kcfg)
        if not info["ok"]:
            print(f"[persistent] {variant} {cfg}: not run ({info['why']})", flush=True)
            continue
        try:
            timing, check = _validated_timing(w, x0, ref, kcfg, plan, stop)
            error = ""
        except Exception as exc:  # noqa: BLE001 - a failed variant is recorded, the rest go on
            error = f"{type(exc).__name__}: {exc}"[:300]
            print(f"[persistent] {kcfg} {cfg}: NOT VALIDATED, not timed ({error})", flush=True)
            timing, check = dict.fromkeys(_NO_TIMING, float("nan")), None
        blocks = info["blocks"]
        bar = barrier_for(barriers, variant, kcfg.threads, blocks)
        bar_cycles = barrier_for(barriers, variant, kcfg.threads, blocks, "cycles")
        stages = cfg.layers + 1
        rows.append({**_shape_cols(sweep, cfg), "variant": variant, "threads": kcfg.threads,
                     "group": info["group"], "blocks": blocks, "k_steps": 0,
                     "weights": f"{info['w_place']}/{info['wout_place']}/{info['e_place']}",
                     **timing, "validated": not error, "error": error,
                     "validated_steps": plan.n_validate if not error else 0, "stop_token": stop,
                     "max_state_err": check.max_state_err if check else float("nan"),
                     "state_tol": check.state_tol if check else float("nan"),
                     "barriers_per_step": stages, "barrier_us": bar, "barrier_cycles": bar_cycles,
                     "model_us": latency_model_us(stages, bar, cfg.flops_per_step, blocks,
                                                  attrs["clock_khz"] * 1e3),
                     "model_cycles": latency_model_cycles(stages, bar_cycles, cfg.flops_per_step,
                                                          blocks),
                     "build_s": build_s})
    return rows


def _graph_rows(sweep, cfg, w, x0, ref, plan, build_s) -> list[dict]:
    k1 = _measure_graph(w, x0, ref, 1, plan)
    multi = [(k, _measure_graph(w, x0, ref, k, plan)) for k in plan.graph_ks]
    best_k, best = min(multi, key=lambda kv: kv[1]["us_per_step"])
    rows = []
    for name, k, timing in (("graph_k1", 1, k1), ("graph_best", best_k, best)):
        rows.append({**_shape_cols(sweep, cfg), "variant": name, "threads": 0, "group": 0,
                     "blocks": 0, "k_steps": k, "weights": "global", **timing,
                     "cycles_per_step": float("nan"), "sm_clock_ghz": float("nan"),
                     "validated": True, "error": "", "validated_steps": k, "stop_token": -1,
                     "max_state_err": float("nan"), "state_tol": float("nan"),
                     "barriers_per_step": 0, "barrier_us": float("nan"),
                     "barrier_cycles": float("nan"), "model_us": float("nan"),
                     "model_cycles": float("nan"), "build_s": build_s})
    return rows


def _shape_pass(plan, t0, budget_s, per_shape, rows: list[dict], strict: bool) -> list[str]:
    """Append ``per_shape(sweep, cfg, w, x0, ref)`` rows over the plan's shapes until ``budget_s``
    is spent; return the shapes skipped. Not ``strict``: an error ends the pass (rows kept)."""
    skipped = []
    for i, (sweep, cfg) in enumerate(plan.shapes):
        if time.perf_counter() - t0 > budget_s:
            skipped.append(f"{sweep}:H{cfg.hidden}L{cfg.layers}B{cfg.batch}")
            continue
        print(f"[persistent] {sweep} H={cfg.hidden} L={cfg.layers} B={cfg.batch} "
              f"at {time.perf_counter() - t0:.1f} s", flush=True)
        try:
            w = toy.make_weights(cfg, "cuda")
            x0 = toy.initial_state(cfg, "cuda")
            ref = toy.run_eager(w, x0, plan.n_validate)
            rows += per_shape(sweep, cfg, w, x0, ref)
        except Exception as exc:
            if strict:
                raise
            print(f"[persistent] pass stopped ({type(exc).__name__}: {exc})", flush=True)
            return skipped + [f"{s}:H{c.hidden}L{c.layers}B{c.batch}" for s, c in plan.shapes[i:]]
    return skipped


def run_bench(profile: str, out_dir: Path) -> list[Path]:
    from decodelab.core.device import collect_info
    from decodelab.core.kernel_build import load_persistent

    t0 = time.perf_counter()
    device = collect_info()  # before any kernel runs: a sticky fault later cannot hide the device
    built = load_persistent()
    print(f"[persistent] kernels for {built.arch}: {built.build_s:.1f} s "
          f"({'cached' if built.cached else 'compiled'})", flush=True)
    plan = sweep_plan(profile)
    attrs = dict(built.module.device_attrs())
    warm = warm_up()
    print(f"[persistent] warm-up {warm['seconds']:.2f} s: SM clock {warm['sm_clock_ghz']:.2f} GHz "
          f"(device attribute: {attrs['clock_khz'] / 1e6:.2f} GHz)", flush=True)
    barriers = measure_barriers(built.module, attrs["sms"])
    print(f"[persistent] barriers measured at {time.perf_counter() - t0:.1f} s", flush=True)

    def proven(sweep, cfg, w, x0, ref):
        rows = _variant_rows(sweep, cfg, w, x0, ref, plan, barriers, attrs, built.build_s, 1)
        return rows + ([] if sweep == "tune" else _graph_rows(sweep, cfg, w, x0, ref, plan,
                                                              built.build_s))

    def second(sweep, cfg, w, x0, ref):
        return _variant_rows(sweep, cfg, w, x0, ref, plan, barriers, attrs, built.build_s, 2)

    rows: list[dict] = []
    skipped = _shape_pass(plan, t0, plan.budget_s, proven, rows, strict=True)
    skipped += [f"v2:{s}" for s in _shape_pass(plan, t0, plan.budget_v2_s, second, rows,
                                               strict=False)]
    if skipped:
        print(f"[persistent] not measured (time budget or error): {', '.join(skipped)}",
              flush=True)
    config = {"plan": plan, "device_attrs": attrs, "warm_up": warm, "arch": built.arch,
              "module": built.name,
              "build_s": built.build_s, "build_cached": built.cached, "skipped": skipped}
    paths = [write_table("persistent", rows, out_dir=out_dir, config=config, profile=profile,
                         info=device),
             write_table("persistent_barriers", barriers, out_dir=out_dir, config=config,
                         profile=profile, info=device)]
    print(f"[persistent] bench done in {time.perf_counter() - t0:.1f} s", flush=True)
    return paths


def bench(profile: str, out_dir: Path) -> list[Path]:
    """Validate every variant, then measure and write ``persistent`` and ``persistent_barriers``."""
    check_choice("bench", "profile", profile, PROFILES)
    require_cuda("running the persistent kernels")
    return run_bench(profile, Path(out_dir))
