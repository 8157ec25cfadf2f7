"""The dispatch benchmark: named configs x modes, and the H/L/B sweep, into table ``dispatch``.

Two passes: first every (config, mode) is built, validated against eager
(:mod:`decodelab.dispatch.check`) and timed; then each is built again and profiled for its
kernel count and GPU-busy time (the profiler must not run before any timing: see
:mod:`decodelab.dispatch.measure`). Compiled modes run on the four named configs only
(compilation takes seconds per config); the sweep varies one factor at a time around the
plan's base config for the eager and CUDA-graph modes.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from decodelab.core.profiles import PROFILES, measured_device
from decodelab.core.validate import check_choice
from decodelab.dispatch.analysis import SWEEP_AXES
from decodelab.dispatch.check import CheckResult, check_against_eager
from decodelab.dispatch.measure import ProfileCounts, StepTiming, profile_counts, time_steps
from decodelab.dispatch.modes import Stepper, make_step
from decodelab.toy import step as toy

TABLE = "dispatch"


@dataclass(frozen=True, slots=True)
class DispatchBenchConfig:
    """What one profile measures, and how long it samples each point."""

    device: str
    base: toy.ToyConfig  # the sweep's centre
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

    @classmethod
    def for_profile(cls, profile: str) -> DispatchBenchConfig:
        """The plan of ``profile`` on its :func:`~decodelab.core.profiles.measured_device`
        (``gpu``: CUDA, refused without it; ``cpu`` and ``smoke``: the CPU backend, eager)."""
        check_choice("dispatch.bench", "profile", profile, PROFILES)
        device = measured_device(profile)
        if profile == "gpu":
            # Around "medium" the eager step crosses from host- to device-bound inside the ranges.
            return cls(device=device, base=toy.named("medium"), named=tuple(toy.NAMED_CONFIGS),
                       named_modes=("eager", "cuda_graph", "compile", "compile_graphs"),
                       sweep_modes=("eager", "cuda_graph"),
                       hidden=(16, 32, 64, 128, 256, 512, 1024, 2048, 4096),
                       layers=(1, 2, 4, 8, 16), batch=(1, 4, 16, 64, 256), repeats=11,
                       target_s=0.005, profile_steps=20, check_steps=100)
        if profile == "cpu":
            return cls(device=device, base=toy.named("h256"),
                       named=("ultra-light", "h256", "medium"), named_modes=("eager",),
                       sweep_modes=("eager",), hidden=(16, 64, 256, 1024), layers=(1, 4, 16),
                       batch=(1, 16, 64), repeats=7, target_s=0.02, profile_steps=10,
                       check_steps=100)
        return cls(device=device, base=toy.named("ultra-light"), named=("ultra-light",),
                   named_modes=("eager",), sweep_modes=("eager",), hidden=(16, 64), layers=(1,),
                   batch=(1,), repeats=3, target_s=1e-3, profile_steps=3, check_steps=100)

    def sweep_configs(self) -> list[toy.ToyConfig]:
        """One factor at a time around ``base`` (the base point once)."""
        configs = [self.base]
        for axis, values in zip(SWEEP_AXES, (self.hidden, self.layers, self.batch), strict=True):
            configs += [self.base.with_(**{axis: v}) for v in values
                        if v != getattr(self.base, axis)]
        return configs


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


Point = tuple[toy.ToyConfig, str, str]  # (config, mode, config name)


def build(point: Point, device: str) -> tuple[Stepper, toy.ToyWeights, torch.Tensor, torch.Tensor]:
    """The stepper of ``point`` from x0, with its weights, x0 and a second start x1."""
    cfg, mode, _ = point
    weights = toy.make_weights(cfg, device)
    x0 = toy.initial_state(cfg, device)
    x1 = toy.initial_state(cfg, device, seed=cfg.seed + 2)
    return make_step(weights, x0, mode), weights, x0, x1


def time_point(point: Point, plan: DispatchBenchConfig) -> tuple[CheckResult, StepTiming, float]:
    """Build, validate against eager, then time one point: (check, timing, setup_s)."""
    stepper, weights, x0, x1 = build(point, plan.device)
    check = check_against_eager(stepper, weights, x0, x1, plan.check_steps)
    timing = time_steps(stepper, on_cuda=plan.device == "cuda", repeats=plan.repeats,
                        target_s=plan.target_s)
    return check, timing, stepper.setup_s


def to_row(point: Point, plan: DispatchBenchConfig, check: CheckResult, t: StepTiming,
           setup_s: float, counts: ProfileCounts) -> DispatchRow:
    cfg, mode, name = point
    on_cuda = plan.device == "cuda"
    idle = max(0.0, 1.0 - counts.device_us / t.wall_us) if on_cuda else math.nan
    bound = "cpu" if not on_cuda else ("host" if t.host_us > counts.device_us else "device")
    return DispatchRow(mode, name, cfg.hidden, cfg.layers, cfg.batch, cfg.vocab, cfg.dtype,
                       plan.device, t.wall_us, t.wall_us_q1, t.wall_us_q3, t.host_us,
                       t.host_us_q1, t.host_us_q3, counts.device_us, counts.kernels,
                       counts.launches, idle, bound, setup_s, 1e6 / t.wall_us, check.n_steps,
                       check.max_state_err, t.inner, t.repeats)


def points(plan: DispatchBenchConfig) -> list[Point]:
    """(config, mode, config name) in measurement order."""
    todo = [(toy.named(n), m, n) for n in plan.named for m in plan.named_modes]
    todo += [(c, m, "sweep") for c in plan.sweep_configs() for m in plan.sweep_modes]
    return todo


def _label(point: Point) -> str:
    cfg, mode, name = point
    return f"{name} H={cfg.hidden} L={cfg.layers} B={cfg.batch} {mode}"


def run(plan: DispatchBenchConfig, log=print) -> tuple[list[DispatchRow], list[str]]:
    """Validate and time every point, then profile each; a failing point is logged and
    skipped. Returns (rows, failures)."""
    timed, failures = {}, []
    for point in points(plan):
        t0 = time.perf_counter()
        try:
            timed[point] = time_point(point, plan)
        except Exception as exc:  # noqa: BLE001 - keep the other points; reported at the end
            failures.append(f"{_label(point)}: {type(exc).__name__}: {exc}")
            log(f"[dispatch] FAILED {_label(point)}: {exc}")
            continue
        _, t, setup_s = timed[point]
        log(f"[dispatch] {_label(point)}: wall {t.wall_us:.1f} µs host {t.host_us:.1f} µs "
            f"setup {setup_s:.2f} s ({time.perf_counter() - t0:.1f} s)")
    rows = []
    for point, (check, t, setup_s) in timed.items():
        try:
            stepper = build(point, plan.device)[0]
            counts = profile_counts(stepper, plan.profile_steps, plan.device == "cuda")
        except Exception as exc:  # noqa: BLE001
            failures.append(f"{_label(point)} (profile): {type(exc).__name__}: {exc}")
            continue
        rows.append(to_row(point, plan, check, t, setup_s, counts))
        log(f"[dispatch] profiled {_label(point)}: device {counts.device_us:.1f} µs, "
            f"{counts.kernels:.1f} kernels, {counts.launches:.1f} launches per step")
    return rows, failures


def bench(profile: str, out_dir: Path) -> list[Path]:
    """``python -m decodelab bench dispatch``: write table ``dispatch`` under ``out_dir``.

    Raises after writing when any point failed validation or measurement.
    """
    from decodelab.core.results import write_table

    plan = DispatchBenchConfig.for_profile(profile)
    with torch.no_grad():
        rows, failures = run(plan, log=lambda s: print(s, flush=True))
    written = [write_table(TABLE, rows, out_dir=out_dir, config=plan, profile=profile)] if rows else []
    if failures:
        raise RuntimeError(f"{len(failures)} dispatch point(s) failed:\n  " + "\n  ".join(failures))
    return written
