"""Notebook 02_replay: its parameters and the helpers it calls (loading, the prose built from
the fits, the stop-mid-chunk trade-off)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pandas as pd

from decodelab.core.params import NotebookParams as BaseParams
from decodelab.core.params import param


@dataclass(frozen=True, slots=True)
class NotebookParams(BaseParams):
    """Parameters of notebook 02_replay (``profile`` and ``interactive`` come from the base)."""

    NOTEBOOK: ClassVar[str] = "02_replay"

    measure_live: bool = param(True, "measure this machine's sweeps (needs a CUDA GPU)")
    p_stop: float = param(0.01, "stop probability per step in the trade-off figures",
                          low=0.0, high=1.0, low_open=True)
    sim_requests: int = param(20000, "requests drawn in the trade-off simulation",
                              low=1, high=10**7)
    seed: int = param(0, "seed of the trade-off simulation", low=0, high=2**32 - 1)


def load() -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """Every stored copy of tables ``replay_nodes`` and ``replay_multistep`` (None if absent)."""
    from decodelab.core.results import stored_tables

    names = ("replay_nodes", "replay_multistep")
    tables = stored_tables(names)
    return tuple(tables.get(t) for t in names)


def meets(r2: float) -> str:
    """Whether a fit's R² reaches :data:`decodelab.replay.fit.R2_TARGET`, in words."""
    from decodelab.replay.fit import R2_TARGET

    return "meets" if r2 >= R2_TARGET else "misses"


def node_summary(fits: pd.DataFrame) -> str:
    """Markdown, one line per origin: T_replay and T_node of a graph, the host's cost per
    replay and an eager launch's cost, each with its interval and its fit's R²."""
    from decodelab.core.results import origin_label
    from decodelab.replay.fit import R2_TARGET

    lines = []
    for origin, f in fits.groupby("origin"):
        def row(kind: str, metric: str, f=f) -> pd.Series:
            return f[(f["kind"] == kind) & (f["metric"] == metric)].iloc[0]

        g, h, e = row("graph", "wall"), row("graph", "host"), row("eager", "wall")
        lines.append(
            f"- **{origin_label(origin)}**: T_replay = {g['intercept']:.2f} µs "
            f"[{g['intercept_ci_low']:.2f}, {g['intercept_ci_high']:.2f}] and T_node = "
            f"{g['slope']:.3f} µs [{g['slope_ci_low']:.3f}, {g['slope_ci_high']:.3f}] per kernel "
            f"inside a graph (R² = {g['r2']:.4f}, {meets(g['r2'])} the {R2_TARGET} target; "
            f"{g['n_excluded']} host-paced points left out by the rule above); the host spends "
            f"{h['intercept']:.2f} µs per replay; an eager launch costs T_launch = "
            f"{e['slope']:.2f} µs [{e['slope_ci_low']:.2f}, {e['slope_ci_high']:.2f}] "
            f"(R² = {e['r2']:.4f}, {meets(e['r2'])} the target), i.e. "
            f"{e['slope'] / g['slope']:.1f}× a graph node.")
    return "\n".join(lines)


def step_summary(fits: pd.DataFrame) -> str:
    """Markdown, one line per fitted (origin, config, variant) of T(K) = T_step + T_replay/K:
    the two terms, where more K stops paying, and both R² with the noise floor they face."""
    from decodelab.core.results import origin_label
    from decodelab.replay.fit import R2_TARGET, snr_needed

    lines = [f"R² target {R2_TARGET}; the per-step form can reach it only where snr ≥ "
             f"{snr_needed():.1f}."]
    for r in fits.itertuples():
        lines.append(
            f"- {origin_label(r.origin)}, **{r.config}**, {r.variant}: T_step = "
            f"{r.t_step_us:.2f} µs, T_replay = {r.t_replay_us:.2f} µs "
            f"[{r.slope_ci_low:.2f}, {r.slope_ci_high:.2f}] per graph"
            + (" (not resolved: its confidence interval reaches below 0, the 1/K term is "
               "within the scatter at this config)" if r.slope_ci_low <= 0 else "")
            + f"; more than K = {r.k_2pct:.0f} steps per graph buys < 2%; at K = {r.k_max} "
            "the per-step wall "
            f"is {100 * r.k_max_rel_dev:+.1f}% from T_step. Per-replay R² = "
            f"{r.r2_per_replay:.4f} ({meets(r.r2_per_replay)} the target); per-step R² = "
            f"{r.r2:.3f} ({meets(r.r2)} it): over the measured K the 1/K term moves the "
            f"per-step time by {100 * r.signal_rel:.2f}% (sd) against a scatter of "
            f"{100 * r.noise_rel:.2f}% about the fit, snr = {r.snr:.1f}.")
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Tradeoff:
    """The stop-mid-chunk trade-off of one fitted config: the chunk model, its curves at three
    stop probabilities, the seeded simulation at ``p_stop`` and how far the two part."""

    origin: str
    config: str
    model: object  # decodelab.replay.tradeoff.ChunkModel
    k_values: list[int]
    analytic: pd.DataFrame
    simulated: pd.DataFrame
    p_stop: float
    best_k: int
    worst_rel_gap: float  # max |simulated / model - 1| of the time per useful token

    def prose(self, n_requests: int, seed: int) -> str:
        from decodelab.core.results import origin_label

        return (f"Model from {origin_label(self.origin)}, config **{self.config}**: R = "
                f"{self.model.t_replay_us:.2f} µs per replay, S = {self.model.t_step_us:.2f} µs "
                f"per step. At p = {self.p_stop:g} the best K is {self.best_k}; the simulation "
                f"({n_requests} requests, seed {seed}) agrees with the model's time per useful "
                f"token within {100 * self.worst_rel_gap:.1f}% over the measured K.")


def tradeoff_of(multi: pd.DataFrame, step_fits: pd.DataFrame, p_stop: float,
                n_requests: int, seed: int) -> Tradeoff:
    """The trade-off of the first fitted (origin, config), variant ``readout`` (the replay
    that streams its tokens to the host): model curves at p/10, p and 10p (capped at 0.5),
    and a seeded simulation on the measured replay times at p."""
    from decodelab.replay.tradeoff import (
        best_k,
        measured_replay_us,
        model_from_fits,
        simulate,
        tradeoff,
    )

    origin, config = step_fits["origin"].iloc[0], step_fits["config"].iloc[0]
    model = model_from_fits(step_fits, config, "readout", origin)
    ks = sorted(int(k) for k in multi["k_steps"].unique())
    probs = sorted({min(p_stop * f, 0.5) for f in (0.1, 1.0, 10.0)})
    analytic = pd.concat([tradeoff(model, ks, p) for p in probs], ignore_index=True)
    simulated = simulate(measured_replay_us(multi, config, "readout", origin), p_stop,
                         n_requests=n_requests, seed=seed)
    both = simulated.merge(analytic[analytic["p_stop"] == p_stop], on="k_steps",
                           suffixes=("_sim", "_model"))
    gap = (both["us_per_useful_token_sim"] / both["us_per_useful_token_model"] - 1).abs().max()
    return Tradeoff(origin, config, model, ks, analytic, simulated, p_stop,
                    best_k(model, p_stop), float(gap))
