"""Interleaved timing: every point of a sweep is sampled once per round, rounds repeat.

Timing the points of a sweep one after the other (all repeats of n=1, then all of n=2, ...)
lets slow drift of the machine (clocks, temperature, host load) land on some points and not
on others, and a fit over the sweep then reads that drift as signal. Here all the points are
built first, then each round visits every point once and takes one sample of it; the visiting
order is rotated by one position each round and reversed every other round, so each point
sees every position and both neighbours about equally often. The per-point median over
rounds then carries drift as noise spread over all points, not as a bias of a few.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

from decodelab.core.timing import Timing, TimingConfig, time_cuda
from decodelab.core.validate import check_int

# One untimed call at each visit: the point's graph / kernels were not the last to run, so
# its first call may pay cold caches that a back-to-back sample would not.
VISIT_WARMUP = 1

Timer = Callable[[Callable[[], object], TimingConfig], Timing]


@dataclass(frozen=True, slots=True)
class Point:
    """One point of a sweep: ``fn`` called ``inner`` times back to back per sample."""

    fn: Callable[[], object]
    inner: int


def round_order(keys: Sequence[Hashable], round_index: int) -> list[Hashable]:
    """The visiting order of round ``round_index``: rotated by it, reversed on odd rounds."""
    keys = list(keys)
    shift = round_index % len(keys) if keys else 0
    order = keys[shift:] + keys[:shift]
    return order[::-1] if round_index % 2 else order


def time_interleaved(points: Mapping[Hashable, Point], rounds: int, warmup: int, *,
                     timer: Timer = time_cuda) -> dict[Hashable, Timing]:
    """Per point a :class:`Timing` with one wall/host/device sample per round (per call, s).

    ``warmup`` untimed calls per point before the first round; :data:`VISIT_WARMUP` per visit.
    ``timer`` takes one sample (CUDA events by default; a host timer for tests on the CPU).
    """
    check_int("time_interleaved", "rounds", rounds, 1)
    check_int("time_interleaved", "warmup", warmup, 0)
    for point in points.values():
        for _ in range(warmup):
            point.fn()
    samples: dict[Hashable, tuple[list, list, list]] = {key: ([], [], []) for key in points}
    for r in range(rounds):
        for key in round_order(list(points), r):
            point = points[key]
            t = timer(point.fn, TimingConfig(VISIT_WARMUP, 1, point.inner))
            wall, host, device = samples[key]
            wall.extend(t.wall)
            host.extend(t.host)
            device.extend(t.device or ())
    return {key: Timing(tuple(w), tuple(h), tuple(d)) for key, (w, h, d) in samples.items()}
