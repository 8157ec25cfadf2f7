"""Figures of phase 2 (replay): cost vs kernels per graph, T(K) measured vs fitted, trade-off."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from decodelab.core.interact import DRAWING, interact
from decodelab.plots.palette import mode_color, origin_label

_KIND_COLORS = {"graph": mode_color("graph"), "eager": mode_color("eager")}
_VARIANT_COLORS = {"none": mode_color("graph"), "readout": mode_color("readout")}
_MARKERS = "osD^v"


def _origins(frame: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(frame["origin"])) if "origin" in frame.columns else [""]


def _select(frame: pd.DataFrame, origin: str, **eq) -> pd.DataFrame:
    mask = np.ones(len(frame), dtype=bool)
    if origin and "origin" in frame.columns:
        mask &= (frame["origin"] == origin).to_numpy()
    for key, value in eq.items():
        mask &= (frame[key] == value).to_numpy()
    return frame[mask]


def _label(origin: str) -> str:
    return f" — {origin_label(origin)}" if origin else ""


def nodes_figure(frame: pd.DataFrame, fits: pd.DataFrame):
    """Wall and host time per graph replay (and per n eager launches) vs n, with the line fits."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharex=True)
    for ax, metric in zip(axes, ("wall", "host"), strict=True):
        for i, origin in enumerate(_origins(frame)):
            for kind, color in _KIND_COLORS.items():
                pts = _select(frame, origin, kind=kind).sort_values("n_kernels")
                if pts.empty:
                    continue
                y = pts[f"{metric}_us"]
                err = [y - pts[f"{metric}_us_q1"], pts[f"{metric}_us_q3"] - y]
                ax.errorbar(pts["n_kernels"], y, yerr=err, fmt=_MARKERS[i % 5], color=color,
                            ms=5, label=f"{kind}{_label(origin)}")
                fit = _select(fits, origin, kind=kind, metric=metric)
                if not fit.empty:
                    f = fit.iloc[0]
                    n = np.geomspace(pts["n_kernels"].min(), pts["n_kernels"].max(), 100)
                    ax.plot(n, f["intercept"] + f["slope"] * n, color=color, lw=1, alpha=0.8,
                            label=f"fit {f['intercept']:.2f} + n·{f['slope']:.3f} µs "
                                  f"(R²={f['r2']:.3f})")
        ax.set(xscale="log", yscale="log", xlabel="kernels per graph / per eager call (n)",
               ylabel=f"{metric} time per replay or call (µs)", title=f"{metric} time")
        ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.legend(fontsize=7)
    fig.suptitle("Replay cost vs kernels inside the graph (T = T_replay + n·T_node)")
    fig.tight_layout()
    return fig


def _r2_forms(fit: pd.Series) -> str:
    """R² of the per-step form, and of the per-replay form when the fit row has it."""
    text = f"per step {fit['r2']:.3f}"
    if "r2_per_replay" in fit.index:
        text += f", per replay {fit['r2_per_replay']:.4f}"
    return text


def multistep_figure(frame: pd.DataFrame, fits: pd.DataFrame):
    """Per-step wall time vs K steps per graph, one panel per toy config, fitted T(K) curves."""
    configs = list(dict.fromkeys(frame["config"]))
    fig, axes = plt.subplots(1, len(configs), figsize=(4.5 * len(configs), 4.2), squeeze=False)
    for ax, config in zip(axes[0], configs, strict=True):
        for i, origin in enumerate(_origins(frame)):
            for variant, color in _VARIANT_COLORS.items():
                pts = _select(frame, origin, config=config, variant=variant).sort_values("k_steps")
                if pts.empty:
                    continue
                y = pts["wall_us_per_step"]
                err = [y - pts["wall_us_per_step_q1"], pts["wall_us_per_step_q3"] - y]
                ax.errorbar(pts["k_steps"], y, yerr=err, fmt=_MARKERS[i % 5], color=color, ms=5,
                            label=f"{variant}{_label(origin)}")
                fit = _select(fits, origin, config=config, variant=variant)
                if not fit.empty:
                    f = fit.iloc[0]
                    k = np.geomspace(pts["k_steps"].min(), pts["k_steps"].max(), 100)
                    ax.plot(k, f["t_step_us"] + f["t_replay_us"] / k, color=color, lw=1,
                            label=f"fit {f['t_step_us']:.2f} + {f['t_replay_us']:.2f}/K "
                                  f"(R² {_r2_forms(f)})")
                    ax.axhline(f["t_step_us"], color=color, ls=":", lw=0.8)
        ax.set(xscale="log", xlabel="steps per graph (K)", ylabel="wall per step (µs)",
               title=config)
        ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.legend(fontsize=7)
    fig.suptitle("Multi-step capture: T(K) = T_step + T_replay/K (dotted: fitted T_step)")
    fig.tight_layout()
    return fig


