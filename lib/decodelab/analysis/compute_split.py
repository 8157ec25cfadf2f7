"""The layered model one level deeper: each regime's compute term split into the physical floor
and what sits above it, each part named for what it is (:data:`~decodelab.analysis.layers.COMPUTE_PARTS`).

    toy step:     T_compute = floor + kernel fixed cost + latency chains
    transformer:  T_compute = floor + matmul above floor + small kernels
                              + attention above floor + kernel gaps (or overlap)

- floor: max(bytes the step must move / measured bandwidth, FLOPs / measured matmul rate)
  (:mod:`decodelab.analysis.compute_floor`);
- kernel fixed cost (the toy step): kernels per step x the measured fixed cost of one kernel
  (what a kernel with no work takes, :func:`decodelab.analysis.compute_floor.toy_kernel_cost`);
- latency chains (the toy step's remainder): its dependent-latency chains (each layer's
  reduction, tanh, argmax and gather wait on the one before) and any work that runs below the
  measured rates;
- matmul above floor (the transformer, from its kernel profile ``paged_model_kernels``): the
  matmul kernels' time minus their weights' bytes at the bandwidth;
- small kernels: the whole time of every kernel that is neither matmul nor attention (norms,
  rotary, copies, embedding: a few KB each, a floor of ~0);
- attention above floor: the attention kernels' time minus the K/V bytes at the bandwidth;
- kernel gaps / kernel overlap (the transformer's remainder): compute minus the profiled
  kernels' summed time (the gaps between kernels where compute is a device span; negative,
  "overlap", where programmatic dependent launch overlaps kernels that the profile, launched
  serially, sums one after another).

The tensor-parallel step has no kernel profile: floor and "above floor, not split". The runtime
loop is not split (:data:`NOT_SPLIT` says why): its compute term is its forward pass. Each part
keeps its rows and derivation, like the regime table's terms; a regime whose rows are missing
gets a note, not an error.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd

from decodelab.analysis.compute_floor import (
    OTHER,
    Floor,
    ceiling_of,
    kernel_class,
    matmul_rate,
    toy_floor,
    toy_kernel_cost,
    us_at,
)
from decodelab.analysis.layers import (
    COMPUTE_PARTS,
    Headline,
    MissingData,
    Regime,
    Tables,
    Term,
    fmt_us,
)
from decodelab.analysis.regimes import persistent_kernels
from decodelab.analysis.tp_regime import DEFAULT_MODEL, tp_model
from decodelab.core.validate import ConfigError
from decodelab.model.analysis import DTYPE_BYTES
from decodelab.model.config import named_config

NAN = math.nan
TOY = ("eager", "graph", "multi-step graph", "persistent kernel")
(FLOOR, FIXED, CHAINS, MATMUL_ABOVE, SMALL, ATTENTION_ABOVE, GAPS, OVERLAP, NOT_FURTHER,
 FORWARD) = COMPUTE_PARTS
# The transformer's remainder by the sign of compute - summed kernel time: name, what it holds.
REST_OF_MODEL = {1: (GAPS, "gaps between kernels"), 0: (GAPS, "none: compute is the kernels' sum"),
                 -1: (OVERLAP, "kernel overlap: the profiled kernels (launched one after "
                               "another) take longer than this step's device span, where "
                               "programmatic dependent launch overlaps them")}
# Regimes whose tables cannot give a floor, and why.
NOT_SPLIT = {"runtime loop": "the runtime table records no context, so the K/V bytes its step "
                             "reads (and with them its floor) are unknown"}


@dataclass(frozen=True, slots=True)
class ComputeSplit:
    """One regime's compute term and its parts (they sum to ``compute.us``)."""

    regime: str
    config: str
    compute: Term
    parts: tuple[Term, ...]
    rest_is: str  # what the remainder holds, in a few words

    def us(self, part: str) -> float:
        """The µs of one part (NaN where this regime has no such part)."""
        return next((t.us for t in self.parts if t.layer == part), NAN)

    @property
    def above_floor(self) -> float:
        return self.compute.us - self.us("floor")


