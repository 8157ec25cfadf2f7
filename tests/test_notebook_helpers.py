"""The helpers notebooks 01, 02 and 05 call, on synthetic tables with chosen values: per-origin
views of the dispatch table, the prose of the replay fits and the stop-mid-chunk trade-off,
the regime views, findings and conclusions of the report, and the tensor-parallel regime."""

import math

import pandas as pd
import pytest
import synthetic

from decodelab.analysis import notebook as report_nb
from decodelab.analysis.conclusions import conclusions
from decodelab.analysis.decompose import decompose, regime_table
from decodelab.analysis.findings import findings, findings_frame
from decodelab.analysis.layers import Tables
from decodelab.analysis.seed_table import seed_table
from decodelab.dispatch import notebook as dispatch_nb
from decodelab.replay import notebook as replay_nb
from decodelab.replay.fit import fit_multistep, fit_nodes


def _tables(frames=None) -> Tables:
    return Tables(frames or synthetic.tables(), synthetic.ORIGIN)


# --- 01_dispatch -------------------------------------------------------------------------------

def _dispatch() -> pd.DataFrame:
    rows = []
    for origin, backend, device in (("reference/h200", "cuda", 12.0), ("local", "cpu", math.nan)):
        for mode, host in (("eager", 40.0), ("cuda_graph", 3.0)):
            if backend == "cpu" and mode != "eager":
                continue
            for config, hidden in (("ultra-light", 64), ("sweep", 256), ("sweep", 1024)):
                rows.append(dict(origin=origin, device="h200" if backend == "cuda" else "cpu",
                                 backend=backend, mode=mode, config=config, hidden=hidden,
                                 layers=4, batch=1, host_us_per_step=host,
                                 device_us_per_step=device, wall_us_per_step=host + 1,
                                 kernels_per_step=8.0))
    return pd.DataFrame(rows)


def test_dispatch_views_per_backend_and_origin():
    table = _dispatch()
    gpu, cpu = dispatch_nb.by_backend(table)
    assert set(gpu["backend"]) == {"cuda"} and set(cpu["backend"]) == {"cpu"}
    assert dispatch_nb.origins(table) == ["reference/h200", "local"]  # references first
    assert dispatch_nb.origins(pd.DataFrame()) == []
    sources = dispatch_nb.sources(table).set_index("origin")
    assert sources.loc["local", "rows"] == 3 and sources.loc["reference/h200", "rows"] == 6
    per_op = dispatch_nb.per_op(cpu)
    assert per_op["us_per_op"].tolist() == [5.0] * 3  # 40 µs of host time over 8 ops
    assert dispatch_nb.slug("reference/h200") == "reference_h200"


def test_dispatch_explorer_prefers_gpu_rows_and_the_sweep():
    gpu, cpu = dispatch_nb.by_backend(_dispatch())
    rows, first = dispatch_nb.explorer_rows(gpu, cpu)
    assert set(rows["origin"]) == {"reference/h200"} and first["config"] == "sweep"
    rows, first = dispatch_nb.explorer_rows(gpu.iloc[0:0], cpu)
    assert set(rows["origin"]) == {"local"}
    assert dispatch_nb.explorer_rows(gpu.iloc[0:0], cpu.iloc[0:0])[1] is None
    sweep = gpu[gpu["config"] == "sweep"]
    assert dispatch_nb.shown_as(gpu, sweep.iloc[0]) is None  # H=256: no named config there
    assert dispatch_nb.shown_as(gpu, gpu[gpu["config"] == "ultra-light"].iloc[0]) == "ultra-light"


def test_dispatch_ratio_lines_name_config_origin_and_seed():
    ratios = pd.DataFrame([dict(origin="reference/h200", config="ultra-light", host_ratio=13.33,
                                wall_ratio=2.5)])
    line = dispatch_nb.ratio_lines(ratios, 15.0)
    assert line == ("- **ultra-light** (H200 (shipped reference)): host CPU 13.3x lower with a "
                    "graph, wall 2.50x (seed: ~15x host CPU)")


# --- 02_replay ---------------------------------------------------------------------------------

