"""Figures of phase 3 (persistent kernel); each takes a result DataFrame and returns a Figure."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from decodelab.persistent.analysis import MODEL_TOLERANCE, TARGETS, kernels, stage_table
from decodelab.plots import origin_label
from decodelab.plots.palette import mode_color, quantity_color

GRAPHS = {"graph_k1": "graph replay, 1 step", "graph_best": "graph replay, best K steps"}


def _origin_suffix(frame: pd.DataFrame) -> str:
    if "origin" not in frame.columns:
        return ""
    return " — " + ", ".join(sorted({origin_label(o) for o in frame["origin"]}))


# One colour per design, one line style and marker per state exchange (plots.palette has the
# graph replays): 18 variants read as 5 colours x 3 styles, never two variants in one look.
_DESIGN_COLORS = {"fixed": "#0072b2", "wide": "#009e73", "narrow": "#d55e00",
                  "wide_fold": "#cc79a7", "narrow_fold": "#e69f00"}
_EXCHANGE_STYLES = {"block": ("-", "o"), "grid": ("--", "s"), "cluster": (":", "^")}


def _variant_style(variant: str) -> dict:
    exchange, _, design = variant.partition("_")
    ls, marker = _EXCHANGE_STYLES.get(exchange, ("-.", "x"))
    return dict(ls=ls, marker=marker, color=_DESIGN_COLORS.get(design, "#666666"))


def steps_vs_hidden(frame: pd.DataFrame) -> plt.Figure:
    """Steps/s against hidden size (B=1, L=4, V=256) per variant at 256 threads (colour: the
    design; line style and marker: the state exchange), with the graph replay on the same
    shapes (thick grey and black); the legend beside the axes, over no line."""
    rows = frame[(frame["layers"] == 4) & (frame["batch"] == 1) & (frame["vocab"] == 256)]
    timed = kernels(rows)
    timed = timed[(timed["threads"] == 256) & (timed["sweep"].isin(["named", "hidden"]))]
    fig, ax = plt.subplots(figsize=(10, 5))
    for variant, sub in timed.groupby("variant"):
        sub = sub.sort_values("steps_per_s").groupby("hidden").tail(1).sort_values("hidden")
        if len(sub) > 1:
            ax.plot(sub["hidden"], sub["steps_per_s"], ms=5, label=variant,
                    **_variant_style(str(variant)))
    for variant, label in GRAPHS.items():
        sub = rows[rows["variant"] == variant].groupby("hidden")["steps_per_s"].max()
        if len(sub):
            ax.plot(sub.index, sub.values, "-", lw=3, marker="s", label=label,
                    color="#999999" if "k1" in variant else "black")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("hidden size H (L=4, B=1, V=256)")
    ax.set_ylabel("steps / s")
    ax.set_title("Persistent kernel against graph replay" + _origin_suffix(rows))
    ax.legend(fontsize="x-small", ncol=1, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def named_configs(frame: pd.DataFrame) -> plt.Figure:
    """Steps/s of every validated launch on the two named configs, the single-step graph and
    the target marked."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, (name, (target, _)) in zip(axes, TARGETS.items(), strict=True):
        hidden = 64 if name == "ultra-light" else 256
        rows = frame[(frame["hidden"] == hidden) & (frame["layers"] == 4)
                     & (frame["batch"] == 1) & (frame["sweep"] == "named")]
        timed = kernels(rows).sort_values("steps_per_s")
        labels = [f"{v} T{t} G{g}" for v, t, g in
                  zip(timed["variant"], timed["threads"], timed["group"], strict=True)]
        ax.barh(labels, timed["steps_per_s"], color=quantity_color("device busy"))
        graph = rows[rows["variant"] == "graph_k1"]["steps_per_s"]
        if len(graph):
            ax.axvline(graph.max(), color=mode_color("graph"), ls="--",
                       label="graph replay, 1 step")
        ax.axvline(target, color="tab:red", ls=":", label=f"target {target:,.0f}")
        ax.set_xscale("log")
        ax.set_xlabel("steps / s")
        ax.set_title(name)
        ax.tick_params(axis="y", labelsize="x-small")
        ax.legend(fontsize="x-small")
    fig.suptitle("Every variant on the named configs" + _origin_suffix(frame))
    fig.tight_layout()
    return fig


