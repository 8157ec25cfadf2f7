"""The result rows of the model, engine and tensor-parallel benches have exactly the columns,
in the same order, of the committed reference tables: one row of each type is built through
its own constructor, written with ``write_table``, and its CSV header compared with the
reference CSV's (under today's names: ``results.RENAMED_COLUMNS``). A field added, dropped,
renamed or moved fails here."""

from __future__ import annotations

import csv
from dataclasses import fields

import pandas as pd
import pytest

from decodelab.core import paths
from decodelab.core.results import (
    ADDED_COLUMNS,
    RENAMED_COLUMNS,
    load_table,
    stamped,
    write_table,
)
from decodelab.engine.bench.rows import (
    BatchRow,
    ErrorRow,
    RequestRow,
    RuntimeRow,
    SamplerRow,
    StepRow,
)
from decodelab.engine.bench.step_timing import RunResult
from decodelab.engine.metrics import RequestRecord, StepRecord
from decodelab.model.bench.rows import GemmRow, KernelRow, LinearRow, PagedModelRow
from decodelab.parallel import rows as tp_rows


def _engine_rows() -> dict[str, object]:
    rec = StepRecord(3, 4, 4, 0, 0, schedule=1e-5, prepare=2e-5, forward=3e-4, sample=4e-5,
                     update=1e-6, emit=5e-6, sync_wait=1e-6, wall=4e-4)
    eng = RunResult([4e-4, 4.2e-4], 1e-4, [rec], 12.0, 3.0)
    bare = RunResult([3.5e-4], 2e-5)
    request = RequestRecord("w0", "finished", "length", 12, 8, 0, 0.01, 0.002, 0.03)
    rows = {"runtime": RuntimeRow.of("engine", 4, eng, bare, 1e-5),
            "runtime_steps": StepRow.of(rec, "engine"),
            "runtime_sampler": SamplerRow("partial_topk", 4, 512, 64, 10.0, 12.0, 30.0, 1.0),
            "runtime_batch": BatchRow.of(4, eng, bare),
            "runtime_requests": RequestRow.of(request, 100.0, 2.0, 500.0),
            "runtime_errors": ErrorRow("error", "callback_error", 1)}
    run = dict(model="tiny", dtype="float32", block_size=8, graph_tokens_agree=1.0, bench_s=3.5)
    return {name: stamped([row], **run)[0] for name, row in rows.items()}


def _tp_rows() -> dict[str, object]:
    checks = tp_rows.TPChecks(True, 0.01, True)
    tp = tp_rows.TPRow("tiny", 2, "graph", 4, 4, 64, "float32", 1.0, 0.9, 0.1, 4000.0, 0.8,
                       0.2, 0.15, 7, 1024, 4096, 1 << 20, 100.0, 0.5, 0.3, 12.0,
                       checks.graph_equals_eager, checks.max_rel_err_vs_tp1,
                       checks.tokens_equal_tp1)
    coll = tp_rows.CollectiveRow("all_reduce", "eager", 2, 1024, "float32", 10.0, 9.0, 3.0,
                                 0.1, 0.1, 8, 5)
    op = tp_rows.OpTime(1, "c10d::allreduce_", 7.0, 20.0, 30.0)
    prof = tp_rows.ProfileRow.of("tiny", 2, "eager", 1, 64, op)
    rows = {"tp": tp, "tp_collectives": coll, "tp_profile": prof}
    return {name: stamped([row], bench_s=2.5, world_size=2)[0] for name, row in rows.items()}


CASES = {
    "h200": {"paged_model": PagedModelRow.measured("eager", 4, 64, 1e-3, 1e-4, 9e-4, 10**6,
                                                   200.0, max_rel_err=0.0),
             "paged_model_kernels": KernelRow("gemv", 2.0, 30.0, 1, 512, 0.25),
             "paged_model_linear": LinearRow(2048, 2048, False, "cublas", 12.0, 700.0, True),
             "paged_model_gemm": GemmRow(2048, 2048, False, 8, "cublas", 12.0, 700.0, True),
             **_engine_rows()},
    "h200x2": _tp_rows(),
}


def _header(path) -> list[str]:
    with open(path, newline="") as fh:
        return next(csv.reader(fh))


@pytest.mark.parametrize(("folder", "name"), [(f, n) for f, rows in CASES.items() for n in rows])
def test_row_fields_match_the_reference_header(folder, name, tmp_path):
    reference = paths.repo_root() / "data" / "reference" / folder / f"{name}.csv"
    if not reference.exists():
        pytest.skip(f"{reference.name}: no reference measured yet")
    renamed = RENAMED_COLUMNS.get(name, {})
    want = [renamed.get(c, c) for c in _header(reference)]
    added = [c for c in ADDED_COLUMNS.get(name, ()) if c not in want]  # after it was shipped
    row = CASES[folder][name]
    assert want[:2] == ["device", "torch_version"]
    names = [f.name for f in fields(row)]
    assert [c for c in names if c not in added] == want[2:], f"{type(row).__name__} vs {reference}"
    assert set(added) <= set(names)
    written = write_table(name, [row], out_dir=tmp_path)
    assert _header(written) == ["device", "torch_version", *names]
    merged = load_table(name, reference=reference.parent.parent, local=tmp_path)  # old + new
    assert set(added) <= set(merged.columns)


