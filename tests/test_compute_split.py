"""The compute split on tables whose answer is known by construction (floor, kernel boundaries,
attention above its floor, the rest), its notes where tables are missing, the kernel classes by
name, and the shipped H200 reference: parts that add up to each regime's compute term."""

import math

import pandas as pd
import pytest
import synthetic

from decodelab.analysis.compute_floor import kernel_class, toy_floor
from decodelab.analysis.compute_split import split_compute
from decodelab.analysis.compute_view import (
    PART_LABELS,
    SPLIT_LABELS,
    parts_frame,
    split_table,
    toy_lines,
    transformer_verdict,
)
from decodelab.analysis.decompose import decompose
from decodelab.analysis.findings import findings
from decodelab.analysis.layers import Headline, Tables, load_tables
from decodelab.analysis.regimes import serial_transformer_us
from decodelab.model.config import named_config
from decodelab.toy.step import named

ORIGIN = synthetic.ORIGIN
# Toy step: ultra-light moves 4 B x (4(64² + 64) + 64 x 256 + 3 x 64) = 132,864 B and does
# 2 x 64 x (64 x 4 + 256) = 65,536 FLOP; the rates below make these 1 µs and 2 µs.
TOY_BYTES, TOY_FLOPS = 132_864, 65_536
COPY_GB_S, FP32_TFLOP_S = TOY_BYTES / 1e3, TOY_FLOPS / 2e6
KERNELS = 10  # per toy step; synthetic's graph: T_node 0.5 µs, node 3 µs -> c = 0.2 µs
# Transformer (llama-3.2-1b shapes, bf16, batch 1, context 512), at 1000 GB/s.
WEIGHT_BYTES, MODEL_GB_S = 2e9, 1000.0
KV_BYTES = 512 * 32_768  # context x K/V bytes per token (16 layers x 2 x 8 heads x 64 x 2 B)
MODEL_KERNELS = {"_gemv_kernel": 2500.0, "nvjet_sm90_tst_128x8": 300.0,
                 "_attn_split_kernel": 40.0, "_merge_splits_kernel": 10.0,
                 "_add_rms_norm_kernel": 30.0, "a_kernel_no_pattern_knows": 20.0}
TP_BYTES = 5e8  # per rank: 500 µs at 1000 GB/s


def _environment(**skip) -> pd.DataFrame:
    rows = [("d2d_copy_bandwidth", COPY_GB_S), ("matmul_fp32", FP32_TFLOP_S),
            ("matmul_bf16", 1000.0)]
    return pd.DataFrame([{"origin": ORIGIN, "device": "h200", "quantity": q, "unit": "",
                          "value": v, "backend": "cuda"} for q, v in rows if q not in skip])


def _model(kernels: dict[str, float]) -> dict[str, pd.DataFrame]:
    total = WEIGHT_BYTES + KV_BYTES
    pm = pd.DataFrame([{"origin": ORIGIN, "device": "h200", "model": "llama-3.2-1b",
                        "dtype": "bfloat16", "mode": mode, "batch": 1, "context": 512,
                        "ms_per_step": wall, "device_ms_per_step": span,
                        "bytes_per_step": total, "copy_gb_s": MODEL_GB_S}
                       for mode, wall, span in (("graph", 3.0, 2.95), ("eager", 10.0, 9.9))])
    ks = pd.DataFrame([{"origin": ORIGIN, "device": "h200", "kernel": k, "us_per_step": us,
                        "calls_per_step": 1.0, "batch": 1, "context": 512}
                       for k, us in kernels.items()])
    return {"paged_model": pm, "paged_model_kernels": ks}


def _tables(kernels: dict[str, float] = MODEL_KERNELS, drop: tuple[str, ...] = (),
            **env_skip) -> Tables:
    frames = synthetic.tables()
    frames["dispatch"]["kernels_per_step"] = float(KERNELS)
    frames["persistent"]["steps_per_launch"] = 1000
    frames["environment"] = _environment(**env_skip)
    frames["tp"] = frames["tp"].assign(bytes_per_rank=TP_BYTES, copy_gb_s=MODEL_GB_S)
    frames.update(_model(kernels))
    return Tables({k: v for k, v in frames.items() if k not in drop}, ORIGIN)


