"""Fits of the replay measurements, computed from stored rows (numpy only).

Two linear models, both fitted by weighted least squares with t-based confidence intervals:

- replay cost vs kernels per graph:  ``T(n) = T_replay + n * T_node``      (table replay_nodes)
  and for eager launches:            ``T(n) = T_0 + n * T_launch``
- per-step time vs steps per graph:  ``T(K) = T_step + T_replay / K``     (table replay_multistep)
  i.e. linear in x = 1/K with intercept T_step and slope T_replay (the per-replay fixed cost,
  including any per-replay host work such as reading tokens out).

Timing noise grows with the time measured (a roughly constant coefficient of variation), so the
fits weight each point by 1/y^2: every point counts by its relative, not absolute, error.

The seed study's replay-cost quotation lives in :mod:`decodelab.core.seed` with the others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import pandas as pd

from decodelab.core.seed import SEED_CLAIMS, SEED_HARDWARE
from decodelab.core.validate import ConfigError

GAIN_THRESHOLD = 0.02  # "more steps per graph buy less than 2%"
# A graph replay whose host time is >= 90% of its wall time is paced by the host issuing it, not
# by the device running its nodes: such points measure the host's cost, not T_replay + n*T_node.
HOST_BOUND = 0.9
R2_TARGET = 0.98


def t_quantile(prob: float, dof: int) -> float:
    """Quantile of Student's t (exact for 1 and 2 degrees of freedom, Cornish-Fisher beyond:
    within 0.3% of the tabulated values for dof >= 3 at the usual levels)."""
    if not 0.0 < prob < 1.0:
        raise ConfigError(f"t_quantile: prob={prob!r} must lie in (0, 1)")
    if dof < 1:
        raise ConfigError(f"t_quantile: dof={dof!r} must be >= 1")
    if dof == 1:
        return math.tan(math.pi * (prob - 0.5))
    if dof == 2:
        return (2 * prob - 1) / math.sqrt(2 * prob * (1 - prob))
    z, v = NormalDist().inv_cdf(prob), float(dof)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / v + g2 / v**2 + g3 / v**3 + g4 / v**4


@dataclass(frozen=True, slots=True)
class LinearFit:
    """y = intercept + slope * x with confidence intervals at ``level``."""

    intercept: float
    slope: float
    intercept_ci: tuple[float, float]
    slope_ci: tuple[float, float]
    r2: float  # weighted coefficient of determination
    n: int
    level: float

    def predict(self, x) -> np.ndarray:
        return self.intercept + self.slope * np.asarray(x, dtype=float)


def fit_linear(x, y, *, relative: bool = True, level: float = 0.95) -> LinearFit:
    """Weighted least squares of y on [1, x]; weights 1/y^2 when ``relative`` (else 1)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ConfigError(f"fit_linear: x and y must be 1-D of one length, got {x.shape}, {y.shape}")
    if x.size < 3:
        raise ConfigError(f"fit_linear: needs at least 3 points, got {x.size}")
    if np.unique(x).size < 2:
        raise ConfigError("fit_linear: x must take at least two distinct values")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ConfigError("fit_linear: x and y must be finite")
    if relative and np.any(y <= 0):
        raise ConfigError("fit_linear: relative weighting needs y > 0")
    sw = 1.0 / y if relative else np.ones_like(y)  # sqrt of the weights
    design = np.column_stack([np.ones_like(x), x])  # (n, 2)
    beta, *_ = np.linalg.lstsq(design * sw[:, None], y * sw, rcond=None)
    resid = (y - design @ beta) * sw
    dof = x.size - 2
    sigma2 = float(resid @ resid) / dof
    cov = sigma2 * np.linalg.inv((design * sw[:, None]).T @ (design * sw[:, None]))
    w = sw**2
    y_bar = float(w @ y / w.sum())
    ss_tot = float(w @ (y - y_bar) ** 2)
    r2 = 1.0 - float(resid @ resid) / ss_tot if ss_tot > 0 else 1.0
    half = t_quantile(0.5 + level / 2, dof) * np.sqrt(np.diag(cov))
    return LinearFit(float(beta[0]), float(beta[1]),
                     (float(beta[0] - half[0]), float(beta[0] + half[0])),
                     (float(beta[1] - half[1]), float(beta[1] + half[1])), r2, int(x.size), level)


def _groups(frame: pd.DataFrame, keys: list[str]):
    keys = [k for k in keys if k in frame.columns]
    if not keys:
        yield {}, frame
        return
    for values, group in frame.groupby(keys, sort=False):
        values = values if isinstance(values, tuple) else (values,)
        yield dict(zip(keys, values, strict=True)), group


