"""Figures of notebook 00: the measured ceilings per device."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from decodelab.plots import origin_label


def ceilings_figure(table: pd.DataFrame):
    """One small panel per calibrated quantity, a bar per origin with its interquartile range."""
    quantities = list(dict.fromkeys(table["quantity"]))
    fig, axes = plt.subplots(1, len(quantities), figsize=(2.6 * len(quantities), 3.2),
                             squeeze=False)
    for ax, quantity in zip(axes[0], quantities, strict=True):
        rows = table[table["quantity"] == quantity]
        labels = [origin_label(o) for o in rows["origin"]]
        err = [(rows["value"] - rows["q1"]).clip(lower=0), (rows["q3"] - rows["value"]).clip(lower=0)]
        ax.bar(range(len(rows)), rows["value"], yerr=err, color=[f"C{i}" for i in range(len(rows))])
        ax.set_xticks(range(len(rows)), labels, rotation=20, ha="right", fontsize=8)
        ax.set_title(f"{quantity}\n[{rows['unit'].iloc[0]}]", fontsize=9)
    fig.suptitle("Measured ceilings")
    fig.tight_layout()
    return fig
