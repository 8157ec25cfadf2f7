"""The cost of running K decode steps blindly per graph replay when a request may stop.

A request stops after each step with probability p (its length L is geometric on 1, 2, ...,
mean 1/p). With K steps per replay it runs ceil(L/K) replays, executes ceil(L/K)*K steps and
wastes the rest of its last chunk; its tokens reach the client once per replay. With a replay
of cost R + K*S (R: per-replay fixed cost including the token readout, S: per-step time)::

    E[replays]            = 1 / (1 - q^K)                       q = 1 - p
    wasted fraction       = 1 - (1 - q^K) / (p K)               (0 at K = 1)
    time per useful token = p (R + K S) / (1 - q^K)
    time to client        = R + K S                             (one replay per delivery)

:func:`simulate` checks the analytic model by drawing request lengths with a seeded RNG and
charging each replay its measured wall time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from decodelab.core.validate import ConfigError, check_float, check_int


@dataclass(frozen=True, slots=True)
class ChunkModel:
    """Per-replay fixed cost and per-step time, in µs (from :func:`replay_fit.fit_multistep`)."""

    t_replay_us: float
    t_step_us: float

    def __post_init__(self) -> None:
        check_float("ChunkModel", "t_replay_us", self.t_replay_us, 0.0, 1e9)
        check_float("ChunkModel", "t_step_us", self.t_step_us, 0.0, 1e9, low_open=True)

    def replay_us(self, k) -> np.ndarray:
        return self.t_replay_us + np.asarray(k, dtype=float) * self.t_step_us


def _check_k(owner: str, k_values: Sequence[int]) -> np.ndarray:
    if len(k_values) == 0:
        raise ConfigError(f"{owner}: k_values must not be empty")
    for k in k_values:
        check_int(owner, "k", int(k) if isinstance(k, np.integer) else k, 1, 1 << 20)
    return np.asarray(k_values, dtype=float)


def tradeoff(model: ChunkModel, k_values: Sequence[int], p_stop: float) -> pd.DataFrame:
    """Analytic waste, time per useful token and time to client for each K."""
    check_float("tradeoff", "p_stop", p_stop, 0.0, 1.0, low_open=True)
    k = _check_k("tradeoff", k_values)
    survive = (1.0 - p_stop) ** k  # P(L > K)
    replays = 1.0 / (1.0 - survive)
    executed = replays * k
    useful = 1.0 / p_stop
    return pd.DataFrame({
        "k_steps": k.astype(int), "p_stop": p_stop,
        "executed_steps": executed, "useful_steps": useful,
        "wasted_steps": executed - useful,
        "waste_fraction": 1.0 - useful / executed,
        "us_per_useful_token": replays * model.replay_us(k) / useful,
        "time_to_client_us": model.replay_us(k),
        "source": "model",
    })


def best_k(model: ChunkModel, p_stop: float, k_max: int = 1024) -> int:
    """The K (1 .. k_max) with the least time per useful token."""
    check_int("best_k", "k_max", k_max, 1, 1 << 20)
    frame = tradeoff(model, np.arange(1, k_max + 1), p_stop)
    return int(frame.loc[frame["us_per_useful_token"].idxmin(), "k_steps"])


def simulate(replay_us: Mapping[int, float], p_stop: float, *, n_requests: int = 20000,
             seed: int = 0) -> pd.DataFrame:
    """Seeded simulation: geometric request lengths, each replay charged its measured wall time.

    ``replay_us`` maps K to the measured wall time of one K-step replay (with token readout).
    """
    check_float("simulate", "p_stop", p_stop, 0.0, 1.0, low_open=True)
    check_int("simulate", "n_requests", n_requests, 1, 10**8)
    ks = _check_k("simulate", list(replay_us))
    lengths = np.random.default_rng(seed).geometric(p_stop, size=n_requests)  # (n_requests,)
    rows = []
    for k in ks.astype(int):
        replays = -(-lengths // k)  # ceil(L / K) per request
        executed = replays * k
        time_us = replays * replay_us[k]
        rows.append({
            "k_steps": k, "p_stop": p_stop,
            "executed_steps": executed.mean(), "useful_steps": lengths.mean(),
            "wasted_steps": (executed - lengths).mean(),
            "waste_fraction": 1.0 - lengths.sum() / executed.sum(),
            "us_per_useful_token": time_us.sum() / lengths.sum(),
            "time_to_client_us": replay_us[k],
            "source": "simulated",
        })
    return pd.DataFrame(rows)


def model_from_fits(step_fits: pd.DataFrame, config: str, variant: str = "readout",
                    origin: str | None = None) -> ChunkModel:
    """The chunk model of one fitted (config, variant) row of :func:`replay_fit.fit_multistep`."""
    rows = step_fits[(step_fits["config"] == config) & (step_fits["variant"] == variant)]
    if origin is not None and "origin" in rows.columns:
        rows = rows[rows["origin"] == origin]
    if rows.empty:
        raise ConfigError(f"no fit for config={config!r}, variant={variant!r}, origin={origin!r}")
    row = rows.iloc[0]
    return ChunkModel(max(float(row["t_replay_us"]), 0.0), float(row["t_step_us"]))


def measured_replay_us(frame: pd.DataFrame, config: str, variant: str = "readout",
                       origin: str | None = None) -> dict[int, float]:
    """K -> measured wall time of one K-step replay, from table ``replay_multistep``."""
    rows = frame[(frame["config"] == config) & (frame["variant"] == variant)]
    if origin is not None and "origin" in rows.columns:
        rows = rows[rows["origin"] == origin]
    return {int(r.k_steps): float(r.wall_us_per_replay) for r in rows.itertuples()}
