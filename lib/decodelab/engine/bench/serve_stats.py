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
