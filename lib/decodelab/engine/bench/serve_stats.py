"""Latency statistics of ``bench serve``: percentiles, inter-token gaps, the saturation rate.
Imports no torch."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

PERCENTILES = (50, 90, 99)
TTFT_LIMIT_S = 1.0  # the online runs report the lowest rate whose TTFT p99 exceeds this


def percentiles(values: Iterable[float], qs: Sequence[float] = PERCENTILES) -> tuple[float, ...]:
    """The ``qs`` percentiles (linear interpolation between order statistics, numpy's default)
    of the finite ``values``; NaN for each where none is finite."""
    x = np.asarray([v for v in values if math.isfinite(v)], dtype=float)
    if x.size == 0:
        return tuple(math.nan for _ in qs)
    return tuple(float(v) for v in np.percentile(x, qs))


def gaps(times: Sequence[float]) -> list[float]:
    """Differences between consecutive times (a request's inter-token latencies)."""
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def first_rate_over(rates: Sequence[float], values: Sequence[float], limit: float) -> float:
    """The lowest of ``rates`` whose value exceeds ``limit``; NaN where none does."""
    over = [r for r, v in zip(rates, values, strict=True) if v > limit]
    return min(over) if over else math.nan


def over_median(kinds: Sequence[str], walls: Sequence[float], factor: float = 3.0
                ) -> tuple[dict[str, float], int]:
    """The median time per step kind, and how many steps exceed ``factor`` times their kind's
    median (a cold shape, a collection, a host stall: what a server's tail is made of)."""
    by_kind: dict[str, list[float]] = {}
    for k, w in zip(kinds, walls, strict=True):
        by_kind.setdefault(k, []).append(w)
    medians = {k: float(np.median(v)) for k, v in by_kind.items()}
    over = sum(w > factor * medians[k] for k, w in zip(kinds, walls, strict=True))
    return medians, int(over)
