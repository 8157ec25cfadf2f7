"""Derived views of table ``dispatch``: crossovers, eager/graph ratios, nearest sweep point.

Pure pandas over the stored rows, so the notebook and the tests use them on any machine.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from decodelab.core.seed import quoted

SWEEP_AXES = ("hidden", "layers", "batch")  # the axes the dispatch sweep varies, one at a time

# The layered study's phase-1 result on one SM75 GPU: CUDA graphs cut host CPU time per
# decode step by about 15x (seed document 004, "phase1_dispatch").
SEED_CPU_REDUCTION = quoted("graph_cpu_reduction")


def sweep_base(frame: pd.DataFrame) -> dict[str, int]:
    """The centre of a one-factor-at-a-time sweep: per factor, its most frequent value."""
    sweep = frame[frame["config"] == "sweep"]
    return {a: int(sweep[a].mode().iloc[0]) for a in SWEEP_AXES} if not sweep.empty else {}


def along_axis(frame: pd.DataFrame, axis: str) -> pd.DataFrame:
    """Sweep rows that vary ``axis`` only (the other two factors at the sweep's base), sorted."""
    base = sweep_base(frame)
    sweep = frame[frame["config"] == "sweep"]
    if sweep.empty:
        return sweep
    mask = np.logical_and.reduce([sweep[a] == base[a] for a in SWEEP_AXES if a != axis])
    return sweep[mask].sort_values(axis)


def _crossing(values: np.ndarray, ratio: np.ndarray) -> tuple[float, str]:
    """Where log(ratio) crosses 0 going up, interpolated on log2(values)."""
    log_r = np.log(ratio)
    if np.all(log_r >= 0):
        return math.nan, "device-bound throughout"
    if np.all(log_r < 0):
        return math.nan, "host-bound throughout"
    for i in range(len(values) - 1):
        if log_r[i] < 0 <= log_r[i + 1]:
            a, b = math.log2(values[i]), math.log2(values[i + 1])
            frac = -log_r[i] / (log_r[i + 1] - log_r[i])
            return 2 ** (a + frac * (b - a)), "crosses"
    return math.nan, "device-bound at small sizes only"


def crossovers(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (origin, mode, axis): where device-busy time first exceeds host CPU time per step.

    A step is host-bound while the issuing thread needs more time per step than the GPU is busy
    (the GPU idles waiting for work), device-bound after. Returns columns origin, mode, axis,
    crossover (axis value, NaN when there is no crossing in range), status.
    """
    out = []
    group_cols = ["origin", "mode"] if "origin" in frame else ["mode"]
    for keys, rows in frame[frame["backend"] == "cuda"].groupby(group_cols):
        keys = keys if isinstance(keys, tuple) else (keys,)
        for axis in SWEEP_AXES:
            line = along_axis(rows, axis)
            if len(line) < 2:
                continue
            ratio = (line["device_us_per_step"] / line["host_us_per_step"]).to_numpy(float)
            value, status = _crossing(line[axis].to_numpy(float), ratio)
            out.append({**dict(zip(group_cols, keys, strict=True)), "axis": axis, "crossover": value,
                        "status": status})
    return pd.DataFrame(out, columns=[*group_cols, "axis", "crossover", "status"])


def graph_ratios(frame: pd.DataFrame, baseline: str = "eager", fast: str = "cuda_graph"
                 ) -> pd.DataFrame:
    """Per named config (and origin): baseline/fast ratio of host CPU and of wall per step."""
    keys = [k for k in ("origin", "config", "hidden", "layers", "batch") if k in frame]
    named = frame[frame["config"] != "sweep"]
    base = named[named["mode"] == baseline].set_index(keys)
    other = named[named["mode"] == fast].set_index(keys)
    cols = ["host_us_per_step", "wall_us_per_step"]
    joined = base[cols].merge(other[cols], left_index=True, right_index=True,
                              suffixes=("", "_fast"))
    return pd.DataFrame({
        "host_ratio": joined["host_us_per_step"] / joined["host_us_per_step_fast"],
        "wall_ratio": joined["wall_us_per_step"] / joined["wall_us_per_step_fast"],
    }).reset_index()


def nearest_point(frame: pd.DataFrame, hidden: int, layers: int, batch: int) -> pd.DataFrame:
    """The measured rows (every mode) of the config nearest to (H, L, B) in log2 distance."""
    dist = sum((np.log2(frame[k].astype(float)) - math.log2(v)) ** 2
               for k, v in (("hidden", hidden), ("layers", layers), ("batch", batch)))
    best = frame.loc[dist == dist.min()]
    return best.drop_duplicates(subset=["mode"] + (["origin"] if "origin" in best else []))
