"""The server and the batch-invariant switch in the report's summary: the sentences of two
findings (text, number, source), computed from tables ``serve_offline``, ``serve_online``,
``batch_invariance`` and ``batch_invariance_cost``. Chapter 04_runtime shows the tables; the
summary carries what a reader needs before it: how fast the engine serves the field's
offline workload against its own floor, and what the switch guarantees and costs.
"""

from __future__ import annotations

import math

import pandas as pd

from decodelab.analysis.layers import MissingData, Tables, selector_of

INVARIANT = "invariant"  # serve_config's variant on the batch-invariant model
COST_POINT = (32, 512)  # (batch, context) the switch's decode cost is quoted at first
OFFLINE_COLUMNS = ("variant", "output_tok_s", "ratio_to_floor", "floor_output_tok_s",
                   "requests", "prompt_tokens", "output_tokens", "model", "dtype")


def _offline(tables: Tables) -> pd.DataFrame:
    frame, _ = tables.rows("serve_offline", {"run": "offline"}, OFFLINE_COLUMNS)
    return frame


def _fastest_default(offline: pd.DataFrame) -> pd.Series:
    """The default kernels' fastest variant on the offline workload."""
    default = offline[offline["variant"] != INVARIANT]
    if default.empty:
        raise MissingData("serve_offline has no variant on the default kernels")
    return default.loc[default["output_tok_s"].idxmax()]


def _online(tables: Tables, variant: str) -> str:
    """The variant's online sweep in words: TTFT p99 at half the offline rate, and the rate
    where it first passes its limit (empty without a sweep)."""
    try:
        sweep, _ = tables.rows("serve_online", {"variant": variant},
                               ["rate_fraction", "offered_rate", "ttft_p99_ms", "ttft_limit_s",
                                "rate_ttft_p99_over_limit"])
    except MissingData:
        return ""
    half = sweep[sweep["rate_fraction"] == 0.5]
    base = sweep["offered_rate"].iloc[0] / sweep["rate_fraction"].iloc[0]  # the sweep's 1x
    text = (f"; arriving as a Poisson process at {half['offered_rate'].iloc[0]:.1f} requests/s "
            f"(half the sweep's base, an offline run's {base:.1f} requests/s), TTFT p99 is "
            f"{half['ttft_p99_ms'].iloc[0]:.0f} ms" if not half.empty
            else "; arriving as a Poisson process")
    limit_ms, knee = sweep["ttft_limit_s"].iloc[0] * 1e3, sweep["rate_ttft_p99_over_limit"].iloc[0]
    if math.isnan(knee):
        return text + (f", and it stays under {limit_ms:,.0f} ms up to "
                       f"{sweep['offered_rate'].max():.1f} requests/s, the highest rate offered")
    return text + f", and it first exceeds {limit_ms:,.0f} ms at {knee:.1f} requests/s"


def serving_line(tables: Tables) -> tuple[str, str, str]:
    """The engine's offline throughput (its fastest default variant), busy time against the
    run's own floor, and its online latency."""
    best = _fastest_default(_offline(tables))
    text = (f"As a server ({best['model']} {best['dtype']}, its fastest variant on the default "
            f"kernels, `{best['variant']}`), the engine runs nano-vllm's offline workload "
            f"({best['requests']} requests, {best['prompt_tokens']:,} prompt and "
            f"{best['output_tokens']:,} output tokens, submitted at once) at "
            f"{best['output_tok_s']:,.0f} output tokens/s, its busy "
            f"time {best['ratio_to_floor']:.2f}x the run's own floor (each step's weight and "
            f"K/V bytes or FLOPs at the rates measured in the run: "
            f"{best['floor_output_tok_s']:,.0f} output tokens/s at the floor)"
            + _online(tables, best["variant"]) + ".")
    source = selector_of("serve_offline", tables.origin,
                         {"run": "offline", "variant": best["variant"]})
    return text, f"{best['output_tok_s'] / 1e3:.1f}k output tok/s", source


def invariance_line(tables: Tables) -> tuple[str, str, str]:
    """What the batch-invariant switch was proved to give (bits compared) and what it costs:
    the decode step at COST_POINT and over every point, and the offline throughput."""
    checks = tables.frame("batch_invariance", ["check", "batch", "compared", "identical"])
    same, compared = int(checks["identical"].sum()), int(checks["compared"].sum())
    cost = tables.frame("batch_invariance_cost", ["step", "batch", "context", "ratio"])
    decode = cost[cost["step"] == "decode"]
    if decode.empty:
        raise MissingData("batch_invariance_cost has no decode rows")
    at = decode[(decode["batch"] == COST_POINT[0]) & (decode["context"] == COST_POINT[1])]
    point = at.iloc[0] if not at.empty else decode.iloc[0]
    proof = (f"{same} of {compared} compared outputs were the same bits" if same == compared
             else f"only {same} of {compared} compared outputs were the same bits")
    text = (f"With the batch-invariant switch on (`batch_invariant=True`), {proof} "
            f"({_checked(checks)}); its decode step takes "
            f"{point['ratio']:.2f}x the default at batch {point['batch']}, context "
            f"{point['context']:,} ({decode['ratio'].min():.2f}-{decode['ratio'].max():.2f}x "
            f"over batches {decode['batch'].min()}-{decode['batch'].max()} and contexts "
            f"{decode['context'].min():,}-{decode['context'].max():,})")
    number, source = f"{point['ratio']:.2f}x decode step", "batch_invariance_cost"
    try:
        offline = _offline(tables)
        served = offline[offline["variant"] == INVARIANT]["output_tok_s"].iloc[0]
        best = _fastest_default(offline)
    except (MissingData, IndexError):
        return text + ".", number, selector_of(source, tables.origin, {})
    served_x = served / best["output_tok_s"]
    return (text + f"; it serves the offline workload at {served:,.0f} against "
            f"{best['output_tok_s']:,.0f} output tokens/s ({served_x:.2f}x `{best['variant']}`).",
            f"{served_x:.2f}x served", selector_of("serve_offline", tables.origin,
                                                   {"run": "offline", "variant": INVARIANT}))


def _checked(checks: pd.DataFrame) -> str:
    """What the proof compared, from its check names (batch sizes as a range)."""
    kinds = set(checks["check"])
    batches = checks[checks["check"] == "decode_alone_vs_batch"]["batch"]
    said = [f"logits alone and in batches of {batches.min()} to {batches.max()}"
            if not batches.empty else "",
            "in every graph bucket" if "graph_bucket" in kinds else "",
            "prefill against decode" if "prefill_vs_decode" in kinds else "",
            "the engine's tokens alone and together" if "engine_tokens" in kinds else ""]
    return ", ".join(s for s in said if s) or "checks " + ", ".join(sorted(kinds))
