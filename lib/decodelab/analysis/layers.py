"""The layered model, computed from result tables: where one decode step's time goes, per regime.

    T_step = T_dispatch + T_replay + T_node + T_orchestration + T_compute

- dispatch: the host issuing kernels one at a time while the GPU waits (eager only);
- replay: the fixed cost of launching a captured graph (host call + device-side graph start);
- node: kernel boundaries inside a graph or barriers inside a persistent kernel;
- orchestration: what a serving loop adds around the forward pass (schedule, prepare, sample,
  update, emit), as exposed on the step's wall clock;
- compute: GPU-busy time of the step's kernels, as measured; not a layer of its own where the
  tables allow a split: :data:`COMPUTE_PARTS` name what it holds (the floor, per-kernel fixed
  cost, dependent-latency chains, ...), and the regime table ranks those parts, so that a
  per-kernel fixed cost or a latency chain is never called "compute" (the seed study's word,
  kept only where its claims are quoted);
- comm: what the collectives of a tensor-parallel step add (the step minus the same step with
  its collectives replaced by local stand-ins of the same shape).

Each regime's terms come from named rows of the phase tables (:mod:`decodelab.analysis.regimes` defines
every derivation); each term keeps its source (table and row selector), how it was derived and an
uncertainty band (interquartile range of the measurement, or the fit's confidence interval). The
dominant layer of a regime is the argmax of its terms: computed, never typed. A regime whose
table, column or row is missing becomes a note ("no data yet for ..."), not an error.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from decodelab.core.validate import check_choice, check_int
from decodelab.toy.step import NAMED_CONFIGS

LAYERS = ("dispatch", "replay", "node", "orchestration", "compute", "comm")
# The compute term named for what it is (:mod:`decodelab.analysis.compute_split` derives each
# part): the floor the work needs at the measured ceilings; for the toy step the fixed cost of
# its kernels and its dependent-latency chains; for the transformer its matmuls above their
# weights' floor, the small kernels (norms, rotary, copies: their whole time), attention above
# the K/V floor and the gaps (or, with PDL, the overlap) between kernels; what is not split
# further, and the runtime loop's forward pass, which is not split at all. "compute" stays only
# where no split was possible.
COMPUTE_PARTS = ("floor", "kernel fixed cost", "latency chains", "matmul above floor",
                 "small kernels", "attention above floor", "kernel gaps", "kernel overlap",
                 "above floor, not split", "forward pass")
SHOWN_LAYERS = ("dispatch", "replay", "node", "orchestration", "comm", *COMPUTE_PARTS, "compute")
REGIMES = ("eager", "graph", "multi-step graph", "persistent kernel", "runtime loop",
           "transformer decode, eager", "transformer decode", "tensor parallel")
HEADLINE_REFERENCE = "h200"  # the shipped reference the README's figure is computed from
# paged_model_linear and paged_attention: the kernel reads a floor's ceiling must not be below
# (env.ceilings.fastest_kernel_read)
TABLES = ("dispatch", "replay_nodes", "replay_multistep", "persistent", "paged_model",
          "paged_model_kernels", "paged_model_linear", "paged_attention", "runtime",
          "runtime_requests", "serve_offline", "serve_online", "batch_invariance",
          "batch_invariance_cost", "tp", "environment")
# Tables measured on several GPUs of one host: the reference ``h200`` keeps them in
# ``data/reference/h200x<n>/`` (the Makefile's bench-gpu-tp names the folder so).
MULTI_GPU_TABLES = ("tp",)


class MissingData(LookupError):
    """A table, column or row that a regime needs is not (yet) in the results."""


@dataclass(frozen=True, slots=True)
class Headline:
    """Which measured configuration each regime is read at.

    The toy regimes (eager, graph, multi-step, persistent) use one named toy config: ultra-light
    by default, the seed study's own headline regime, measured by phases 1-3 alike. The model
    regimes use Llama-3.2-1B shapes: the bare transformer decode at batch 1 and ``context`` (the
    latency case), the runtime loop at batch 32 (the serving case phase 4b targets, at the
    context of its steady-decode run).
    """

    toy_config: str = "ultra-light"
    model_batch: int = 1
    runtime_batch: int = 32
    context: int = 512

    def __post_init__(self) -> None:
        check_choice("Headline", "toy_config", self.toy_config, tuple(NAMED_CONFIGS))
        check_int("Headline", "model_batch", self.model_batch, 1, 4096)
        check_int("Headline", "runtime_batch", self.runtime_batch, 1, 4096)
        check_int("Headline", "context", self.context, 1, 1 << 20)


@dataclass(frozen=True, slots=True)
class Term:
    """One layer's time per step (µs) in one regime, with where it came from."""

    layer: str
    us: float
    low: float  # uncertainty band (NaN when the source gives none)
    high: float
    source: str  # table[selector]
    how: str  # the derivation, in words


@dataclass(frozen=True, slots=True)
class Regime:
    """One regime's measured step time and its terms (the terms sum to ``step_us``)."""

    name: str
    step_us: float
    step_low: float
    step_high: float
    source: str
    terms: tuple[Term, ...]
    config: str = ""  # what was measured, for labels: "ultra-light, K=256", "B=32"
    origin: str = ""  # where its rows come from when not the decomposed origin's own folder
    parts: tuple[Term, ...] = ()  # the compute term's parts (they sum to it), where split

    @property
    def layers(self) -> tuple[Term, ...]:
        """The terms, the compute term replaced by its parts where it was split: the layers
        the regime table ranks (they sum to ``step_us`` too)."""
        if not self.parts:
            return self.terms
        return tuple(p for t in self.terms for p in (self.parts if t.layer == "compute" else (t,)))

    @property
    def dominant(self) -> Term:
        """The largest layer (the first listed wins a tie)."""
        return max(self.layers, key=lambda t: t.us)


