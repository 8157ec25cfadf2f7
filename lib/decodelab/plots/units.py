"""Every shown column's unit, as declared (:mod:`decodelab.core.units` names the units).

A result table declares its columns' units beside its row dataclasses (the ``UNITS`` mapping of
``model.bench.rows``, ``engine.bench.rows``, ``parallel.rows``, ``persistent.rows``); the tables
whose rows are built where torch is imported (dispatch, replay, environment) and the frames the
analysis modules derive for the notebooks declare theirs below, each block naming the function
or table it belongs to. :func:`column_units` merges them and refuses a column declared with two
units. Beyond these, one naming convention is read, by suffix only (``_us`` µs, ``_ms`` ms,
``_s`` s, ``_gb_s`` GB/s, ...: :data:`SUFFIXES`); shares and ratios are never inferred.
"""

from __future__ import annotations

import importlib
from functools import cache

from decodelab.core.units import check_units

ROW_MODULES = ("decodelab.model.bench.rows", "decodelab.engine.bench.rows",
               "decodelab.parallel.rows", "decodelab.persistent.rows")
# Column-name suffixes that name a unit (the project's naming convention), longest first.
SUFFIXES: tuple[tuple[str, str], ...] = (
    ("_us_per_step", "us"), ("_ms_per_step", "ms"), ("_us_per_op", "us"), ("_us_per_call", "us"),
    ("_gb_s", "GB/s"), ("_tb_s", "TB/s"), ("_tok_s", "tokens/s"), ("_mib", "MiB"),
    ("_gib", "GiB"), ("_bytes", "bytes"), ("_us", "us"), ("_ms", "ms"), ("_s", "s"),
)