def _split(tables: Tables) -> tuple[dict, list[str], list]:
    regimes, _ = decompose(tables)
    splits, notes = split_compute(tables, regimes)
    return {s.regime: s for s in splits}, notes, regimes


def test_toy_floor_is_the_slower_of_bytes_and_flops():
    floor = toy_floor(_tables(), "ultra-light")
    assert (floor.nbytes, floor.flops) == (TOY_BYTES, TOY_FLOPS)
    assert floor.bytes_us == pytest.approx(1.0) and floor.flops_us == pytest.approx(2.0)
    assert floor.us == pytest.approx(2.0) and "FLOPs-bound" in floor.how
    cfg = named("ultra-light")
    assert floor.flops == cfg.flops_per_step


def test_toy_split_known_by_construction():
    by, notes, _ = _split(_tables())
    c = 0.5 - 3.0 / KERNELS  # T_node - node / kernels
    for name in ("eager", "graph", "multi-step graph"):
        s = by[name]
        assert s.compute.us == pytest.approx(synthetic.BUSY)
        assert s.us("floor") == pytest.approx(2.0)
        assert s.us("kernel fixed cost") == pytest.approx(KERNELS * c)
        assert s.us("latency chains") == pytest.approx(synthetic.BUSY - 2.0 - KERNELS * c)
        assert math.isnan(s.us("attention above floor"))
        assert s.rest_is.startswith("dependent-latency chains")
    p = by["persistent kernel"]  # one launch per 1000 steps
    assert p.us("kernel fixed cost") == pytest.approx(c / 1000)
    assert sum(t.us for t in p.parts) == pytest.approx(p.compute.us)
    assert all(t.source and t.how for s in by.values() for t in s.parts)


def test_transformer_split_known_by_construction():
    by, _, _ = _split(_tables())
    s = by["transformer decode"]
    weight_us, kv_us = WEIGHT_BYTES / (MODEL_GB_S * 1e3), KV_BYTES / (MODEL_GB_S * 1e3)
    assert s.compute.us == pytest.approx(sum(MODEL_KERNELS.values()))
    assert s.us("floor") == pytest.approx(weight_us + kv_us)  # bytes-bound: 2.5 µs of FLOPs
    # matmuls minus their weights' floor; the norm and the unknown kernel whole, apart
    assert s.us("matmul above floor") == pytest.approx(2800.0 - weight_us)
    assert s.us("small kernels") == pytest.approx(30.0 + 20.0)
    assert s.us("attention above floor") == pytest.approx(50.0 - kv_us)
    assert s.us("kernel gaps") == pytest.approx(0.0, abs=1e-9)
    eager = by["transformer decode, eager"]  # compute = the device span: its gaps are the rest
    assert eager.us("kernel gaps") == pytest.approx(2950.0 - sum(MODEL_KERNELS.values()))
    assert eager.rest_is == "gaps between kernels"


def test_tensor_parallel_split_is_floor_and_the_rest():
    by, _, _ = _split(_tables())
    tp = by["tensor parallel"]
    assert tp.compute.us == pytest.approx(synthetic.KNOWN["tensor parallel"]["compute"])
    assert tp.us("floor") == pytest.approx(TP_BYTES / (MODEL_GB_S * 1e3))
    assert tp.us("above floor, not split") == pytest.approx(tp.compute.us - tp.us("floor"))
    assert tp.rest_is.endswith("above the floor, not split")
    assert tp.parts[0].source.startswith("tp[origin=reference/h200x2")