def model_vs_measured(frame: pd.DataFrame) -> plt.Figure:
    """Measured cycles per step against the stage model (filled) and the peak model (open),
    with the ±25% band around model = measured."""
    rows = kernels(frame).dropna(subset=["cycles_per_step", "model_cycles"])
    fig, ax = plt.subplots()
    for exchange, marker in (("block", "o"), ("grid", "s"), ("cluster", "^")):
        sub = rows[rows["variant"].str.startswith(exchange)]
        if len(sub):
            ax.scatter(sub["model_cycles"], sub["cycles_per_step"], marker=marker,
                       label=f"{exchange}: stage model")
            ax.scatter(sub["peak_model_cycles"], sub["cycles_per_step"], marker=marker,
                       facecolors="none", edgecolors="gray", label=f"{exchange}: peak model")
    if len(rows):
        lo = min(rows["model_cycles"].min(), rows["peak_model_cycles"].min(),
                 rows["cycles_per_step"].min())
        hi = max(rows["model_cycles"].max(), rows["cycles_per_step"].max())
        xs = np.geomspace(lo, hi, 50)
        ax.plot(xs, xs, "k:", label="model = measured")
        ax.fill_between(xs, xs / (1 + MODEL_TOLERANCE), xs / (1 - MODEL_TOLERANCE),
                        color="gray", alpha=0.15, label="model within 25%")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("model (SM cycles / step)")
    ax.set_ylabel("measured (SM cycles / step)")
    ax.set_title("Latency models against measurement" + _origin_suffix(rows))
    ax.legend(fontsize="x-small")
    return fig


def stage_breakdown(stages: pd.DataFrame, name: str) -> plt.Figure:
    """Where a step's cycles go on one named config, per launch (diagnostic build). Left: each
    stage's work and the wait at its barrier (hatched, the stage's colour), as shares of the
    launch's step, so that a slow launch does not flatten the others; right: the step's
    cycles on a log axis."""
    wide = stage_table(stages, name)
    fig, (ax, ax_t) = plt.subplots(1, 2, figsize=(12, 0.35 * max(len(wide), 4) + 1.8),
                                   sharey=True, gridspec_kw={"width_ratios": [3, 1.3]})
    if len(wide):
        labels = [f"{v} T{t} G{g}" for v, t, g in
                  zip(wide["variant"], wide["threads"], wide["group"], strict=True)]
        parts = [c for c in wide.columns if c.endswith((" work", " wait"))]
        total = wide[parts].fillna(0).sum(axis=1).to_numpy()
        stage_names = list(dict.fromkeys(c.rsplit(" ", 1)[0] for c in parts))
        colors = plt.get_cmap("tab10")
        left = np.zeros(len(wide))
        for col in parts:
            stage, kind = col.rsplit(" ", 1)
            share = wide[col].fillna(0).to_numpy() / np.where(total > 0, total, 1)
            color = colors(stage_names.index(stage) % 10)
            ax.barh(labels, share, left=left, color=color, alpha=0.45 if kind == "wait" else 1,
                    hatch="//" if kind == "wait" else None, edgecolor="white", label=col)
            left += share
        ax_t.barh(labels, total, color=quantity_color("device busy"))
        for y, cycles in enumerate(total):
            ax_t.annotate(f" {cycles:,.0f}", (cycles, y), va="center", fontsize=7)
        ax_t.set_xscale("log")
        ax_t.set_xlim(right=total.max() * 8)
        ax.tick_params(axis="y", labelsize="x-small")
        ax.invert_yaxis()
    ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:.0%}"))
    ax.set_xlabel("share of the launch's step (diagnostic build)")
    ax_t.set_xlabel("SM cycles per step (log)")
    ax.set_title(f"Stages of one step, {name}" + _origin_suffix(stages))
    ax.legend(fontsize="xx-small", loc="upper left", bbox_to_anchor=(0.0, -0.12), ncol=6)
    fig.tight_layout()
    return fig


def barrier_costs(frame: pd.DataFrame) -> plt.Figure:
    """Measured µs per barrier by kind and size."""
    fig, ax = plt.subplots()
    for name, sub in frame.groupby("barrier"):
        size = sub["threads"] if name == "syncthreads" else sub["blocks"]
        what = "threads" if name == "syncthreads" else "blocks"
        ax.plot(size, sub["us"], marker="o", label=f"{name} (x: {what})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("threads (syncthreads) or blocks (grid, cluster)")
    ax.set_ylabel("µs per barrier")
    ax.set_title("Barrier cost" + _origin_suffix(frame))
    ax.legend(fontsize="small")
    return fig
