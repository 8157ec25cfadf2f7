"""The tensor-parallel tables' analysis and figures, on synthetic tables with known answers."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from decodelab.core.validate import ConfigError
from decodelab.parallel import analysis
from decodelab.parallel.collectives import bus_bandwidth_gb_s
from decodelab.parallel.notebook import NotebookParams, crossover_prose, local_plan

BATCHES = (1, 2, 4, 8)
# model -> (TP=1 ms, TP=2 compute ms, TP=2 comm ms) per batch. "big" pays off at once; "small"
# is slower at batches 1 and 2, faster at 4 and 8; "flaky" is faster at batch 2 only.
STEPS = {
    "big": ((4.0, 4.2, 4.4, 5.0), (2.0, 2.1, 2.2, 2.5), (0.5, 0.5, 0.5, 0.6)),
    "small": ((1.0, 1.1, 1.2, 1.4), (0.6, 0.7, 0.75, 0.9), (0.5, 0.5, 0.4, 0.4)),
    "flaky": ((1.0, 1.0, 1.0, 1.0), (0.6, 0.5, 0.7, 0.7), (0.5, 0.4, 0.4, 0.4)),
}


def tp_table() -> pd.DataFrame:
    rows = []
    for model, (one, compute, comm) in STEPS.items():
        for i, b in enumerate(BATCHES):
            rows.append(dict(origin="reference/x", model=model, mode="graph", batch=b, tp=1,
                             ms_per_step=one[i], ms_no_comm=math.nan, comm_ms=math.nan,
                             ms_comm_alone=math.nan, all_reduces_per_step=0,
                             all_reduce_bytes=0, all_gather_bytes=0))
            rows.append(dict(origin="reference/x", model=model, mode="graph", batch=b, tp=2,
                             ms_per_step=compute[i] + comm[i], ms_no_comm=compute[i],
                             comm_ms=comm[i], ms_comm_alone=comm[i] * 1.2,
                             all_reduces_per_step=9, all_reduce_bytes=b * 64,
                             all_gather_bytes=b * 256))
    return pd.DataFrame(rows)


def test_speedups_pair_each_tp_with_tp1():
    s = analysis.speedups(tp_table()).set_index(["model", "batch"])
    assert s.loc[("big", 1), "speedup"] == pytest.approx(4.0 / 2.5)
    assert s.loc[("small", 1), "speedup"] == pytest.approx(1.0 / 1.1)
    assert set(s["tp"]) == {2}


def test_crossover_is_the_batch_from_which_tp_stays_faster():
    c = analysis.crossover(tp_table()).set_index("model")
    assert c.loc["big", "pays_off_from"] == 1
    assert c.loc["small", "pays_off_from"] == 4
    assert math.isnan(c.loc["flaky", "pays_off_from"])  # faster at 2, slower again at 4
    assert c.loc["small", "speedup_largest"] == pytest.approx(1.4 / 1.3)
    text = crossover_prose(tp_table())
    assert "`small`, graph: TP=2 pays off from **batch 4**" in text
    assert "`flaky`, graph: TP=2 does not pay off **within the measured batches**" in text
    assert "pays off from **not" not in text  # was "pays off from not within the measured batches"


def test_decomposition_adds_up_and_tp1_has_no_comm():
    d = analysis.decomposition(tp_table())
    many = d[d["tp"] == 2]
    assert (many["compute_ms"] + many["comm_ms"] - many["ms_per_step"]).abs().max() < 1e-12
    one = d[d["tp"] == 1]
    assert (one["comm_ms"] == 0).all() and (one["compute_ms"] == one["ms_per_step"]).all()
    per = analysis.per_collective_us(tp_table()).set_index(["model", "batch"])
    assert per.loc[("big", 1), "in_step_us"] == pytest.approx(0.5e3 / 10)


def test_graph_saving_and_bus_bandwidth():
    assert bus_bandwidth_gb_s(1_000_000_000, 1.0, 2) == pytest.approx(1.0)
    assert bus_bandwidth_gb_s(1_000_000_000, 1.0, 4) == pytest.approx(1.5)
    coll = pd.DataFrame([dict(origin="o", ranks=2, nbytes=n, mode=m, us_per_op=us,
                              host_us_per_op=us / 2, device_us_per_op=us,
                              busbw_gb_s=n / us / 1e3)
                         for n in (1024, 1 << 20) for m, us in (("eager", 50.0), ("graph", 10.0))])
    g = analysis.graph_saving(coll)
    assert (g["saved_us"] == 40.0).all() and (g["ratio"] == 5.0).all()
    lat = analysis.small_message_latency(coll).set_index("mode")
    assert lat.loc["graph", "us_per_op"] == 10.0
    peak = analysis.peak_bus_bandwidth(coll)
    assert (peak["nbytes"] == 1 << 20).all()


def test_figures_draw_from_the_tables():
    from decodelab.plots import parallel as figs

    tp = tp_table()
    for fig in (figs.decode_vs_batch(tp), figs.step_decomposition(tp, "graph")):
        assert fig.axes
    coll = pd.DataFrame([dict(origin="o", mode="graph", nbytes=n, us_per_op=10.0,
                              host_us_per_op=5.0, busbw_gb_s=1.0) for n in (1024, 2048)])
    assert len(figs.all_reduce_sweep(coll).axes) == 2


def test_notebook_params_and_local_plan():
    with pytest.raises(ConfigError, match="profile"):
        NotebookParams(profile="fast", interactive=False)
    with pytest.raises(ConfigError, match="run_bench"):
        NotebookParams(profile="cpu", interactive=False, run_bench="yes")
    assert local_plan("smoke") == ("smoke", "gloo")
    assert local_plan("cpu") == ("cpu", "gloo")


def test_collective_ops_keeps_communication_per_call():
    prof = pd.DataFrame([
        dict(model="m", mode="eager", rank=0, op="c10d::allreduce_", calls_per_step=10,
             host_us_per_step=500.0, device_us_per_step=0.0),
        dict(model="m", mode="eager", rank=0, op="ncclDevKernel_AllReduce_Sum_bf16(ncclArgs)",
             calls_per_step=10, host_us_per_step=0.0, device_us_per_step=120.0),
        dict(model="m", mode="eager", rank=0, op="aten::mm", calls_per_step=40,
             host_us_per_step=400.0, device_us_per_step=900.0)])
    ops = analysis.collective_ops(prof).set_index("op")
    assert list(ops.index) == ["c10d::allreduce_", "ncclDevKernel_AllReduce_Sum_bf16"]
    assert ops.loc["c10d::allreduce_", "host_us_per_call"] == 50.0
    assert ops.loc["ncclDevKernel_AllReduce_Sum_bf16", "device_us_per_call"] == 12.0


def test_profile_prose_names_kernel_and_host_time_per_rank():
    from decodelab.parallel.notebook import profile_prose

    prof = pd.DataFrame([
        dict(origin="reference/h200x2", model="m", mode="eager", rank=r, op=op, calls_per_step=2,
             host_us_per_step=host, device_us_per_step=dev)
        for r, wait in ((0, 6.0), (1, 400.0))
        for op, host, dev in (("c10d::allreduce_", 30.0, 0.0),
                              ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(x)", 0.0, 2 * wait))])
    text = profile_prose(prof)
    assert "rank 0: NCCL all-reduce kernel 6.0 µs, host call 15.0 µs" in text
    assert "rank 1: NCCL all-reduce kernel 400.0 µs" in text


def test_a_speedup_within_the_margin_is_a_tie_not_a_win():
    tp = tp_table()
    one = (tp["model"] == "big") & (tp["tp"] == 1)
    tp.loc[one, "ms_per_step"] = [2.52, 2.61, 4.4, 5.0]  # ties at batches 1 and 2
    c = analysis.crossover(tp, margin=0.025).set_index("model")
    assert c.loc["big", "pays_off_from"] == 4
    assert c.loc["big", "ties"] == [1, 2]
    assert "a tie (within 2.5%) at batch 1, 2" in crossover_prose(tp)


def test_cpu_runs_are_kept_apart_from_timed_rows():
    from decodelab.parallel.notebook import local_check_prose, split_timed

    ref = tp_table().assign(device="h200")
    cpu = tp_table().assign(origin="local", device="cpu", dtype="float32",
                            max_rel_err_vs_tp1=[0.0, 3e-7] * 12,
                            tokens_equal_tp1=["True"] * 24)
    cpu.loc[cpu["tp"] == 2, "comm_ms"] = -0.1  # a gloo stand-in can out-cost the collective
    timed, local = split_timed({"tp": pd.concat([ref, cpu]), "tp_collectives": cpu})
    assert set(timed) == {"tp"} and set(timed["tp"]["origin"]) == {"reference/x"}
    assert set(local) == {"tp", "tp_collectives"} and (local["tp"]["origin"] == "local").all()
    text = local_check_prose(local["tp"])
    assert "largest relative logit difference 3e-07, greedy tokens equal (float32)" in text
    assert text.count("\n") == len(STEPS) - 1  # one line per model
    unlabelled = split_timed({"tp": tp_table()})[0]  # a table without a device column is kept
    assert len(unlabelled["tp"]) == len(tp_table())
