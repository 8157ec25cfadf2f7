"""Steady-state cost of one toy step in one dispatch mode.

Definitions (per step; all medians over repeated samples unless stated):

- ``wall``: host clock over ``inner`` back-to-back steps with one device sync at the end, / inner.
- ``host``: CPU time of the issuing thread over the same steps, stopped before the sync
  (``time.thread_time``). It includes driver time spent waiting when the launch queue is full,
  so for strongly device-bound steps it rises towards ``wall``.
- ``device``: GPU-busy time: the union of the intervals of every device activity (kernels,
  memcpy, memset) that ``torch.profiler`` (CUPTI) records over a separate window of
  ``profile_steps`` steps, / profile_steps. Kernels replayed from a CUDA graph are included.
  Timing and profiling are separate passes: once a process has profiled, CUPTI stays attached
  and slows every later launch (pytorch/pytorch#144455), so all timings are taken first.
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

from decodelab.core.profiler import profile_steps
from decodelab.core.timing import TimingConfig, auto_inner, device_sync, time_host
from decodelab.dispatch.modes import Stepper

LAUNCH_PREFIXES = ("cudaLaunch", "cuLaunch", "cudaGraphLaunch", "cuGraphLaunch")
COPY_PREFIXES = ("Memcpy", "Memset")


@dataclass(frozen=True, slots=True)
class ProfileCounts:
    device_us: float  # GPU-busy µs per step (NaN on the CPU backend)
    kernels: float  # device kernels per step (top-level ATen ops on the CPU backend)
    launches: float  # host launch calls per step (same as ``kernels`` on the CPU backend)


@dataclass(frozen=True, slots=True)
class StepTiming:
    wall_us: float
    wall_us_q1: float
    wall_us_q3: float
    host_us: float
    host_us_q1: float
    host_us_q3: float
    inner: int
    repeats: int


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
    """Kernel and launch counts and GPU-busy time per step from one profiled window, after two
    warm-up steps (a freshly built stepper, caches)."""
    events = profile_steps(stepper, n_steps, cuda=on_cuda, warmup=2)
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


def time_steps(stepper: Stepper, *, on_cuda: bool, repeats: int, target_s: float,
               max_inner: int = 4096) -> StepTiming:
    """Wall and host-CPU µs per step of ``stepper`` (already validated; warmed up here)."""
    sync = device_sync if on_cuda else (lambda: None)
    inner = auto_inner(stepper, target_s=target_s, sync=sync, max_inner=max_inner)
    timing = time_host(stepper, TimingConfig(warmup=2, repeats=repeats, inner=inner), sync=sync)
    wall, host = timing.wall_stats().scaled(1e6), timing.host_stats().scaled(1e6)
    return StepTiming(wall.median, wall.q1, wall.q3, host.median, host.q1, host.q3, inner,
                      repeats)
