"""Figure of notebook 00: the measured ceilings, this machine beside each shipped reference."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from decodelab.plots.palette import origin_color, origin_label
from decodelab.plots.tables import fmt_number

# Calibrations that measure the same ceiling on different backends share a row: a CPU's
# per-op host cost is what a GPU's per-launch host cost is, its memory copy the device copy.
CEILINGS: dict[str, str] = {
    "launch_host": "issue one tiny op, host",
    "op_dispatch_overhead": "issue one tiny op, host",
    "launch_wall": "tiny kernels back to back, wall",
    "d2d_copy_bandwidth": "memory copy (read + write)",
    "memory_copy_bandwidth": "memory copy (read + write)",
    "read_bandwidth": "memory read (read only)",
    "memory_read_bandwidth": "memory read (read only)",
    "h2d_bandwidth": "host → device copy",
    "d2h_bandwidth": "device → host copy",
    "matmul_bf16": "matmul, bf16",
    "matmul_fp32": "matmul, fp32",
}
_LOWER_IS_BETTER = ("us", "ms")


def ceiling_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The calibrations with a shared row label (``ceiling``: what is measured, its unit and
    which way is better), in the order of :data:`CEILINGS`."""
    rows = table.copy()
    name = rows["quantity"].map(CEILINGS).fillna(rows["quantity"].str.replace("_", " "))
    better = np.where(rows["unit"].isin(_LOWER_IS_BETTER), "lower is better", "higher is better")
    unit = rows["unit"].replace({"us": "µs", "ms": "ms"})
    rows["ceiling"] = name + " [" + unit + ", " + better + "]"
    order = {label: i for i, label in enumerate(dict.fromkeys(CEILINGS.values()))}
    rows["_order"] = name.map(order).fillna(len(order))
    return rows.sort_values(["_order", "quantity"]).drop(columns="_order")


def ceilings_figure(table: pd.DataFrame):
    """One horizontal bar per (ceiling, origin) on one log axis: this machine beside each
    reference, the value written at the bar, interquartile range as error bars."""
    rows = ceiling_rows(table)
    labels = list(dict.fromkeys(rows["ceiling"]))
    origins = list(dict.fromkeys(rows["origin"]))
    height = 0.8 / max(1, len(origins))
    fig, ax = plt.subplots(figsize=(10, 0.5 + 0.42 * len(labels) * max(1, len(origins)) ** 0.7))
    for j, origin in enumerate(origins):
        sel = rows[rows["origin"] == origin].set_index("ceiling")
        ys, vals, errs = [], [], []
        for i, label in enumerate(labels):
            if label in sel.index:
                r = sel.loc[label]
                r = r.iloc[0] if isinstance(r, pd.DataFrame) else r
                ys.append(i + (j - (len(origins) - 1) / 2) * height)
                vals.append(r["value"])
                errs.append((max(0.0, r["value"] - r["q1"]), max(0.0, r["q3"] - r["value"])))
        label = origin_label(origin)
        if origin == "local" and "device" in sel:
            label += f" ({sel['device'].iloc[0]})"
        ax.barh(ys, vals, height * 0.9, xerr=np.array(errs).T if errs else None,
                color=origin_color(origin), label=label)
        for y, v in zip(ys, vals, strict=True):
            ax.annotate(f" {fmt_number(v)}", (v, y), va="center", fontsize=8)
    ax.set_yticks(range(len(labels)), labels, fontsize=9)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlim(right=ax.get_xlim()[1] * 8)  # room for the value labels
    ax.set_xlabel("measured value (log scale; unit in each row's label)")
    ax.set_title("Measured ceilings: this machine beside each shipped reference")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def ceilings_markdown(table: pd.DataFrame) -> str:
    """One Markdown line per origin: every calibrated quantity with its value and unit."""
    lines = []
    for origin, rows in table.groupby("origin", sort=False):
        parts = [f"{r.quantity} = {fmt_number(r.value)} {'µs' if r.unit == 'us' else r.unit}"
                 for r in rows.itertuples()]
        lines.append(f"- **{origin_label(origin)}** ({rows['device'].iloc[0]}): "
                     + "; ".join(parts))
    return "\n".join(lines)
