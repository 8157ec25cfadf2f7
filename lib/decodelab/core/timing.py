"""One place for timing: warm-up, repetition, host and CUDA-event timers, robust statistics.

Vocabulary (its home is this docstring; code, tables and plots use these names as defined):
- wall time per step: host clock over ``inner`` steps with one synchronisation at the end, / inner.
- host time per step: CPU time of the issuing thread over the same steps, before the sync, / inner.
- device time per step: CUDA-event elapsed time over the same steps, / inner.
- per step, not per token: a decode step of B rows makes B tokens (``ms_per_step``;
  ``tokens_per_s`` = B / wall time per step).

Clocks are injectable so the statistics can be tested exactly with fake clocks.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class Stats:
    """Robust summary of repeated samples (same unit as the samples)."""

    median: float
    q1: float
    q3: float
    ci_low: float
    ci_high: float
    mean: float
    min: float
    n: int

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    def scaled(self, factor: float) -> Stats:
        """The same summary in another unit (e.g. seconds -> microseconds)."""
        return Stats(*(v * factor for v in (self.median, self.q1, self.q3, self.ci_low,
                                             self.ci_high, self.mean, self.min)), n=self.n)


def bootstrap_ci(samples: Sequence[float], *, level: float = 0.95, n_boot: int = 2000,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of the median."""
    x = np.asarray(samples, dtype=float)
    if x.size == 0:
        raise ValueError("bootstrap_ci needs at least one sample, got 0")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level={level!r} must lie in (0, 1)")
    if x.size == 1:
        return float(x[0]), float(x[0])
    rng = np.random.default_rng(seed)
    medians = np.median(x[rng.integers(0, x.size, size=(n_boot, x.size))], axis=1)
    alpha = (1.0 - level) / 2.0
    return float(np.quantile(medians, alpha)), float(np.quantile(medians, 1.0 - alpha))


def summarize(samples: Sequence[float], *, level: float = 0.95, seed: int = 0) -> Stats:
    """Median, quartiles, bootstrap CI of the median, mean, min and count."""
    x = np.asarray(samples, dtype=float)
    if x.size == 0:
        raise ValueError("summarize needs at least one sample, got 0")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"summarize got non-finite samples: {x[~np.isfinite(x)][:3].tolist()}")
    q1, med, q3 = np.quantile(x, [0.25, 0.5, 0.75])
    lo, hi = bootstrap_ci(x, level=level, seed=seed)
    return Stats(float(med), float(q1), float(q3), lo, hi, float(x.mean()), float(x.min()),
                 int(x.size))


