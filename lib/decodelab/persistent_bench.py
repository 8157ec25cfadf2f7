"""Phase-3 measurements: persistent variants against graph replay, barrier costs, latency model.

Tables written by :func:`run_bench`:
- ``persistent``: one row per (sweep, variant, shape): steps/s and µs/step (device time of one
  launch of N steps / N), host CPU time per launch, the launch plan, validation outcome and the
  latency model; the single-step graph (``graph_k1``) and the best multi-step graph
  (``graph_best``) of phase 2 measured in the same run on the same shapes.
- ``persistent_barriers``: µs per barrier (__syncthreads, grid.sync, cluster.sync) by size.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from decodelab import graphs, persistent, toy
from decodelab.results import write_table
from decodelab.timing import TimingConfig, time_cuda

V = 256  # vocabulary of every sweep (the seed's ultra-light and h256 configs)


@dataclass(frozen=True, slots=True)
class SweepPlan:
    shapes: tuple[tuple[str, toy.ToyConfig], ...]  # (sweep name, shape)
    n_validate: int
    graph_ks: tuple[int, ...]
    target_launch_s: float  # device time aimed for per timed launch
    repeats: int
    budget_s: float  # shapes left when this much time has passed are skipped (and said so)


def sweep_plan(profile: str) -> SweepPlan:
    def cfg(h: int, n_layers: int, b: int) -> toy.ToyConfig:
        return toy.ToyConfig(hidden=h, layers=n_layers, batch=b, vocab=V)

    if profile != "gpu":
        shapes = (("hidden", cfg(64, 4, 1)), ("batch", cfg(64, 2, 2)))
        return SweepPlan(shapes, 200, (8,), 2e-3, 3, 60.0)
    # The named shapes first (ultra-light, h256), so a budget cut never loses them.
    shapes = [("hidden", cfg(h, 4, 1)) for h in (64, 256, 16, 32, 128, 512, 1024)]
    shapes += [("layers", cfg(h, n, 1)) for h in (64, 256) for n in (1, 2, 8)]
    shapes += [("batch", cfg(h, 4, b)) for h in (64, 256) for b in (8, 32)]
    # Launch alternatives (threads, blocks per row) on the two named shapes.
    shapes[2:2] = [("tune", cfg(64, 4, 1)), ("tune", cfg(256, 4, 1))]
    return SweepPlan(tuple(shapes), 1000, (16, 64), 5e-3, 5, 75.0)


def latency_model_us(stages: int, barrier_us: float, flops: float, blocks: int, clock_hz: float,
                     flop_per_clk_per_sm: float = 256.0) -> float:
    """Per-step time: ``stages`` barriers plus the FMAs spread over ``blocks`` SMs (fp32 FMA rate
    of one SM: 128 lanes x 2 flop per clock)."""
    if stages < 0 or barrier_us < 0 or flops < 0 or blocks < 1 or clock_hz <= 0:
        raise ValueError("latency_model_us: stages, barrier_us, flops >= 0; blocks >= 1; clock > 0")
    return stages * barrier_us + flops / (blocks * flop_per_clk_per_sm * clock_hz) * 1e6


def barrier_for(barriers: list[dict], variant: str, threads: int, blocks: int) -> float:
    """Measured µs of the barrier a variant uses, at the nearest measured size."""
    kind = {"block": "syncthreads", "grid": "grid_sync", "cluster": "cluster_sync"}[variant]
    size = threads if kind == "syncthreads" else blocks
    rows = [r for r in barriers if r["barrier"] == kind]
    if not rows:
        return float("nan")
    key = "threads" if kind == "syncthreads" else "blocks"
    return min(rows, key=lambda r: abs(r[key] - size))["us"]


def measure_barriers(ext, sms: int) -> list[dict]:
    """µs per barrier from two launches of the same kernel (many vs few iterations)."""
    sink = torch.zeros(1, dtype=torch.int32, device="cuda")
    sizes = [("syncthreads", 0, t, 1) for t in (256, 512)]
    sizes += [("grid_sync", 1, 256, b) for b in sorted({1, 2, 8, 32, sms})]
    if persistent.cluster_available():
        sizes += [("cluster_sync", 2, 256, b) for b in (2, 4, 8, 16)]
    rows = []
    for name, kind, threads, blocks in sizes:
        few, many = 100, 20_100
        try:
            per = [time_cuda(lambda n=n, k=kind, t=threads, b=blocks: ext.barrier(k, t, b, n, sink),
                             TimingConfig(warmup=2, repeats=5, inner=1)).device_stats().median
                   for n in (few, many)]
        except RuntimeError as exc:  # e.g. a 16-block cluster refused on this part
            print(f"[persistent] barrier {name} x{blocks}: not measured ({exc})", flush=True)
            continue
        rows.append({"barrier": name, "threads": threads, "blocks": blocks,
                     "us": (per[1] - per[0]) / (many - few) * 1e6})
    return rows


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
    return _time_launches(lambda: persistent.run(w, x0, n_steps, kcfg=kcfg), n_steps, plan.repeats)


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


def launch_configs(sweep: str, cluster: bool) -> list[persistent.KernelConfig]:
    """The default launch per variant; for the ``tune`` sweep, the alternatives as well."""
    K = persistent.KernelConfig  # noqa: N806
    if sweep != "tune":
        out = [K("block", 512), K("grid", 256)] + ([K("cluster", 256)] if cluster else [])
        return out
    out = [K("block", 256), K("grid", 512), K("grid", 256, 2), K("grid", 256, 4)]
    if cluster:
        out += [K("cluster", t, g) for t in (256, 512) for g in (2, 4, 8, 16)]
    return out


def _variant_rows(sweep, cfg, w, x0, ref, plan, barriers, attrs, build_s) -> list[dict]:
    rows = []
    stop = persistent.stop_token_for(ref)
    for kcfg in launch_configs(sweep, persistent.cluster_available()):
        variant = kcfg.variant
        info = persistent.plan(cfg, kcfg)
        if not info["ok"]:
            print(f"[persistent] {variant} {cfg}: not run ({info['why']})", flush=True)
            continue
        try:
            check = persistent.validate(w, x0, ref, kcfg)
            stop_check = persistent.validate(w, x0, ref, kcfg, stop=stop)
        except RuntimeError as exc:  # a launch the device refuses (e.g. a 16-block cluster)
            print(f"[persistent] {kcfg} {cfg}: launch refused ({exc})", flush=True)
            continue
        if not (check.ok and stop_check.ok):
            raise AssertionError(f"persistent {kcfg} {cfg}: {check.describe()}; "
                                 f"with stop token {stop}: {stop_check.describe()}")
        timing = _measure_variant(w, x0, kcfg, plan)
        bar = barrier_for(barriers, variant, kcfg.threads, info["blocks"])
        stages = cfg.layers + 1
        rows.append({**_shape_cols(sweep, cfg), "variant": variant, "threads": kcfg.threads,
                     "group": info["group"], "blocks": info["blocks"], "k_steps": 0,
                     "weights": f"{info['w_place']}/{info['wout_place']}/{info['e_place']}",
                     **timing, "validated_steps": plan.n_validate, "stop_token": stop,
                     "max_state_err": check.max_state_err, "state_tol": check.state_tol,
                     "barriers_per_step": stages, "barrier_us": bar,
                     "model_us": latency_model_us(stages, bar, cfg.flops_per_step,
                                                  info["blocks"], attrs["clock_khz"] * 1e3),
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
                     "validated_steps": k, "stop_token": -1, "max_state_err": float("nan"),
                     "state_tol": float("nan"), "barriers_per_step": 0,
                     "barrier_us": float("nan"), "model_us": float("nan"), "build_s": build_s})
    return rows


def run_bench(profile: str, out_dir: Path) -> list[Path]:
    from decodelab.kernel_build import load_persistent

    t0 = time.perf_counter()
    built = load_persistent()
    print(f"[persistent] kernels for {built.arch}: {built.build_s:.1f} s "
          f"({'cached' if built.cached else 'compiled'})", flush=True)
    plan = sweep_plan(profile)
    attrs = dict(built.module.device_attrs())
    barriers = measure_barriers(built.module, attrs["sms"])
    print(f"[persistent] barriers measured at {time.perf_counter() - t0:.1f} s", flush=True)
    rows, skipped = [], []
    for sweep, cfg in plan.shapes:
        if time.perf_counter() - t0 > plan.budget_s:
            skipped.append(f"{sweep}:H{cfg.hidden}L{cfg.layers}B{cfg.batch}")
            continue
        print(f"[persistent] {sweep} H={cfg.hidden} L={cfg.layers} B={cfg.batch} "
              f"at {time.perf_counter() - t0:.1f} s", flush=True)
        w = toy.make_weights(cfg, "cuda")
        x0 = toy.initial_state(cfg, "cuda")
        ref = toy.run_eager(w, x0, plan.n_validate)
        rows += _variant_rows(sweep, cfg, w, x0, ref, plan, barriers, attrs, built.build_s)
        if sweep != "tune":
            rows += _graph_rows(sweep, cfg, w, x0, ref, plan, built.build_s)
    if skipped:
        print(f"[persistent] time budget {plan.budget_s:.0f} s spent; skipped {', '.join(skipped)}",
              flush=True)
    config = {"plan": plan, "device_attrs": attrs, "arch": built.arch, "module": built.name,
              "build_s": built.build_s, "build_cached": built.cached, "skipped": skipped}
    paths = [write_table("persistent", rows, out_dir=out_dir, config=config, profile=profile),
             write_table("persistent_barriers", barriers, out_dir=out_dir, config=config,
                         profile=profile)]
    print(f"[persistent] bench done in {time.perf_counter() - t0:.1f} s", flush=True)
    return paths
