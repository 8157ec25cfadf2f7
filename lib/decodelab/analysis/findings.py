"""The report's findings and conclusions, computed from the tables: each finding is a sentence
with its number and the table it comes from; none is written by hand.

A finding whose table is missing is left out (the report says how many it could compute), so
the summary shrinks with the data instead of failing or inventing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd

from decodelab.analysis.layers import Headline, MissingData, Regime, Tables, fmt_us


@dataclass(frozen=True, slots=True)
class Finding:
    text: str  # the sentence, its number included
    number: str  # the number alone, for the summary table
    source: str  # table[selector] the number is computed from


def _term(regime: Regime, layer: str) -> float:
    return next((t.us for t in regime.terms if t.layer == layer), 0.0)


def _by_name(regimes: Sequence[Regime]) -> dict[str, Regime]:
    return {r.name: r for r in regimes}


def _needed(regimes: Sequence[Regime], *names: str) -> list[Regime]:
    """The named regimes, in order; MissingData names those the tables did not allow."""
    by_name = _by_name(regimes)
    missing = [n for n in names if n not in by_name]
    if missing:
        raise MissingData(" and ".join(missing) + " regime")
    return [by_name[n] for n in names]


def graph_removes_dispatch(tables: Tables, regimes: Sequence[Regime], h: Headline) -> Finding:
    e, g = _needed(regimes, "eager", "graph")
    return Finding(f"On the toy step ({g.config}) a CUDA graph cuts the step from "
                   f"{fmt_us(e.step_us)} µs to {fmt_us(g.step_us)} µs: dispatch was "
                   f"{_term(e, 'dispatch') / e.step_us:.0%} of the eager step.",
                   f"{e.step_us / g.step_us:.1f}x", g.source)


def replay_cost(tables: Tables, regimes: Sequence[Regime], h: Headline) -> Finding:
    from decodelab.analysis.regimes import multistep_fit
    from decodelab.core.seed import quoted

    fit, _, src = multistep_fit(tables, h)
    return Finding(f"A graph replay costs {fit['t_replay_us']:.2f} µs "
                   f"[{fit['slope_ci_low']:.2f}, {fit['slope_ci_high']:.2f}] per launch on the "
                   f"{h.toy_config} step (seed: ~{quoted('replay_per_step'):g} µs on SM75); "
                   f"capturing K steps per graph divides it by K.",
                   f"{fit['t_replay_us']:.2f} µs", f"fit of {src}")


def persistent_vs_graph(tables: Tables, p: Regime, g: Regime, h: Headline) -> tuple[float, str]:
    """The persistent kernel's speed-up over the single-step graph, and which graph: the replay
    timed beside it in the same run (phase 3's table, the ratio chapter 03 shows: one
    computation, :func:`decodelab.persistent.analysis.seed_comparison`), else phase 1's
    graph step (another run)."""
    from decodelab.persistent.analysis import seed_comparison

    try:
        cmp = seed_comparison(tables.frame("persistent"))
        ratio = float(cmp[cmp["config"] == h.toy_config]["x_graph_k1"].iloc[0])
    except (MissingData, KeyError, IndexError, ValueError):
        ratio = float("nan")
    if ratio == ratio:
        return ratio, "the single-step graph replay timed beside it in the same run"
    return g.step_us / p.step_us, "the single-step graph of phase 1 (another run)"


def persistent_rate(tables: Tables, regimes: Sequence[Regime], h: Headline) -> Finding:
    p, g = _needed(regimes, "persistent kernel", "graph")
    ratio, which = persistent_vs_graph(tables, p, g, h)
    return Finding(f"The persistent kernel ({p.config}) runs {1e6 / p.step_us:,.0f} steps/s, "
                   f"{ratio:.1f}x {which}: replay and kernel boundaries gone, "
                   f"{p.dominant.layer} is {p.dominant.us / p.step_us:.0%} of its step.",
                   f"{1e6 / p.step_us:,.0f} steps/s", p.source)


def _paged_model(tables: Tables) -> pd.DataFrame:
    """Table ``paged_model`` with its floors' ceiling (``model.floors.with_ceiling``)."""
    from decodelab.model.floors import with_ceiling

    frame = tables.frame("paged_model", ["mode", "batch", "context", "ms_per_step",
                                         "bytes_per_step", "copy_gb_s", "roofline_fraction"])
    try:
        environment = tables.frame("environment")
    except MissingData:
        environment = None
    return with_ceiling(frame, environment, tables.frames)


def _model_row(tables: Tables, mode: str, h: Headline) -> pd.Series:
    pm = _paged_model(tables)
    hit = pm[(pm["mode"] == mode) & (pm["batch"] == h.model_batch)
             & (pm["context"] == h.context)]
    if hit.empty:
        raise MissingData(f"no {mode} row at batch {h.model_batch}, context {h.context}")
    return hit.iloc[0]


