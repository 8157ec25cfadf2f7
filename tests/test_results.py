"""Result tables: atomic writes, metadata, merging reference and local, schema checks."""

import dataclasses
import json
import math
import os
from dataclasses import dataclass

import pandas as pd
import pytest

from decodelab.core import paths, results, table_io
from decodelab.core.device import collect_info


@dataclass(frozen=True)
class Row:
    mode: str
    hidden: int
    wall_us: float


def _rows():
    return [Row("eager", 64, 10.5), Row("graph", 64, 2.25)]


def test_write_and_load_roundtrip(tmp_path):
    ref, local = tmp_path / "reference", tmp_path / "local"
    results.write_table("demo", _rows(), out_dir=ref / "h200", config={"n": 3}, profile="gpu")
    results.write_table("demo", _rows()[:1], out_dir=local, config={"n": 1}, profile="cpu")
    table = results.load_table("demo", reference=ref, local=local)
    assert list(table["origin"]) == ["reference/h200", "reference/h200", "local"]
    assert list(table["wall_us"]) == [10.5, 2.25, 10.5]
    assert {"device", "torch_version"} <= set(table.columns)
    meta = results.read_meta(ref / "h200" / "demo.csv")
    assert meta["profile"] == "gpu" and meta["config"] == {"n": 3} and meta["rows"] == 2
    assert meta["device"]["torch_version"] == collect_info().torch_version
    only_local = results.load_table("demo", reference=ref, local=local, origins=["local"])
    assert list(only_local["origin"]) == ["local"]


def test_crash_mid_write_leaves_previous_file(tmp_path, monkeypatch):
    results.write_table("demo", _rows(), out_dir=tmp_path)
    before = (tmp_path / "demo.csv").read_text()

    def exploding_to_csv(self, fh, **kwargs):
        fh.write("mode,hidden\nhalf")
        raise RuntimeError("power cut")

    monkeypatch.setattr(pd.DataFrame, "to_csv", exploding_to_csv)
    with pytest.raises(RuntimeError, match="power cut"):
        results.write_table("demo", [Row("x", 1, 1.0)], out_dir=tmp_path)
    assert (tmp_path / "demo.csv").read_text() == before
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_crash_on_first_write_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(pd.DataFrame, "to_csv", lambda *a, **k: (_ for _ in ()).throw(OSError("disk")))
    with pytest.raises(OSError):
        results.write_table("fresh", _rows(), out_dir=tmp_path)
    assert not (tmp_path / "fresh.csv").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_schema_mismatch_names_file_and_column(tmp_path):
    ref, local = tmp_path / "reference", tmp_path / "local"
    results.write_table("demo", _rows(), out_dir=ref / "h200")
    results.write_table("demo", [{"mode": "eager", "hidden": 64}], out_dir=local)
    with pytest.raises(results.SchemaMismatchError, match=r"local/demo.csv.*'wall_us'"):
        results.load_table("demo", reference=ref, local=local)


def test_csv_disagreeing_with_its_metadata_is_refused(tmp_path):
    path = results.write_table("demo", _rows(), out_dir=tmp_path / "local")
    meta_path = tmp_path / "local" / "demo.meta.json"
    meta = json.loads(meta_path.read_text())
    meta["columns"].append("extra_col")
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(results.SchemaMismatchError, match="extra_col"):
        results.load_table("demo", reference=tmp_path / "none", local=path.parent)