Parts = tuple[tuple[Term, ...], str]  # the parts and what their remainder holds


def _term(name: str, us: float, sources: str, how: str) -> Term:
    """A part in µs (a sum that should be 0 comes out 0, not -1e-13), its rows listed once."""
    unique = dict.fromkeys(s for s in sources.split("; ") if s)
    return Term(name, float(0.0 if abs(us) < 1e-9 else us), NAN, NAN, "; ".join(unique), how)


def _floor_term(floor: Floor, note: str = "") -> Term:
    return _term(FLOOR, floor.us, floor.source, floor.how + note)


# --- the toy step ------------------------------------------------------------------------------

def _toy(tables: Tables, h: Headline, compute: Term, kernels: float, kernels_src: str,
         kernels_how: str, floor_note: str = "") -> Parts:
    floor = toy_floor(tables, h.toy_config)
    parts = [_floor_term(floor, floor_note)]
    try:
        cost = toy_kernel_cost(tables, h)
    except MissingData as exc:
        return (*parts, _term(NOT_FURTHER, compute.us - floor.us, compute.source,
                              "compute - floor (remainder): per-kernel fixed cost and "
                              f"dependent-latency chains together, not split ({exc})")), \
            "per-kernel fixed cost and latency chains, not split"
    fixed = kernels * cost.us
    parts.append(_term(FIXED, fixed, f"{kernels_src}; {cost.source}",
                       f"per-kernel fixed cost: {kernels_how} x c = {kernels:.3g} x "
                       f"{fmt_us(cost.us)} µs; {cost.how}"))
    return (*parts, _term(CHAINS, compute.us - floor.us - fixed, compute.source,
                          "compute - floor - kernel fixed cost (remainder): the kernels' time "
                          "beyond their fixed cost and the floor: dependent-latency chains "
                          "(each layer's reduction, the argmax and the gather wait on the one "
                          "before) and any work running below the measured rates")), \
        "dependent-latency chains and sub-peak work"


def _toy_kernels(mode: str) -> Callable[[Tables, Regime, Headline, Term], Parts]:
    def split(tables: Tables, regime: Regime, h: Headline, compute: Term) -> Parts:
        row, src = tables.one("dispatch", {"mode": mode, "config": h.toy_config,
                                           "backend": "cuda"}, ["kernels_per_step"])
        return _toy(tables, h, compute, float(row["kernels_per_step"]), src,
                    "kernels per step (profiler)")
    return split


def _persistent(tables: Tables, regime: Regime, h: Headline, compute: Term) -> Parts:
    frame, _, src = persistent_kernels(tables, h.toy_config)
    best = frame.loc[frame["us_per_step"].astype(float).idxmin()]  # the regime's variant
    steps = float(best.get("steps_per_launch", NAN))
    if not steps >= 1:
        raise MissingData(f"{src} records no steps per launch")
    weights = str(best.get("weights", ""))  # where W / W_out / E live (persistent.rows.Launch)
    memory = {"shared": "shared memory", "global": "device memory", "peers": "peer blocks"}
    where = ", ".join(f"{name} in {memory.get(place, place)}" for name, place in
                      zip(("W", "W_out", "E"), weights.split("/"), strict=False))
    on_chip = ("; this kernel keeps its weights on chip across steps "
               f"({where}), so it reads fewer bytes per step from device memory: the floor "
               "is that of the step's work, the same for every toy regime"
               ) if "register" in weights or "shared" in weights else ""
    return _toy(tables, h, compute, 1.0 / steps, f"{src}, variant={best['variant']}",
                f"1 launch per {steps:g} steps", on_chip)


# --- the real-shaped transformer ---------------------------------------------------------------

