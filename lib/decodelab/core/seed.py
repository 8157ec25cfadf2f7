"""The seed study's claims as plain data: quotations from its README (an SM75 GPU), none of them
a measurement of ours. :mod:`decodelab.analysis.seed_table` sets our numbers beside them."""

from __future__ import annotations

from dataclasses import dataclass

SEED_SOURCE = "seed 004 (README of the layered decode study)"
SEED_HARDWARE = "one SM75 GPU (seed)"


@dataclass(frozen=True, slots=True)
class SeedClaim:
    key: str
    claim: str
    value: float
    unit: str
    quote: str


# Quotations from the seed study (SM75 GPU); none of these is a measurement of ours.
SEED_CLAIMS: tuple[SeedClaim, ...] = (
    SeedClaim("graph_cpu_reduction", "host CPU per step, eager / CUDA graph", 15.0, "x",
              "phase1_dispatch: '~15× CPU reduction observed.'"),
    SeedClaim("replay_per_step", "graph replay cost per step (one step per graph)", 2.8, "µs",
              "phase2_replay: 'Replay cost measured (~2.8 µs per step).'"),
    SeedClaim("persistent_ultra_light", "persistent kernel, ultra-light", 2.1e6, "steps/s",
              "phase3_persistent: '~2.1M steps/sec in ultra-light regime.'"),
    SeedClaim("persistent_h256", "persistent kernel, hidden=256", 153e3, "steps/s",
              "phase3_persistent: 'hidden=256 ... (~153k steps/sec).'"),
)
@dataclass(frozen=True, slots=True)
class SeedRegime:
    regime: str  # our regime name
    layers: tuple[str, ...]  # the dominant layer(s) the seed names
    quote: str
    toy_config: str | None = None  # read at another toy config than the headline's


# The seed's regime-dominance table (its "Regime | Dominant Layer") and its phase-3 remark on
# hidden=256, keyed by our regime names.
SEED_REGIMES: tuple[SeedRegime, ...] = (
    SeedRegime("eager", ("dispatch",), "Pre-Graph → Dispatch"),
    SeedRegime("graph", ("replay",), "Graph → Replay"),
    SeedRegime("multi-step graph", ("replay", "compute"), "Multi-Step → Replay + Compute"),
    SeedRegime("persistent kernel", ("compute",), "Persistent → Compute"),
    SeedRegime("persistent kernel", ("compute",), "phase3_persistent: 'Under heavier compute "
               "(hidden=256), compute became dominant'", toy_config="h256"),
    SeedRegime("transformer decode", ("compute",), "Real Transformer Decode → Compute"),
)


def quoted(key: str) -> float:
    """The value the seed quotes for claim ``key`` (e.g. ``"persistent_h256"``)."""
    by_key = {c.key: c for c in SEED_CLAIMS}
    if key not in by_key:
        raise KeyError(f"no seed claim {key!r}; have {sorted(by_key)}")
    return by_key[key].value