def _at_ceiling(row: pd.Series) -> str:
    """Which bandwidth a finding's floor uses, in a few words (the floors' notes say more)."""
    if row.get("ceiling") == "read ceiling":
        return "the measured read ceiling"
    return ("the copy bandwidth, standing in for a read ceiling not measured yet (a read-only "
            "kernel can beat it)")


def roofline(tables: Tables, regimes: Sequence[Regime], h: Headline) -> Finding:
    from decodelab.model.analysis import floor_ms

    g, e = _model_row(tables, "graph", h), _model_row(tables, "eager", h)
    _, src = tables.one("paged_model", {"mode": "graph", "batch": h.model_batch,
                                        "context": h.context})
    return Finding(f"The real-shaped decode step ({g.get('model', 'paged model')}, batch "
                   f"{h.model_batch}, context {h.context}) takes {g['ms_per_step']:.3g} ms "
                   f"graph-captured, {g['roofline_fraction']:.0%} of the HBM roofline (its "
                   f"bytes need {float(floor_ms(g)):.3g} ms at {_at_ceiling(g)}); "
                   f"eager it takes {e['ms_per_step'] / g['ms_per_step']:.1f}x longer.",
                   f"{g['roofline_fraction']:.0%} of roofline", src)


def compute_floor(tables: Tables, regimes: Sequence[Regime], h: Headline) -> Finding:
    from decodelab.analysis.compute_split import split_compute

    splits, notes = split_compute(tables, _needed(regimes, "transformer decode"), h)
    if not splits:
        raise MissingData("; ".join(notes))
    s = splits[0]
    floor = s.us("floor")
    above = ", ".join(f"{fmt_us(t.us)} µs of {t.layer}" for t in s.parts[1:])
    return Finding(f"Split one level deeper, the device time of the transformer step's kernels "
                   f"({fmt_us(s.compute.us)} µs) is {fmt_us(floor)} µs of floor (its bytes or "
                   f"FLOPs at the measured rates), then {above}.",
                   f"floor {floor / s.compute.us:.0%} of compute", s.parts[0].source)


def _transformers_line(tables: Tables) -> tuple[str, str]:
    """Our step against transformers' generate (uncompiled, its faster cache) at the smallest
    batch it was timed: the sentence and its number ("" where it was not timed)."""
    from decodelab.model.analysis import vs_transformers

    vs = vs_transformers(_paged_model(tables))
    vs = vs[vs["batch"] == vs["batch"].min()]
    if vs.empty:
        return "", ""
    r = vs.iloc[0]
    return (f"against transformers' generate without compilation (batch {r['batch']}, its "
            f"faster cache `{r['best_peer']}`: {r[r['best_peer']]:,.0f} tokens/s against our "
            f"{r[r['ours']]:,.0f}) it is {r['speedup']:.1f}x"), f"{r['speedup']:.1f}x"


def versus_peers(tables: Tables, regimes: Sequence[Regime], h: Headline) -> Finding:
    """Our step against the strongest peer measured: torch.compile max-autotune over a static
    cache (``compile_static``) where it was timed, at the headline point where it was timed
    there, with its range over every point; transformers' uncompiled generate after it (and
    alone, where no compiled peer was timed)."""
    from decodelab.model.analysis import vs_compiled

    compiled = vs_compiled(_paged_model(tables))
    hf, hf_number = _transformers_line(tables)
    if compiled.empty:
        if not hf:
            raise MissingData("no peer rows in paged_model")
        return Finding(f"No compiled peer was timed here; {hf}.", hf_number,
                       f"paged_model[origin={tables.origin}]")
    at = compiled[(compiled["batch"] == h.model_batch) & (compiled["context"] == h.context)]
    r = (at if not at.empty else compiled).iloc[0]
    lo, hi = compiled["speedup"].min(), compiled["speedup"].max()
    spread = (f"; {lo:.2f}-{hi:.2f}x at the {len(compiled)} points both were timed"
              if len(compiled) > 1 else "")
    return Finding(f"Against the strongest peer measured, `torch.compile(mode=\"max-autotune\")` "
                   f"over a static cache (`compile_static`: the same weights, checked against "
                   f"ours, {r['compile_s']:.0f} s of compilation), our graph step is "
                   f"{r['speedup']:.2f}x faster at batch {r['batch']}, context {r['context']} "
                   f"({r['compile_static_ms']:.3g} ms against {r['ms_per_step']:.3g} ms{spread})"
                   + (f"; {hf}." if hf else "."),
                   f"{r['speedup']:.2f}x vs compile_static",
                   f"paged_model[origin={tables.origin}, mode=compile_static, "
                   f"batch={r['batch']}, context={r['context']}]")


