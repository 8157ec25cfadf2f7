"""Phase 3 on CPU: result rows, latency models, the bench's failure path, the tool parsers, the
ctypes mirror of the kernels' C structs, and the tables' analysis and figures."""

from __future__ import annotations

import dataclasses
import math
import shutil
import subprocess

import pandas as pd
import pytest
import torch

from decodelab.core import kernel_build
from decodelab.persistent import analysis, library, model, profile, rows, validation
from decodelab.persistent import bench as pb
from decodelab.persistent import kernel as persistent
from decodelab.persistent.sweep import PersistentBenchConfig
from decodelab.toy import step as toy


def test_row_schema_is_the_union_of_its_parts():
    parts = (rows.Shape, rows.Launch, rows.Timing, rows.Clock, rows.Validation, rows.Model)
    names = [f.name for p in parts for f in dataclasses.fields(p)] + ["build_s"]
    assert [f.name for f in dataclasses.fields(rows.PersistentRow)] == names
    row = rows.PersistentRow.of(rows.Shape("named", 64, 4, 1, 256, 65536), rows.Launch("graph_k1"),
                                rows.NO_TIMING)
    assert row.variant == "graph_k1" and math.isnan(row.us_per_step) and row.validated


def test_peak_model():
    # 5 barriers of 40 cycles + 2e6 flop over 2 SMs at 256 flop/clk
    assert math.isclose(model.peak_model_cycles(5, 40.0, 2e6, 2), 200 + 2e6 / 512)
    with pytest.raises(ValueError):
        model.peak_model_cycles(1, -1.0, 1.0, 1)


def test_stage_model_and_error():
    assert model.stage_model_cycles([100.0, 200.0, 50.0], 2, 30.0) == 410.0
    with pytest.raises(ValueError):
        model.stage_model_cycles([-1.0], 1, 1.0)
    assert math.isclose(model.relative_error(110.0, 100.0), 0.1)
    assert math.isnan(model.relative_error(float("nan"), 100.0))


def test_barrier_lookup_nearest_size():
    bars = [{"barrier": "grid_sync", "threads": 256, "blocks": b, "us": b / 10, "cycles": b * 10.0}
            for b in (1, 8, 32)]
    bars.append({"barrier": "syncthreads", "threads": 512, "blocks": 1, "us": 0.02, "cycles": 44.0})
    assert model.barrier_for(bars, "grid", 256, 6) == 80.0
    assert model.barrier_for(bars, "grid", 256, 6, "us") == 0.8
    assert model.barrier_for(bars, "block", 512, 1) == 44.0
    assert math.isnan(model.barrier_for(bars, "cluster", 256, 4))


def test_bench_records_a_failing_variant_and_goes_on(monkeypatch):
    """CPU: with the kernel calls replaced, a variant that raises or fails validation gets a row
    (validated False, no timing) and the others are measured, with their stages and models."""
    cfg = toy.named("ultra-light")
    w, x0 = toy.make_weights(cfg), toy.initial_state(cfg)
    ref = toy.run_eager(w, x0, 20)
    good = validation.Check(True, True, None, None, 0.0, 1e-3)
    bad = validation.Check(False, True, (3, 0), 0.5, 0.0, 1e-3)

    def validate(w, x0, ref, kcfg, stop=-1):
        if kcfg.variant == "grid_wide":
            raise RuntimeError("persistent kernel: launch failed: an illegal memory access")
        return bad if kcfg.variant == "block_fixed" else good

    plan_ok = library.LaunchPlan(True, "", 1, 1, 256, 1024, "shared", "shared", "shared", 4, 1,
                                 2, 1)
    stages = torch.tensor([[100.0, 30.0]] * cfg.layers + [[300.0, 30.0], [80.0, 0.0]])
    monkeypatch.setattr(persistent, "plan", lambda cfg, kcfg: plan_ok)
    monkeypatch.setattr(validation, "validate", validate)
    monkeypatch.setattr(persistent, "cluster_available", lambda: False)
    monkeypatch.setattr(pb.measure, "steps_for", lambda *a: 1000)
    monkeypatch.setattr(pb.measure, "measure_variant", lambda *a: (
        rows.Timing(1000, 1e6, 1.0), rows.Clock(1000.0, 2.0, 1100.0), stages))
    barriers = [{"barrier": "syncthreads", "threads": 256, "blocks": 1, "us": 0.02,
                 "cycles": 40.0}]
    plan = PersistentBenchConfig.for_profile("gpu")
    got, stage_rows = pb.variant_rows("hidden", cfg, w, x0, ref, plan, barriers, 0.0)
    by = {r.variant: r for r in got}
    assert {"block_fixed", "block_wide", "grid_wide", "block_wide_fold"} <= set(by)
    assert by["block_wide"].validated and by["block_wide"].steps_per_s == 1e6
    expect = 100.0 * cfg.layers + 300 + 80 + (cfg.layers + 1) * 40.0
    assert math.isclose(by["block_wide"].model_cycles, expect)
    assert math.isclose(by["block_wide"].model_err, (expect - 1000.0) / 1000.0)
    for name, why in (("block_fixed", "token differs"), ("grid_wide", "illegal memory access")):
        assert not by[name].validated and why in by[name].error
        assert math.isnan(by[name].us_per_step) and by[name].validated_steps == 0
    assert {s.stage for s in stage_rows} == {"layer_0", "layer_1", "layer_2", "layer_3",
                                            "output", "token"}
    assert all(s.variant not in ("block_fixed", "grid_wide") for s in stage_rows)