_T, _F, _R, _C, _N = "us", "fraction", "ratio", "count", "number"
DECLARED: dict[str, dict[str, str]] = {
    # table dispatch (dispatch.bench.DispatchRow)
    "dispatch": {"hidden": _C, "layers": _C, "batch": _C, "vocab": _C,
                 "kernels_per_step": _C, "launches_per_step": _C, "idle_fraction": _F,
                 "steps_per_s": "steps/s", "check_steps": _C, "max_state_err": _N,
                 "inner": _C, "repeats": _C},
    # tables replay_nodes and replay_multistep (replay.measure, rows as dicts)
    "replay": {"n_kernels": _C, "k_steps": _C, "steps_per_sample": _C,
               "replays_per_sample": _C, "wall_us_ci_low": _T, "wall_us_ci_high": _T},
    # table environment (env.calibrate.Calibration): each row's unit is in its `unit` column
    "environment": {"value": _N, "q1": _N, "q3": _N, "ci_low": _N, "ci_high": _N, "n": _C},
    # table paged_attention (model.bench.attention)
    "paged_attention": {"heads": _C, "kv_heads": _C, "head_dim": _C, "us_q1": _T, "us_q3": _T,
                        "kv_bytes": "bytes", "us_per_layer": _T},
    # tables persistent_ncu and persistent_sanitizer (persistent.tools)
    "persistent tools": {"launches": _C, "errors": _C, "returncode": _N},
    # model.attention_view (chapter 04, model)
    "attention view": {"paged_vs_best_peer": _R},
    # analysis.decompose, compute_view, load, notebook (chapter 05)
    "analysis": {"step_us": _T, "step_low": _T, "step_high": _T, "dominant_share": _F,
                 "runner_up_share": _F, "low": _T, "high": _T, "compute_us": _T,
                 "floor_us": _T, "floor_share": _F, "fixed_us": _T, "chains_us": _T,
                 "matmul_us": _T, "small_us": _T, "attention_us": _T, "rest_us": _T,
                 "requests": _C, "offered_per_s": "req/s", "served_per_s": "req/s",
                 "overload": _R, "step ratio (yours / ours)": _R},
    # model.analysis (chapter 04a)
    "model.analysis": {"floor_ms": "ms", "above_floor_ms": "ms", "eager": "tokens/s",
                       "graph": "tokens/s", "hf_dynamic": "tokens/s", "hf_static": "tokens/s",
                       "compile_static": "tokens/s", "speedup": _R, "graph_no_pdl_ms": "ms",
                       "saved_us": _T, "roofline_before": _F, "roofline_after": _F,
                       "tb_s": "TB/s", "of_ceiling": _F, "floor_gb_s": "GB/s",
                       "cublas_us": _T, "vs_cublas": _R, "above_us": _T,
                       "context_short": _C, "context_long": _C, "extra_kv_bytes": "bytes",
                       "kv_share_long": _F, "calls": _C},
    # parallel.analysis (chapter 06)
    "parallel.analysis": {"compute_ms": "ms", "comm_alone_ms": "ms", "comm_share": _F,
                          "in_step_us": _T, "alone_us": _T, "ratio": _R, "ms_tp1": "ms",
                          "us_per_op_eager": _T, "us_per_op_graph": _T,
                          "host_us_per_op_eager": _T, "host_us_per_op_graph": _T,
                          "busbw_gb_s_eager": "GB/s", "busbw_gb_s_graph": "GB/s"},
    # persistent.analysis (chapter 03)
    "persistent.analysis": {"seed_steps_per_s": "steps/s", "graph_k1_steps_per_s": "steps/s",
                            "x_graph_k1": _R, "target_steps_per_s": "steps/s",
                            "target_x_graph_k1": _R, "total": "cycles",
                            "warp_cycles_per_issued_instruction": "cycles",
                            "shared_wavefronts_per_step": _C,
                            "shared_bank_conflicts_per_step": _C,
                            "stall_barrier": "cycles", "stall_long_scoreboard": "cycles",
                            "stall_membar": "cycles", "stall_short_scoreboard": "cycles",
                            "stall_wait": "cycles", "stall_mio_throttle": "cycles",
                            "stall_math_pipe_throttle": "cycles", "stall_no_instruction": "cycles",
                            "stall_not_selected": "cycles", "stall_selected": "cycles",
                            "stall_dispatch_stall": "cycles", "stall_lg_throttle": "cycles",
                            "stall_branch_resolving": "cycles", "stall_drain": "cycles",
                            "stall_sleeping": "cycles", "stall_tex_throttle": "cycles",
                            "stall_imc_miss": "cycles", "stall_misc": "cycles"},
    # dispatch.notebook (chapter 01)
    "dispatch.notebook": {"crossover": _N, "host_ratio": _R, "wall_ratio": _R,
                          "device_ratio": _R, "us": _T},
    # replay.fit, replay.notebook (chapter 02)
    "replay.notebook": {"slope": _T, "intercept": _T, "slope_ci_low": _T, "slope_ci_high": _T,
                        "intercept_ci_low": _T, "intercept_ci_high": _T, "r2": "r2",
                        "r2_per_replay": "r2", "n_points": _C, "n_excluded": _C,
                        "k_2pct": _N, "k_max": _C, "k_max_rel_dev": _F, "noise_rel": _F,
                        "signal_rel": _F, "snr": _R, "ours_us": _T, "seed_us": _T,
                        "ours_over_seed": _R, "t_replay_us": _T, "t_step_us": _T},
    # engine.notebook (chapter 04b): the demo and the serving bench's tables
    # (engine.bench.serve_rows), declared here until their rows declare their own
    "engine.notebook": {"tokens": _C, "rows": _C, "finished": _C, "steps": _C,
                        "prompt_tokens": _C, "output_tokens": _C, "request_rate": "req/s",
                        "offered_rate": "req/s", "rate_fraction": _F, "ratio_to_floor": _R,
                        "max_num_seqs": _C, "kv_blocks": _C, "tflop_s": "TFLOP/s",
                        "gb_s": "GB/s", "output_tok_s": "tokens/s", "total_tok_s": "tokens/s",
                        "floor_output_tok_s": "tokens/s", "gc_pauses": _C,
                        "itl_p99_x_decode": _R, "steps_over_3x": _C, "prefill_buckets": _C,
                        "jit_compiles": _C, "token_budget": _C},
}


@cache
def column_units() -> dict[str, str]:
    """Column -> unit, from every declaration; ValueError where two declare one column with
    two units (the table would then be written one way or the other by chance)."""
    sources: list[tuple[str, dict[str, str]]] = []
    for name in ROW_MODULES:
        units = getattr(importlib.import_module(name), "UNITS", {})
        sources += [(f"{name}.{table}", mapping) for table, mapping in units.items()]
    sources += list(DECLARED.items())
    merged: dict[str, str] = {}
    owner: dict[str, str] = {}
    for where, mapping in sources:
        for col, unit in check_units(where, mapping).items():
            if col in merged and merged[col] != unit:
                raise ValueError(f"column {col!r}: unit {merged[col]!r} in {owner[col]}, "
                                 f"{unit!r} in {where}")
            merged[col], owner[col] = unit, where
    return merged


def unit_of(column: str, extra: dict[str, str] | None = None) -> str | None:
    """A column's declared unit (``extra`` first: a caller's declaration for columns it
    names itself, e.g. a pivot's), else the unit its suffix names, else None."""
    if extra and column in extra:
        return extra[column]
    declared = column_units().get(column)
    if declared is not None:
        return declared
    return next((unit for suffix, unit in SUFFIXES if column.endswith(suffix)
                 and len(column) > len(suffix)), None)