class Tables:
    """The phase tables of one origin (e.g. ``reference/h200``); absent tables are remembered."""

    def __init__(self, frames: Mapping[str, pd.DataFrame], origin: str | None = None,
                 problems: Mapping[str, str] | None = None,
                 stamps: Mapping[tuple[str, str], tuple[str, str]] | None = None):
        self.frames = {k: v for k, v in frames.items() if v is not None and not v.empty}
        self.origin = origin
        self.problems = dict(problems or {})
        # (table, origin) -> (commit, UTC time) of the run that wrote it, from its sidecar
        self.stamps = dict(stamps or {})

    def stamp(self, table: str, origin: str | None = None) -> tuple[str, str]:
        """(commit, UTC time) table ``table`` of ``origin`` (default: this origin) was measured
        at; each "" where unknown (tables built in memory, sidecars without the field)."""
        return self.stamps.get((table, origin or self.origin or ""), ("", ""))

    def frame(self, table: str, columns: Iterable[str] = ()) -> pd.DataFrame:
        """Table ``table`` restricted to this origin; MissingData names what is absent."""
        if table not in self.frames:
            why = self.problems.get(table, "not written yet")
            raise MissingData(f"no data yet for table `{table}` ({why})")
        frame = self.frames[table]
        if self.origin is not None and "origin" in frame.columns:
            frame = frame[self.accepts(frame["origin"], table)]
            if frame.empty:
                raise MissingData(f"no data yet for table `{table}` from {self.origin}")
        lacking = [c for c in columns if c not in frame.columns]
        if lacking:
            raise MissingData(f"table `{table}` lacks column(s) {', '.join(map(repr, lacking))} "
                              f"(it has: {', '.join(frame.columns)})")
        return frame

    def accepts(self, origins: pd.Series, table: str) -> pd.Series:
        """Which rows are this origin's: its own, and for a multi-GPU table those of the same
        device's ``x<n>`` folder (``reference/h200x2`` for ``reference/h200``)."""
        mine = origins == self.origin
        if table in MULTI_GPU_TABLES:
            mine |= origins.astype(str).str.fullmatch(re.escape(str(self.origin)) + r"x\d+")
        return mine

    def rows(self, table: str, where: Mapping[str, object], columns: Sequence[str] = ()
             ) -> tuple[pd.DataFrame, str]:
        """Rows matching ``where`` (column == value) and a selector string naming them."""
        frame = self.frame(table, [*where, *columns])
        for col, value in where.items():
            frame = frame[frame[col] == value]
        selector = selector_of(table, self.origin, where)
        if frame.empty:
            raise MissingData(f"no rows in {selector}")
        return frame, selector

    def one(self, table: str, where: Mapping[str, object], columns: Sequence[str] = ()
            ) -> tuple[pd.Series, str]:
        """The first row matching ``where`` (tables hold one row per measured point)."""
        frame, selector = self.rows(table, where, columns)
        return frame.iloc[0], selector


def fmt_us(us: float) -> str:
    """µs for tables and prose: three significant digits, no exponent."""
    if not math.isfinite(us):
        return "n/a"
    return f"{us:,.0f}" if abs(us) >= 100 else f"{us:.3g}"


def fmt_si(value: float, unit: str) -> str:
    """A count in SI units, four significant digits: 2,488,410,112 B -> "2.488 GB",
    65,536 FLOP -> "65.54 kFLOP" (raw digit strings are for tables of record, not prose)."""
    if not math.isfinite(value):
        return "n/a"
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.4g} {prefix}{unit}"
    return f"{value:.4g} {unit}"


def selector_of(table: str, origin: str | None, where: Mapping[str, object]) -> str:
    parts = ([f"origin={origin}"] if origin else []) + [f"{k}={v}" for k, v in where.items()]
    return f"{table}[{', '.join(parts)}]"


def _stamps(names: Sequence[str]) -> dict[tuple[str, str], tuple[str, str]]:
    """(table, origin) -> (commit, UTC time) from every stored sidecar of ``names``."""
    from decodelab.core.results import table_files
    from decodelab.core.table_io import read_meta

    out = {}
    for name in names:
        for origin, path in table_files(name):
            try:
                meta = read_meta(path)
            except (OSError, ValueError):
                continue
            commit = str(meta.get("device", {}).get("git_commit") or "")
            out[(name, origin)] = ("" if commit == "unknown" else commit,
                                   str(meta.get("created_utc") or ""))
    return out


def load_tables(origin: str | None = "reference/h200", names: Sequence[str] = TABLES) -> Tables:
    """Every phase table that exists (merged reference + local, then filtered to ``origin``)."""
    from decodelab.core.results import stored_tables

    problems: dict[str, str] = {}  # unreadable tables: say so
    # only this origin's files: a local run of another schema must not hide them
    frames = stored_tables(names, origins=[origin] if origin else None, problems=problems)
    return Tables(frames, origin, problems, _stamps(list(frames)))