def test_parse_sanitizer_summaries():
    out = ("block_wide         T=256 H=64 L=4 V=256 B=1 N=6 stop=-1 group=1 ...: ok\n"
           "cluster_wide       T=256 H=64 L=4 V=256 B=1 N=6 stop=5 group=2 ...: ok\nALL OK\n"
           "========= ERROR SUMMARY: 0 errors\n")
    row = profile.parse_sanitizer("memcheck", out, 0)
    assert (row.launches, row.errors, row.results_ok) == (2, 0, True)
    race = profile.parse_sanitizer("racecheck", "FAILED\n========= RACECHECK SUMMARY: 3 hazards "
                                   "displayed (3 errors, 0 warnings)\n", 1)
    assert race.errors == 3 and not race.results_ok
    assert profile.parse_sanitizer("memcheck", "", 1).errors == -1


def test_parse_ncu_raw_and_kernel_names():
    name = "void toy_kernel<SplitWide, BlockX, 256, Fixed<64, 4, 256, 1>, true, false>(ToyArgs, Layout)"
    assert profile.variant_of(name) == ("block_wide_fold", 256)
    assert profile.variant_of("void other()") == ("", 0)
    raw = ('"ID","Kernel Name","smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",'
           '"l1tex__data_pipe_lsu_wavefronts_mem_shared.sum","other"\n'
           '"","","ratio","","x"\n'
           f'"0","{name}","1.5","2,000,000","9"\n==PROF== noise\n')
    got = profile.parse_raw(raw, [("ultra-light", 1)], 2000)
    metrics = {r.metric: r.value for r in got}
    assert metrics == {"stall_barrier": 1.5, "shared_wavefronts_per_step": 1000.0}
    assert got[0].variant == "block_wide_fold" and got[0].config == "ultra-light"
    launches = profile._launches("PROFILED h256 cluster_wide T=256 G=16: ran\n"
                                 "PROFILED h256 grid_wide T=256 G=8: no kernel\n")
    assert launches == [("h256", 16)]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_ctypes_structs_mirror_the_header(tmp_path):
    """The sizes of toyk::ToyArgs and toyk::LaunchInfo as nvcc lays them out equal the ctypes
    mirror's (a host-only program: no GPU needed)."""
    prog = tmp_path / "sizes.cu"
    prog.write_text('#include "persistent.cuh"\n#include <cstdio>\nint main() { printf("%zu %zu %d",'
                    " sizeof(toyk::ToyArgs), sizeof(toyk::LaunchInfo), toyk::kAbiVersion); }\n")
    exe = tmp_path / "sizes"
    subprocess.run(["nvcc", "-std=c++17", "-I", str(kernel_build.kernels_dir()), str(prog), "-o",
                    str(exe)], check=True, capture_output=True, timeout=240)
    args, info, abi = (int(v) for v in subprocess.run([str(exe)], capture_output=True, text=True,
                                                      check=True).stdout.split())
    import ctypes

    assert (args, info, abi) == (ctypes.sizeof(library.ToyArgs), ctypes.sizeof(library.LaunchInfo),
                                 library.ABI_VERSION)


