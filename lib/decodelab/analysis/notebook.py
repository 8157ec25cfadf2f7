"""Notebook 05_report: its parameters and the helpers it calls (loading and decomposing a
source, the views and prose of the regime table, this machine's GPU against the reference)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pandas as pd

from decodelab.analysis.decompose import decompose, regime_table, terms_frame
from decodelab.analysis.layers import (
    HEADLINE_REFERENCE,
    Headline,
    Regime,
    Tables,
    fmt_us,
    load_tables,
)
from decodelab.core import paths
from decodelab.core.params import NotebookParams as BaseParams
from decodelab.core.params import param
from decodelab.toy.step import NAMED_CONFIGS


def _sources() -> tuple[str, ...]:
    """What notebook 05 can decompose: this machine's results or any shipped reference."""
    return ("local", *paths.reference_folders())


@dataclass(frozen=True, slots=True)
class NotebookParams(BaseParams):
    """Parameters of notebook 05_report (``profile`` and ``interactive`` come from the base)."""

    NOTEBOOK: ClassVar[str] = "05_report"

    reference: str = param(HEADLINE_REFERENCE, "the results decomposed: a reference folder, or "
                           "local (this machine's)", choices=_sources,
                           what="'local' or a folder of data/reference/")
    toy_config: str = param("ultra-light", "toy configuration of the toy regimes",
                            choices=tuple(NAMED_CONFIGS))
    model_batch: int = param(1, "batch of the transformer-decode regimes", low=1, high=4096)
    runtime_batch: int = param(32, "batch of the runtime-loop regime", low=1, high=4096)
    context: int = param(512, "tokens of context of the transformer-decode regimes",
                         low=1, high=1 << 20)

    @property
    def headline(self) -> Headline:
        return Headline(self.toy_config, self.model_batch, self.runtime_batch, self.context)

    @property
    def origin(self) -> str:
        """The origin decomposed: a reference folder, or ``local`` (this machine's results)."""
        return "local" if self.reference == "local" else f"reference/{self.reference}"

    @property
    def is_headline(self) -> bool:
        """The README's configuration: only this run may rewrite ``figures/headline_*``."""
        return self.reference == HEADLINE_REFERENCE and self.headline == Headline()


def load(params: NotebookParams) -> Decomposition:
    """The decomposed origin's tables, regimes (at the parameters' headline) and the missing
    ones, with their terms and regime table."""
    tables = load_tables(params.origin)
    regimes, missing = decompose(tables, params.headline)
    return Decomposition(tables, regimes, missing, terms_frame(regimes), regime_table(regimes))


@dataclass(frozen=True, slots=True)
class Decomposition:
    tables: Tables
    regimes: list[Regime]
    missing: list[str]
    terms: pd.DataFrame
    table: pd.DataFrame


def regime_view(table: pd.DataFrame) -> pd.DataFrame:
    """The regime table as the report shows it: step, dominant layer and the next one."""
    return table[["regime", "config", "step_us", "dominant", "dominant_share", "runner_up",
                  "runner_up_share", "check"]]


REGIME_LABELS = {"regime": "regime", "config": "measured at", "step_us": "µs per step",
                 "dominant": "dominant layer", "dominant_share": "share",
                 "runner_up": "next layer", "runner_up_share": "its share", "check": "check"}
TERM_LABELS = {"regime": "regime", "layer": "layer", "us": "µs per step", "low": "low (µs)",
               "high": "high (µs)", "share": "share of the step", "source": "rows",
               "how": "derived as"}


def local_gpu(params: NotebookParams) -> Decomposition | None:
    """This machine's own decomposition, from its GPU rows only (a CPU run's rows say what the
    CPU backend costs, not where a GPU step's time goes); None when it has no GPU regime."""
    tables = load_tables("local")
    gpu = Tables({name: frame[frame["device"].astype(str) != "cpu"] if "device" in frame
                  else frame for name, frame in tables.frames.items()}, "local", tables.problems)
    regimes, missing = decompose(gpu, params.headline)
    if not regimes:
        return None
    return Decomposition(gpu, regimes, missing, terms_frame(regimes), regime_table(regimes))


def side_by_side(ours: pd.DataFrame, yours: pd.DataFrame, ours_name: str,
                 yours_name: str) -> pd.DataFrame:
    """One row per regime measured on both: the step and dominant layer of each."""
    cols = ["regime", "step_us", "dominant", "dominant_share"]
    both = yours[cols].merge(ours[cols], on="regime", suffixes=("_yours", "_ours"))
    both["ratio"] = both["step_us_yours"] / both["step_us_ours"]
    return both.rename(columns={
        "step_us_yours": f"{yours_name}: µs per step", "dominant_yours": f"{yours_name}: dominant",
        "dominant_share_yours": f"{yours_name}: share", "step_us_ours": f"{ours_name}: µs per step",
        "dominant_ours": f"{ours_name}: dominant", "dominant_share_ours": f"{ours_name}: share",
        "ratio": "step ratio (yours / ours)"})


