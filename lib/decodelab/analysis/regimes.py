"""How each regime's step is split into layers, from which rows (the definitions of the report).

All times are µs per decode step. "busy" is the GPU-busy time of phase 1 (the union of kernel
intervals recorded by the profiler); a term marked *remainder* is the step's wall time minus the
terms measured directly, so the terms always sum to the measured step.

- eager (``dispatch``, mode eager): compute = busy; dispatch = wall - busy (remainder: the GPU
  waits while the host issues the step's kernels one by one).
- graph (``dispatch``, mode cuda_graph; fit of ``replay_multistep``): compute = busy;
  node = T_step(K->inf) - busy, where T_step(K->inf) is the fitted per-step time of back-to-back
  steps inside one graph (what remains once replay is amortised away: the kernels and the
  boundaries between them); replay = wall - busy - node (remainder).
- multi-step graph (``replay_multistep`` at the largest K measured, variant none):
  replay = fitted T_replay / K; compute = busy (same kernels as the single-step graph);
  node = wall - replay - compute (remainder).
- persistent kernel (``persistent``, fastest kernel variant on the config): node = barriers per
  step x the measured latency of that variant's barrier; compute = us_per_step - node
  (remainder). The host is not involved per step.
- transformer decode (``paged_model``, graph mode, Llama-3.2-1B shapes, model batch): compute =
  summed kernel time of one step (``paged_model_kernels``, profiler); node = device span (CUDA
  events) - summed kernel time (gaps between the step's kernels); replay = wall - device span
  (the graph launch and the input copies, where not hidden). Without the kernel profile at that
  shape, compute = device span. Its share of the HBM roofline is reported by phase 4a.
- transformer decode, eager (``paged_model``, eager mode, same shape): compute = the device span
  of the same step graph-captured; dispatch = eager wall - that span (remainder).
- runtime loop (``runtime``, variants engine and bare_forward at the runtime batch, one run):
  orchestration = engine wall - bare forward wall (what the loop adds on the wall clock:
  schedule, prepare, sample, update, emit, where not hidden by overlap); compute = the bare
  graph-captured forward (its few µs of replay are split out in the transformer regime).
  Uncertainty: the fastest and slowest timed chunk.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pandas as pd

from decodelab.analysis.layers import Headline, MissingData, Regime, Tables, Term, selector_of
from decodelab.model.modes import SERIAL
from decodelab.toy.step import named

NAN = math.nan


def _num(row: pd.Series, col: str) -> float:
    value = row.get(col, NAN)
    try:
        return float(value)
    except (TypeError, ValueError):
        return NAN


def _us(row: pd.Series, col: str) -> float:
    """``col`` in µs (columns named ``*_ms*`` hold milliseconds, ``*_s`` seconds)."""
    words = col.split("_")
    scale = 1e3 if "ms" in words else (1e6 if words[-1] == "s" and "per" not in words else 1.0)
    return _num(row, col) * scale


def _band(row: pd.Series, col: str, minus: float = 0.0) -> tuple[float, float]:
    """Interquartile band of ``col`` (``col_q1``/``col_q3`` or the dispatch table's short names)
    shifted by ``-minus``; NaN where the table has no quartiles."""
    stem = col.removesuffix("_per_step")
    for lo, hi in ((f"{col}_q1", f"{col}_q3"), (f"{stem}_q1", f"{stem}_q3")):
        if lo in row.index and hi in row.index:
            return _us(row, lo) - minus, _us(row, hi) - minus
    return NAN, NAN


def _dispatch_row(tables: Tables, h: Headline, mode: str) -> tuple[pd.Series, str]:
    where = {"mode": mode, "config": h.toy_config, "backend": "cuda"}
    return tables.one("dispatch", where, ["wall_us_per_step", "device_us_per_step"])


def _busy(row: pd.Series, selector: str) -> float:
    busy = _num(row, "device_us_per_step")
    if not math.isfinite(busy):
        raise MissingData(f"{selector} has no GPU-busy time")
    return busy


def multistep_fit(tables: Tables, h: Headline) -> tuple[pd.Series, pd.DataFrame, str]:
    """Phase 2's fit T(K) = T_step + T_replay/K on the headline config (variant none)."""
    frame, selector = tables.rows("replay_multistep", {"config": h.toy_config, "variant": "none"},
                                  ["k_steps", "wall_us_per_step"])
    try:
        from decodelab.replay.fit import fit_multistep

        fit = fit_multistep(frame).iloc[0]
        fit["t_step_us"], fit["t_replay_us"]  # noqa: B018 - the columns this module reads
    except (ImportError, KeyError, IndexError, ValueError) as exc:
        raise MissingData(f"the phase-2 fit of {selector} failed: {exc}") from exc
    return fit, frame, selector


def eager(tables: Tables, h: Headline) -> Regime:
    row, src = _dispatch_row(tables, h, "eager")
    wall, busy = _num(row, "wall_us_per_step"), _busy(row, src)
    lo, hi = _band(row, "wall_us_per_step", busy)
    return Regime("eager", wall, *_band(row, "wall_us_per_step"), src, (
        Term("dispatch", wall - busy, lo, hi, src, "wall - GPU-busy (remainder)"),
        Term("compute", busy, NAN, NAN, src, "GPU-busy time (profiler)")), h.toy_config)


def graph(tables: Tables, h: Headline) -> Regime:
    row, src = _dispatch_row(tables, h, "cuda_graph")
    wall, busy = _num(row, "wall_us_per_step"), _busy(row, src)
    step = (wall, *_band(row, "wall_us_per_step"))
    compute = Term("compute", busy, NAN, NAN, src, "GPU-busy time (profiler)")
    try:
        fit, _, fit_src = multistep_fit(tables, h)
    except MissingData as exc:  # node not separable yet: replay keeps the kernel boundaries
        lo, hi = _band(row, "wall_us_per_step", busy)
        return Regime("graph", *step, src, (
            Term("replay", wall - busy, lo, hi, src,
                 f"wall - GPU-busy (remainder, kernel boundaries included: {exc})"), compute),
            h.toy_config)
    node = max(0.0, float(fit["t_step_us"]) - busy)
    node_lo = max(0.0, _num(fit, "intercept_ci_low") - busy)
    node_hi = max(0.0, _num(fit, "intercept_ci_high") - busy)
    lo, hi = _band(row, "wall_us_per_step", busy + node)
    return Regime("graph", *step, src, (
        Term("replay", wall - busy - node, lo, hi, src, "wall - GPU-busy - node (remainder)"),
        Term("node", node, node_lo, node_hi, f"fit of {fit_src}; {src}",
             "fitted T_step(K->inf) - GPU-busy"), compute), h.toy_config)


def multistep(tables: Tables, h: Headline) -> Regime:
    fit, frame, fit_src = multistep_fit(tables, h)
    k = int(frame["k_steps"].max())
    at_k = frame[frame["k_steps"] == k].iloc[0]
    src = selector_of("replay_multistep", tables.origin,
                      {"config": h.toy_config, "variant": "none", "k_steps": k})
    wall = _num(at_k, "wall_us_per_step")
    replay = float(fit["t_replay_us"]) / k
    replay_lo, replay_hi = _num(fit, "slope_ci_low") / k, _num(fit, "slope_ci_high") / k
    brow, bsrc = _dispatch_row(tables, h, "cuda_graph")
    busy = _busy(brow, bsrc)
    lo, hi = _band(at_k, "wall_us_per_step", replay + busy)
    return Regime("multi-step graph", wall, *_band(at_k, "wall_us_per_step"), src, (
        Term("replay", replay, replay_lo, replay_hi, f"fit of {fit_src}",
             f"fitted T_replay / K (K = {k})"),
        Term("node", wall - replay - busy, lo, hi, src, "wall - replay - GPU-busy (remainder)"),
        Term("compute", busy, NAN, NAN, bsrc, "GPU-busy time of the same step (profiler)")),
        f"{h.toy_config}, K={k}")


def persistent_kernels(tables: Tables, config: str) -> tuple[pd.DataFrame, dict, str]:
    """Validated, timed persistent-kernel rows of a toy config (not the graph peers measured
    alongside them, not variants that failed validation)."""
    cfg = named(config)
    where = {"hidden": cfg.hidden, "layers": cfg.layers, "batch": cfg.batch}
    frame, src = tables.rows("persistent", where, ["variant", "us_per_step"])
    keep = ~frame["variant"].astype(str).str.startswith("graph")
    keep &= pd.to_numeric(frame["us_per_step"], errors="coerce").notna()
    if "validated" in frame.columns:
        keep &= frame["validated"].astype(str) == "True"
    if not keep.any():
        raise MissingData(f"no validated, timed persistent-kernel variant in {src}")
    return frame[keep], where, src


def persistent(tables: Tables, h: Headline) -> Regime:
    frame, where, _ = persistent_kernels(tables, h.toy_config)
    best = frame.loc[frame["us_per_step"].astype(float).idxmin()]
    src = selector_of("persistent", tables.origin, {**where, "variant": best["variant"]})
    step = _num(best, "us_per_step")
    node = _num(best, "barriers_per_step") * _num(best, "barrier_us")
    how = "barriers_per_step x barrier_us (measured barrier latency)"
    if not math.isfinite(node):
        node, how = 0.0, "no barrier cost recorded"
    return Regime("persistent kernel", step, *_band(best, "us_per_step"), src, (
        Term("node", node, NAN, NAN, src, how),
        Term("compute", step - node, *_band(best, "us_per_step", node), src,
             "us_per_step - node (remainder): the whole step runs on the device")),
        f"{h.toy_config}, {best['variant']}")


_MODEL_COLS = ["ms_per_step", "device_ms_per_step"]


def _model_row(tables: Tables, batch: int, context: int) -> tuple[pd.Series, str]:
    where = {"mode": "graph", "batch": batch, "context": context}
    return tables.one("paged_model", where, _MODEL_COLS)


def serial_transformer_us(tables: Tables, h: Headline) -> float:
    """The transformer step at the headline point with its kernels launched one after another
    (``graph_no_pdl``: before programmatic dependent launch removed their boundaries), µs;
    NaN where the tables hold no such row (PDL needs sm_90+)."""
    where = {"mode": SERIAL, "batch": h.model_batch, "context": h.context}
    try:
        row, _ = tables.one("paged_model", where, ["ms_per_step"])
    except MissingData:
        return NAN
    return _us(row, "ms_per_step")


def _kernel_busy(tables: Tables, batch: int, context: int) -> tuple[float, str]:
    """Sum of per-kernel device time of one graph step (phase 4a's profile)."""
    frame, src = tables.rows("paged_model_kernels", {"batch": batch, "context": context},
                             ["us_per_step"])
    return float(frame["us_per_step"].sum()), src


def _forward_terms(tables: Tables, batch: int, context: int) -> tuple[float, list[Term], str]:
    """The graph-captured forward of phase 4a: replay = wall - device span; node = device span -
    summed kernel time (when profiled at this shape); compute = the rest."""
    row, src = _model_row(tables, batch, context)
    wall, span = _us(row, "ms_per_step"), _us(row, "device_ms_per_step")
    terms = [Term("replay", wall - span, NAN, NAN, src,
                  "wall - device span (CUDA events): graph launch and input copies")]
    try:
        busy, ksrc = _kernel_busy(tables, batch, context)
    except MissingData as exc:
        busy, why = NAN, str(exc)
    if busy <= span:
        return wall, [*terms, Term("node", span - busy, NAN, NAN, f"{src}; {ksrc}",
                                   "device span - summed kernel time (gaps between kernels)"),
                      Term("compute", busy, NAN, NAN, ksrc, "summed kernel time (profiler)")], src
    if math.isfinite(busy):
        why = f"its summed kernel time {busy:.4g} µs exceeds the device span"
    terms.append(Term("compute", span, NAN, NAN, src,
                      f"device span (CUDA events; kernel boundaries included: {why})"))
    return wall, terms, src


def _model_label(tables: Tables, batch: int, context: int) -> str:
    row, _ = _model_row(tables, batch, context)
    return f"{row.get('model', 'paged model')}, B={batch}, context {context}"


def transformer(tables: Tables, h: Headline) -> Regime:
    wall, terms, src = _forward_terms(tables, h.model_batch, h.context)
    return Regime("transformer decode", wall, NAN, NAN, src, tuple(terms),
                  _model_label(tables, h.model_batch, h.context))


def transformer_eager(tables: Tables, h: Headline) -> Regime:
    where = {"mode": "eager", "batch": h.model_batch, "context": h.context}
    row, src = tables.one("paged_model", where, _MODEL_COLS)
    wall = _us(row, "ms_per_step")
    graph_row, graph_src = _model_row(tables, h.model_batch, h.context)
    span = _us(graph_row, "device_ms_per_step")
    return Regime("transformer decode, eager", wall, NAN, NAN, src, (
        Term("dispatch", wall - span, NAN, NAN, f"{src}; {graph_src}",
             "eager wall - device span of the same kernels in a graph (remainder)"),
        Term("compute", span, NAN, NAN, graph_src,
             "device span of the graph-captured step (CUDA events)")),
        _model_label(tables, h.model_batch, h.context))


def _runtime_row(tables: Tables, variant: str, batch: int) -> tuple[pd.Series, str]:
    return tables.one("runtime", {"variant": variant, "batch": batch}, ["wall_us"])


def runtime(tables: Tables, h: Headline) -> Regime:
    row, src = _runtime_row(tables, "engine", h.runtime_batch)
    bare, bare_src = _runtime_row(tables, "bare_forward", h.runtime_batch)
    step, forward = _num(row, "wall_us"), _num(bare, "wall_us")
    lo, hi = _num(row, "wall_min_us"), _num(row, "wall_max_us")  # fastest / slowest chunk
    return Regime("runtime loop", step, lo, hi, src, (
        Term("orchestration", step - forward, lo - forward, hi - forward, f"{src}; {bare_src}",
             "engine wall - bare graph forward wall (same run, same batch)"),
        Term("compute", forward, _num(bare, "wall_min_us"), _num(bare, "wall_max_us"), bare_src,
             "bare graph-captured forward (its replay included: split in the transformer "
             "regime)")), f"{row.get('model', 'paged model')}, B={h.runtime_batch}")


BUILDERS: dict[str, Callable[[Tables, Headline], Regime]] = {
    "eager": eager, "graph": graph, "multi-step graph": multistep,
    "persistent kernel": persistent, "runtime loop": runtime,
    "transformer decode, eager": transformer_eager, "transformer decode": transformer,
}