def _replay() -> tuple[pd.DataFrame, pd.DataFrame]:
    frames = synthetic.tables()
    nodes = frames["replay_nodes"]
    multi = frames["replay_multistep"].assign(
        wall_us_per_replay=lambda f: f["wall_us_per_step"] * f["k_steps"])
    return nodes, multi


def test_replay_prose_carries_the_fitted_numbers():
    nodes, multi = _replay()
    text = replay_nb.node_summary(fit_nodes(nodes))
    assert "T_replay = 4.00 µs" in text and "T_node = 0.500 µs" in text
    assert "T_launch = 3.00 µs" in text and "6.0× a graph node" in text
    steps = replay_nb.step_summary(fit_multistep(multi))
    assert "**ultra-light**, none: T_step = 15.00 µs, T_replay = 5.00 µs" in steps
    assert replay_nb.meets(0.99) == "meets" and replay_nb.meets(0.5) == "misses"


def test_tradeoff_model_and_simulation_agree_on_exact_data():
    nodes, multi = _replay()
    trade = replay_nb.tradeoff_of(multi, fit_multistep(multi), 0.01, 4000, 1)
    assert trade.config == "ultra-light" and trade.origin == synthetic.ORIGIN
    assert trade.model.t_replay_us == pytest.approx(35.0)  # readout: 5 + 30 per replay
    assert trade.model.t_step_us == pytest.approx(15.0)
    assert sorted(trade.analytic["p_stop"].unique()) == pytest.approx([0.001, 0.01, 0.1])
    assert trade.best_k >= 1 and trade.worst_rel_gap < 0.05
    assert f"best K is {trade.best_k}" in trade.prose(4000, 1)


# --- 05_report ---------------------------------------------------------------------------------

def test_regime_view_and_prose():
    regimes, _ = decompose(_tables())
    view = report_nb.regime_view(regime_table(regimes))
    assert list(view.columns) == list(report_nb.REGIME_LABELS)
    lines = report_nb.regime_lines(regimes)
    assert lines[0] == "- **eager** (ultra-light): 60 µs per step; dispatch dominates with 80% (48 µs)."
    moves = "\n".join(report_nb.transitions(regimes))
    assert "from 60 µs to 20 µs (3.0x)" in moves and "adds 400 µs of collectives" in moves
    assert report_nb.term(regimes[0], "replay") == 0.0
    tally = report_nb.seed_tally(seed_table(_tables(), regimes))
    assert tally.startswith("Of the seed's 10 claims we could check, 8 agree")
    assert report_nb.seed_tally(seed_table(Tables({}, synthetic.ORIGIN), [])) \
        == "No seed claim could be checked yet."


def test_explore_view_is_the_decomposition_at_another_toy_config():
    params = report_nb.NotebookParams(profile="smoke", interactive=False)
    terms, table = report_nb.explore_view(_tables(), params, "ultra-light", toy_only=True)
    assert list(table["regime"]) == list(report_nb.TOY_REGIMES)
    assert set(terms["regime"]) == set(report_nb.TOY_REGIMES)
    assert report_nb.explore_view(Tables({}, synthetic.ORIGIN), params, "h256") is None


def test_findings_carry_numbers_and_sources_and_shrink_with_the_data():
    tables = _tables()
    regimes, _ = decompose(tables)
    found = findings(tables, regimes)
    assert 5 <= len(found) <= 8
    frame = findings_frame(found).set_index("number")
    assert frame.loc["3.0x", "source"].startswith("dispatch[")
    assert frame.loc["50% of roofline", "source"].startswith("paged_model[")
    assert frame.loc["10.0x", "finding"].startswith("No compiled peer")  # 500 vs 50 tok/s
    assert frame.loc["27% of the step", "source"].startswith("tp[origin=reference/h200x2")
    only = Tables({"dispatch": synthetic.tables()["dispatch"]}, synthetic.ORIGIN)
    assert [f.number for f in findings(only, decompose(only)[0])] == ["3.0x"]