def test_an_added_column_loads_from_the_sidecar_config_or_as_missing(tmp_path):
    """A copy written before ``model``/``dtype`` (here ``paged_model_kernels``) or the serving
    tables' garbage-collection columns merges with a new one: the run's values from its
    sidecar's config, NaN where the config has none."""
    old, new = tmp_path / "old" / "h200", tmp_path / "new"
    cfg = {"model": "tiny", "dtype": "bfloat16"}
    write_table("paged_model_kernels", pd.DataFrame({"kernel": ["gemv"]}), out_dir=old,
                config=cfg)
    write_table("paged_model_kernels", pd.DataFrame({"kernel": ["norm"], "model": ["tiny"],
                                                     "dtype": ["float16"]}), out_dir=new)
    merged = load_table("paged_model_kernels", reference=old.parent, local=new)
    assert list(merged["dtype"]) == ["bfloat16", "float16"] and set(merged["model"]) == {"tiny"}
    write_table("serve_steps", pd.DataFrame({"step": [0]}), out_dir=old, config=cfg)
    write_table("serve_steps", pd.DataFrame({"step": [0], "gc_ms": [0.5]}), out_dir=new)
    merged = load_table("serve_steps", reference=old.parent, local=new)
    assert merged["gc_ms"].isna().tolist() == [True, False]


def test_a_column_added_with_the_old_rows_value_merges(tmp_path):
    """``paged_attention`` before its ``lens`` column (every row at its context) merges with a
    copy that has it, as "uniform"."""
    old, new = tmp_path / "old" / "h200", tmp_path / "new"
    write_table("paged_attention", pd.DataFrame({"impl": ["paged"]}), out_dir=old)
    write_table("paged_attention", pd.DataFrame({"impl": ["paged"], "lens": ["mixed"]}),
                out_dir=new)
    merged = load_table("paged_attention", reference=old.parent, local=new)
    assert list(merged["lens"]) == ["uniform", "mixed"]


def test_every_reference_table_of_these_phases_has_a_row_type():
    folders = {"h200": ("paged_model", "runtime"), "h200x2": ("tp",)}
    for folder, prefixes in folders.items():
        stored = {p.stem for p in (paths.repo_root() / "data" / "reference" / folder).glob("*.csv")
                  if p.stem.startswith(prefixes)}
        assert stored <= set(CASES[folder]), folder


@pytest.mark.parametrize(("folder", "name"), [("h200", "paged_model"), ("h200x2", "tp")])
def test_step_time_is_ms_per_step_in_the_shipped_and_in_a_new_table(folder, name, tmp_path):
    """The shipped tables (written as ``ms_per_token``, their bytes and hash untouched) load
    with ``ms_per_step``, as a new run writes it, and the two merge into one table."""
    reference = paths.repo_root() / "data" / "reference"
    if not (reference / folder / f"{name}.csv").exists():
        pytest.skip(f"{name}: no reference measured yet")
    written = write_table(name, [CASES[folder][name]], out_dir=tmp_path)
    assert "ms_per_step" in _header(written) and "ms_per_token" not in _header(written)
    merged = load_table(name, reference=reference, local=tmp_path)
    assert "ms_per_step" in merged and "ms_per_token" not in merged
    shipped = merged[merged["origin"] == f"reference/{folder}"]
    assert len(shipped) > 0 and (shipped["ms_per_step"] > 0).all()
    assert list(merged.loc[merged["origin"] == "local", "ms_per_step"]) == [
        CASES[folder][name].ms_per_step]


def test_a_renamed_column_loads_under_its_new_name(tmp_path):
    """A table written before a rename (here ``tp`` with ``ms_per_token``) loads with the new
    name, checked against its sidecar as written, and merges with a table of the new layout."""
    old, new = tmp_path / "old", tmp_path / "new"
    write_table("tp", pd.DataFrame({"batch": [1], "ms_per_token": [2.5]}), out_dir=old / "h200x2")
    write_table("tp", pd.DataFrame({"batch": [8], "ms_per_step": [3.0]}), out_dir=new)
    merged = load_table("tp", reference=old, local=new)
    assert list(merged["ms_per_step"]) == [2.5, 3.0] and "ms_per_token" not in merged
    assert "ms_per_token" in _header(old / "h200x2" / "tp.csv")  # the file itself unchanged


def test_stamped_fills_placeholders_and_keeps_what_an_earlier_write_stamped():
    first = stamped([tp_rows.SkipRow("tiny", 2, 1.0, 0.5, "too big")], bench_s=1.5, world_size=2)
    both = stamped([*first, tp_rows.SkipRow("small", 2, 2.0, 0.5, "too big")], bench_s=4.0,
                   world_size=2)
    assert [(r.bench_s, r.world_size) for r in both] == [(1.5, 2), (4.0, 2)]
    with pytest.raises(TypeError, match="no run column"):
        stamped([KernelRow("gemv", 2.0, 30.0, 1, 512, 0.25)], batch=4)


def test_the_step_phases_and_the_request_record_are_declared_once():
    from decodelab.engine.metrics import PHASE_COLS, PHASES

    record = [f.name for f in fields(StepRecord)]
    assert record[5:5 + len(PHASES)] == list(PHASES)  # after step .. prefill_tokens
    step = [f.name for f in fields(StepRow)]
    assert step[4:4 + len(PHASE_COLS)] == list(PHASE_COLS)  # after variant .. bucket
    request = [f.name for f in fields(RequestRow)]
    assert request[:len(fields(RequestRecord))] == [f.name for f in fields(RequestRecord)]
