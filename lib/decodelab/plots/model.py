"""Figures of notebook 04_model (the real-shaped model over a paged KV cache). Each takes the
frames of :mod:`decodelab.model.analysis` and returns a matplotlib Figure."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import NullFormatter

from decodelab.plots.palette import mode_color, origin_label, quantity_color
from decodelab.plots.tables import fmt_number

_CONTEXT_STYLES = ("-", "--", "-.", ":")


def _origins(frame: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(frame["origin"]))


def _batch_axis(ax, batches) -> None:
    ticks = sorted(int(b) for b in set(batches))
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(b) for b in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())


def step_vs_batch(view: pd.DataFrame) -> plt.Figure:
    """Per origin: ms per step against batch (left; mode by colour, context by line style, the
    HBM floor in grey) and the same steps as a share of that floor, % of roofline (right)."""
    origins = _origins(view)
    fig, axes = plt.subplots(len(origins), 2, figsize=(12, 4.2 * len(origins)), squeeze=False)
    for (ax, ax_r), origin in zip(axes, origins, strict=True):
        sel = view[view["origin"] == origin]
        contexts = sorted(sel["context"].unique())
        for ci, context in enumerate(contexts):
            style = _CONTEXT_STYLES[ci % len(_CONTEXT_STYLES)]
            at = sel[sel["context"] == context]
            for mode, g in at.groupby("mode"):
                g = g.sort_values("batch")
                kw = dict(ls=style, marker="o", ms=4, color=mode_color(mode))
                ax.plot(g["batch"], g["ms_per_step"], label=f"{mode}, context {context}", **kw)
                ax_r.plot(g["batch"], g["roofline_fraction"], label=f"{mode}, context {context}",
                          **kw)
            floor = at.drop_duplicates("batch").sort_values("batch")
            ax.plot(floor["batch"], floor["floor_ms"], ls=style, color=quantity_color(
                "memory floor"), lw=2, alpha=0.7, label=f"memory floor, context {context}")
        model = sel["model"].iloc[0]
        ax.set(yscale="log", xlabel="batch (sequences decoding)", ylabel="ms per step",
               title=f"{origin_label(origin)}: {model}, step time")
        ax_r.set(xlabel="batch (sequences decoding)", ylabel="% of roofline",
                 title="bytes / copy bandwidth ÷ step time", ylim=(0, 1))
        ax_r.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:.0%}"))
        for a in (ax, ax_r):
            _batch_axis(a, sel["batch"])
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def tokens_vs_transformers(vs: pd.DataFrame) -> plt.Figure:
    """Tokens/s of our eager and graph step beside transformers' generate (default and static
    cache), per origin and batch, log scale; the label is our speed-up over the faster peer."""
    modes = [m for m in ("eager", "graph", "hf_dynamic", "hf_static") if m in vs.columns]
    groups = list(vs.itertuples(index=False))
    fig, ax = plt.subplots(figsize=(max(6.0, 2.6 * len(groups)), 4.2))
    width = 0.8 / len(modes)
    for j, mode in enumerate(modes):
        x = np.arange(len(groups)) + (j - (len(modes) - 1) / 2) * width
        ax.bar(x, [getattr(g, mode) for g in groups], width * 0.95, color=mode_color(mode),
               label=mode)
    for i, g in enumerate(groups):
        top = max(getattr(g, m) for m in modes if pd.notna(getattr(g, m)))
        ax.annotate(f"{g.speedup:.1f}x", (i, top), ha="center", va="bottom", fontsize=9,
                    xytext=(0, 4), textcoords="offset points")
    ax.set_xticks(range(len(groups)), [f"{origin_label(g.origin)}\n{g.model}, batch {g.batch}"
                                       for g in groups], fontsize=8)
    ax.set(yscale="log", ylabel="tokens/s (decode only)",
           title="Our paged model against transformers' generate (label: ours / faster peer)")
    ax.legend(fontsize=8, ncol=len(modes))
    fig.tight_layout()
    return fig


def kernel_profile(profile: pd.DataFrame) -> plt.Figure:
    """One graph step's kernels (left: µs per step; right: the rate each reached where its
    bytes are known, against the measured copy bandwidth)."""
    origins = _origins(profile)
    fig, axes = plt.subplots(len(origins), 2, figsize=(12, 0.5 + 0.42 * len(profile)),
                             squeeze=False, gridspec_kw={"width_ratios": [3, 2]})
    for (ax, ax_bw), origin in zip(axes, origins, strict=True):
        sel = profile[profile["origin"] == origin].sort_values("us_per_step", ascending=False)
        y = np.arange(len(sel))
        labels = [f"{n} ({r})" for n, r in zip(sel["name"], sel["role"], strict=True)]
        ax.barh(y, sel["us_per_step"], color=quantity_color("compute"))
        for yi, (us, share) in enumerate(zip(sel["us_per_step"], sel["share"], strict=True)):
            ax.annotate(f" {fmt_number(us)} µs · {share:.0%}", (us, yi), va="center", fontsize=8)
        ax.set_yticks(y, labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(right=sel["us_per_step"].max() * 1.35)
        batch, context = int(sel["batch"].iloc[0]), int(sel["context"].iloc[0])
        ax.set(xlabel="µs per step", title=f"{origin_label(origin)}: one graph step, batch "
                                           f"{batch}, context {context}")
        known = sel["tb_s"].notna().to_numpy()
        ax_bw.barh(y[known], sel["tb_s"][known], color=quantity_color("compute"))
        copy = (sel["tb_s"] / sel["of_ceiling"]).dropna()
        if not copy.empty:
            ax_bw.axvline(copy.iloc[0], color=quantity_color("memory floor"), ls="--",
                          label=f"{sel['ceiling'].iloc[0]} {copy.iloc[0]:.2f} TB/s")
            ax_bw.legend(fontsize=8, loc="lower right")
        ax_bw.set_yticks(y, [""] * len(y))
        ax_bw.set_ylim(ax.get_ylim())
        ax_bw.set(xlabel="TB/s reached (bytes the shapes say it must move)",
                  title="bandwidth per kernel")
    fig.tight_layout()
    return fig


def attention_bandwidth(marginal: pd.DataFrame) -> plt.Figure:
    """The K/V read rate attention reached at long context (extra bytes / extra time between
    the shortest and longest context), per batch, against the ceiling of the floors (the read
    ceiling, or the copy bandwidth standing in)."""
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for origin in _origins(marginal):
        sel = marginal[marginal["origin"] == origin].sort_values("batch")
        ax.plot(sel["batch"], sel["kv_tb_s"], marker="o", color=quantity_color("compute"),
                label=f"{origin_label(origin)}: K/V read rate")
        copy = (sel["kv_tb_s"] / sel["of_ceiling"]).dropna()
        if not copy.empty:
            ax.axhline(copy.iloc[0], color=quantity_color("memory floor"), ls="--",
                       label=f"{origin_label(origin)}: {sel['ceiling'].iloc[0]}")
    _batch_axis(ax, marginal["batch"])
    top = max(marginal["kv_tb_s"].max(), (marginal["kv_tb_s"] / marginal["of_ceiling"]).max())
    ax.set(ylim=(0, 1.15 * top), xlabel="batch (sequences decoding)", ylabel="TB/s",
           title="Attention at long context: extra K/V bytes / extra step time")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig
