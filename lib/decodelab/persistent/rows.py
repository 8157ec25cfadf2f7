"""The rows of phase 3's result tables, as frozen dataclasses (one CSV column per field).

A persistent-kernel row and a graph-replay row share one schema (``PersistentRow``): the graph
rows leave the kernel's launch, clock and model fields at their "not applicable" defaults, and
a variant that failed validation keeps ``NO_TIMING``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

NAN = float("nan")


@dataclass(frozen=True, slots=True)
class Shape:
    sweep: str
    hidden: int
    layers: int
    batch: int
    vocab: int
    flops_per_step: int


@dataclass(frozen=True, slots=True)
class Timing:
    """One launch (or graph replays) timed with CUDA events: medians over repeats."""

    steps_per_launch: int = 0
    steps_per_s: float = NAN
    us_per_step: float = NAN
    us_per_step_q1: float = NAN
    us_per_step_q3: float = NAN
    wall_us_per_step: float = NAN
    host_us_total: float = NAN
    host_us_per_step: float = NAN
    host_fraction: float = NAN


NO_TIMING = Timing()


@dataclass(frozen=True, slots=True)
class Launch:
    variant: str
    threads: int = 0
    group: int = 0
    blocks: int = 0
    k_steps: int = 0  # graph rows: steps captured per replay
    weights: str = "global"  # W / W_out / E: registers, shared, global, peers
    lanes_layer: int = 0  # work split: lanes per column and rounds of a layer / the output
    rounds_layer: int = 0
    lanes_out: int = 0
    rounds_out: int = 0


@dataclass(frozen=True, slots=True)
class Clock:
    """The kernel's own clocks: plain build (run clock) and diagnostic build (stage clock)."""

    cycles_per_step: float = NAN
    sm_clock_ghz: float = NAN
    clocked_cycles_per_step: float = NAN  # the diagnostic build's run clock


@dataclass(frozen=True, slots=True)
class Validation:
    validated: bool = True
    error: str = ""
    validated_steps: int = 0
    stop_token: int = -1
    max_state_err: float = NAN
    state_tol: float = NAN


@dataclass(frozen=True, slots=True)
class Model:
    barriers_per_step: int = 0
    barrier_us: float = NAN
    barrier_cycles: float = NAN
    model_cycles: float = NAN  # stage model (model.stage_model_cycles)
    model_us: float = NAN  # the same at the run's SM clock
    model_err: float = NAN  # (model - measured) / measured, in cycles
    peak_model_cycles: float = NAN  # barriers + FMAs at peak rate (model.peak_model_cycles)


@dataclass(frozen=True, slots=True)
class PersistentRow:
    sweep: str
    hidden: int
    layers: int
    batch: int
    vocab: int
    flops_per_step: int
    variant: str
    threads: int
    group: int
    blocks: int
    k_steps: int
    weights: str
    lanes_layer: int
    rounds_layer: int
    lanes_out: int
    rounds_out: int
    steps_per_launch: int
    steps_per_s: float
    us_per_step: float
    us_per_step_q1: float
    us_per_step_q3: float
    wall_us_per_step: float
    host_us_total: float
    host_us_per_step: float
    host_fraction: float
    cycles_per_step: float
    sm_clock_ghz: float
    clocked_cycles_per_step: float
    validated: bool
    error: str
    validated_steps: int
    stop_token: int
    max_state_err: float
    state_tol: float
    barriers_per_step: int
    barrier_us: float
    barrier_cycles: float
    model_cycles: float
    model_us: float
    model_err: float
    peak_model_cycles: float
    build_s: float

    @classmethod
    def of(cls, shape: Shape, launch: Launch, timing: Timing, clock: Clock = Clock(),
           validation: Validation = Validation(), model: Model = Model(),
           build_s: float = NAN) -> PersistentRow:
        parts = (shape, launch, timing, clock, validation, model)
        fields = {f.name: getattr(p, f.name) for p in parts for f in dataclasses.fields(p)}
        return cls(**fields, build_s=build_s)


@dataclass(frozen=True, slots=True)
class StageRow:
    """One stage of one launch, from the diagnostic build: cycles per step."""

    sweep: str
    hidden: int
    layers: int
    batch: int
    vocab: int
    variant: str
    threads: int
    group: int
    stage: str  # layer_0 .. layer_{L-1}, output, token
    index: int
    work_cycles: float  # previous boundary -> last warp's arrival at the stage's barrier
    wait_cycles: float  # that arrival -> thread 0 leaves the barrier (0 for the token stage)


@dataclass(frozen=True, slots=True)
class BarrierRow:
    barrier: str  # syncthreads, grid_sync, cluster_sync
    threads: int
    blocks: int
    us: float
    cycles: float
    sm_clock_ghz: float


# Each table's column units (core.units), the numeric columns of the rows above, which
# plots.tables formats by.
UNITS: dict[str, dict[str, str]] = {
    "persistent": {"hidden": "count", "layers": "count", "batch": "count", "vocab": "count",
                   "flops_per_step": "count", "threads": "count", "group": "count",
                   "blocks": "count", "k_steps": "count", "lanes_layer": "count",
                   "rounds_layer": "count", "lanes_out": "count", "rounds_out": "count",
                   "steps_per_launch": "count", "steps_per_s": "steps/s", "us_per_step": "us",
                   "us_per_step_q1": "us", "us_per_step_q3": "us", "wall_us_per_step": "us",
                   "host_us_total": "us", "host_us_per_step": "us", "host_fraction": "fraction",
                   "cycles_per_step": "cycles", "sm_clock_ghz": "number",
                   "clocked_cycles_per_step": "cycles", "validated_steps": "count",
                   "stop_token": "number", "max_state_err": "number", "state_tol": "number",
                   "barriers_per_step": "count", "barrier_us": "us", "barrier_cycles": "cycles",
                   "model_cycles": "cycles", "model_us": "us", "model_err": "fraction",
                   "peak_model_cycles": "cycles", "build_s": "s"},
    "persistent_stages": {"index": "number", "work_cycles": "cycles", "wait_cycles": "cycles"},
    "persistent_barriers": {"us": "us", "cycles": "cycles"},
}
