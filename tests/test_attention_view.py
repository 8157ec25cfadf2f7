"""The paged_attention table side by side (model.attention_view): one line per point, every
implementation's column even where a run lacked it, ours against the fastest peer there."""

from __future__ import annotations

import math

import pandas as pd

from decodelab.core.results import load_table
from decodelab.model.attention_view import IMPLS, attention_view


def test_one_line_per_point_and_ours_against_the_fastest_peer():
    frame = pd.DataFrame({
        "origin": ["local"] * 5, "batch": [8] * 5, "context": [512] * 5,
        "lens": ["uniform", "uniform", "uniform", "mixed", "mixed"],
        "impl": ["paged", "sdpa_contiguous", "flashinfer", "paged", "paged_uncapped"],
        "us_per_layer": [10.0, 8.0, 12.0, 11.0, 13.0]})
    view = attention_view(frame)
    assert list(view["lens"]) == ["uniform", "mixed"]
    assert [c for c in view if c.endswith("_us")] == [f"{i}_us" for i in IMPLS]
    uniform, mixed = view.iloc[0], view.iloc[1]
    assert uniform["paged_vs_best_peer"] == 10.0 / 8.0
    assert math.isnan(uniform["paged_uncapped_us"])
    assert mixed["paged_uncapped_us"] == 13.0 and math.isnan(mixed["paged_vs_best_peer"])


def test_the_shipped_reference_has_every_point_once():
    frame = load_table("paged_attention", origins=["reference"])
    view = attention_view(frame)
    assert len(view) == len(frame.groupby(["origin", "batch", "context", "lens"]))
    assert view["paged_us"].notna().all()
