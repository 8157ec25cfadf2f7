"""The report summary's serving and batch-invariance findings (``analysis.serving``), from
small tables with known numbers: the fastest default-kernel variant is quoted (never the
invariant one), the online sweep in words, the proof and the cost of the switch, and each
finding left out or shortened when its tables are missing."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from decodelab.analysis.findings import findings
from decodelab.analysis.layers import MissingData, Tables
from decodelab.analysis.serving import invariance_line, serving_line

ORIGIN = "reference/h200"


def _frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([{"origin": ORIGIN, **r} for r in rows])


def _offline() -> pd.DataFrame:
    base = dict(run="offline", ratio_to_floor=1.5, requests=256, prompt_tokens=140_000,
                output_tokens=130_000, model="llama-3.2-1b", dtype="bfloat16")
    return _frame([base | dict(variant="engine", output_tok_s=30_000.0, floor_output_tok_s=6e4),
                   base | dict(variant="chunked", output_tok_s=40_000.0, floor_output_tok_s=6e4),
                   base | dict(variant="invariant", output_tok_s=50_000.0,
                               floor_output_tok_s=6e4),
                   base | dict(run="long_prompts", variant="engine", output_tok_s=9e4,
                               floor_output_tok_s=1e5)])


def _online(knee: float) -> pd.DataFrame:
    return _frame([dict(variant="chunked", rate_fraction=f, offered_rate=80.0 * f,
                        ttft_p99_ms=ms, ttft_limit_s=1.0, rate_ttft_p99_over_limit=knee)
                   for f, ms in ((0.5, 25.0), (1.0, 400.0), (2.0, 1500.0))])


def _checks(identical: int) -> pd.DataFrame:
    return _frame([dict(check="decode_alone_vs_batch", batch=b, compared=1, identical=1)
                   for b in (1, 7, 256)]
                  + [dict(check="engine_tokens", batch=64, compared=64, identical=identical)])


def _cost() -> pd.DataFrame:
    return _frame([dict(step="decode", batch=b, context=c, ratio=r)
                   for b, c, r in ((1, 512, 1.4), (32, 512, 1.05), (128, 4096, 1.2))]
                  + [dict(step="prefill", batch=1, context=512, ratio=0.8)])


def test_the_serving_finding_quotes_the_fastest_default_variant_and_its_floor():
    tables = Tables({"serve_offline": _offline(), "serve_online": _online(math.nan)}, ORIGIN)
    text, number, source = serving_line(tables)
    assert number == "40.0k output tok/s"
    assert source == "serve_offline[origin=reference/h200, run=offline, variant=chunked]"
    assert "`chunked`" in text and "at 40,000 output tokens/s" in text
    assert "1.50x the run's own floor" in text and "60,000 output tokens/s at the floor" in text
    assert "at 40.0 requests/s (half the sweep's base, an offline run's 80.0 requests/s), " \
           "TTFT p99 is 25 ms" in text
    assert "stays under 1,000 ms up to 160.0 requests/s, the highest rate offered" in text
    knee = serving_line(Tables({"serve_offline": _offline(), "serve_online": _online(120.0)},
                               ORIGIN))[0]
    assert knee.endswith("it first exceeds 1,000 ms at 120.0 requests/s.")
    alone = serving_line(Tables({"serve_offline": _offline()}, ORIGIN))[0]
    assert "Poisson" not in alone and alone.endswith("at the floor).")
    only_invariant = _offline()[lambda f: f["variant"] == "invariant"]
    with pytest.raises(MissingData, match="no variant on the default kernels"):
        serving_line(Tables({"serve_offline": only_invariant}, ORIGIN))


def test_the_invariance_finding_gives_the_proof_and_the_cost():
    tables = Tables({"batch_invariance": _checks(64), "batch_invariance_cost": _cost(),
                     "serve_offline": _offline()}, ORIGIN)
    text, number, source = invariance_line(tables)
    assert "67 of 67 compared outputs were the same bits (logits alone and in batches of 1 " \
           "to 256, the engine's tokens alone and together)" in text
    assert "1.05x the default at batch 32, context 512 (1.05-1.40x over batches 1-128 and " \
           "contexts 512-4,096)" in text  # decode rows only: the prefill 0.8x is not a step
    assert text.endswith("at 50,000 against 40,000 output tokens/s (1.25x `chunked`).")
    assert (number, source) == ("1.25x served", "serve_offline[origin=reference/h200, "
                                                "run=offline, variant=invariant]")
    failed = Tables({"batch_invariance": _checks(60), "batch_invariance_cost": _cost()},
                    ORIGIN)
    text, number, source = invariance_line(failed)
    assert "only 63 of 67 compared outputs were the same bits" in text
    assert text.endswith("contexts 512-4,096).") and number == "1.05x decode step"
    assert source == "batch_invariance_cost[origin=reference/h200]"


def test_findings_hold_both_where_their_tables_are_and_neither_without():
    frames = {"serve_offline": _offline(), "serve_online": _online(math.nan),
              "batch_invariance": _checks(64), "batch_invariance_cost": _cost()}
    numbers = [f.number for f in findings(Tables(frames, ORIGIN), [])]
    assert numbers == ["40.0k output tok/s", "1.25x served"]
    assert findings(Tables({"batch_invariance": _checks(64)}, ORIGIN), []) == []