def _model_config(row: pd.Series, src: str):
    try:
        return named_config(str(row.get("model", DEFAULT_MODEL)))
    except ConfigError as exc:
        raise MissingData(f"{src}: no named model shape to count parameters ({exc})") from exc


def _dtype_bytes(row: pd.Series, src: str) -> int:
    dtype = str(row.get("dtype", "bfloat16"))
    if dtype not in DTYPE_BYTES:
        raise MissingData(f"{src}: dtype {dtype!r} has no known size")
    return DTYPE_BYTES[dtype]


def _kernel_sums(tables: Tables, batch: int, context: int) -> tuple[pd.Series, str]:
    """Summed µs per step of each kernel class at one shape (``paged_model_kernels``)."""
    frame, src = tables.rows("paged_model_kernels", {"batch": batch, "context": context},
                             ["kernel", "us_per_step"])
    sums = frame.groupby(frame["kernel"].astype(str).map(kernel_class))["us_per_step"].sum()
    for needed in ("matmul", "attention"):
        if needed not in sums.index:
            raise MissingData(f"no kernel of {src} matches the {needed} patterns (kernels: "
                              f"{', '.join(frame['kernel'].astype(str).str[:40])})")
    return sums.reindex(["matmul", "attention", OTHER], fill_value=0.0).astype(float), src


def _transformer(tables: Tables, regime: Regime, h: Headline, compute: Term) -> Parts:
    b, ctx = h.model_batch, h.context
    row, src = tables.one("paged_model", {"mode": "graph", "batch": b, "context": ctx},
                          ["bytes_per_step", "copy_gb_s"])
    config, nbytes = _model_config(row, src), _dtype_bytes(row, src)
    kv = b * ctx * config.kv_bytes_per_token(nbytes)
    total = float(row["bytes_per_step"])
    ceiling = ceiling_of(tables, copy_gb_s=float(row["copy_gb_s"]),
                         copy_source=f"{src} (copy bandwidth measured in the same run)",
                         backend=str(row.get("device", "cuda")))
    gb_s = ceiling.gb_s
    tflop_s, rate_src = matmul_rate(tables, str(row.get("dtype", "bfloat16")))
    floor = Floor(total, ceiling, 2 * config.num_parameters() * b, tflop_s, rate_src,
                  f"bytes_per_step (the weights read once + the K/V attended, {b} x {ctx} x "
                  f"{config.kv_bytes_per_token(nbytes):,} B per token)",
                  f"2 x parameters ({config.num_parameters() / 1e9:.4g} billion, "
                  f"{config.name}) x batch {b}")
    sums, ksrc = _kernel_sums(tables, b, ctx)
    weight_us, kv_us = us_at(total - kv, gb_s), us_at(kv, gb_s)
    matmul = float(sums["matmul"] - weight_us)
    small = float(sums[OTHER])
    attention = float(sums["attention"] - kv_us)
    unprofiled = compute.us - float(sums.sum())
    unprofiled = 0.0 if abs(unprofiled) < 1e-9 else unprofiled
    rest, rest_is = REST_OF_MODEL[(unprofiled > 0) - (unprofiled < 0)]
    return (
        _floor_term(floor),
        _term(MATMUL_ABOVE, matmul, f"{ksrc}; {src}",
              f"matmul kernels {fmt_us(sums['matmul'])} µs - their weights' bytes at "
              f"{ceiling.words} {fmt_us(weight_us)} µs"),
        _term(SMALL, small, ksrc,
              f"every other kernel's whole time, {fmt_us(sums[OTHER])} µs (norms, rotary, "
              "copies, embedding and kernels no pattern matches: a few KB each, a floor of ~0)"),
        _term(ATTENTION_ABOVE, attention, f"{ksrc}; {src}",
              f"attention kernels {fmt_us(sums['attention'])} µs - the K/V bytes at the "
              f"{ceiling.name} {fmt_us(kv_us)} µs"),
        _term(rest, compute.us - floor.us - matmul - small - attention,
              f"{compute.source}; {ksrc}",
              f"compute - the four (remainder) = compute - summed kernel time "
              f"({fmt_us(unprofiled)} µs: where compute is a device span, the gaps between its "
              f"kernels) + per-kernel floors - the step's floor "
              f"({fmt_us(weight_us + kv_us - floor.us)} µs: nonzero when FLOPs set the floor)")
    ), rest_is


