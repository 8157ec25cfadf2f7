"""Result tables: atomic writes, metadata, merging reference and local, schema checks."""

import json
from dataclasses import dataclass

import pandas as pd
import pytest

from decodelab.core import results
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
