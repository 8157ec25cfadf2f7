"""Steady-state cost of one toy step in one dispatch mode.

Definitions (per step; all medians over repeated samples unless stated):

- ``wall``: host clock over ``inner`` back-to-back steps with one device sync at the end, / inner.
- ``host``: CPU time of the issuing thread over the same steps, stopped before the sync
  (``time.thread_time``). It includes driver time spent waiting when the launch queue is full,
  so for strongly device-bound steps it rises towards ``wall``.
- ``device``: GPU-busy time: the union of the intervals of every device activity (kernels,
  memcpy, memset) that ``torch.profiler`` (CUPTI) records over a separate window of
  ``profile_steps`` steps, / profile_steps. Kernels replayed from a CUDA graph are included.
- ``kernels``: device kernels executed per step in that window (memcpy/memset not counted);
  ``launches``: host launch calls per step (kernel launches and graph launches).
- ``idle_fraction`` = 1 - device / wall (the share of the step the GPU waits for the host).

On the CPU backend there is no device: ``device`` and ``idle_fraction`` are NaN and
``kernels``/``launches`` count the top-level ATen operator calls per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from decodelab.dispatch.modes import Stepper
from decodelab.timing import TimingConfig, auto_inner, cuda_sync, time_host

LAUNCH_PREFIXES = ("cudaLaunch", "cuLaunch", "cudaGraphLaunch", "cuGraphLaunch")
COPY_PREFIXES = ("Memcpy", "Memset")


@dataclass(frozen=True, slots=True)
class ProfileCounts:
    device_us: float  # GPU-busy µs per step (NaN on the CPU backend)
    kernels: float  # device kernels per step (top-level ATen ops on the CPU backend)
    launches: float  # host launch calls per step (same as ``kernels`` on the CPU backend)


@dataclass(frozen=True, slots=True)
class StepCost:
    wall_us: float
    wall_us_q1: float
    wall_us_q3: float
    host_us: float
    host_us_q1: float
    host_us_q3: float
    device_us: float
    kernels: float
    launches: float
    inner: int
    repeats: int

    @property
    def idle_fraction(self) -> float:
        if math.isnan(self.device_us):
            return math.nan
        return max(0.0, 1.0 - self.device_us / self.wall_us)


def _busy_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (µs)."""
    total, end = 0.0, -math.inf
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def profile_counts(stepper: Stepper, n_steps: int, on_cuda: bool) -> ProfileCounts:
    """Kernel and launch counts and GPU-busy time per step from one profiled window."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(n_steps):
            stepper()
        if on_cuda:
            torch.cuda.synchronize()
    events = prof.events()
    if not on_cuda:
        ops = [e for e in events if e.name.startswith("aten::") and e.cpu_parent is None]
        return ProfileCounts(math.nan, len(ops) / n_steps, len(ops) / n_steps)
    device = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    kernels = [e for e in device if not e.name.startswith(COPY_PREFIXES)]
    launches = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU
                and e.name.startswith(LAUNCH_PREFIXES)]
    busy = _busy_us([(e.time_range.start, e.time_range.end) for e in device])
    return ProfileCounts(busy / n_steps if device else math.nan, len(kernels) / n_steps,
                         len(launches) / n_steps)


def start_profiler() -> None:
    """Initialise the profiler (CUPTI) once, so its start-up cost stays out of the first point."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
        torch.ones(1, device="cuda").add_(1)
        torch.cuda.synchronize()


def measure(stepper: Stepper, *, on_cuda: bool, repeats: int, target_s: float,
            profile_steps: int, max_inner: int = 4096) -> StepCost:
    """Time ``stepper`` (already validated and warmed up), then profile it separately."""
    sync = cuda_sync if on_cuda else (lambda: None)
    inner = auto_inner(stepper, target_s=target_s, sync=sync, max_inner=max_inner)
    timing = time_host(stepper, TimingConfig(warmup=2, repeats=repeats, inner=inner), sync=sync)
    wall, host = timing.wall_stats().scaled(1e6), timing.host_stats().scaled(1e6)
    counts = profile_counts(stepper, profile_steps, on_cuda)
    return StepCost(wall.median, wall.q1, wall.q3, host.median, host.q1, host.q3,
                    counts.device_us, counts.kernels, counts.launches, inner, repeats)