def attention_rate(tables: Tables, regimes: Sequence[Regime], h: Headline) -> Finding:
    from decodelab.model.analysis import attention_marginal

    m = attention_marginal(_paged_model(tables))
    if m.empty:
        raise MissingData("one context only in paged_model")
    r = m.sort_values("batch").iloc[-1]
    lead = ("attention, not the weights, sets the step" if r["kv_share_long"] > 0.5
            else "the weights still dominate the bytes")
    return Finding(f"At long context {lead}: from {r['context_short']} to "
                   f"{r['context_long']} tokens at batch {r['batch']}, the extra K/V "
                   f"({r['kv_share_long']:.0%} of the step's bytes) is read at "
                   f"{r['kv_tb_s']:.2f} TB/s, {r['of_ceiling']:.0%} of the {r['ceiling']}"
                   + (" (a read-only stream can exceed the copy bandwidth, which counts a read "
                      "and a write of every byte; no read ceiling was measured yet)"
                      if r["ceiling"] != "read ceiling" and r["of_ceiling"] > 1 else "") + ".",
                   f"{r['kv_tb_s']:.2f} TB/s", f"paged_model[origin={tables.origin}, "
                                               f"mode=graph, batch={r['batch']}]")


def orchestration(tables: Tables, regimes: Sequence[Regime], h: Headline) -> Finding:
    (rt,) = _needed(regimes, "runtime loop")
    orch = _term(rt, "orchestration")
    return Finding(f"The serving loop ({rt.config}) adds {fmt_us(orch)} µs of orchestration "
                   "(schedule, prepare, sample, update, emit) on top of the graph-captured "
                   "forward pass, on the wall clock" + host_work_line(tables, h, orch) + ".",
                   f"{orch / rt.step_us:.0%} of the step", rt.source)


def host_work_line(tables: Tables, h: Headline, exposed: float) -> str:
    """The engine's host work outside the forward (its per-step breakdown: chapter 04b's
    "host outside forward") beside the orchestration the wall clock shows: two measurements,
    the second what the first leaves exposed."""
    try:
        row, src = tables.one("runtime", {"variant": "engine", "batch": h.runtime_batch},
                              ["orchestration_us"])
    except MissingData:
        return ""
    host = float(row["orchestration_us"])
    if math.isnan(host):
        return ""
    hidden = host - exposed
    return (f"; the host work behind it is {fmt_us(host)} µs per step (the engine's own "
            f"breakdown, `{src}` column orchestration_us, chapter 04b's \"host outside "
            f"forward\"), and {fmt_us(hidden)} µs of that runs while the GPU computes (the "
            "graph replay returns at once, and the step before's tokens are processed under "
            "the next forward), so only the rest shows"
            if hidden > 0 else f"; the host work behind it is {fmt_us(host)} µs per step")


def poisson_load(tables: Tables, regimes: Sequence[Regime], h: Headline) -> Finding:
    """Chapter 04b's workload latencies explained by its offered load (analysis.load)."""
    from decodelab.analysis.load import load_of, load_text

    load = load_of(tables)
    return Finding(load_text(load), f"offered {load.overload:.1f}x what it serves", load.source)


def serving(tables: Tables, regimes: Sequence[Regime], h: Headline) -> Finding:
    from decodelab.analysis.serving import serving_line

    return Finding(*serving_line(tables))


def batch_invariance(tables: Tables, regimes: Sequence[Regime], h: Headline) -> Finding:
    from decodelab.analysis.serving import invariance_line

    return Finding(*invariance_line(tables))


def communication(tables: Tables, regimes: Sequence[Regime], h: Headline) -> Finding:
    from decodelab.analysis.tp_regime import tp_speedup_line

    (tp,) = _needed(regimes, "tensor parallel")
    comm = _term(tp, "comm")
    versus = tp_speedup_line(tables, tp, h)
    return Finding(f"Split over two GPUs ({tp.config}), the collectives add "
                   f"{fmt_us(comm)} µs to a {fmt_us(tp.step_us)} µs step: T_comm is the layer "
                   "tensor parallelism adds" + (f"; {versus}" if versus else "") + ".",
                   f"{comm / tp.step_us:.0%} of the step", tp.source)


FINDINGS: tuple[Callable[[Tables, Sequence[Regime], Headline], Finding], ...] = (
    graph_removes_dispatch, replay_cost, persistent_rate, roofline, compute_floor,
    versus_peers, attention_rate, orchestration, poisson_load, serving, batch_invariance,
    communication)


def findings(tables: Tables, regimes: Sequence[Regime], h: Headline | None = None
             ) -> list[Finding]:
    """Every finding the tables allow, in the order of the layers they peel off."""
    h = h or Headline()
    out = []
    for compute in FINDINGS:
        try:
            out.append(compute(tables, regimes, h))
        except (MissingData, KeyError, IndexError, ValueError, ZeroDivisionError):
            continue
    return out


def findings_frame(found: Sequence[Finding]) -> pd.DataFrame:
    return pd.DataFrame([{"finding": f.text, "number": f.number, "source": f.source}
                         for f in found], columns=["finding", "number", "source"])