def _tp_row(tables: Tables, regime: Regime, h: Headline) -> pd.Series:
    """The ``tp`` row the tensor-parallel regime reads (largest TP size on GPUs, graph mode)."""
    where = {"mode": "graph", "model": tp_model(tables, h), "batch": h.model_batch,
             "context": h.context}
    frame, src = tables.rows("tp", where, ["tp", "bytes_per_rank", "copy_gb_s"])
    frame = frame[frame["tp"] > 1]
    if "device" in frame.columns:
        frame = frame[frame["device"].astype(str) != "cpu"]
    if frame.empty:
        raise MissingData(f"no GPU row with TP > 1 in {src}")
    return frame.loc[frame["tp"].idxmax()]


def _tensor_parallel(tables: Tables, regime: Regime, h: Headline, compute: Term) -> Parts:
    row, src = _tp_row(tables, regime, h), regime.source
    n, config = int(row["tp"]), _model_config(row, src)
    tflop_s, rate_src = matmul_rate(tables, str(row.get("dtype", "bfloat16")))
    if math.isfinite(tflop_s):
        rate_src += " (the same GPU model)"
    ceiling = ceiling_of(tables, str(row.get("origin", tables.origin)),
                         float(row["copy_gb_s"]),
                         f"{src} (copy bandwidth measured in the same run)")
    floor = Floor(float(row["bytes_per_rank"]), ceiling,
                  2 * config.num_parameters() * h.model_batch / n, tflop_s, rate_src,
                  f"bytes_per_rank (the weights and K/V each of the {n} ranks reads)",
                  f"2 x parameters x batch / {n}")
    return (_floor_term(floor),
            _term(NOT_FURTHER, compute.us - floor.us, compute.source,
                  "compute - floor (remainder): matmuls above their floor, the small kernels, "
                  "attention above its floor and the gaps together (the TP step has no "
                  "per-kernel profile)"),
            ), "matmuls, small kernels, attention and gaps above the floor, not split"


SPLITTERS: dict[str, Callable[[Tables, Regime, Headline, Term], Parts]] = {
    "eager": _toy_kernels("eager"), "graph": _toy_kernels("cuda_graph"),
    "multi-step graph": _toy_kernels("cuda_graph"), "persistent kernel": _persistent,
    "transformer decode, eager": _transformer, "transformer decode": _transformer,
    "tensor parallel": _tensor_parallel,
}


def split_compute(tables: Tables, regimes: Sequence[Regime], h: Headline | None = None
                  ) -> tuple[list[ComputeSplit], list[str]]:
    """The split of every regime's compute term that the tables allow, and a note per regime
    that has a compute term but no split."""
    h = h or Headline()
    splits, notes = [], []
    for regime in regimes:
        compute = next((t for t in regime.terms if t.layer == "compute"), None)
        if compute is None:
            continue
        if regime.name not in SPLITTERS:
            notes.append(f"{regime.name}: {NOT_SPLIT.get(regime.name, 'no split defined')}")
            continue
        try:
            parts, rest_is = SPLITTERS[regime.name](tables, regime, h, compute)
        except MissingData as exc:
            notes.append(f"{regime.name}: {exc}")
            continue
        if not all(math.isfinite(t.us) for t in parts):
            notes.append(f"{regime.name}: a part of its split is not a finite number")
            continue
        splits.append(ComputeSplit(regime.name, regime.config, compute, parts, rest_is))
    return splits, notes

