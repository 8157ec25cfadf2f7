"""The seed study's headline claims next to what we measured: "seed reported / we measured /
hardware / agrees?".

The seed's numbers are quotations, kept in :data:`SEED_CLAIMS` and :data:`SEED_REGIMES` only.
Agreement rule (stated in the table):

- a number agrees when ours lies within a factor of :data:`AGREE_FACTOR` of the seed's
  (different GPU generations: the same regime, not the same digits, is what can agree);
- a regime row agrees when our computed dominant layer is one of the layers the seed names.
  The seed's word "Compute" is kept where its claims are quoted and covers every part our
  split names (:data:`SEED_WORDS`: all the device time of the step's kernels); such a row says
  what the part is (a per-kernel fixed cost, a latency chain, the floor) and how large the
  floor is, so that agreement in the seed's word is never read as "arithmetic-bound".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import pandas as pd

from decodelab.analysis.decompose import decompose
from decodelab.analysis.layers import COMPUTE_PARTS, Headline, MissingData, Regime, Tables, fmt_us
from decodelab.analysis.regimes import multistep_fit, persistent_kernels
from decodelab.core.seed import SEED_CLAIMS, SEED_REGIMES, SeedRegime

AGREE_FACTOR = 2.0
# What each of the seed's layer words covers among our layers: its "Compute" is everything the
# device does inside the step's kernels, which we split and name part by part.
SEED_WORDS = {"compute": ("compute", *COMPUTE_PARTS)}


def _cpu_reduction(tables: Tables, h: Headline) -> tuple[float, str]:
    hosts, sources = [], []
    for mode in ("eager", "cuda_graph"):
        row, src = tables.one("dispatch", {"mode": mode, "config": h.toy_config,
                                           "backend": "cuda"}, ["host_us_per_step"])
        hosts.append(float(row["host_us_per_step"]))
        sources.append(src)
    return hosts[0] / hosts[1], " / ".join(sources)


def _replay_per_step(tables: Tables, h: Headline) -> tuple[float, str]:
    fit, _, src = multistep_fit(tables, h)
    return float(fit["t_replay_us"]), f"fitted T_replay of {src}"


def _persistent(config: str) -> Callable[[Tables, Headline], tuple[float, str]]:
    def measure(tables: Tables, _: Headline) -> tuple[float, str]:
        kernels, _, src = persistent_kernels(tables, config)
        return 1e6 / float(kernels["us_per_step"].min()), f"fastest kernel variant of {src}"
    return measure


MEASURES: dict[str, Callable[[Tables, Headline], tuple[float, str]]] = {
    "graph_cpu_reduction": _cpu_reduction,
    "replay_per_step": _replay_per_step,
    "persistent_ultra_light": _persistent("ultra-light"),
    "persistent_h256": _persistent("h256"),
}


def agrees(ours: float, seed: float, factor: float = AGREE_FACTOR) -> tuple[str, str]:
    """("yes"/"no", why) by the factor rule; "n/a" when ours is not a positive number."""
    if not (math.isfinite(ours) and ours > 0):
        return "n/a", "no measurement"
    ratio = ours / seed
    if 1 / factor <= ratio <= factor:
        return "yes", f"ours = {ratio:.2g}x the seed's (within {factor:g}x)"
    side = "higher" if ratio > 1 else "lower"
    return "no", f"ours {max(ratio, 1 / ratio):.3g}x {side} than the seed's"


def _fmt(value: float, unit: str) -> str:
    if unit == "x":
        return f"{value:,.3g}x"
    if abs(value) >= 1e6:
        return f"{value / 1e6:,.3g}M {unit}"
    if abs(value) >= 1e3:
        return f"{value / 1e3:,.3g}k {unit}"
    return f"{value:,.3g} {unit}"


def seed_table(tables: Tables, regimes: list[Regime], headline: Headline | None = None
               ) -> pd.DataFrame:
    """One row per seed claim: what the seed reported, what we measured, on which hardware,
    whether they agree (rule in :func:`agrees`) and the row(s) our number comes from."""
    headline = headline or Headline()
    ours_hw = hardware(tables)
    rows = []
    for claim in SEED_CLAIMS:
        try:
            value, source = MEASURES[claim.key](tables, headline)
            measured = _fmt(value, claim.unit)
        except MissingData as exc:
            value, source, measured = math.nan, str(exc), "no data yet"
        verdict, why = agrees(value, claim.value)
        rows.append((claim.claim, f"~{_fmt(claim.value, claim.unit)}", measured, ours_hw, verdict,
                     why, source, claim.quote))
    by_name = {r.name: r for r in regimes}
    for seed in SEED_REGIMES:
        rows.append(_regime_row(seed, by_name, tables, headline, ours_hw))
    return pd.DataFrame(rows, columns=["claim", "seed reported", "we measured", "our hardware",
                                       "agrees?", "rule applied", "our source", "seed quote"])


def _regime_row(seed: SeedRegime, by_name: dict[str, Regime], tables: Tables,
                headline: Headline, ours_hw: str) -> tuple:
    claim, seed_says = f"dominant layer: {seed.regime}", " + ".join(seed.layers)
    r = by_name.get(seed.regime)
    if seed.toy_config is not None and seed.toy_config != headline.toy_config:
        claim += f" ({seed.toy_config})"
        other = replace(headline, toy_config=seed.toy_config)
        r = next((x for x in decompose(tables, other)[0] if x.name == seed.regime), None)
    if r is None:
        return (claim, seed_says, "no data yet", ours_hw, "n/a", "no measurement", "", seed.quote)
    top = r.dominant
    share = top.us / r.step_us if r.step_us > 0 else math.nan
    covered = {ours for word in seed.layers for ours in SEED_WORDS.get(word, (word,))}
    ok = top.layer in covered
    return (claim, seed_says, f"{top.layer} ({share:.0%} of {fmt_us(r.step_us)} µs)", ours_hw,
            "yes" if ok else "no", _why(seed, r, ok), r.source, seed.quote)


def _why(seed: SeedRegime, r: Regime, ok: bool) -> str:
    """The rule as applied to one regime row, saying where the seed's word is kept."""
    top = r.dominant.layer
    if not ok:
        return f"the seed names {' + '.join(seed.layers)}; ours is {top}"
    if top not in COMPUTE_PARTS or top == "compute":
        return f"our dominant layer is {'one' if len(seed.layers) > 1 else 'the one'} the seed names"
    floor = next((p.us for p in r.parts if p.layer == "floor"), math.nan)
    said = ("in the seed's word: its \"Compute\" (the seed's word, kept here) covers all the "
            f"device time of the step's kernels, and the largest part of it is {top}")
    if top == "floor":
        return said + " (the bytes or FLOPs the work needs at the measured rates)"
    return said + (f", not arithmetic: the floor is {floor / r.step_us:.1%} of the step"
                   if math.isfinite(floor) else "")


def hardware(tables: Tables) -> str:
    """Our hardware as the tables record it (their ``device`` column), else the origin."""
    for frame in tables.frames.values():
        if "device" in frame.columns:
            picked = (frame[frame["origin"] == tables.origin]
                      if tables.origin and "origin" in frame.columns else frame)
            if not picked.empty:
                return str(picked["device"].iloc[0]).upper()
    return tables.origin or "unknown"