def tradeoff_figure(model: pd.DataFrame, simulated: pd.DataFrame | None = None, *,
                    mark_k: int | None = None):
    """Time per useful token, wasted fraction and time to client vs K (lines: model, markers:
    seeded simulation on measured replay times); ``mark_k`` draws a vertical line."""
    panels = (("us_per_useful_token", "time per useful token (µs)"),
              ("waste_fraction", "wasted fraction of executed steps"),
              ("time_to_client_us", "time to client per replay (µs)"))
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    probs = sorted(model["p_stop"].unique())
    shades = plt.cm.viridis(np.linspace(0.1, 0.8, len(probs)))  # an ordered parameter, not a quantity
    for j, p in enumerate(probs):
        m = model[model["p_stop"] == p].sort_values("k_steps")
        s = None if simulated is None else simulated[simulated["p_stop"] == p]
        for ax, (col, ylabel) in zip(axes, panels, strict=True):
            ax.plot(m["k_steps"], m[col], color=shades[j], label=f"model, p={p:g}")
            if s is not None and not s.empty:
                ax.plot(s["k_steps"], s[col], "o", color=shades[j], ms=5,
                        label=f"simulated, p={p:g}")
            ax.set(xscale="log", yscale="linear" if col == "waste_fraction" else "log",
                   xlabel="steps per graph (K)", ylabel=ylabel)
            ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
    for ax in axes:
        if mark_k is not None:
            ax.axvline(mark_k, color="k", ls="--", lw=0.8, label=f"K = {mark_k}")
    axes[0].legend(fontsize=7)
    fig.suptitle("Stopping mid-chunk: what larger K costs (stop probability p per step)")
    fig.tight_layout()
    return fig


def explorer_point(model, k_values, k: int, p: float) -> None:
    """What the explorer shows at (K, p): one line of the model's numbers and the trade-off
    figure with K marked, drawn and shown under ``core.interact.DRAWING``: one point at a time,
    when JupyterLab runs two slider callbacks at once (matplotlib is not thread-safe)."""
    from IPython.display import Markdown, display

    from decodelab.replay.tradeoff import best_k, tradeoff

    with DRAWING:
        frame = tradeoff(model, list(k_values), p)
        row = tradeoff(model, [k], p).iloc[0]
        display(Markdown(
            f"K = {k}, p = {p:g}: {row['us_per_useful_token']:.2f} µs per useful token, "
            f"{100 * row['waste_fraction']:.1f}% of executed steps wasted, tokens reach the "
            f"client every {row['time_to_client_us']:.0f} µs (best K for this p: "
            f"{best_k(model, p)})"))
        tradeoff_figure(frame, mark_k=k)
        plt.show()


def explorer(model, k_values, p_stop: float, *, interactive: bool):
    """Choose K and the stop probability; show the model's trade-off at that point.

    ``model`` is a :class:`decodelab.replay.tradeoff.ChunkModel`. Without ``interactive`` (or
    without ipywidgets) it shows the static figure at the best K for ``p_stop``.
    """
    from decodelab.replay.tradeoff import best_k

    def show(k: int, p: float):
        explorer_point(model, k_values, k, p)

    if interactive:
        try:
            import ipywidgets as widgets
        except ImportError:
            interactive = False
    if not interactive:
        return show(best_k(model, p_stop), p_stop)
    k_slider = widgets.SelectionSlider(options=list(k_values), value=list(k_values)[0],
                                       description="K")
    p_slider = widgets.FloatLogSlider(value=p_stop, base=10, min=-4, max=-0.3, step=0.05,
                                      description="p stop")
    return interact(show, k=k_slider, p=p_slider)
