"""``bench tp`` skips what does not fit: the memory estimate and the decision on CPU with fake
free-memory numbers, and the bench recording a skip (a line, a table) instead of running it."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from decodelab.model.config import named_config
from decodelab.parallel.memory import GIB, Fit, decide, rank_memory

# The gpu profile's shapes: batches up to 128 at context 512 in blocks of 16, graphs of
# buckets 1 .. 128, bf16 (see TPBenchConfig.for_profile and bench.VALIDATION_BLOCKS).
GPU_BLOCKS, GPU_BUCKETS = 128 * (512 // 16 + 1) + 64, (1, 2, 4, 8, 16, 32, 64, 128)


def _needs(model: str, tps=(1, 2)) -> dict[int, int]:
    return {tp: rank_memory(named_config(model), tp, 2, GPU_BLOCKS, 16, GPU_BUCKETS).need
            for tp in tps}


def test_estimate_parts():
    cfg = named_config("llama-3.1-8b")
    one, two = (rank_memory(cfg, tp, 2, GPU_BLOCKS, 16, GPU_BUCKETS) for tp in (1, 2))
    assert one.full_weights == two.full_weights == cfg.num_parameters() * 2
    assert one.shard == 0 and two.shard == math.ceil(one.full_weights / 2)
    assert two.kv_pool * 2 == one.kv_pool  # each rank caches half of the KV heads
    assert one.kv_pool == (GPU_BLOCKS + 1) * 16 * cfg.kv_bytes_per_token(2)
    assert two.logits == 2 * one.logits  # the twin without collectives has its own graphs
    assert one.need > one.peak >= one.full_weights + one.kv_pool


def test_a_16_gb_gpu_runs_the_1b_shapes_and_skips_the_8b_ones():
    t4_free = int(14.5 * GIB)  # what a 16 GB T4 typically has free
    small, large = decide(_needs("llama-3.2-1b"), t4_free), decide(_needs("llama-3.1-8b"),
                                                                       t4_free)
    assert [f.runs for f in small] == [True, True]
    assert [f.runs for f in large] == [False, False]
    assert "GiB per rank" in large[0].reason and "14.5 GiB free" in large[0].reason
    assert "GiB per rank" in large[1].reason  # every rank builds the full weights first


def test_an_h200_runs_everything_and_a_cpu_is_not_checked():
    for model in ("llama-3.2-1b", "llama-3.1-8b"):
        assert all(f.runs for f in decide(_needs(model), 139 * GIB))
        assert all(f.runs and f.free is None for f in decide(_needs(model), None))


def test_decision_by_size_with_fake_numbers():
    got = decide({1: 10 * GIB, 2: 5 * GIB}, 8 * GIB)
    assert got[0] == Fit(1, 10 * GIB, 8 * GIB, got[0].reason) and not got[0].runs
    assert not got[1].runs  # it would fit, but its reference run does not
    assert [f.runs for f in decide({1: 6 * GIB, 2: 9 * GIB}, 8 * GIB)] == [True, False]
    assert [f.runs for f in decide({1: 8 * GIB}, 8 * GIB)] == [True]  # need == free fits


def test_bench_records_what_it_skips(tmp_path, monkeypatch, capsys):
    """A world of one on CPU, told it has 1 MiB free: the model is not built, a line says so,
    and ``tp_skipped`` holds the configuration with its numbers; no ``tp`` table is written."""
    from decodelab.parallel import bench
    from decodelab.parallel.config import TPBenchConfig
    from decodelab.parallel.group import TPGroup

    monkeypatch.setattr(bench, "free_bytes", lambda device: 1 << 20)
    monkeypatch.setattr(bench, "random_weights", lambda *a, **k: pytest.fail("model built"))
    paths = bench.run(TPBenchConfig.for_profile("smoke"), TPGroup(0, 1, torch.device("cpu")),
                      tmp_path)
    assert [p.name for p in paths] == ["tp_skipped.csv"]
    skipped = pd.read_csv(tmp_path / "tp_skipped.csv")
    assert skipped[["model", "tp"]].values.tolist() == [["tiny", 1]]
    assert skipped["free_gib"].iloc[0] == pytest.approx(1 / 1024)
    assert skipped["need_gib"].iloc[0] > 1 and "GiB free" in skipped["reason"].iloc[0]
    assert "[bench] tp: tiny tp=1 skipped: needs" in capsys.readouterr().out


def test_the_tightest_rank_decides_for_every_rank():
    """Two gloo ranks, one with room and one without: both skip alike (a rank that went on
    alone would wait forever in its group's first collective)."""
    import tp_workers

    from decodelab.parallel.check import run_on_ranks

    decisions = run_on_ranks(tp_workers.fits_on_ranks, 2, [100 * GIB, 1 << 20])
    assert decisions[0] == decisions[1]
    assert decisions[0] == [(1, False, 1 << 20), (2, False, 1 << 20)]
