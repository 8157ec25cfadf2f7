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
- persistent kernel (``persistent``, fastest variant on the config; ``persistent_barriers``):
  node = barriers per step x measured barrier latency, when both are recorded;
  compute = us_per_step - node (remainder). The host is not involved per step.
- transformer decode (``paged_model``, graph mode, Llama-3.2-1B shapes): replay = the fitted fixed
  cost of one graph replay (``replay_nodes``, same device); compute = step - replay (remainder).
  Its share of the HBM roofline is reported by phase 4a.
- runtime loop (``runtime`` at the runtime batch; ``paged_model`` at the same batch): forward =
  the bare graph-captured forward of phase 4a; orchestration = engine step - forward (what the
  loop adds on the wall clock: schedule, prepare, sample, update, emit, not hidden by overlap);
  replay as above; compute = forward - replay (remainder).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import pandas as pd

from decodelab.layers import Headline, MissingData, Regime, Tables, Term, selector_of
from decodelab.toy import named

NAN = math.nan


def _num(row: pd.Series, col: str) -> float:
    value = row.get(col, NAN)
    try:
        return float(value)
    except (TypeError, ValueError):
        return NAN


def _first_column(frame: pd.DataFrame, table: str, candidates: Sequence[str]) -> str:
    """The first of ``candidates`` that ``frame`` has (phases name the same quantity in µs or ms)."""
    for col in candidates:
        if col in frame.columns:
            return col
    raise MissingData(f"table `{table}` has none of the columns {', '.join(candidates)}")


def _us(row: pd.Series, col: str) -> float:
    """``col`` in µs (columns named ``*_ms*`` hold milliseconds, ``*_s`` seconds)."""
    scale = 1e3 if "_ms" in col else (1e6 if col.endswith("_s") else 1.0)
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
        from decodelab.replay_fit import fit_multistep

        fit = fit_multistep(frame).iloc[0]
        fit["t_step_us"], fit["t_replay_us"]  # noqa: B018 - the columns this module reads
    except (ImportError, KeyError, IndexError, ValueError) as exc:
        raise MissingData(f"the phase-2 fit of {selector} failed: {exc}") from exc
    return fit, frame, selector


def replay_cost(tables: Tables) -> tuple[float, float, float, str]:
    """Fitted fixed cost of one graph replay (intercept of T(n) = T_replay + n T_node, wall)."""
    frame, selector = tables.rows("replay_nodes", {"kind": "graph"}, ["n_kernels", "wall_us"])
    try:
        from decodelab.replay_fit import fit_nodes

        fits = fit_nodes(frame, metrics=("wall",))
        fit = fits[fits["kind"] == "graph"].iloc[0]
        return (float(fit["intercept"]), float(fit["intercept_ci_low"]),
                float(fit["intercept_ci_high"]), f"fit of {selector}")
    except (ImportError, KeyError, IndexError, ValueError) as exc:
        raise MissingData(f"the phase-2 fit of {selector} failed: {exc}") from exc


def eager(tables: Tables, h: Headline) -> Regime:
    row, src = _dispatch_row(tables, h, "eager")
    wall, busy = _num(row, "wall_us_per_step"), _busy(row, src)
    lo, hi = _band(row, "wall_us_per_step", busy)
    return Regime("eager", wall, *_band(row, "wall_us_per_step"), src, (
        Term("dispatch", wall - busy, lo, hi, src, "wall - GPU-busy (remainder)"),
        Term("compute", busy, NAN, NAN, src, "GPU-busy time (profiler)")))


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
                 f"wall - GPU-busy (remainder, kernel boundaries included: {exc})"), compute))
    node = max(0.0, float(fit["t_step_us"]) - busy)
    node_lo = max(0.0, _num(fit, "intercept_ci_low") - busy)
    node_hi = max(0.0, _num(fit, "intercept_ci_high") - busy)
    lo, hi = _band(row, "wall_us_per_step", busy + node)
    return Regime("graph", *step, src, (
        Term("replay", wall - busy - node, lo, hi, src, "wall - GPU-busy - node (remainder)"),
        Term("node", node, node_lo, node_hi, f"fit of {fit_src}; {src}",
             "fitted T_step(K->inf) - GPU-busy"), compute))


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
        Term("compute", busy, NAN, NAN, bsrc, "GPU-busy time of the same step (profiler)")))