@dataclass(frozen=True, slots=True)
class TimingConfig:
    """How a region is timed: ``warmup`` untimed calls, then ``repeats`` samples of ``inner`` calls."""

    warmup: int = 5
    repeats: int = 20
    inner: int = 100

    def __post_init__(self) -> None:
        for name, low in (("warmup", 0), ("repeats", 1), ("inner", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"TimingConfig.{name}={value!r}: must be an integer >= {low}")


@dataclass(frozen=True, slots=True)
class Timing:
    """Per-call samples in seconds: one wall, host-CPU and (optional) device sample per repeat."""

    wall: tuple[float, ...]
    host: tuple[float, ...]
    device: tuple[float, ...] | None = None

    def wall_stats(self) -> Stats:
        return summarize(self.wall)

    def host_stats(self) -> Stats:
        return summarize(self.host)

    def device_stats(self) -> Stats | None:
        return None if self.device is None else summarize(self.device)


def _noop() -> None:
    return None


def time_host(fn: Callable[[], object], cfg: TimingConfig = TimingConfig(), *,
              sync: Callable[[], None] = _noop, before_each: Callable[[], None] = _noop,
              wall_clock: Clock = time.perf_counter,
              cpu_clock: Clock = time.thread_time) -> Timing:
    """Time ``fn`` with host clocks.

    Each sample runs ``fn`` ``cfg.inner`` times back to back. The host-CPU clock stops
    before ``sync`` (host time = issue cost); the wall clock stops after it. ``before_each``
    runs untimed before every sample, after the previous one has synchronised (restore an input
    the calls change, meet other processes at a barrier).
    """
    for _ in range(cfg.warmup):
        fn()
    sync()
    wall, host = [], []
    for _ in range(cfg.repeats):
        before_each()
        w0, c0 = wall_clock(), cpu_clock()
        for _ in range(cfg.inner):
            fn()
        c1 = cpu_clock()
        sync()
        w1 = wall_clock()
        wall.append((w1 - w0) / cfg.inner)
        host.append((c1 - c0) / cfg.inner)
    return Timing(tuple(wall), tuple(host))


def time_cuda(fn: Callable[[], object], cfg: TimingConfig = TimingConfig(), *,
              stream=None, before_each: Callable[[], None] = _noop,
              wall_clock: Clock = time.perf_counter,
              cpu_clock: Clock = time.thread_time) -> Timing:
    """Time ``fn`` on the current CUDA stream: wall, host-CPU and CUDA-event time per call.
    ``before_each`` runs untimed before every sample (see :func:`time_host`), followed by a
    device synchronisation so its work stays out of the sample."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("time_cuda needs a CUDA GPU; none is visible to torch")
    stream = stream or torch.cuda.current_stream()
    for _ in range(cfg.warmup):
        fn()
    torch.cuda.synchronize()
    wall, host, device = [], [], []
    for _ in range(cfg.repeats):
        if before_each is not _noop:
            before_each()
            torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        w0, c0 = wall_clock(), cpu_clock()
        start.record(stream)
        for _ in range(cfg.inner):
            fn()
        end.record(stream)
        c1 = cpu_clock()
        end.synchronize()
        w1 = wall_clock()
        wall.append((w1 - w0) / cfg.inner)
        host.append((c1 - c0) / cfg.inner)
        device.append(start.elapsed_time(end) * 1e-3 / cfg.inner)
    return Timing(tuple(wall), tuple(host), tuple(device))


def median_times(fn: Callable[[], object], cuda: bool, cfg: TimingConfig = TimingConfig(), *,
                 before_each: Callable[[], None] = _noop) -> tuple[float, float, float]:
    """(wall, host, device) seconds per call, medians: CUDA events on a GPU (``cuda``), host
    clocks on a CPU, where the device time is the wall time (the host does the work)."""
    if cuda:
        t = time_cuda(fn, cfg, before_each=before_each)
        return t.wall_stats().median, t.host_stats().median, t.device_stats().median
    t = time_host(fn, cfg, before_each=before_each)
    return t.wall_stats().median, t.host_stats().median, t.wall_stats().median


def time_graph_replays(graph, reps: int) -> float:
    """Seconds per replay of a captured CUDA graph: one untimed replay, then ``reps`` replays
    between two CUDA events (back to back, so launch gaps between replays are included)."""
    import torch

    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3 / reps


@contextlib.contextmanager
def cpu_threads(n: int):
    """Run a block with ``n`` torch CPU threads (tiny-model CPU steps are a few hundred small
    ops; with one thread, thread-pool wake-ups no longer dominate and scatter them)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def device_sync(device=None) -> None:
    """Wait for the work queued on ``device``: a CUDA device synchronises (``None``: the current
    one; as a ``sync`` argument of :func:`time_host`), any other device has none to wait for."""
    import torch

    if device is None or torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def auto_inner(fn: Callable[[], object], *, target_s: float = 2e-3, sync: Callable[[], None] = _noop,
               max_inner: int = 1 << 20, wall_clock: Clock = time.perf_counter) -> int:
    """Smallest power of two of calls whose wall time reaches ``target_s`` (fewer clock reads
    per call for very short regions)."""
    n = 1
    while n < max_inner:
        t0 = wall_clock()
        for _ in range(n):
            fn()
        sync()
        if wall_clock() - t0 >= target_s:
            break
        n *= 2
    return n


def copy_bandwidth_gb_s(device, nbytes: int, cfg: TimingConfig) -> float:
    """Device-to-device (or host memory) copy rate, bytes read + written per second / 1e9."""
    import torch

    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).uniform_()
    dst = torch.empty_like(src)
    if device.type == "cuda":
        t = time_cuda(lambda: dst.copy_(src), cfg).device_stats().median
    else:
        t = time_host(lambda: dst.copy_(src), cfg).wall_stats().median
    return 2 * nbytes / t / 1e9
