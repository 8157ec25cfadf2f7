"""Latency models of one persistent step, in SM cycles (no clock assumed). Pure arithmetic.

- stage model: the step is its stages, each ended by a barrier except the token stage:
  ``sum(stage work) + barriers x (the barrier's cost measured alone)``, where a stage's work is
  what the diagnostic build's stage clock measured (from the previous barrier to the last warp's
  arrival, its stores made visible). It predicts the plain build's cycles per step when the
  barriers cost inside the kernel what they cost alone; where it misses, the barriers (their
  skew across blocks) or the stage clock's own cost are what it leaves out.
- peak model (the first model, kept for contrast): barriers plus the FMAs at the peak rate of
  the SMs in use (128 FMA lanes x 2 flop per clock per SM). It explains little of a step: the
  arithmetic is not what a step waits for.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

FLOP_PER_CLK_PER_SM = 256.0
BARRIER_OF = {"block": "syncthreads", "grid": "grid_sync", "cluster": "cluster_sync"}


def peak_model_cycles(stages: int, barrier_cycles: float, flops: float, blocks: int,
                      flop_per_clk_per_sm: float = FLOP_PER_CLK_PER_SM) -> float:
    """Barriers in measured cycles plus the FMAs at the peak rate of ``blocks`` SMs."""
    if stages < 0 or barrier_cycles < 0 or flops < 0 or blocks < 1:
        raise ValueError("peak_model_cycles: stages, barrier_cycles, flops >= 0; blocks >= 1")
    return stages * barrier_cycles + flops / (blocks * flop_per_clk_per_sm)


def stage_model_cycles(work: Sequence[float], barriers: int, barrier_cycles: float) -> float:
    """Sum of the stages' work plus ``barriers`` barriers at their cost measured alone."""
    if barriers < 0 or barrier_cycles < 0 or any(w < 0 for w in work):
        raise ValueError("stage_model_cycles: work, barriers, barrier_cycles >= 0")
    return float(sum(work)) + barriers * barrier_cycles


def relative_error(model: float, measured: float) -> float:
    """(model - measured) / measured; NaN when either is missing."""
    if not (math.isfinite(model) and math.isfinite(measured)) or measured <= 0:
        return float("nan")
    return (model - measured) / measured


def barrier_for(barriers: Sequence[Mapping], exchange: str, threads: int, blocks: int,
                column: str = "cycles") -> float:
    """Measured cycles (or ``column``) of the barrier an exchange uses, at the nearest size:
    threads for __syncthreads, blocks per row for grid.sync and cluster.sync."""
    kind = BARRIER_OF[exchange]
    rows = [r for r in barriers if r["barrier"] == kind]
    if not rows:
        return float("nan")
    key, size = ("threads", threads) if kind == "syncthreads" else ("blocks", blocks)
    return float(min(rows, key=lambda r: abs(r[key] - size)).get(column, float("nan")))