def side_by_side_units(ours_name: str, yours_name: str) -> dict[str, str]:
    """The units of :func:`side_by_side`'s columns (named after the two sources)."""
    units = {"step ratio (yours / ours)": "ratio"}
    for name in (ours_name, yours_name):
        units |= {f"{name}: µs per step": "us", f"{name}: share": "fraction"}
    return units


def transitions(regimes: list[Regime], tables: Tables | None = None,
                headline: Headline | None = None) -> list[str]:
    """What removing each layer revealed, read off consecutive regimes (tensor parallelism
    against TP=1 of its own run, read from ``tables``)."""
    by_name = {r.name: r for r in regimes}
    lines = []
    if "eager" in by_name and "graph" in by_name:
        e, g = by_name["eager"], by_name["graph"]
        replay = term(g, "replay")
        lines.append(f"- A graph removes dispatch: the step goes from {fmt_us(e.step_us)} µs to "
                     f"{fmt_us(g.step_us)} µs ({e.step_us / g.step_us:.1f}x). What remains is "
                     f"{fmt_us(replay)} µs of replay ({replay / g.step_us:.0%}) next to "
                     f"{fmt_us(term(g, 'compute'))} µs of kernel time: {g.dominant.layer} "
                     "dominates the single-step graph.")
    h = headline or Headline()
    if "graph" in by_name and "persistent kernel" in by_name:
        from decodelab.analysis.findings import persistent_vs_graph

        g, p = by_name["graph"], by_name["persistent kernel"]
        ratio, which = ((g.step_us / p.step_us, "the single-step graph's") if tables is None
                        else persistent_vs_graph(tables, p, g, h))
        lines.append(f"- A persistent kernel removes replay and the kernel boundaries: its step "
                     f"is {ratio:.1f}x shorter than {which}, and {p.dominant.layer} is "
                     f"{p.dominant.us / p.step_us:.0%} of it.")
    if "runtime loop" in by_name:
        from decodelab.analysis.findings import host_work_line

        rt = by_name["runtime loop"]
        orch = term(rt, "orchestration")
        lines.append(f"- The runtime loop ({rt.config}) adds {fmt_us(orch)} µs of orchestration "
                     f"to the forward pass, {orch / rt.step_us:.0%} of its step"
                     + (host_work_line(tables, h, orch) if tables is not None else "") + ".")
    if "tensor parallel" in by_name:
        from decodelab.analysis.tp_regime import one_gpu_note, tp_speedup_line

        tp = by_name["tensor parallel"]
        versus = tp_speedup_line(tables, tp, h) if tables is not None else ""
        lines.append(f"- Tensor parallelism ({tp.config}) halves the weights each GPU reads but "
                     f"adds {fmt_us(term(tp, 'comm'))} µs of collectives"
                     + (f": {versus}." if versus else ".")
                     + (f" {one_gpu_note(tables, h)}" if tables is not None else ""))
    return lines


def term(regime: Regime, layer: str) -> float:
    """The µs of one layer in a regime (0 where the regime has no such term)."""
    return next((t.us for t in regime.terms if t.layer == layer), 0.0)


def regime_lines(regimes: list[Regime]) -> list[str]:
    """One line per regime: its step and the layer that dominates it."""
    return [f"- **{r.name}** ({r.config}): {fmt_us(r.step_us)} µs per step; "
            f"{r.dominant.layer} dominates with {r.dominant.us / r.step_us:.0%} "
            f"({fmt_us(r.dominant.us)} µs)." for r in regimes]


def seed_tally(seeds: pd.DataFrame) -> str:
    """How many of the seed's claims agree by the rule, and which do not."""
    agreed = seeds[seeds["agrees?"] != "n/a"]
    if agreed.empty:
        return "No seed claim could be checked yet."
    yes = int((agreed["agrees?"] == "yes").sum())
    no = agreed.loc[agreed["agrees?"] == "no", ["claim", "rule applied"]]
    return (f"Of the seed's {len(agreed)} claims we could check, {yes} agree by the rule above "
            f"and {len(no)} do not" + (": " + "; ".join(f"{c} ({w})" for c, w in
                                                         no.itertuples(index=False))
                                       if len(no) else "") + ".")


TOY_REGIMES = ("eager", "graph", "multi-step graph", "persistent kernel")


def explore_view(tables: Tables, params: NotebookParams, config: str, *,
                 toy_only: bool = False) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """(terms, regime table) of the decomposition at another toy config, of every regime or
    (``toy_only``) of the regimes that config changes, for ``plots.report.decomposition_figure``;
    None when nothing was measured there."""
    from dataclasses import replace

    picked = decompose(tables, replace(params.headline, toy_config=config))[0]
    if toy_only:
        picked = [r for r in picked if r.name in TOY_REGIMES]
    return (terms_frame(picked), regime_table(picked)) if picked else None