def _fit_row(labels: dict, metric: str, fit: LinearFit) -> dict:
    return {**labels, "metric": metric, "intercept": fit.intercept,
            "intercept_ci_low": fit.intercept_ci[0], "intercept_ci_high": fit.intercept_ci[1],
            "slope": fit.slope, "slope_ci_low": fit.slope_ci[0], "slope_ci_high": fit.slope_ci[1],
            "r2": fit.r2, "n_points": fit.n}


def fit_nodes(frame: pd.DataFrame, metrics: tuple[str, ...] = ("wall", "host")) -> pd.DataFrame:
    """Per (origin, device, kind) and metric: T(n) = intercept + n * slope, in µs.

    graph: intercept = T_replay (fixed cost of a replay), slope = T_node (cost per kernel node).
    The graph's wall fit uses only device-paced points (host < HOST_BOUND * wall) when at least
    3 exist: at small n back-to-back replays wait for the host, and the host fit reports that
    cost. eager: slope = T_launch (cost per back-to-back launch; every point is host-paced).
    """
    rows = []
    for labels, group in _groups(frame, ["origin", "device", "kind"]):
        device_paced = (group[group["host_us"] < HOST_BOUND * group["wall_us"]]
                        if "host_us" in group.columns else group)
        for metric in metrics:
            use_paced = metric == "wall" and labels.get("kind") == "graph" and len(device_paced) >= 3
            pts = device_paced if use_paced else group
            fit = fit_linear(pts["n_kernels"], pts[f"{metric}_us"])
            rows.append(_fit_row(labels, metric, fit) | {"n_excluded": len(group) - len(pts)})
    return pd.DataFrame(rows)