def test_unknown_kernels_count_whole_as_boundaries():
    assert kernel_class("a_kernel_no_pattern_knows") == "other"
    assert kernel_class("Memcpy DtoD (Device -> Device)") == "other"
    for name in ("_gemv_pdl_kernel", "_skinny_gemm_kernel", "sm90_xmma_gemm_bf16", "matmul_kernel",
                 "nvjet_sm90_tst_128x8_64x12", "cutlass::Kernel2<gemm>"):
        assert kernel_class(name) == "matmul", name
    for name in ("_attn_split_kernel", "_merge_splits_kernel", "_row_order_kernel",
                 "cutlass::fmha_fwd"):
        assert kernel_class(name) == "attention", name
    more = {**MODEL_KERNELS, "another_new_kernel": 100.0}
    base, grown = _split(_tables())[0], _split(_tables(more))[0]
    delta = grown["transformer decode"].us("small kernels") \
        - base["transformer decode"].us("small kernels")
    assert delta == pytest.approx(100.0)


def test_missing_tables_become_notes():
    by, notes, _ = _split(_tables(drop=("environment",)))
    for name in ("eager", "graph", "multi-step graph", "persistent kernel"):
        assert name not in by
        assert any(n.startswith(name + ":") and "`environment`" in n for n in notes)
    floor = by["transformer decode"].parts[0]  # the copy bandwidth of its own run, no FLOPs
    assert "no FLOPs bound (no data yet for table `environment`" in floor.how
    assert floor.source.startswith("paged_model[") and "environment" not in floor.source
    assert any(n.startswith("runtime loop:") and "context" in n for n in notes)
    # no replay_nodes: the toy's fixed cost and chains stay one part, and say why
    by, _, _ = _split(_tables(drop=("replay_nodes",)))
    graph = by["graph"]
    assert [t.layer for t in graph.parts] == ["floor", "above floor, not split"]
    assert graph.rest_is.endswith("not split") and "replay_nodes" in graph.parts[1].how
    # no kernel profile, or no kernel named like a matmul: no transformer split, a note
    by, notes, _ = _split(_tables(drop=("paged_model_kernels",)))
    assert "transformer decode" not in by
    assert any("paged_model_kernels" in n for n in notes)
    renamed = {k.replace("gemv", "mv").replace("nvjet", "jet"): v
               for k, v in MODEL_KERNELS.items()}
    by, notes, _ = _split(_tables(renamed))
    assert any("matmul patterns" in n for n in notes) and "transformer decode" not in by
    splits, notes = split_compute(Tables({}, ORIGIN), [])
    assert splits == [] and notes == []


def test_views_and_prose_follow_the_numbers():
    by, _, regimes = _split(_tables())
    table = split_table(list(by.values()))
    assert list(table.columns) == list(SPLIT_LABELS)
    assert list(parts_frame(list(by.values())).columns) == list(PART_LABELS)
    assert "latency chains" in toy_lines(list(by.values()))
    verdict = transformer_verdict(list(by.values()), regimes)
    assert "holds once the floor is separated" in verdict and "is floor" in verdict
    # norms ten times slower: boundaries outgrow the floor, and the verdict says so
    slow = {**MODEL_KERNELS, "_add_rms_norm_kernel": 3000.0}
    tables = _tables(slow)
    regimes, _ = decompose(tables)
    splits, _ = split_compute(tables, regimes)
    assert "is small kernels" in transformer_verdict(splits, regimes)
    assert "holds only in the seed's word" in transformer_verdict(splits, regimes)
    assert "cannot be checked" in transformer_verdict([], [])
    assert toy_lines([]) == "No toy regime's compute could be split yet."


