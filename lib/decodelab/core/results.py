"""Tidy result tables: one row per measurement, a column per parameter, a metadata sidecar.

A table ``NAME`` is stored as ``NAME.csv`` plus ``NAME.meta.json`` (device, software, commit,
date, profile, the config that produced it, the column list). Files are written atomically:
a crash mid-write leaves the previous file (or none), never half a file.

Loading merges the shipped reference results (``data/reference/<device>/NAME.csv``) and this
machine's runs (``data/local/NAME.csv``), labels each row's ``origin``, and refuses files whose
columns disagree, naming the file and the column.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from decodelab.core import paths

ORIGIN = "origin"
META_SUFFIX = ".meta.json"


class SchemaMismatchError(ValueError):
    """Two files of one table disagree on their columns."""


def _atomic_write(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", newline="") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _plain(obj: Any) -> Any:
    """A JSON-friendly copy of a config (dataclasses, tuples, paths, dtypes)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    return str(obj)


def to_frame(rows: pd.DataFrame | Iterable[Any]) -> pd.DataFrame:
    """Rows as a DataFrame: accepts a DataFrame, dataclass instances or mappings."""
    if isinstance(rows, pd.DataFrame):
        return rows.copy()
    records = [dataclasses.asdict(r) if dataclasses.is_dataclass(r) else dict(r) for r in rows]
    if not records:
        raise ValueError("a result table needs at least one row, got none")
    return pd.DataFrame.from_records(records)


def write_table(name: str, rows: pd.DataFrame | Iterable[Any], *, out_dir: Path | str | None = None,
                config: Any = None, profile: str = "custom", info: Any = None) -> Path:
    """Write ``rows`` as ``out_dir/NAME.csv`` with its metadata sidecar; return the CSV path.

    Every row gets the columns ``device`` and ``torch_version`` so a merged table never loses
    where a number came from; the sidecar holds the full device and software description.
    """
    from decodelab.core.device import collect_info

    info = info if info is not None else collect_info()
    frame = to_frame(rows)
    frame.insert(0, "device", info.label)
    frame.insert(1, "torch_version", info.torch_version)
    out = Path(out_dir) if out_dir is not None else paths.local_dir()
    csv_path = out / f"{name}.csv"
    meta = {
        "table": name,
        "columns": list(frame.columns),
        "rows": len(frame),
        "profile": profile,
        "created_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": _plain(info),
        "config": _plain(config),
    }
    _atomic_write(out / f"{name}{META_SUFFIX}", lambda fh: json.dump(meta, fh, indent=2))
    _atomic_write(csv_path, lambda fh: frame.to_csv(fh, index=False))
    return csv_path


def read_meta(csv_path: Path | str) -> dict[str, Any]:
    path = Path(csv_path)
    meta_path = path.with_name(path.name.removesuffix(".csv") + META_SUFFIX)
    if not meta_path.exists():
        raise FileNotFoundError(f"{path}: metadata sidecar {meta_path.name} is missing")
    return json.loads(meta_path.read_text())


def table_files(name: str, *, reference: Path | None = None, local: Path | None = None
                ) -> list[tuple[str, Path]]:
    """(origin, path) of every stored copy of table ``name``: references first, then local."""
    reference = reference if reference is not None else paths.reference_dir()
    local = local if local is not None else paths.local_dir()
    found = [(f"reference/{p.parent.name}", p) for p in sorted(reference.glob(f"*/{name}.csv"))]
    if (local / f"{name}.csv").exists():
        found.append(("local", local / f"{name}.csv"))
    return found


def _read_checked(path: Path) -> pd.DataFrame:
    frame = pd.read_csv(path)
    meta_cols = read_meta(path)["columns"]
    for col in frame.columns:
        if col not in meta_cols:
            raise SchemaMismatchError(f"{path}: column {col!r} is not in its metadata's columns")
    for col in meta_cols:
        if col not in frame.columns:
            raise SchemaMismatchError(f"{path}: column {col!r} of its metadata is missing")
    return frame


def load_table(name: str, *, reference: Path | None = None, local: Path | None = None,
               origins: Iterable[str] | None = None) -> pd.DataFrame:
    """Every stored copy of table ``name`` merged, with an ``origin`` column.

    ``origins`` filters by prefix (e.g. ``["reference"]`` or ``["local"]``). Raises
    FileNotFoundError when no copy exists and SchemaMismatchError when two copies disagree.
    """
    files = table_files(name, reference=reference, local=local)
    if origins is not None:
        wanted = tuple(origins)
        files = [(o, p) for o, p in files if o.startswith(wanted)]
    if not files:
        raise FileNotFoundError(f"no stored results for table {name!r} "
                                f"(looked in data/reference/*/ and data/local/)")
    frames, first_cols, first_path = [], None, None
    for origin, path in files:
        frame = _read_checked(path)
        if first_cols is None:
            first_cols, first_path = list(frame.columns), path
        else:
            missing = [c for c in first_cols if c not in frame.columns]
            extra = [c for c in frame.columns if c not in first_cols]
            if missing or extra:
                col = (missing or extra)[0]
                what = "lacks" if missing else "has extra"
                raise SchemaMismatchError(f"{path}: {what} column {col!r} compared with {first_path}")
        frame.insert(0, ORIGIN, origin)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def has_table(name: str, **kwargs: Any) -> bool:
    return bool(table_files(name, **kwargs))
