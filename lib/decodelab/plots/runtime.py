"""Figures of phase 4b (the runtime loop). Each takes result-table DataFrames (with an
``origin`` column from ``load_table``) and returns a matplotlib Figure."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import NullFormatter

from decodelab.engine.metrics import PHASE_COLS
from decodelab.plots import use_style
from decodelab.plots.palette import origin_color, origin_label, quantity_color

VARIANT_ORDER = ("bare_forward", "engine", "engine_plain", "no_graphs", "no_async_output",
                 "no_static_inputs")


def phase_colors() -> list[str]:
    """One colour per phase column (PHASE_COLS): the forward pass in the compute colour, each
    of the loop's own phases in a hue of its own (plots.palette)."""
    return [quantity_color("compute") if c == "forward_us" else quantity_color(c[:-3])
            for c in PHASE_COLS]


def _origins(df: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(df["origin"])) if "origin" in df else ["local"]


def step_breakdown(steps: pd.DataFrame) -> plt.Figure:
    """Stacked host time per phase, step by step, for each origin and run variant: the emit
    phase without its sync wait, and the sync wait (the host blocked on the device, part of
    emit) as a hatched band of its own, so that the bands add up to the wall, not beyond it."""
    use_style()
    panels = [(o, v) for o in _origins(steps) for v in dict.fromkeys(steps["variant"])
              if ((steps.get("origin", o) == o) & (steps["variant"] == v)).any()]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.4), squeeze=False)
    colors = phase_colors()
    for ax, (origin, variant) in zip(axes[0], panels, strict=True):
        sel = steps[(steps.get("origin", origin) == origin) & (steps["variant"] == variant)]
        sel = sel.sort_values("step")
        x = range(len(sel))
        bands = [sel[c] - (sel["sync_wait_us"] if c == "emit_us" else 0) for c in PHASE_COLS]
        stacks = ax.stackplot(x, *bands, sel["sync_wait_us"],
                              labels=[*(c[:-3] for c in PHASE_COLS), "sync wait (in emit)"],
                              colors=[*colors, quantity_color("sync wait")])
        stacks[-1].set_hatch("///")
        stacks[-1].set_edgecolor(quantity_color("wall"))
        ax.plot(x, sel["wall_us"], color=quantity_color("wall"), lw=1, label="wall per step")
        ax.set(title=f"{origin_label(origin)}: {variant}", xlabel="step (timed window)",
               ylabel="µs", ylim=(0, 1.3 * sel["wall_us"].quantile(0.95)))
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def techniques(runtime: pd.DataFrame) -> plt.Figure:
    """Wall time per steady decode step: bare forward, full engine, one technique off, on a
    log axis (one technique off can cost several times the rest); each bar labelled as a
    multiple of the full engine's step, the ratio the prose quotes."""
    use_style()
    origins = _origins(runtime)
    fig, axes = plt.subplots(1, len(origins), figsize=(6 * len(origins), 3.6), squeeze=False)
    for ax, origin in zip(axes[0], origins, strict=True):
        sel = runtime[runtime.get("origin", origin) == origin].set_index("variant")
        order = [v for v in VARIANT_ORDER if v in sel.index]
        wall = sel.loc[order, "wall_us"]
        ax.barh(order, wall, facecolor="white", edgecolor=quantity_color("wall"))
        engine = float(sel.loc["engine", "wall_us"]) if "engine" in sel.index else float("nan")
        for v, us in wall.items():
            ax.annotate(f" {us:,.0f} µs · {us / engine:.2f}x the engine", (us, v),
                        va="center", fontsize=8)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlim(right=wall.max() * 12)  # room for the labels
        ax.xaxis.set_minor_formatter(NullFormatter())
        batch = int(sel["batch"].iloc[0])
        ax.set(title=f"{origin_label(origin)}: batch {batch}", xlabel="µs per step (log)")
    fig.tight_layout()
    return fig


def host_overhead_vs_batch(batch: pd.DataFrame) -> plt.Figure:
    """Engine and bare-forward step time, and the engine's host time, against batch size."""
    use_style()
    origins = _origins(batch)
    fig, axes = plt.subplots(1, len(origins), figsize=(6 * len(origins), 4), squeeze=False)
    for ax, origin in zip(axes[0], origins, strict=True):
        sel = batch[batch.get("origin", origin) == origin].sort_values("batch")
        for col, style, quantity, label in (
                ("engine_wall_us", "o-", "wall", "engine step (wall)"),
                ("bare_wall_us", "s--", "compute", "bare forward (wall)"),
                ("engine_host_us", "^-", "host CPU", "engine host time"),
                ("orchestration_us", "v:", "orchestration", "host outside the forward")):
            ax.plot(sel["batch"], sel[col], style, color=quantity_color(quantity), label=label)
        ax.set(title=origin_label(origin), xlabel="batch (rows decoding)", ylabel="µs per step",
               xscale="log", yscale="log")
        ax.set_xticks(sel["batch"], [str(b) for b in sel["batch"]])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def sampler(samplers: pd.DataFrame) -> plt.Figure:
    """Sampler time by variant (partial selection vs full sort, greedy, penalties), one
    horizontal bar per variant so that long names never overlap."""
    use_style()
    origins = _origins(samplers)
    height = 0.6 + 0.32 * max(len(samplers[samplers.get("origin", o) == o]) for o in origins)
    fig, axes = plt.subplots(1, len(origins), figsize=(6.5 * len(origins), height),
                             squeeze=False)
    for ax, origin in zip(axes[0], origins, strict=True):
        sel = samplers[samplers.get("origin", origin) == origin]
        ax.barh(sel["variant"], sel["device_us"], color=quantity_color("device busy"),
                label="device (kernels back to back)")
        ax.plot(sel["host_us"], sel["variant"], "o", color=quantity_color("host CPU"),
                label="host time to issue")
        ax.invert_yaxis()
        ax.set(title=f"{origin_label(origin)}: batch {int(sel['batch'].iloc[0])}, "
                     f"vocab {int(sel['vocab'].iloc[0])}", xlabel="µs per call")
    handles, labels = axes[0][0].get_legend_handles_labels()  # below the panels: no overlap
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig


def workload_latency(requests: pd.DataFrame) -> plt.Figure:
    """Time to first token and time per output token of the Poisson workload (ECDFs)."""
    use_style()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for origin in _origins(requests):
        sel = requests[requests.get("origin", origin) == origin]
        label = f"{origin_label(origin)} ({sel['throughput_tok_s'].iloc[0]:.0f} tok/s)"
        for ax, col in zip(axes, ("ttft_ms", "tpot_ms"), strict=True):
            vals = sel[col].dropna().sort_values()
            ax.step(vals, [(i + 1) / len(vals) for i in range(len(vals))], where="post",
                    color=origin_color(origin), label=label)
    axes[0].set(title="time to first token", xlabel="ms", ylabel="fraction of requests",
                xscale="log")
    axes[1].set(title="time per output token", xlabel="ms", xscale="log")
    for ax in axes:
        ax.xaxis.set_minor_formatter(NullFormatter())  # log minor labels overlap
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    return fig