def test_verdict_reads_the_same_step_launched_serially():
    """With the headline step launched without PDL (graph_no_pdl) in the tables, the verdict
    also gives the floor's share of that step and what PDL took off; without it, nothing."""
    tables = _tables()
    by, _, regimes = _split(tables)
    assert math.isnan(serial_transformer_us(tables, Headline()))
    splits = list(by.values())
    assert "Before programmatic" not in transformer_verdict(splits, regimes)
    pm = tables.frames["paged_model"]
    serial = pm[pm["mode"] == "graph"].assign(mode="graph_no_pdl", ms_per_step=3.5)
    frames = {**tables.frames, "paged_model": pd.concat([pm, serial], ignore_index=True)}
    serial_us = serial_transformer_us(Tables(frames, ORIGIN), Headline())
    assert serial_us == pytest.approx(3500.0)
    floor = by["transformer decode"].us("floor")
    text = transformer_verdict(splits, regimes, serial_us)
    assert f"the floor was {floor / 3500:.0%} of the step" in text
    assert "PDL took 500 µs of kernel boundaries off" in text
    assert ("its largest part there too" in text) == (floor / 3500 > 0.5)


def test_finding_reads_the_split():
    tables = _tables()
    regimes, _ = decompose(tables)
    found = {f.number: f for f in findings(tables, regimes)}
    floor = (WEIGHT_BYTES + KV_BYTES) / (MODEL_GB_S * 1e3) / sum(MODEL_KERNELS.values())
    assert found[f"floor {floor:.0%} of compute"].source.startswith("paged_model[")


def test_shipped_reference_split_adds_up():
    tables = load_tables("reference/h200")
    h = Headline()
    regimes, _ = decompose(tables, h)
    splits, notes = split_compute(tables, regimes, h)
    by = {s.regime: s for s in splits}
    assert {"graph", "persistent kernel", "transformer decode"} <= set(by)
    for s in splits:
        assert sum(t.us for t in s.parts) == pytest.approx(s.compute.us, rel=1e-9), s.regime
        assert s.us("floor") > 0, s.regime
    t = by["transformer decode"]
    assert t.us("matmul above floor") > 0 and t.us("attention above floor") > 0
    assert t.us("small kernels") > 0
    config = named_config("llama-3.2-1b")
    assert t.parts[0].how.count(f"{config.num_parameters() / 1e9:.4g} billion") == 1


def test_regime_table_ranks_the_named_parts_not_compute():
    """Where compute is split, the regime table ranks its parts (named for what they are), the
    layers still sum to the step, and a seed row that says "Compute" is agreed with in the
    seed's word only, the part and the floor's share named."""
    from decodelab.analysis.decompose import regime_table, terms_frame
    from decodelab.analysis.layers import COMPUTE_PARTS, SHOWN_LAYERS
    from decodelab.analysis.seed_table import seed_table

    tables = _tables()
    regimes, _ = decompose(tables)
    by = {r.name: r for r in regimes}
    for r in regimes:
        assert sum(t.us for t in r.layers) == pytest.approx(r.step_us, rel=1e-9), r.name
        assert {t.layer for t in r.layers} <= set(SHOWN_LAYERS), r.name
        assert r.name == "runtime loop" or "compute" not in {t.layer for t in r.layers}
    assert [t.layer for t in by["runtime loop"].layers] == ["orchestration", "forward pass"]
    graph = by["graph"]  # 12 µs busy = 2 floor + 10 x 0.2 fixed + 8 chains
    assert graph.dominant.layer == "latency chains"
    assert "compute" not in set(regime_table(regimes)["dominant"])
    assert set(terms_frame(regimes)["layer"]) <= set(SHOWN_LAYERS)
    seeds = seed_table(tables, regimes).set_index("claim")
    multi = seeds.loc["dominant layer: multi-step graph"]
    assert multi["agrees?"] == "yes" and multi["we measured"].startswith("latency chains")
    assert 'in the seed\'s word: its "Compute"' in multi["rule applied"]
    assert "the floor is" in multi["rule applied"]
    # the shipped reference: no toy regime is "compute"-dominated any more
    ref = load_tables("reference/h200")
    table = regime_table(decompose(ref)[0]).set_index("regime")
    for name in ("graph", "multi-step graph", "persistent kernel", "transformer decode"):
        assert table.loc[name, "dominant"] in COMPUTE_PARTS and \
            table.loc[name, "dominant"] != "compute", name
