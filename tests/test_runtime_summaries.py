"""Notebook 04_runtime's summaries of the GPU-only tables (batch invariance, its matmul tiles,
the sampler grid), on small frames of the tables' shape and on the shipped H200 reference."""

import pandas as pd

from decodelab.engine import notebook_gpu as nb


def _checks(origin: str, identical: int) -> pd.DataFrame:
    return pd.DataFrame({"origin": origin, "check": ["decode_alone_vs_batch", "engine_tokens"],
                         "batch": [1, 64], "compared": [1, 64], "identical": [1, identical],
                         "model": "llama-3.2-1b", "dtype": "bfloat16"})


def test_the_invariance_summary_counts_identical_outputs_and_prices_the_switch():
    cost = pd.DataFrame({"origin": "local", "step": ["decode", "decode", "prefill"],
                         "batch": [1, 8, 1], "context": [512, 512, 2048],
                         "ratio": [1.5, 1.25, 1.75]})
    text = nb.invariance_summary({"batch_invariance": pd.concat(
        [_checks("local", 60), _checks("reference/h200", 64)]), "batch_invariance_cost": cost})
    mine, ref = text.splitlines()
    assert "**61 of 65**" in mine and "`engine_tokens` 60/64" in mine
    assert "decode 1.25-1.50x (batch 1-8, context 512)" in mine
    assert "prefill 1.75-1.75x (prompts of 2,048 tokens)" in mine
    assert "**65 of 65**" in ref and "Cost" not in ref  # no cost rows for that origin
    assert "No batch-invariance results" in nb.invariance_summary({})


def test_the_sampler_grid_view_ranks_the_fused_sampler_against_the_fastest_other():
    grid = pd.DataFrame({"kind": ["plain"] * 3 + ["p0.9"] * 3 + ["plain"],
                         "sampler": ["fused", "torch", "flashinfer"] * 2 + ["fused"],
                         "batch": [128] * 6 + [8], "vocab": [128256] * 7,
                         "device_us": [40.0, 3000.0, 150.0, 360.0, 3100.0, 270.0, 9.0]})
    view = nb.sampler_grid_view(grid, 128, 128256).set_index("kind")
    assert view.loc["plain", "fused / best other"] == 40.0 / 150.0
    assert view.loc["p0.9", "fused / best other"] == 360.0 / 270.0
    assert list(view.index) == ["plain", "p0.9"]


def test_the_tile_view_sets_the_rules_pick_against_the_fastest_same_bits_tile():
    from decodelab.plots import show_table

    def row(bm, rows, us, same=True, picked=False):
        return {"origin": "local", "weight": "o", "rows": rows, "block_m": bm, "block_n": 32,
                "block_k": 128, "warps": 4, "same_bits": same, "tile_us": us,
                "cublas_us": 5.0, "x_cublas": us / 5.0, "picked": picked}

    tiles = pd.DataFrame([row(64, 32, 6.0, picked=True), row(16, 32, 4.0, same=False),
                          row(32, 32, 5.5), row(64, 256, 9.0, picked=True), row(16, 256, 12.0,
                                                                                same=False)])
    view = nb.tile_rule_view(tiles).set_index("rows")
    assert view.loc[32, "fastest"] == "32x32x128/4"  # the faster 16-row tile differs in bits
    assert view.loc[32, "picked / fastest"] == 6.0 / 5.5
    assert view.loc[256, "fastest"] == view.loc[256, "picked"] == "64x32x128/4"
    assert view.loc[32, "picked / cuBLAS"] == 6.0 / 5.0
    assert set(view["same bits"]) == {"2/3"}  # three tiles, one of them not the same bits
    html = show_table(view.reset_index(), units={"picked µs": "us", "fastest µs": "us",
                                                 "cuBLAS µs": "us", "picked / fastest": "ratio",
                                                 "picked / cuBLAS": "ratio"}).to_html()
    assert "32x32x128/4" in html


def test_the_shipped_h200_tables_summarise():
    tables = nb.load_tables()
    text = nb.invariance_summary(tables)
    assert "H200" in text and "the same bits" in text and "Cost" in text
    grid = tables["sampler_grid"]
    view = nb.sampler_grid_view(grid[grid["origin"] == "reference/h200"], 128, 128256)
    assert {"fused", "flashinfer", "fused / best other"} <= set(view.columns)
    assert len(view) == grid["kind"].nunique()


def test_the_grid_losses_name_each_setting_where_another_sampler_is_ahead():
    view = pd.DataFrame({"kind": ["plain", "p0.9"], "fused": [40.0, 360.0],
                         "torch": [3000.0, 3100.0], "flashinfer": [150.0, 270.0]})
    view["fused / best other"] = view["fused"] / view[["torch", "flashinfer"]].min(axis=1)
    assert nb.sampler_grid_losses(view) == (
        "The fused sampler is not the fastest at: `p0.9` (1.33x flashinfer's time).")
    assert nb.sampler_grid_losses(view[:1]) == (
        "The fused sampler is the fastest at every setting (1).")
