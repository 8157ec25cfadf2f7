"""Figures of the serving bench (notebook 04_runtime, tables ``serve_offline``,
``serve_online``, ``serve_steps``). Each takes result-table DataFrames with an ``origin``
column (from ``load_table``) and returns a matplotlib Figure."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from decodelab.plots import use_style
from decodelab.plots.palette import origin_color, origin_label, quantity_color

PERCENTILE_STYLES = {"p50": "-", "p90": "--", "p99": ":"}
VARIANT_MARKERS = "os^Dv"  # by a variant's position among those of the figure


def _origins(frame: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(frame["origin"]))


def offline_vs_floor(offline: pd.DataFrame) -> plt.Figure:
    """Output tokens/s of each offline run (bars) beside the throughput its own steps' floor
    allows (grey); the label is measured / floor in time."""
    use_style()
    groups = list(offline.itertuples(index=False))
    fig, ax = plt.subplots(figsize=(max(6.0, 2.2 * len(groups)), 4.2))
    x = np.arange(len(groups))
    ax.bar(x - 0.2, [g.output_tok_s for g in groups], 0.4, color=[origin_color(g.origin)
                                                                  for g in groups],
           label="measured")
    ax.bar(x + 0.2, [g.floor_output_tok_s for g in groups], 0.4,
           color=quantity_color("memory floor"), label="at the floor of its steps")
    for i, g in enumerate(groups):
        ax.annotate(f"{g.ratio_to_floor:.1f}x", (i - 0.2, g.output_tok_s), ha="center",
                    va="bottom", fontsize=9, xytext=(0, 3), textcoords="offset points")
    ax.set_xticks(x, [f"{origin_label(g.origin)}\n{g.variant}: {g.run}, {g.requests} req"
                      for g in groups], fontsize=8)
    ax.set(yscale="log", ylabel="output tokens/s",
           title="Offline throughput against each run's floor (label: busy time / floor)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def online_latency(online: pd.DataFrame) -> plt.Figure:
    """Against the offered rate: the rate achieved (left, the diagonal is keeping up), TTFT
    percentiles (middle, the TTFT limit dashed) and inter-token latency percentiles (right).
    Colour: origin; marker: engine variant; line style: percentile."""
    use_style()
    fig, (ax_r, ax_t, ax_i) = plt.subplots(1, 3, figsize=(15, 4.2))
    origins = _origins(online)
    variants = list(dict.fromkeys(online["variant"]))
    for (origin, variant), sel in online.groupby(["origin", "variant"], sort=False):
        sel = sel.sort_values("offered_rate")
        kw = dict(color=origin_color(origin), ms=5,
                  marker=VARIANT_MARKERS[variants.index(variant) % len(VARIANT_MARKERS)])
        who = f"{origin_label(origin)}, {variant}"
        ax_r.plot(sel["offered_rate"], sel["request_rate"], label=who, **kw)
        for p, style in PERCENTILE_STYLES.items():
            ax_t.plot(sel["offered_rate"], sel[f"ttft_{p}_ms"], ls=style, label=f"{who} {p}", **kw)
            ax_i.plot(sel["offered_rate"], sel[f"itl_{p}_ms"], ls=style, label=f"{who} {p}", **kw)
    top = online["offered_rate"].max()
    ax_r.plot([0, top], [0, top], color=quantity_color("memory floor"), lw=1,
              label="achieved = offered")
    ax_r.set(xlabel="offered rate (requests/s)", ylabel="achieved rate (requests/s)",
             title="Throughput against offered load")
    ax_t.axhline(online["ttft_limit_s"].iloc[0] * 1e3, color=quantity_color("wall"), lw=1,
                 ls="--")
    ax_t.set(xlabel="offered rate (requests/s)", ylabel="ms", yscale="log",
             title="Time to first token")
    ax_i.set(xlabel="offered rate (requests/s)", ylabel="ms", yscale="log",
             title="Inter-token latency")
    ax_r.legend(fontsize=7)
    ax_t.legend(fontsize=6, ncol=max(1, len(origins)))
    fig.tight_layout()
    return fig


def step_walls(steps: pd.DataFrame, run: str = "offline") -> plt.Figure:
    """One run's steps in order: wall time (black), the step's own device time (green, where
    recorded), floor (grey) and the host's time issuing the step (indigo, where recorded), ms
    per step; steps that prefill (alone or mixed with decode rows) marked where they stand.
    One panel per origin and variant."""
    use_style()
    sel_run = steps[steps["run"] == run]
    panels = list(sel_run.groupby(["origin", "variant"], sort=False))
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 3.2 * len(panels)), squeeze=False)
    for ax, ((origin, variant), sel) in zip(axes[:, 0], panels, strict=True):
        sel = sel.sort_values("step")
        ax.plot(sel["step"], sel["wall_ms"], color=quantity_color("wall"), lw=0.8,
                label="wall per step")
        ax.plot(sel["step"], sel["floor_ms"], color=quantity_color("memory floor"), lw=1.2,
                label="floor of the step")
        if "device_ms" in sel and sel["device_ms"].notna().any():  # a GPU's, since recorded
            ax.plot(sel["step"], sel["device_ms"], color=quantity_color("device busy"), lw=0.6,
                    label="device time of the step")
        if "issue_ms" in sel and sel["issue_ms"].notna().any():  # tables before it lack it
            ax.plot(sel["step"], sel["issue_ms"], color=quantity_color("host CPU"), lw=0.6,
                    label="host issuing the step")
        pre = sel[sel["kind"].isin(["prefill", "mixed"])]
        ax.plot(pre["step"], pre["wall_ms"], "x", color=quantity_color("wall"), ms=5,
                label="prefill or mixed step")
        ax.set(yscale="log", xlabel="step", ylabel="ms",
               title=f"{origin_label(origin)}, {variant}: run {run}")
        ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return fig
