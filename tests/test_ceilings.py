"""The read ceiling of read-dominated work (env.ceilings) and the floors built on it: the read
ceiling where an origin measured one, the copy bandwidth standing in (with the caveat and the
command that measures it) where not. The calibration that measures it: tests/test_device.py."""

import math

import pandas as pd
import pytest

from decodelab.env.ceilings import (
    environment_origin,
    fastest_kernel_read,
    lacking_read_ceiling,
    read_ceiling,
)


def _env(rows, origin="reference/h200") -> pd.DataFrame:
    return pd.DataFrame([{"origin": origin, "quantity": q, "value": v, "unit": "GB/s",
                          "backend": "cuda" if not q.startswith("memory") else "cpu"}
                         for q, v in rows])


def test_read_ceiling_where_measured_copy_with_caveat_where_not():
    both = _env([("d2d_copy_bandwidth", 4000.0), ("read_bandwidth", 4600.0)])
    c = read_ceiling(both, "reference/h200")
    assert (c.gb_s, c.name, c.caveat) == (4600.0, "read ceiling", "")
    assert c.source == "environment[origin=reference/h200, quantity=read_bandwidth]"
    copy_only = _env([("d2d_copy_bandwidth", 4000.0)])
    c = read_ceiling(copy_only, "reference/h200", copy_gb_s=4100.0, copy_source="the run")
    assert (c.gb_s, c.name, c.source) == (4100.0, "copy bandwidth", "the run")
    assert "no read ceiling measured for reference/h200" in c.caveat
    assert "python -m decodelab bench env --profile gpu --out data/reference/h200" in c.caveat
    assert "can beat it" in c.words
    c = read_ceiling(copy_only, "reference/h200")  # no run copy given: the environment's
    assert c.gb_s == 4000.0 and c.source.endswith("quantity=d2d_copy_bandwidth]")
    # a reduction slower than the copy must not loosen the floor: the higher rate wins
    slow = _env([("d2d_copy_bandwidth", 4000.0), ("read_bandwidth", 3000.0)])
    c = read_ceiling(slow, "reference/h200")
    assert c.gb_s == 4000.0 and "above the read ceiling measured" in c.caveat
    assert math.isnan(read_ceiling(None, "reference/h200").gb_s)


def test_a_kernel_that_reads_faster_than_the_stream_sets_the_ceiling():
    """The H200's case: the LM head's gemv (4,540 GB/s) beat the calibration's read stream
    (4,483): the floor takes the kernel's rate and names its row; a slower kernel changes
    nothing; the origin's own rows only, a multi-GPU origin reading its device's."""
    env = _env([("d2d_copy_bandwidth", 4266.0), ("read_bandwidth", 4483.0)])
    linear = pd.DataFrame({"origin": ["reference/h200", "reference/h200", "local"],
                           "n": [128256, 2048, 128256], "k": [2048, 2048, 2048],
                           "candidate": ["gemv_4x1024w4", "cublas", "gemv_4x1024w4"],
                           "weight_gb_s": [4540.0, 2700.0, 9999.0]})
    attention = pd.DataFrame({"origin": ["reference/h200"] * 2, "impl": ["paged", "sdpa"],
                              "batch": [128, 128], "context": [4096, 4096],
                              "kv_gb_s": [4321.0, 4420.0]})
    frames = {"paged_model_linear": linear, "paged_attention": attention}
    fastest = fastest_kernel_read(frames, "reference/h200")
    assert fastest == (4540.0, "paged_model_linear[origin=reference/h200, "
                               "candidate=gemv_4x1024w4, n=128256, k=2048]")
    assert fastest_kernel_read(frames, "reference/h200x2") == fastest
    c = read_ceiling(env, "reference/h200", kernel_read=fastest)
    assert (c.gb_s, c.name, c.caveat) == (4540.0, "read ceiling", "")
    assert c.source.startswith("the fastest kernel read measured, paged_model_linear[")
    assert "above the read ceiling measured (4,483 GB/s" in c.source
    slower = fastest_kernel_read({"paged_attention": attention}, "reference/h200")
    assert slower[0] == 4420.0 and "impl=sdpa" in slower[1]
    assert read_ceiling(env, "reference/h200", kernel_read=slower).gb_s == 4483.0
    assert math.isnan(fastest_kernel_read({}, "reference/h200")[0])
    assert math.isnan(fastest_kernel_read(None, "reference/h200")[0])
    # no calibration at all: a kernel's measured read is still a read ceiling, with no caveat
    c = read_ceiling(None, "reference/h200", kernel_read=fastest)
    assert (c.gb_s, c.caveat) == (4540.0, "") and "above" not in c.source


