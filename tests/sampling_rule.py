"""The sampling rule of ``engine.sampler`` evaluated in float64, to check a sampler's
thresholds and tokens up to the float32 rounding of its sums.

A sampler's masses are float32 sums in an order of its own. A decision whose float64 margin
is above ``tol`` (a mass compared with its boundary) has one right answer and the sampler must
give it; a decision within ``tol`` of its boundary may fall either way. ``tol`` is relative to
the sum it is compared within, so a check with a small ``tol`` stays exact on almost every row
(on a flat row of V tokens a draw's interval is ~1/V of the mass)."""

from __future__ import annotations

import numpy as np


def _e(z: np.ndarray, zmax: np.float32, invt: np.float32) -> np.ndarray:
    """e = exp((z - z_max) / T) as the samplers compute it (float32 argument), in float64."""
    return np.exp(((z - zmax) * invt).astype(np.float32).astype(np.float64))


def thresholds(z: np.ndarray, invt: float, top_k: int, top_p: float, tol: float) -> set[float]:
    """The thresholds max(tau_k, tau_p) the rule allows for one row, z (V,) float32 (the
    penalised logits): one value, or two where the top-p mass lies within ``tol`` (relative
    to the top-k mass) of a tie group's boundary. -inf: neither filter."""
    z = np.asarray(z, dtype=np.float32)
    zmax, invt = z.max(), np.float32(invt)
    e = _e(z, zmax, invt)
    vals = np.unique(z)[::-1]  # distinct values, descending
    tk = np.sort(z)[::-1][top_k - 1] if 0 < top_k < z.size else -np.inf
    if top_p >= 1:
        return {float(tk)}
    vals = vals[vals >= tk]
    group = np.array([e[z == v].sum() for v in vals])
    above = np.concatenate([[0.0], np.cumsum(group)[:-1]])  # M(> v) within the top-k set
    total = group.sum()
    p = np.float64(np.float32(top_p)) * total
    i = int(np.sum(above < p)) - 1  # tau_p = vals[i]: the smallest value with M(> v) < P
    ok = {i}
    if i > 0 and p - above[i] <= tol * total:
        ok.add(i - 1)  # M(> tau_p) within rounding of P: the value above may be it
    if i + 1 < vals.size and above[i + 1] - p <= tol * total:
        ok.add(i + 1)  # the group at tau_p within rounding of reaching P: the one below
    return {float(max(tk, vals[j])) for j in ok}


def token_ok(z: np.ndarray, invt: float, tau: float, min_p: float, u: float, token: int,
             tol: float) -> bool:
    """Whether ``token`` is the inverse-CDF draw of ``u`` over the kept tokens (z >= tau,
    e >= min_p; e in float32 as the samplers have it) in token-id order, up to ``tol`` of
    their mass: a kept token of nonzero mass whose interval holds u * total within tol."""
    z = np.asarray(z, dtype=np.float32)
    zmax, invt = z.max(), np.float32(invt)
    e32 = np.exp((z - zmax) * invt)
    keep = (z >= np.float32(tau)) & (e32 >= np.float32(min_p))
    mass = np.where(keep, e32.astype(np.float64), 0.0)
    cum = np.cumsum(mass)
    target, slack = np.float64(np.float32(u)) * cum[-1], tol * cum[-1]
    return bool(keep[token] and mass[token] > 0
                and cum[token] - mass[token] - slack <= target <= cum[token] + slack)


def row_params(rows, uniforms, slots=None, device="cpu"):
    """``RowParams`` of rows (temperature, top_k, top_p, min_p[, repetition, presence,
    frequency]) through ``SamplingParams`` and ``RowSampling.of``, as the engine packs them;
    ``slots`` default to the row numbers."""
    from decodelab.engine.requests import SamplingParams
    from decodelab.engine.row_sampling import RowParams, RowSampling

    names = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
             "frequency_penalty")
    slots = range(len(rows)) if slots is None else slots
    packed = []
    for row, u, slot in zip(rows, uniforms, slots, strict=True):
        settings = {n: float(x) for n, x in zip(names, row, strict=False)}
        settings["top_k"] = int(row[1])
        packed.append(RowSampling.of(SamplingParams(**settings), uniform=float(u), slot=int(slot)))
    return RowParams.of(packed, device)
