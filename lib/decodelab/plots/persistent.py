"""Figures of phase 3 (persistent kernel); each takes a result DataFrame and returns a Figure."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from decodelab.plots import origin_label

PERSISTENT = ("block", "grid", "cluster", "block_v2", "grid_v2", "cluster_v2")
GRAPHS = ("graph_k1", "graph_best")
LABELS = {"block": "persistent: block", "grid": "persistent: grid (cooperative)",
          "cluster": "persistent: cluster (sm_90)", "block_v2": "persistent: block v2",
          "grid_v2": "persistent: grid v2", "cluster_v2": "persistent: cluster v2",
          "graph_k1": "graph replay, 1 step", "graph_best": "graph replay, best K steps"}


def timed(frame: pd.DataFrame) -> pd.DataFrame:
    """Persistent-kernel rows that were validated and timed (a failed variant has no timing)."""
    rows = frame[frame["variant"].isin(PERSISTENT)].dropna(subset=["us_per_step"])
    if "validated" in rows:
        rows = rows[rows["validated"].astype(str) == "True"]
    return rows


def _origin_suffix(frame: pd.DataFrame) -> str:
    if "origin" not in frame.columns:
        return ""
    return " — " + ", ".join(sorted({origin_label(o) for o in frame["origin"]}))


def steps_vs_hidden(frame: pd.DataFrame) -> plt.Figure:
    """Steps/s against hidden size (B=1, L=4) per variant, with graph replay on the same shapes."""
    rows = frame[(frame["sweep"] == "hidden")]
    fig, ax = plt.subplots()
    rows = pd.concat([timed(rows), rows[rows["variant"].isin(GRAPHS)]])
    for variant in (*PERSISTENT, *GRAPHS):
        sub = rows[rows["variant"] == variant].sort_values("hidden")
        if len(sub):
            style = "--" if variant in GRAPHS else "-"
            ax.plot(sub["hidden"], sub["steps_per_s"], style, marker="o", label=LABELS[variant])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("hidden size H (L=4, B=1, V=256)")
    ax.set_ylabel("steps / s")
    ax.set_title("Persistent kernel against graph replay" + _origin_suffix(rows))
    ax.legend(fontsize="small")
    return fig


def model_vs_measured(frame: pd.DataFrame) -> plt.Figure:
    """Latency model (barriers x cost + arithmetic) against measurement, per variant: in SM
    cycles (model_cycles vs the kernel's own clock64 cycles_per_step) where the table has them,
    so the comparison does not depend on the clock the SM ran at; else in µs."""
    rows = timed(frame)
    in_cycles = ({"model_cycles", "cycles_per_step"} <= set(rows.columns) and
                 len(rows.dropna(subset=["model_cycles", "cycles_per_step"])) > 0)
    model, measured, unit = (("model_cycles", "cycles_per_step", "SM cycles") if in_cycles
                             else ("model_us", "us_per_step", "µs"))
    rows = rows.dropna(subset=[model, measured])
    fig, ax = plt.subplots()
    for variant in PERSISTENT:
        sub = rows[rows["variant"] == variant]
        if len(sub):
            ax.scatter(sub[model], sub[measured], label=LABELS[variant])
    if len(rows):
        lo = min(rows[model].min(), rows[measured].min())
        hi = max(rows[model].max(), rows[measured].max())
        ax.plot([lo, hi], [lo, hi], "k:", label="model = measured")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"model {unit}/step (stages × barrier + arithmetic)")
    ax.set_ylabel(f"measured {unit}/step")
    ax.set_title("Latency model against measurement" + _origin_suffix(rows))
    ax.legend(fontsize="small")
    return fig


def regime_shift(frame: pd.DataFrame) -> plt.Figure:
    """µs/step split for B=1, L=4 shapes: barrier time, arithmetic, and the rest of the step,
    next to the single-step graph replay (replay gone, compute left)."""
    rows = frame[(frame["sweep"] == "hidden")]
    best = timed(rows).sort_values("us_per_step").groupby("hidden", as_index=False).head(1)
    best = best.sort_values("hidden").reset_index(drop=True)
    graph = rows[rows["variant"] == "graph_k1"].set_index("hidden")["us_per_step"]
    fig, ax = plt.subplots()
    if len(best):
        x = range(len(best))
        barrier = best["barriers_per_step"] * best["barrier_us"]
        arith = (best["model_us"] - barrier).clip(lower=0)
        rest = (best["us_per_step"] - barrier - arith).clip(lower=0)
        ax.bar(x, barrier, label="barriers (measured cost × stages)")
        ax.bar(x, arith, bottom=barrier, label="arithmetic at peak FMA rate")
        ax.bar(x, rest, bottom=barrier + arith, label="rest (latency of loads, shuffles, tanh)")
        ax.plot(x, [graph.get(h, float("nan")) for h in best["hidden"]], "k--o",
                label="graph replay, 1 step")
        ax.set_xticks(list(x), [f"H={h}\n{v}" for h, v in zip(best["hidden"], best["variant"],
                                                              strict=True)])
    ax.set_ylabel("µs / step")
    ax.set_title("Where a step's time goes (fastest variant per H)" + _origin_suffix(rows))
    ax.legend(fontsize="small")
    return fig


def barrier_costs(frame: pd.DataFrame) -> plt.Figure:
    """Measured µs per barrier by kind and size."""
    fig, ax = plt.subplots()
    for name, sub in frame.groupby("barrier"):
        size = sub["threads"] if name == "syncthreads" else sub["blocks"]
        ax.plot(size, sub["us"], marker="o", label=f"{name} (x: {'threads' if name == 'syncthreads' else 'blocks'})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("threads (syncthreads) or blocks (grid, cluster)")
    ax.set_ylabel("µs per barrier")
    ax.set_title("Barrier cost" + _origin_suffix(frame))
    ax.legend(fontsize="small")
    return fig