def test_conclusions_split_agreement_and_name_the_next_layer():
    tables = _tables()
    regimes, _ = decompose(tables)
    text = "\n".join(conclusions(regimes, seed_table(tables, regimes), tables))
    assert "**Agrees with the seed study** (8 of 10 checked)" in text
    assert "**Does not agree with the seed study** (2 of 10 checked)" in text
    assert "the HBM floor is 1,005 µs of it" in text  # 1.00512 GB at 1000 GB/s
    assert "comm is 27% of the TP step" in text


def test_side_by_side_pairs_regimes_measured_on_both():
    regimes, _ = decompose(_tables())
    ours = regime_table(regimes)
    yours = ours[ours["regime"].isin(["eager", "graph"])].assign(step_us=lambda f: 2 * f["step_us"])
    both = report_nb.side_by_side(ours, yours, "H200", "this machine").set_index("regime")
    assert list(both.index) == ["eager", "graph"]
    assert both["step ratio (yours / ours)"].tolist() == [2.0, 2.0]
    assert set(report_nb.side_by_side_units("H200", "this machine")) >= set(both.columns) - {
        "regime", "H200: dominant", "this machine: dominant"}


def test_local_gpu_uses_gpu_rows_only(tmp_path, monkeypatch):
    from decodelab.core.results import write_table

    local = tmp_path / "local"
    monkeypatch.setenv("DECODELAB_LOCAL", str(local))
    monkeypatch.setenv("DECODELAB_REFERENCE", str(tmp_path / "reference"))
    (tmp_path / "reference" / "h200").mkdir(parents=True)
    frames = synthetic.tables()
    params = report_nb.NotebookParams(profile="smoke", interactive=False)
    cpu_runtime = frames["runtime"].drop(columns=["origin", "device"])
    write_table("runtime", cpu_runtime, out_dir=local, info=synthetic.FakeInfo(label="cpu"))
    assert report_nb.local_gpu(params) is None  # a CPU's runtime rows are no GPU regime
    write_table("dispatch", frames["dispatch"].drop(columns=["origin", "device"]), out_dir=local,
                info=synthetic.FakeInfo(label="t4"))
    yours = report_nb.local_gpu(params)
    assert [r.name for r in yours.regimes] == ["eager", "graph"]


def test_tensor_parallel_regime_refuses_cpu_rows_and_reads_the_multi_gpu_folder():
    frames = synthetic.tables()
    regimes, _ = decompose(_tables(frames))
    tp = {r.name: r for r in regimes}["tensor parallel"]
    assert tp.origin == synthetic.TP_ORIGIN and tp.config.endswith("TP=2")
    frames["tp"] = frames["tp"].assign(device="cpu")
    regimes, notes = decompose(_tables(frames))
    assert "tensor parallel" not in {r.name for r in regimes}
    assert any(n.startswith("tensor parallel: no GPU rows") for n in notes)
    frames["tp"] = synthetic.tables()["tp"].assign(origin="reference/h200-other")
    regimes, notes = decompose(_tables(frames))
    assert any("tensor parallel: no data yet for table `tp`" in n for n in notes)


def test_tensor_parallelism_is_compared_with_tp1_of_its_own_run():
    """TP=n against the tp table's own TP=1 (same run, same code path), never against the
    paged_model run's step; where both are quoted, the note says they are two runs and names
    the commits of their sidecars."""
    from decodelab.analysis.layers import Headline
    from decodelab.analysis.tp_regime import one_gpu_note, tp1_step, tp_speedup_line

    tables = _tables()
    regimes, _ = decompose(tables)
    tp = {r.name: r for r in regimes}["tensor parallel"]
    us, src, origin = tp1_step(tables, Headline())
    assert us == pytest.approx(2000.0) and src.endswith("tp=1]") and origin == synthetic.TP_ORIGIN
    assert "a speed-up of 1.33x" in tp_speedup_line(tables, tp, Headline())  # 2.0 ms / 1.5 ms
    moves = "\n".join(report_nb.transitions(regimes, tables))
    assert "TP=1 of the same run and code path takes 2,000 µs" in moves
    assert "on one GPU" not in moves
    stamped = Tables(tables.frames, synthetic.ORIGIN, stamps={
        ("paged_model", synthetic.ORIGIN): ("newer1", "2026-02-01T00:00"),
        ("tp", synthetic.TP_ORIGIN): ("older2", "2026-01-01T00:00")})
    note = one_gpu_note(stamped, Headline())
    assert "Table `tp` was measured at commit older2, table `paged_model` at newer1" in note
    assert "two benches, two runs" in note and "2,000 µs" in note
    assert "Both were measured" not in note
    same = Tables(tables.frames, synthetic.ORIGIN, stamps={
        ("paged_model", synthetic.ORIGIN): ("c1", "2"), ("tp", synthetic.TP_ORIGIN): ("c1", "1")})
    assert "Both were measured at commit c1" in one_gpu_note(same, Headline())
    frames = synthetic.tables()
    frames["tp"] = frames["tp"][frames["tp"]["tp"] > 1]
    alone = _tables(frames)
    regimes, _ = decompose(alone)
    assert tp_speedup_line(alone, regimes[-1], Headline()) == ""
    assert one_gpu_note(alone, Headline()) == ""
    found = {f.number: f.text for f in findings(tables, decompose(tables)[0])}
    assert "TP=1 of the same run" in found["27% of the step"]


