"""Figures of phase 5 (tensor parallelism). Each takes result-table DataFrames (with an
``origin`` column from ``load_table``) and returns a matplotlib Figure."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import NullFormatter

from decodelab.parallel.analysis import decomposition
from decodelab.plots import use_style
from decodelab.plots.palette import mode_color, origin_label, origin_marker, quantity_color

_TP_STYLES = {1: "-", 2: "--", 4: "-.", 8: ":"}


def _panels(df: pd.DataFrame) -> list[tuple[str, str]]:
    """(origin, model) pairs in order of appearance."""
    return list(dict.fromkeys(zip(df["origin"], df["model"], strict=True)))


def _grid(n: int, width: float = 5.5, height: float = 4.0):
    fig, axes = plt.subplots(1, n, figsize=(width * n, height), squeeze=False)
    return fig, axes[0]


def decode_vs_batch(tp: pd.DataFrame) -> plt.Figure:
    """ms per decode step against batch size, one line per (TP size, mode), a panel per model."""
    use_style()
    panels = _panels(tp)
    fig, axes = _grid(len(panels))
    for ax, (origin, model) in zip(axes, panels, strict=True):
        sel = tp[(tp["origin"] == origin) & (tp["model"] == model)]
        for (n, mode), g in sel.groupby(["tp", "mode"]):
            g = g.sort_values("batch")
            ax.plot(g["batch"], g["ms_per_step"], marker="o", ls=_TP_STYLES.get(int(n), ":"),
                    color=mode_color(mode), label=f"TP={n}, {mode}")
        ax.set(xscale="log", yscale="log", xlabel="batch (sequences decoding)",
               ylabel="ms per step (one token per sequence)",
               title=f"{origin_label(origin)}\n{model}")
        ax.set_xticks(sorted(sel["batch"].unique()), labels=sorted(sel["batch"].unique()))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def step_decomposition(tp: pd.DataFrame, mode: str = "graph") -> plt.Figure:
    """Per model, for each batch: the TP=1 step beside the TP=n step split into compute (the
    step with its collectives left out) and communication (what they add); a marker shows the
    same collectives run alone."""
    use_style()
    d = decomposition(tp)
    d = d[d["mode"] == mode]
    panels = _panels(d)
    fig, axes = _grid(len(panels), width=6.5)
    for ax, (origin, model) in zip(axes, panels, strict=True):
        sel = d[(d["origin"] == origin) & (d["model"] == model)]
        batches = sorted(sel["batch"].unique())
        x = range(len(batches))
        one = sel[sel["tp"] == 1].set_index("batch").reindex(batches)
        many = sel[sel["tp"] > 1].set_index("batch").reindex(batches)
        w = 0.38
        compute, comm = quantity_color("compute"), quantity_color("communication")
        ax.bar([i - w / 2 for i in x], one["compute_ms"], w, facecolor="white", edgecolor=compute,
               hatch="///", label="TP=1 step (all compute)")
        ax.bar([i + w / 2 for i in x], many["compute_ms"], w, color=compute,
               label="TP=n compute (collectives left out)")
        ax.bar([i + w / 2 for i in x], many["comm_ms"], w, bottom=many["compute_ms"],
               color=comm, label="TP=n communication (T_comm)")
        ax.scatter([i + w / 2 for i in x], many["comm_alone_ms"], marker="_", s=250,
                   color=quantity_color("wall"), zorder=3, label="the collectives alone")
        ax.set_xticks(list(x), labels=batches)
        ax.set(xlabel="batch", ylabel="ms per step",
               title=f"{origin_label(origin)}\n{model}, {mode}")
    handles, labels = axes[0].get_legend_handles_labels()  # below the panels, over no bar
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def all_reduce_sweep(coll: pd.DataFrame) -> plt.Figure:
    """All-reduce latency (left) and bus bandwidth (right) against message size, eager and
    replayed from a CUDA graph; wall time solid, host time dotted."""
    use_style()
    fig, (lat, bw) = plt.subplots(1, 2, figsize=(12, 4.2))
    origins = list(dict.fromkeys(coll["origin"]))
    for (origin, mode), g in coll.groupby(["origin", "mode"], sort=False):
        g = g.sort_values("nbytes")
        label = f"{origin_label(origin)}, {mode}"
        style = dict(marker=origin_marker(origins, origin), ms=3, color=mode_color(mode))
        lat.plot(g["nbytes"], g["us_per_op"], label=label, **style)
        lat.plot(g["nbytes"], g["host_us_per_op"], ls=":", color=mode_color(mode),
                 label=f"{label} (host)")
        bw.plot(g["nbytes"], g["busbw_gb_s"], label=label, **style)
    lat.set(xscale="log", yscale="log", xlabel="message (bytes)", ylabel="µs per all-reduce",
            title="latency")
    bw.set(xscale="log", xlabel="message (bytes)", ylabel="bus bandwidth (GB/s)",
           title="bus bandwidth (nccl-tests convention)")
    lat.legend(fontsize=7)
    bw.legend(fontsize=7)
    fig.tight_layout()
    return fig
