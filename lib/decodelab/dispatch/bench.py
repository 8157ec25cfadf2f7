"""The dispatch benchmark: named configs x modes, and the H/L/B sweep, into table ``dispatch``.

Every (config, mode) is validated against eager (:mod:`decodelab.dispatch.check`) before it is
timed (:mod:`decodelab.dispatch.measure`). Compiled modes run on the four named configs only
(compilation takes seconds per config); the sweep varies one factor at a time around
:data:`SWEEP_BASE` for the eager and CUDA-graph modes.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from decodelab import toy
from decodelab.dispatch.check import check_against_eager
from decodelab.dispatch.measure import measure, start_profiler
from decodelab.dispatch.modes import make_step
from decodelab.profiles import PROFILES
from decodelab.validate import ConfigError, check_choice

TABLE = "dispatch"
SWEEP_BASE = toy.NAMED_CONFIGS["h256"]
SWEEP_AXES = ("hidden", "layers", "batch")


@dataclass(frozen=True, slots=True)
class BenchPlan:
    """What one profile measures, and how long it samples each point."""

    device: str
    named: tuple[str, ...]
    named_modes: tuple[str, ...]
    sweep_modes: tuple[str, ...]
    hidden: tuple[int, ...]
    layers: tuple[int, ...]
    batch: tuple[int, ...]
    repeats: int
    target_s: float  # wall time of one timing sample
    profile_steps: int
    check_steps: int

    def sweep_configs(self) -> list[toy.ToyConfig]:
        """One factor at a time around SWEEP_BASE (the base point once)."""
        configs = [SWEEP_BASE]
        for axis, values in zip(SWEEP_AXES, (self.hidden, self.layers, self.batch), strict=True):
            configs += [SWEEP_BASE.with_(**{axis: v}) for v in values
                        if v != getattr(SWEEP_BASE, axis)]
        return configs


def plan_for(profile: str) -> BenchPlan:
    """The plan of ``profile``; ``gpu`` needs CUDA, ``cpu`` measures the CPU backend."""
    check_choice("dispatch.bench", "profile", profile, PROFILES)
    cuda = torch.cuda.is_available()
    if profile == "gpu":
        if not cuda:
            raise ConfigError("dispatch bench profile 'gpu' needs CUDA; use 'cpu' or 'smoke'")
        return BenchPlan("cuda", tuple(toy.NAMED_CONFIGS),
                         ("eager", "cuda_graph", "compile", "compile_graphs"),
                         ("eager", "cuda_graph"),
                         (16, 32, 64, 128, 256, 512, 1024, 2048, 4096), (1, 2, 4, 8, 16),
                         (1, 4, 16, 64, 256), repeats=15, target_s=0.01, profile_steps=20,
                         check_steps=100)
    if profile == "cpu":
        return BenchPlan("cpu", ("ultra-light", "h256", "medium"), ("eager",), ("eager",),
                         (16, 64, 256, 1024), (1, 4, 16), (1, 16, 64), repeats=7, target_s=0.02,
                         profile_steps=10, check_steps=100)
    device = "cuda" if cuda else "cpu"
    modes = ("eager", "cuda_graph") if cuda else ("eager",)
    return BenchPlan(device, ("ultra-light",), modes, modes, (16, 64), (1,), (1,), repeats=3,
                     target_s=1e-3, profile_steps=3, check_steps=100)


@dataclass(frozen=True, slots=True)
class DispatchRow:
    mode: str
    config: str  # a named config, or "sweep"
    hidden: int
    layers: int
    batch: int
    vocab: int
    dtype: str
    backend: str  # "cuda" or "cpu"
    wall_us_per_step: float
    wall_us_q1: float
    wall_us_q3: float
    host_us_per_step: float
    host_us_q1: float
    host_us_q3: float
    device_us_per_step: float
    kernels_per_step: float
    launches_per_step: float
    idle_fraction: float
    bound: str  # "host" when host_us > device_us, "device" otherwise, "cpu" on the CPU backend
    setup_s: float  # capture or compile time, apart from steady state
    steps_per_s: float
    check_steps: int
    max_state_err: float
    inner: int
    repeats: int


def measure_point(cfg: toy.ToyConfig, mode: str, name: str, plan: BenchPlan) -> DispatchRow:
    """Build, validate, then time one (config, mode) on the plan's device."""
    weights = toy.make_weights(cfg, plan.device)
    x0 = toy.initial_state(cfg, plan.device)
    x1 = toy.initial_state(cfg, plan.device, seed=cfg.seed + 2)
    stepper = make_step(weights, x0, mode)
    check = check_against_eager(stepper, weights, x0, x1, plan.check_steps)
    on_cuda = plan.device == "cuda"
    cost = measure(stepper, on_cuda=on_cuda, repeats=plan.repeats, target_s=plan.target_s,
                   profile_steps=plan.profile_steps)
    bound = "cpu" if not on_cuda else ("host" if cost.host_us > cost.device_us else "device")
    return DispatchRow(mode, name, cfg.hidden, cfg.layers, cfg.batch, cfg.vocab, cfg.dtype,
                       plan.device, cost.wall_us, cost.wall_us_q1, cost.wall_us_q3, cost.host_us,
                       cost.host_us_q1, cost.host_us_q3, cost.device_us, cost.kernels,
                       cost.launches, cost.idle_fraction, bound, stepper.setup_s,
                       1e6 / cost.wall_us if cost.wall_us > 0 else math.nan, check.n_steps,
                       check.max_state_err, cost.inner, cost.repeats)


def points(plan: BenchPlan) -> list[tuple[toy.ToyConfig, str, str]]:
    """(config, mode, config name) in measurement order."""
    todo = [(toy.named(n), m, n) for n in plan.named for m in plan.named_modes]
    todo += [(c, m, "sweep") for c in plan.sweep_configs() for m in plan.sweep_modes]
    return todo


def run(plan: BenchPlan, log=print) -> tuple[list[DispatchRow], list[str]]:
    """Measure every point; a failing point is logged and skipped. Returns (rows, failures)."""
    rows, failures = [], []
    for cfg, mode, name in points(plan):
        t0 = time.perf_counter()
        label = f"{name} H={cfg.hidden} L={cfg.layers} B={cfg.batch} {mode}"
        try:
            row = measure_point(cfg, mode, name, plan)
        except Exception as exc:  # noqa: BLE001 - keep the other points; reported at the end
            failures.append(f"{label}: {type(exc).__name__}: {exc}")
            log(f"[dispatch] FAILED {label}: {exc}")
            continue
        rows.append(row)
        log(f"[dispatch] {label}: wall {row.wall_us_per_step:.1f} µs host "
            f"{row.host_us_per_step:.1f} µs device {row.device_us_per_step:.1f} µs kernels "
            f"{row.kernels_per_step:.1f} setup {row.setup_s:.2f} s "
            f"({time.perf_counter() - t0:.1f} s)")
    return rows, failures


def bench(profile: str, out_dir: Path) -> list[Path]:
    """``python -m decodelab bench dispatch``: write table ``dispatch`` under ``out_dir``.

    Raises after writing when any point failed validation or measurement.
    """
    from decodelab.results import write_table

    plan = plan_for(profile)
    if plan.device == "cuda":
        start_profiler()
    with torch.no_grad():
        rows, failures = run(plan, log=lambda s: print(s, flush=True))
    written = [write_table(TABLE, rows, out_dir=out_dir, config=plan, profile=profile)] if rows else []
    if failures:
        raise RuntimeError(f"{len(failures)} dispatch point(s) failed:\n  " + "\n  ".join(failures))
    return written