def test_the_peer_finding_leads_with_the_strongest_peer():
    """With compile_static timed, the finding's number is ours against it (the strongest peer),
    its range over every point both were timed, and transformers' uncompiled generate after."""
    frames = synthetic.tables()
    pm = frames["paged_model"]
    graph = pm[(pm["mode"] == "graph") & (pm["batch"] == 1) & (pm["context"] == 512)]
    peer = graph.assign(mode="compile_static", ms_per_step=3.0, compile_s=60.0)
    far = pm[(pm["mode"] == "graph") & (pm["batch"] == 32)].assign(
        mode="compile_static", ms_per_step=3.0, compile_s=90.0)
    frames["paged_model"] = pd.concat([pm, peer, far], ignore_index=True)
    tables = _tables(frames)
    found = {f.number: f for f in findings(tables, decompose(tables)[0])}
    lead = found["1.50x vs compile_static"]  # 3.0 ms against our 2.0 ms at batch 1
    assert lead.text.startswith("Against the strongest peer measured")
    assert "; 1.20-1.50x at the 2 points both were timed)" in lead.text  # 3.0 / 2.5 at B=32
    assert "against transformers' generate without compilation" in lead.text
    assert lead.text.index("compile_static") < lead.text.index("transformers")
    assert "mode=compile_static" in lead.source


def test_the_workload_latencies_are_read_against_its_offered_load():
    """Chapter 04b's Poisson workload: offered rate against the rate the engine served it at;
    above it a queue builds and the text says so (time to first token is the wait), below it
    not; the time per output token is set against the steady decode step."""
    from decodelab.analysis.load import load_of, load_table, load_text, loads

    def requests(origin, rate, n, workload_s, ttft_ms):
        return pd.DataFrame({"origin": origin, "device": "h200", "arrival_rate": rate,
                             "workload_s": workload_s, "ttft_ms": [ttft_ms] * n,
                             "tpot_ms": 20.0, "throughput_tok_s": 960.0})

    frames = synthetic.tables()
    frames["runtime_requests"] = pd.concat([requests(synthetic.ORIGIN, 80.0, 160, 13.0, 7000.0),
                                            requests("local", 100.0, 48, 0.4, 60.0)])
    load = load_of(_tables(frames))
    assert load.served_per_s == pytest.approx(160 / 13.0)
    assert load.overload == pytest.approx(80 * 13.0 / 160)
    text = load_text(load)
    assert "offered 80 requests/s" in text and "6.5x what it serves, so a queue builds" in text
    assert "mostly waiting behind" in text
    assert "steady decode step takes 2.7 ms at batch 32" in text  # synthetic engine 2,700 µs
    assert "within what it serves" in load_text(loads(frames)["local"])
    table = load_table(frames).set_index("origin")
    assert table.loc["local", "overload"] == pytest.approx(100 * 0.4 / 48)
    found = {f.number for f in findings(_tables(frames), decompose(_tables(frames))[0])}
    assert "offered 6.5x what it serves" in found