def test_kernel_build_cache_key_and_nvcc(tmp_path, monkeypatch):
    src = tmp_path / "a.cu"
    src.write_text("x")
    key = kernel_build.cache_key([src], "sm_90", ["-O3"], "13.0")
    assert key != kernel_build.cache_key([src], "sm_75", ["-O3"], "13.0")
    src.write_text("y")
    assert key != kernel_build.cache_key([src], "sm_90", ["-O3"], "13.0")
    assert kernel_build.gencode_flags("sm_90") == ["-gencode=arch=compute_90,code=sm_90"]
    with pytest.raises(kernel_build.ConfigError, match="sm_90"):
        kernel_build.gencode_flags("hopper")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("NVCC", raising=False)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.setattr(kernel_build.Path, "exists", lambda self: False)
    with pytest.raises(kernel_build.ConfigError, match="nvcc"):
        kernel_build.find_nvcc()


def _frames():
    out, stages = [], []
    for h in (64, 256):
        for variant, sps, cycles, err in (("block_wide", 6e5, 3300.0, -0.1),
                                          ("cluster_wide_fold", 2e5, 9900.0, -0.3),
                                          ("graph_k1", 4e4, math.nan, math.nan)):
            kernel = not variant.startswith("graph")
            out.append({"sweep": "named", "variant": variant, "hidden": h, "layers": 4,
                        "batch": 1, "vocab": 256, "threads": 256 if kernel else 0,
                        "group": 1 if kernel else 0, "blocks": 1 if kernel else 0,
                        "steps_per_s": sps, "us_per_step": 1e6 / sps,
                        "cycles_per_step": cycles, "sm_clock_ghz": 1.98 if kernel else math.nan,
                        "clocked_cycles_per_step": cycles * 1.2, "model_cycles": cycles * (1 + err),
                        "model_err": err, "peak_model_cycles": 500.0 if kernel else math.nan,
                        "model_us": math.nan, "barriers_per_step": 5 if kernel else 0,
                        "barrier_us": 0.02, "barrier_cycles": 40.0, "host_fraction": 0.01,
                        "validated": True, "error": "", "origin": "reference/h200"})
            if kernel:
                for i, stage in enumerate(["layer_0", "layer_1", "layer_2", "layer_3", "output",
                                           "token"]):
                    stages.append({"sweep": "named", "hidden": h, "layers": 4, "batch": 1,
                                   "vocab": 256, "variant": variant, "threads": 256, "group": 1,
                                   "stage": stage, "index": i, "work_cycles": 400.0 + i,
                                   "wait_cycles": 0.0 if stage == "token" else 50.0,
                                   "origin": "reference/h200"})
    return pd.DataFrame(out), pd.DataFrame(stages)


def test_analysis_on_synthetic_frames():
    frame, stages = _frames()
    table = analysis.seed_comparison(frame)
    ul = table[table["config"] == "ultra-light"].iloc[0]
    assert ul["best_variant"] == "block_wide" and math.isclose(ul["x_graph_k1"], 6e5 / 4e4)
    assert not ul["meets_target"]
    check = analysis.model_check(frame)
    assert set(check["variant"]) == {"block_wide", "cluster_wide_fold"}
    assert check.set_index("variant").loc["block_wide", "within_25pct"].all()
    assert not check.set_index("variant").loc["cluster_wide_fold", "within_25pct"].any()
    wide = analysis.stage_table(stages, "ultra-light")
    assert list(wide.columns[:2]) == ["variant", "threads"] and "output work" in wide.columns
    assert "SM clock" in analysis.clock_summary(frame, None)


def test_plots_on_synthetic_frames():
    import matplotlib.pyplot as plt

    from decodelab.plots import persistent as pp

    frame, stages = _frames()
    barriers = pd.DataFrame([{"barrier": "syncthreads", "threads": t, "blocks": 1, "us": 0.02}
                             for t in (256, 512)])
    for fig in (pp.model_vs_measured(frame), pp.stage_breakdown(stages, "ultra-light"),
                pp.barrier_costs(barriers), pp.named_configs(frame)):
        assert fig.axes
        plt.close(fig)