def test_missing_table_and_empty_rows(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        results.load_table("nope", reference=tmp_path, local=tmp_path)
    with pytest.raises(ValueError, match="at least one row"):
        results.write_table("empty", [], out_dir=tmp_path)
    assert not results.has_table("nope", reference=tmp_path, local=tmp_path)


# ------------------------------------------------------------------ damaged files
def _three_rows(tmp_path):
    rows = [Row("eager", 64, 10.5), Row("graph", 64, 2.25), Row("multi", 128, 1.125)]
    return results.write_table("demo", rows, out_dir=tmp_path / "local")


def _load(tmp_path):
    return results.load_table("demo", reference=tmp_path / "none", local=tmp_path / "local")


def test_sidecar_records_rows_and_hash_and_no_pending_file_is_left(tmp_path):
    path = _three_rows(tmp_path)
    meta = results.read_meta(path)
    assert meta["rows"] == 3 and meta["sha256"] == results.sha256(path.read_bytes())
    assert sorted(p.name for p in path.parent.iterdir()) == ["demo.csv", "demo.meta.json"]
    assert list(_load(tmp_path)["wall_us"]) == [10.5, 2.25, 1.125]


@pytest.mark.parametrize(("damage", "match"), [
    (lambda text: text.split("\n", 2)[0] + "\n" + text.split("\n", 2)[1] + "\n",
     "does not match its sidecar"),  # cut after its first row
    (lambda text: text[:text.rindex("1.125") + 3], "does not match its sidecar"),  # mid-number
    (lambda text: text.replace("graph,64,2.25", "graph,64,2.25,9"), "does not match"),
    (lambda text: "", "does not match its sidecar"),
])
def test_a_damaged_csv_is_refused_naming_the_file(tmp_path, damage, match):
    path = _three_rows(tmp_path)
    path.write_text(damage(path.read_text()))
    with pytest.raises(results.DamagedResultError, match=rf"local/demo.csv: .*{match}"):
        _load(tmp_path)


def test_without_a_recorded_hash_row_count_and_shape_still_checked(tmp_path):
    """Sidecars written before hashes were recorded: the row count, a longer row and an
    empty file are still caught, naming the file."""
    path = _three_rows(tmp_path)
    meta_path = path.with_name("demo.meta.json")
    meta = json.loads(meta_path.read_text())
    del meta["sha256"]
    meta_path.write_text(json.dumps(meta))
    text = path.read_text()
    for damaged, match in ((text.split("\n", 2)[0] + "\n" + text.split("\n", 2)[1] + "\n",
                            "1 rows, its sidecar records 3"),
                           (text.replace("graph,64,2.25", "graph,64,2.25,9"), "cannot be parsed"),
                           ("", "cannot be parsed")):
        path.write_text(damaged)
        with pytest.raises(results.DamagedResultError, match=rf"local/demo.csv: {match}"):
            _load(tmp_path)


@pytest.mark.parametrize(("sidecar", "match"), [
    ('{"table": "demo", "columns": ["dev', "not valid JSON"),  # half-written
    ("", "not valid JSON"),
    ("[1, 2]", "holds a list, must be a JSON object"),
    ('{"table": "demo"}', "'columns' is None, must be a list"),
])
def test_a_damaged_sidecar_is_refused_naming_the_file(tmp_path, sidecar, match):
    path = _three_rows(tmp_path)
    path.with_name("demo.meta.json").write_text(sidecar)
    with pytest.raises(results.DamagedResultError, match=rf"local/demo.meta.json: {match}"):
        _load(tmp_path)


def _crash_on(monkeypatch, nth: int):
    """Make the nth file rename of write_table fail: 1 is the sidecar's (the commit), 2 the
    CSV's."""
    real = os.replace
    calls = []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == nth:
            raise OSError("power cut")
        return real(src, dst)

    monkeypatch.setattr(table_io.os, "replace", replace)


def _temps(folder):
    return [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("nth", [1, 2])
def test_an_interrupted_first_write_leaves_no_table_or_the_whole_new_one(tmp_path, monkeypatch, nth):
    _crash_on(monkeypatch, nth)
    with pytest.raises(OSError, match="power cut"):
        _three_rows(tmp_path)
    monkeypatch.undo()
    local = tmp_path / "local"
    if nth == 1:  # the sidecar did not commit: no table (no orphan sidecar)
        assert not results.has_table("demo", reference=tmp_path / "none", local=local)
    else:  # committed: the new table loads
        assert list(_load(tmp_path)["mode"]) == ["eager", "graph", "multi"]
    assert not _temps(local)


@pytest.mark.parametrize("nth", [1, 2])
def test_an_interrupted_overwrite_adding_a_column_leaves_old_or_new_never_a_mix(
        tmp_path, monkeypatch, nth):
    _three_rows(tmp_path)
    _crash_on(monkeypatch, nth)
    with pytest.raises(OSError, match="power cut"):
        results.write_table("demo", [{"mode": "x", "hidden": 1, "wall_us": 1.0, "extra": 2}],
                            out_dir=tmp_path / "local")
    monkeypatch.undo()
    table = _load(tmp_path)
    if nth == 1:  # the sidecar did not commit: the old pair
        assert list(table["mode"]) == ["eager", "graph", "multi"] and "extra" not in table
    else:  # committed, the CSV's rename interrupted: loading takes the new CSV and renames it
        assert list(table["mode"]) == ["x"] and list(table["extra"]) == [2]
        assert "extra" in (tmp_path / "local" / "demo.csv").read_text()
    assert not _temps(tmp_path / "local")


def test_a_swapped_pair_is_refused_naming_both_tables(tmp_path):
    """Table u's CSV and sidecar copied over table t's: the pair is whole (the hash matches),
    but its sidecar records table u."""
    local = tmp_path / "local"
    results.write_table("t", _rows(), out_dir=local)
    results.write_table("u", [Row("other", 1, 1.0)], out_dir=local)
    for suffix in (".csv", ".meta.json"):
        (local / f"t{suffix}").write_bytes((local / f"u{suffix}").read_bytes())
    with pytest.raises(results.DamagedResultError,
                       match=r"local/t.meta.json: records table 'u', but is stored as table 't'"):
        results.load_table("t", reference=tmp_path / "none", local=local)
    assert list(results.load_table("u", reference=tmp_path / "none", local=local)["mode"]) == [
        "other"]


# ------------------------------------------------------------------ exact round trip
@dataclass(frozen=True)
class Typed:
    text: str
    count: int
    value: float
    flag: bool


TEXTS = ("", "NA", "nan", "None", "null", "1", "True", "N/A", "#N/A", "-1.5", " padded ", "a,b",
         'say "hi"', "two\nlines")
VALUES = (math.nan, math.inf, -math.inf, -0.0, 1 / 3, 1e-310, 1e300, 0.1, 2.0, 7.0)


def _same(a, b) -> bool:
    """Equal, NaN equal to NaN, -0.0 apart from 0.0, and of the same Python type."""
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return type(a) is type(b) and a == b and str(a) == str(b)


def _values(table: pd.DataFrame) -> list[dict]:
    return table.drop(columns=["origin", "device", "torch_version"]).to_dict("records")


def _typed_rows() -> list[Typed]:
    counts = (0, 1, -1, 2**62, -(2**62))
    return [Typed(text, counts[i % len(counts)], VALUES[i % len(VALUES)], i % 3 == 0)
            for i, text in enumerate(TEXTS)]


def test_str_int_float_and_bool_fields_round_trip_exactly(tmp_path):
    """Strings that look like NA, numbers or booleans stay strings; NaN, inf and -0.0 stay
    themselves in a float column; ints and bools keep their type."""
    rows = _typed_rows()
    results.write_table("typed", rows, out_dir=tmp_path / "local")
    table = results.load_table("typed", reference=tmp_path / "none", local=tmp_path / "local")
    assert [str(t) for t in table.dtypes[["count", "value", "flag"]]] == ["int64", "float64",
                                                                        "bool"]
    for row, got in zip(rows, _values(table), strict=True):
        assert all(_same(v, got[k]) for k, v in dataclasses.asdict(row).items()), (row, got)


@dataclass(frozen=True)
class Floats:
    whole: float
    either: int | float


def test_a_float_field_of_whole_numbers_loads_as_float(tmp_path):
    results.write_table("floats", [Floats(1, 2), Floats(3, 4)], out_dir=tmp_path)
    table = results.load_table("floats", reference=tmp_path / "none", local=tmp_path)
    assert _values(table) == [{"whole": 1.0, "either": 2.0}, {"whole": 3.0, "either": 4.0}]
    assert [str(t) for t in table.dtypes[["whole", "either"]]] == ["float64", "float64"]


def test_a_frame_round_trips_by_its_column_dtypes(tmp_path):
    frame = pd.DataFrame({"s": ["1", "True", "nan"], "i": [1, 2, 3], "f": [1.5, math.nan, 2.0],
                          "b": [True, False, True]})
    results.write_table("frame", frame, out_dir=tmp_path)
    got = _values(results.load_table("frame", reference=tmp_path / "none", local=tmp_path))
    for want, row in zip(frame.to_dict("records"), got, strict=True):
        assert all(_same(v, row[k]) for k, v in want.items()), (want, row)


@pytest.mark.parametrize(("column", "match"), [
    ([1, "a"], r"column 'x' mixes int and str values \(1, 'a'\)"),
    (["a", None], r"column 'x' mixes str and float values \('a', nan\)"),  # pandas: None -> NaN
    (["a", math.nan], r"column 'x' mixes str and float values \('a', nan\)"),
    ([True, 1], r"column 'x' mixes bool and int values \(True, 1\)"),
    ([[1], [2]], r"column 'x' holds \[1\] \(list\), which would not read back"),
])
def test_a_column_that_would_not_read_back_is_refused_naming_it(tmp_path, column, match):
    with pytest.raises(ValueError, match=match):
        results.write_table("bad", pd.DataFrame({"x": column}), out_dir=tmp_path)
    with pytest.raises(ValueError, match=match.replace("'x'", "'text'")):
        results.write_table("bad", [Typed(v, 1, 1.0, True) for v in column], out_dir=tmp_path)
    assert not results.has_table("bad", reference=tmp_path / "none", local=tmp_path)


def test_a_sidecar_without_column_types_loads_as_before(tmp_path):
    """Tables written before column types were recorded (the shipped references) are parsed
    by pandas' guess, as they always were."""
    path = results.write_table("old", [Typed("1", 1, 1.0, True)], out_dir=tmp_path)
    meta_path = path.with_name("old.meta.json")
    meta = json.loads(meta_path.read_text())
    del meta["column_types"]
    meta_path.write_text(json.dumps(meta))
    table = results.load_table("old", reference=tmp_path / "none", local=tmp_path)
    assert _values(table) == [{"text": 1, "count": 1, "value": 1.0, "flag": True}]


def test_every_shipped_reference_table_loads():
    for csv in sorted(paths.reference_dir().glob("*/*.csv")):
        table = results.load_table(csv.stem, origins=[f"reference/{csv.parent.name}"])
        assert len(table) == results.read_meta(csv)["rows"], csv


@pytest.mark.parametrize(("kind", "match"), [("integer", "column_types is .*'integer'.*must map"),
                                             ("int", "cannot be parsed as CSV")])
def test_a_sidecar_with_wrong_column_types_is_refused_naming_the_file(tmp_path, kind, match):
    path = _three_rows(tmp_path)
    meta_path = path.with_name("demo.meta.json")
    meta = json.loads(meta_path.read_text())
    meta["column_types"]["mode"] = kind  # 'eager' is no int
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(results.DamagedResultError, match=rf"local/demo.csv: .*{match}"):
        _load(tmp_path)
