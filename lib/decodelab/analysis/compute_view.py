"""The compute split as notebook 05 shows it: one row per regime, every part with its rows, and
the two statements it reads off the split (how much of the toy step's compute sits above its
floor, and in what; whether the seed's "Real Transformer Decode → Compute" holds once the floor
is apart). The seed's word "compute" is kept only where the seed is quoted."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from decodelab.analysis.compute_split import (
    ATTENTION_ABOVE,
    CHAINS,
    FIXED,
    FLOOR,
    GAPS,
    MATMUL_ABOVE,
    NOT_FURTHER,
    OVERLAP,
    SMALL,
    TOY,
    ComputeSplit,
)
from decodelab.analysis.layers import Regime, fmt_us
from decodelab.core.seed import SEED_REGIMES

SPLIT_LABELS = {"regime": "regime", "config": "measured at", "compute_us": "compute (µs)",
                "floor_us": "floor (µs)", "floor_share": "floor, share of compute",
                "fixed_us": "kernel fixed cost (µs)", "chains_us": "latency chains (µs)",
                "matmul_us": "matmul above floor (µs)",
                "small_us": "small kernels: norm, rotary, copy (µs)",
                "attention_us": "attention above floor (µs)",
                "rest_us": "remainder (µs)", "rest_is": "the remainder is"}
PART_LABELS = {"regime": "regime", "part": "part", "us": "µs per step",
               "share": "share of compute", "source": "rows", "how": "derived as"}
# Parts that are a cost of the way the work runs (the step's kernels and their boundaries),
# not the work itself.
RUNNING_COSTS = (FIXED, MATMUL_ABOVE, SMALL, GAPS)


def _remainder(s: ComputeSplit) -> float:
    """The part that closes the split: gaps or overlap, or what is not split further."""
    return next((t.us for t in s.parts if t.layer in (GAPS, OVERLAP, NOT_FURTHER)), math.nan)


def split_table(splits: Sequence[ComputeSplit]) -> pd.DataFrame:
    """One row per regime: compute, its floor (and share) and each named part, in µs per step
    (NaN where a regime has no such part)."""
    rows = [{"regime": s.regime, "config": s.config, "compute_us": s.compute.us,
             "floor_us": s.us(FLOOR), "floor_share": s.us(FLOOR) / s.compute.us,
             "fixed_us": s.us(FIXED), "chains_us": s.us(CHAINS), "matmul_us": s.us(MATMUL_ABOVE),
             "small_us": s.us(SMALL), "attention_us": s.us(ATTENTION_ABOVE),
             "rest_us": _remainder(s), "rest_is": s.rest_is} for s in splits]
    return pd.DataFrame(rows, columns=list(SPLIT_LABELS))


def parts_frame(splits: Sequence[ComputeSplit]) -> pd.DataFrame:
    """Tidy rows: regime, part, µs, share of compute, the rows it comes from, its derivation."""
    rows = [{"regime": s.regime, "part": t.layer, "us": t.us, "share": t.us / s.compute.us,
             "source": t.source, "how": t.how} for s in splits for t in s.parts]
    return pd.DataFrame(rows, columns=list(PART_LABELS))


def _share(part: float, whole: float) -> str:
    share = part / whole
    if abs(share) < 0.001:
        return "<0.1%"
    return f"{share:.1%}" if abs(share) < 0.1 else f"{share:.0%}"


def toy_lines(splits: Sequence[ComputeSplit]) -> str:
    """How much of the toy regimes' compute sits above the floor, and what it is."""
    toy = [s for s in splits if s.regime in TOY]
    if not toy:
        return "No toy regime's compute could be split yet."
    above = [s.above_floor / s.compute.us for s in toy]
    floor = toy[0].us("floor")
    amount = "almost all" if min(above) > 0.9 else "most" if min(above) > 0.5 else "part"
    lines = [f"**The toy step** ({toy[0].config.split(',')[0]}): {amount} of its measured "
             f"compute sits above the floor, {min(above):.1%} to {max(above):.1%} across the toy "
             f"regimes. Its bytes and FLOPs need {fmt_us(floor)} µs at the measured rates; what "
             "sits above is the cost of the way they run, not arithmetic, and the regime table "
             "names it so (kernel fixed cost, latency chains):"]
    for s in toy:
        parts = [f"floor {fmt_us(floor)} µs ({_share(floor, s.compute.us)})"]
        for name in (FIXED, CHAINS, NOT_FURTHER):
            if math.isfinite(s.us(name)):
                parts.append(f"{name} {fmt_us(s.us(name))} µs ({_share(s.us(name), s.compute.us)})")
        lines.append(f"- {s.regime}: device time {fmt_us(s.compute.us)} µs = " + ", ".join(parts)
                     + ".")
    return "\n".join(lines)