def test_no_kernel_on_the_shipped_page_beats_its_floor():
    """Every kernel read in the shipped H200 tables is at or under the ceiling its floors use."""
    from decodelab.core.results import stored_tables
    from decodelab.model.floors import with_ceiling

    tables = stored_tables(("paged_model", "paged_model_linear", "paged_attention",
                            "environment"))
    pm = with_ceiling(tables["paged_model"], tables.get("environment"), tables)
    ref = pm[pm["origin"] == "reference/h200"]
    ceiling = float(ref["floor_gb_s"].iloc[0])
    for table, column in (("paged_model_linear", "weight_gb_s"), ("paged_attention", "kv_gb_s")):
        frame = tables[table]
        assert frame[frame["origin"] == "reference/h200"][column].max() <= ceiling, table
    assert (ref["roofline_fraction"] <= 1).all()


def test_multi_gpu_origins_read_the_single_gpu_calibration_and_cpu_its_own():
    assert environment_origin("reference/h200x2") == "reference/h200"
    both = _env([("d2d_copy_bandwidth", 4000.0), ("read_bandwidth", 4600.0)])
    assert read_ceiling(both, "reference/h200x2").gb_s == 4600.0
    cpu = _env([("memory_copy_bandwidth", 10.0), ("memory_read_bandwidth", 12.0)], "local")
    assert read_ceiling(cpu, "local", backend="cpu").gb_s == 12.0
    assert lacking_read_ceiling(pd.concat([both, _env([("d2d_copy_bandwidth", 1.0)], "local")])
                                ) == ["local"]


def test_floors_use_the_read_ceiling_where_measured():
    """The transformer's and the toy's floor: bytes at the read ceiling when the environment
    table has one, else at the copy bandwidth with the caveat in its derivation."""
    import test_compute_split as cs

    from decodelab.analysis.compute_split import split_compute
    from decodelab.analysis.decompose import decompose
    from decodelab.analysis.layers import Tables

    tables = cs._tables()
    regimes, _ = decompose(tables)
    by = {s.regime: s for s in split_compute(tables, regimes)[0]}
    assert "stands in" in by["transformer decode"].parts[0].how
    env = tables.frames["environment"]
    read = env[env["quantity"] == "d2d_copy_bandwidth"].assign(quantity="read_bandwidth",
                                                                value=2000.0)
    faster = Tables({**tables.frames, "environment": pd.concat([env, read])}, tables.origin)
    regimes, _ = decompose(faster)
    by = {s.regime: s for s in split_compute(faster, regimes)[0]}
    floor = by["transformer decode"].parts[0]
    assert by["transformer decode"].us("floor") == pytest.approx(
        (cs.WEIGHT_BYTES + cs.KV_BYTES) / (2000.0 * 1e3))
    assert "bytes / read ceiling" in floor.how and "stands in" not in floor.how
    assert "quantity=read_bandwidth" in floor.source
    assert by["graph"].us("floor") == pytest.approx(max(cs.TOY_BYTES / 2e6, 2.0))



def test_the_report_says_which_ceiling_its_floors_use():
    import test_compute_split as cs

    from decodelab.analysis.compute_floor import ceiling_note, copy_stands_in
    from decodelab.analysis.compute_split import split_compute
    from decodelab.analysis.compute_view import transformer_verdict
    from decodelab.analysis.decompose import decompose
    from decodelab.analysis.layers import Tables

    tables = cs._tables()
    assert copy_stands_in(tables)
    note = ceiling_note(tables)
    assert note.startswith("**Every floor here is at the copy bandwidth**")
    assert "bench env --profile gpu" in note
    regimes, _ = decompose(tables)
    splits, _ = split_compute(tables, regimes)
    assert "floor sits higher" in transformer_verdict(splits, regimes, copy_stands_in=True)
    assert "floor sits higher" not in transformer_verdict(splits, regimes)
    env = tables.frames["environment"]
    read = env[env["quantity"] == "d2d_copy_bandwidth"].assign(quantity="read_bandwidth",
                                                                value=2000.0)
    measured = Tables({**tables.frames, "environment": pd.concat([env, read])}, tables.origin)
    assert not copy_stands_in(measured)
    assert ceiling_note(measured).startswith("The floors use the read ceiling, 2,000 GB/s")


def test_the_machine_table_says_no_gpu_instead_of_blank_gpu_fields():
    from dataclasses import replace

    from decodelab.core.device import collect_info
    from decodelab.env.notebook import GPU_FIELDS, machine_table

    info = replace(collect_info(), gpu_name="", compute_capability="", sm_count=0)
    rows = machine_table(info).set_index("field")["value"]
    assert rows["gpu"].startswith("none") and not set(GPU_FIELDS) & set(rows.index)
    gpu = machine_table(replace(info, gpu_name="NVIDIA H200", sm_count=132))
    assert "gpu" not in set(gpu["field"]) and "132" in set(gpu["value"])


def test_spread_warning_flags_quartiles_far_apart():
    from decodelab.env.calibrate import spread_warning

    rows = pd.DataFrame([{"quantity": "memory_copy_bandwidth", "unit": "GB/s", "q1": 3.0,
                          "q3": 9.0}, {"quantity": "matmul_fp32", "unit": "TFLOP/s",
                                       "q1": 1.0, "q3": 1.1}])
    assert spread_warning(rows) == ["memory_copy_bandwidth: its quartiles span 3.0x (3 to 9 GB/s)"]
