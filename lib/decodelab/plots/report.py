"""Figures of notebook 05: the layered decomposition of one decode step across regimes."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import NullFormatter

from decodelab.analysis.layers import SHOWN_LAYERS, fmt_us
from decodelab.plots.palette import quantity_color

# One colour per layer (the compute term's parts included), the same in every figure of the
# report (plots.palette).
LAYER_COLORS = {layer: quantity_color(layer) for layer in SHOWN_LAYERS}


def decomposition_figure(terms: pd.DataFrame, regimes: pd.DataFrame, title: str = ""):
    """Left: each regime's step split into layers (share of the step, stacked; a negative part,
    the kernel overlap, is drawn hatched back from the end of the bar, so the bar still ends
    where its positive parts do and the hatch marks how far they over-count the step). Right:
    the step time itself (log scale, interquartile band) with the dominant layer named."""
    order = list(regimes["regime"])
    fig, (ax, ax_t) = plt.subplots(1, 2, figsize=(12, 0.55 * len(order) + 2.2), sharey=True,
                                   gridspec_kw={"width_ratios": [3, 2]})
    y = np.arange(len(order))
    left, negative = np.zeros(len(order)), np.zeros(len(order))
    for layer in SHOWN_LAYERS:
        part = terms[terms["layer"] == layer].set_index("regime")["share"]
        share = part.reindex(order).fillna(0.0).to_numpy()
        negative += share.clip(max=0.0)
        share = share.clip(min=0.0)
        if share.any():
            ax.barh(y, share, left=left, color=LAYER_COLORS[layer], label=layer, height=0.6)
        left += share
    if negative.any():
        ax.barh(y, -negative, left=left + negative, height=0.6, fill=False, hatch="///",
                edgecolor="black", linewidth=0.5, label="overlap (negative part)")
    configs = regimes["config"] if "config" in regimes.columns else [""] * len(order)
    ax.set_yticks(y, [f"{name}\n{cfg}" if cfg else name for name, cfg in zip(order, configs,
                                                                              strict=True)])
    ax.invert_yaxis()
    ax.set_xlim(0, max(1.0, float(left.max()) if len(left) else 1.0))
    ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:.0%}"))
    ax.set_xlabel("share of the step")
    shown = ax.get_legend_handles_labels()[1]
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=max(1, min(5, len(shown))),
              fontsize=8, frameon=False)
    step = regimes["step_us"].to_numpy(dtype=float)
    err = np.vstack([(step - regimes["step_low"]).clip(lower=0).fillna(0),
                     (regimes["step_high"] - step).clip(lower=0).fillna(0)])
    colors = [LAYER_COLORS.get(d, "grey") for d in regimes["dominant"]]
    ax_t.barh(y, step, xerr=err, color=colors, height=0.6)
    ax_t.set_xscale("log")
    ax_t.xaxis.set_minor_formatter(NullFormatter())  # decades only: short ranges stay legible
    ax_t.set_xlabel("µs per step (log)")
    for yi, (s, d) in enumerate(zip(step, regimes["dominant"], strict=True)):
        ax_t.annotate(f" {fmt_us(s)} µs · {d}", (s, yi), va="center", fontsize=8)
    ax_t.set_xlim(right=ax_t.get_xlim()[1] * 3000)  # room for the labels (log axis)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


def empty_figure(message: str):
    """A placeholder that says what data is missing (the report never drops a figure silently)."""
    fig, ax = plt.subplots(figsize=(8, 1.6))
    ax.axis("off")
    ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True)
    return fig