def persistent(tables: Tables, h: Headline) -> Regime:
    cfg = named(h.toy_config)
    where = {"hidden": cfg.hidden, "layers": cfg.layers, "batch": cfg.batch}
    frame, sel = tables.rows("persistent", where, ["variant"])
    col = _first_column(frame, "persistent", ("us_per_step", "wall_us_per_step"))
    best = frame.loc[frame[col].astype(float).idxmin()]
    src = selector_of("persistent", tables.origin, {**where, "variant": best["variant"]})
    step = _us(best, col)
    node, node_src, how = 0.0, src, "no barrier cost recorded"
    barriers = next((c for c in ("barriers_per_step", "stages_per_step") if c in best.index), None)
    try:
        cost, bsrc = barrier_us(tables, str(best["variant"]))
        if barriers is not None:
            node = _num(best, barriers) * cost
            node_src, how = f"{src}; {bsrc}", f"{barriers} x measured barrier latency"
    except MissingData:
        pass
    return Regime("persistent kernel", step, *_band(best, col), src, (
        Term("node", node, NAN, NAN, node_src, how),
        Term("compute", step - node, *_band(best, col, node), src,
             f"{col} - node (remainder): the whole step runs on the device")))


def barrier_us(tables: Tables, variant: str) -> tuple[float, str]:
    """Measured latency of the barrier a persistent variant uses between stages (µs)."""
    frame, sel = tables.rows("persistent_barriers", {"variant": variant})
    col = _first_column(frame, "persistent_barriers", ("us_per_barrier", "barrier_us", "us"))
    return _us(frame.iloc[0], col), sel


_MODEL_STEP = ("us_per_token", "step_us", "wall_us_per_step", "ms_per_token", "ms_per_step")


def _model_row(tables: Tables, batch: int, context: int) -> tuple[pd.Series, str, str]:
    where = {"mode": "graph", "batch": batch, "context": context}
    frame, src = tables.rows("paged_model", where)
    col = _first_column(frame, "paged_model", _MODEL_STEP)
    return frame.iloc[0], col, src


def transformer(tables: Tables, h: Headline) -> Regime:
    row, col, src = _model_row(tables, h.model_batch, h.context)
    step = _us(row, col)
    replay, rlo, rhi, rsrc = replay_cost(tables)
    return Regime("transformer decode", step, *_band(row, col), src, (
        Term("replay", replay, rlo, rhi, rsrc, "fitted fixed cost of one graph replay"),
        Term("compute", step - replay, *_band(row, col, replay), src,
             f"{col} - replay (remainder)")))


_ENGINE_STEP = ("engine_us_per_step", "step_us", "wall_us_per_step", "engine_ms_per_step",
                "ms_per_step")


def runtime(tables: Tables, h: Headline) -> Regime:
    frame, src = tables.rows("runtime", {"batch": h.runtime_batch})
    col = _first_column(frame, "runtime", _ENGINE_STEP)
    row = frame.iloc[0]
    step = _us(row, col)
    fwd_row, fwd_col, fwd_src = _model_row(tables, h.runtime_batch, h.context)
    forward = _us(fwd_row, fwd_col)
    replay, rlo, rhi, rsrc = replay_cost(tables)
    return Regime("runtime loop", step, *_band(row, col), src, (
        Term("orchestration", step - forward, *_band(row, col, forward), f"{src}; {fwd_src}",
             f"engine {col} - bare forward {fwd_col}"),
        Term("replay", replay, rlo, rhi, rsrc, "fitted fixed cost of one graph replay"),
        Term("compute", forward - replay, NAN, NAN, fwd_src,
             "bare graph forward - replay (remainder)")))


BUILDERS: dict[str, Callable[[Tables, Headline], Regime]] = {
    "eager": eager, "graph": graph, "multi-step graph": multistep,
    "persistent kernel": persistent, "runtime loop": runtime, "transformer decode": transformer,
}
