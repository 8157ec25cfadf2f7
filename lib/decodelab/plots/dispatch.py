"""Figures of phase 1 (dispatch), each from a slice of table ``dispatch``."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from decodelab.dispatch.analysis import SWEEP_AXES, along_axis
from decodelab.dispatch.modes import MODES
from decodelab.plots.palette import origin_label, quantity_color

COLORS = {q: quantity_color(q) for q in ("device busy", "GPU idle", "host CPU", "wall")}
MODE_STYLE = {"eager": "-", "cuda_graph": "--", "compile": ":", "compile_graphs": "-."}


def _title(frame: pd.DataFrame) -> str:
    if "origin" not in frame or frame.empty:
        return ""
    return ", ".join(sorted({origin_label(o) for o in frame["origin"]}))


def _modes(frame: pd.DataFrame) -> list[str]:
    return [m for m in MODES if m in set(frame["mode"])]


def stacked_bars(frame: pd.DataFrame) -> plt.Figure:
    """Per named config, per mode: wall split into device-busy and GPU-idle (stacked), with the
    host CPU time per step as a bar beside it. CPU-backend rows show wall and host only."""
    named = frame[frame["config"] != "sweep"]
    configs = list(dict.fromkeys(named["config"]))
    fig, axes = plt.subplots(1, max(1, len(configs)), figsize=(3.6 * max(1, len(configs)), 4.2),
                             squeeze=False)
    for ax, config in zip(axes[0], configs, strict=False):
        rows = named[named["config"] == config].set_index("mode")
        modes = [m for m in _modes(rows.reset_index()) if m in rows.index]
        x = np.arange(len(modes))
        wall = rows.loc[modes, "wall_us_per_step"].to_numpy(float)
        busy = rows.loc[modes, "device_us_per_step"].to_numpy(float)
        host = rows.loc[modes, "host_us_per_step"].to_numpy(float)
        has_device = ~np.isnan(busy)
        if has_device.any():
            busy_shown = np.where(has_device, np.minimum(busy, wall), 0.0)
            ax.bar(x - 0.2, busy_shown, 0.38, color=COLORS["device busy"], label="device busy")
            ax.bar(x - 0.2, wall - busy_shown, 0.38, bottom=busy_shown, color=COLORS["GPU idle"],
                   label="GPU idle (wall − busy)")
        else:  # the CPU backend: no device to be busy or idle, only the wall clock
            ax.bar(x - 0.2, wall, 0.38, facecolor="white", edgecolor=COLORS["wall"],
                   label="wall (no device)")
        ax.bar(x + 0.2, host, 0.38, color=COLORS["host CPU"], label="host CPU (issue)")
        ax.set_xticks(x, [m.replace("_", "\n") for m in modes])
        ax.set_title(config)
        ax.set_ylabel("µs per step")
    axes[0][0].legend(fontsize=8, loc="upper right")
    fig.suptitle(f"Where a toy step's time goes — {_title(frame)}".rstrip(" —"))
    fig.tight_layout()
    return fig


def crossover_figure(frame: pd.DataFrame, marks: pd.DataFrame | None = None) -> plt.Figure:
    """Host CPU (green) and device-busy (blue) µs per step along each sweep axis, per mode;
    a vertical line marks where the step turns device-bound (from ``crossovers``)."""
    fig, axes = plt.subplots(1, len(SWEEP_AXES), figsize=(13, 4.2), squeeze=False)
    for ax, axis in zip(axes[0], SWEEP_AXES, strict=True):
        line = along_axis(frame, axis)
        for mode in _modes(line):
            rows = line[line["mode"] == mode]
            style = MODE_STYLE[mode]
            ax.plot(rows[axis], rows["host_us_per_step"], style, marker="o", ms=3,
                    color=COLORS["host CPU"], label=f"host CPU, {mode}")
            if rows["device_us_per_step"].notna().any():
                ax.plot(rows[axis], rows["device_us_per_step"], style, marker="s", ms=3,
                        color=COLORS["device busy"], label=f"device busy, {mode}")
            if marks is not None and not marks.empty:
                hit = marks[(marks["mode"] == mode) & (marks["axis"] == axis)]
                for value in hit["crossover"].dropna():
                    ax.axvline(value, ls=style, color="grey", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel({"hidden": "hidden H", "layers": "layers L", "batch": "batch B"}[axis])
        ax.set_ylabel("µs per step")
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=4,
                   bbox_to_anchor=(0.5, -0.08))
    fig.suptitle(f"Host-bound → device-bound crossover (grey lines) — {_title(frame)}"
                 .rstrip(" —"))
    fig.tight_layout()
    return fig


def ratio_figure(ratios: pd.DataFrame, seed_ratio: float) -> plt.Figure:
    """Eager/graph ratio of host CPU and of wall time per named config, against the seed."""
    fig, ax = plt.subplots(figsize=(7, 4))
    x = np.arange(len(ratios))
    ax.bar(x - 0.2, ratios["host_ratio"], 0.38, color=COLORS["host CPU"], label="host CPU ratio")
    ax.bar(x + 0.2, ratios["wall_ratio"], 0.38, facecolor="white", edgecolor=COLORS["wall"],
           label="wall ratio")
    ax.axhline(seed_ratio, color="black", ls="--", lw=1,
               label=f"seed (SM75): ~{seed_ratio:g}x host CPU")
    ax.set_xticks(x, list(ratios["config"]))
    ax.set_yscale("log")
    ax.set_ylabel("eager / cuda_graph")
    ax.legend(fontsize=8)
    ax.set_title(f"What a CUDA graph removes per step — {_title(ratios)}".rstrip(" —"))
    fig.tight_layout()
    return fig


def point_figure(rows: pd.DataFrame) -> plt.Figure:
    """One config, every mode: wall (outline), host CPU and device-busy µs per step side by
    side, in the colours of every other figure; the origin is in the title."""
    fig, ax = plt.subplots(figsize=(7, 3.8))
    modes = _modes(rows)
    x = np.arange(len(modes))
    shown = rows.drop_duplicates("mode").set_index("mode")
    for i, (col, name) in enumerate((("wall_us_per_step", "wall"),
                                     ("host_us_per_step", "host CPU"),
                                     ("device_us_per_step", "device busy"))):
        values = shown.loc[modes, col].to_numpy(float)
        if np.isnan(values).all():
            continue
        style = (dict(facecolor="white", edgecolor=COLORS[name]) if name == "wall"
                 else dict(color=COLORS[name]))
        ax.bar(x + (i - 1) * 0.27, np.nan_to_num(values), 0.26, label=name, **style)
    ax.set_xticks(x, modes)
    ax.set_ylabel("µs per step")
    if not shown.empty:
        first = shown.iloc[0]
        ax.set_title(f"H={first['hidden']} L={first['layers']} B={first['batch']} "
                     f"({first['config']}) — {_title(rows)}".rstrip(" —"))
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