def transformer_verdict(splits: Sequence[ComputeSplit], regimes: Sequence[Regime],
                        serial_us: float = math.nan, copy_stands_in: bool = False) -> str:
    """Whether the seed's "Real Transformer Decode → Compute" holds once the floor is split
    out of compute: is the floor the largest single part of the step, or the boundaries? With
    ``serial_us`` (the same step, its kernels launched serially), also before programmatic
    dependent launch removed part of the boundaries. ``copy_stands_in``: the floor is at the
    copy bandwidth (no read ceiling measured), so what sits above it is a lower bound."""
    seed = next(s for s in SEED_REGIMES if s.regime == "transformer decode")
    split = next((s for s in splits if s.regime == "transformer decode"), None)
    regime = next((r for r in regimes if r.name == "transformer decode"), None)
    if split is None or regime is None:
        return f'The seed\'s "{seed.quote}" cannot be checked one level deeper yet: no split ' \
               "of the transformer regime's compute."
    parts = [(t.layer, t.us) for t in regime.terms if t.layer != "compute"]
    parts += [(t.layer, t.us) for t in split.parts]
    ranked = sorted(parts, key=lambda p: p[1], reverse=True)
    (top, top_us), (second, second_us) = ranked[0], ranked[1]
    step = regime.step_us
    said = (f"the largest single part of the {fmt_us(step)} µs step ({regime.config}) is "
            f"{top} ({fmt_us(top_us)} µs, {top_us / step:.0%}), then {second} "
            f"({fmt_us(second_us)} µs, {second_us / step:.0%})")
    if top == FLOOR:
        verdict = ("holds once the floor is separated: " + said + ". The largest part is the "
                   "memory traffic the work needs, not a cost of the way it runs; the "
                   f"{fmt_us(step - top_us)} µs ({1 - top_us / step:.0%}) above the floor is "
                   "what a faster implementation on this GPU could still remove"
                   + (" (more, in truth: with the copy bandwidth standing in for the read "
                      "ceiling, the floor sits higher than this GPU's reads allow)"
                      if copy_stands_in else ""))
    elif top in RUNNING_COSTS:
        verdict = ("holds only in the seed's word once the floor is separated: " + said
                   + f". The {top}, not the memory traffic, set the step")
    else:
        verdict = "is not what the split shows: " + said
    return f'**The seed\'s regime-table line "{seed.quote}"** {verdict}.' + _before_pdl(
        split.us("floor"), step, serial_us)


def _before_pdl(floor: float, step: float, serial_us: float) -> str:
    """The floor's share of the step launched serially: more than half makes it that step's
    largest part too, whatever the rest splits into."""
    if not math.isfinite(serial_us):
        return ""
    share = floor / serial_us
    return (f" Before programmatic dependent launch (the same kernels launched one after "
            f"another: {fmt_us(serial_us)} µs), the floor was {share:.0%} of the step"
            + (", its largest part there too" if share > 0.5 else "")
            + f"; PDL took {fmt_us(serial_us - step)} µs of kernel boundaries off.")