def fit_multistep(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (origin, device, config, variant): wall per step = T_step + T_replay / K, in µs.

    ``r2`` is that of the per-step form (how much of the small variation of per-step time the
    1/K term explains); ``r2_per_replay`` is that of the same fit written per replay,
    T_replay + K * T_step (with 1/y^2 weights both forms have the same estimates and CIs).
    Adds ``k_2pct`` (the K beyond which even infinitely many more steps per graph would cut the
    per-step time by less than 2%: T_replay/K < 2% of T(K)), the largest K measured and how far
    its per-step wall lies from the fitted T_step.

    Why the per-step R² can stay low on a good fit: ``signal_rel`` is the spread of the fitted
    1/K term relative to the per-step time (weighted sd of the fitted values), ``noise_rel`` the
    relative scatter of the points about the fit; R² is about snr²/(1 + snr²) with
    snr = signal_rel / noise_rel, so R² >= R2_TARGET needs the scatter below signal_rel /
    :func:`snr_needed`. When T_replay/K is a few percent of T_step, a scatter of a percent from
    one K to the next caps the per-step R² whatever the fit. The per-replay form divides by a
    spread over orders of magnitude (K·T_step), so its R² tests the model, not the noise floor.
    """
    rows = []
    for labels, group in _groups(frame, ["origin", "device", "config", "variant"]):
        x, y = 1.0 / group["k_steps"].to_numpy(float), group["wall_us_per_step"].to_numpy(float)
        fit = fit_linear(x, y)
        row = _fit_row(labels, "wall", fit)
        row["signal_rel"], row["noise_rel"] = _signal_and_noise(fit, x, y)
        row["snr"] = row["signal_rel"] / row["noise_rel"] if row["noise_rel"] > 0 else math.inf
        row["t_step_us"], row["t_replay_us"] = fit.intercept, fit.slope
        per_replay = fit_linear(group["k_steps"], group["wall_us_per_step"] * group["k_steps"])
        row["r2_per_replay"] = per_replay.r2
        row["k_2pct"] = k_for_gain(fit.slope, fit.intercept)
        k_max = int(group["k_steps"].max())
        at_max = float(group.loc[group["k_steps"] == k_max, "wall_us_per_step"].median())
        row["k_max"], row["wall_us_at_k_max"] = k_max, at_max
        row["k_max_rel_dev"] = at_max / fit.intercept - 1.0
        rows.append(row)
    return pd.DataFrame(rows)


def _signal_and_noise(fit: LinearFit, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(weighted sd of the fitted values, sd of the residuals), both relative to y (1/y^2
    weights, as in the fit)."""
    pred = fit.predict(x)
    w = 1.0 / y**2
    centre = float(w @ pred / w.sum())
    signal = math.sqrt(float(w @ (pred - centre) ** 2) / y.size)
    noise = math.sqrt(float(((y - pred) / y) @ ((y - pred) / y)) / (y.size - 2))
    return signal, noise


def snr_needed(r2: float = R2_TARGET) -> float:
    """The signal-to-noise ratio at which R² = snr²/(1 + snr²) reaches ``r2``."""
    return math.sqrt(r2 / (1.0 - r2))


def k_for_gain(t_replay: float, t_step: float, threshold: float = GAIN_THRESHOLD) -> float:
    """Smallest K with T_replay/K < threshold * (T_step + T_replay/K), i.e. the remaining gain
    of unbounded K is below ``threshold``: K > (1 - threshold)/threshold * T_replay/T_step."""
    if t_step <= 0:
        return math.inf
    return max(1.0, (1.0 - threshold) / threshold * max(t_replay, 0.0) / t_step)


def quantities(node_fits: pd.DataFrame, step_fits: pd.DataFrame) -> pd.DataFrame:
    """The headline numbers as tidy rows: quantity, value, ci_low, ci_high, r2, unit, source."""
    rows = []
    for _, f in node_fits[node_fits["metric"] == "wall"].iterrows():
        source = f.get("origin", f.get("device", ""))
        if f["kind"] == "graph":
            rows.append(("T_replay (graph of n tiny kernels)", f["intercept"],
                         f["intercept_ci_low"], f["intercept_ci_high"], f["r2"], source))
            rows.append(("T_node (per kernel inside a graph)", f["slope"], f["slope_ci_low"],
                         f["slope_ci_high"], f["r2"], source))
        else:
            rows.append(("T_launch (per eager launch)", f["slope"], f["slope_ci_low"],
                         f["slope_ci_high"], f["r2"], source))
    for _, f in node_fits[(node_fits["metric"] == "host") & (node_fits["kind"] == "graph")
                          ].iterrows():
        rows.append(("host CPU per graph replay (intercept of host fit)", f["intercept"],
                     f["intercept_ci_low"], f["intercept_ci_high"], f["r2"],
                     f.get("origin", f.get("device", ""))))
    for _, f in step_fits.iterrows():
        source = f.get("origin", f.get("device", ""))
        what = f"{f['config']}, {f['variant']}"
        rows.append((f"T_replay per graph ({what})", f["slope"], f["slope_ci_low"],
                     f["slope_ci_high"], f["r2"], source))
        rows.append((f"T_step ({what})", f["intercept"], f["intercept_ci_low"],
                     f["intercept_ci_high"], f["r2"], source))
    return pd.DataFrame(rows, columns=["quantity", "value", "ci_low", "ci_high", "r2", "source"]
                        ).assign(unit="us")


def seed_replay_claim():
    """The seed's quoted replay cost per step (a :class:`decodelab.core.seed.SeedClaim`)."""
    claim = {c.key: c for c in SEED_CLAIMS}["replay_per_step"]
    if claim.unit != "µs":
        raise ConfigError(f"seed claim replay_per_step is in {claim.unit!r}, expected µs")
    return claim


def seed_comparison(step_fits: pd.DataFrame, node_fits: pd.DataFrame) -> pd.DataFrame:
    """Our fitted per-replay costs next to the seed's quoted replay cost per step (K = 1)."""
    seed = seed_replay_claim()
    rows = []
    for _, f in node_fits[(node_fits["metric"] == "wall") & (node_fits["kind"] == "graph")
                          ].iterrows():
        rows.append(("graph of tiny kernels: T_replay (device)", f.get("origin", ""), f["intercept"],
                     f["intercept_ci_low"], f["intercept_ci_high"]))
    for _, f in node_fits[(node_fits["metric"] == "host") & (node_fits["kind"] == "graph")
                          ].iterrows():
        rows.append(("host CPU per graph replay", f.get("origin", ""), f["intercept"],
                     f["intercept_ci_low"], f["intercept_ci_high"]))
    for _, f in step_fits[step_fits["variant"] == "none"].iterrows():
        rows.append((f"toy step {f['config']}: T_replay", f.get("origin", ""), f["slope"],
                     f["slope_ci_low"], f["slope_ci_high"]))
    frame = pd.DataFrame(rows, columns=["quantity", "source", "ours_us", "ci_low", "ci_high"])
    frame["seed_us"] = seed.value
    frame["seed_device"] = SEED_HARDWARE
    # a confidence interval reaching below 0 does not resolve the cost: no ratio to the seed
    frame["resolved"] = frame["ci_low"] > 0
    frame["ours_over_seed"] = (frame["ours_us"] / frame["seed_us"]).where(frame["resolved"])
    return frame
