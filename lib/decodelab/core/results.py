"""Tidy result tables: one row per measurement, a column per parameter, a metadata sidecar.

A table ``NAME`` is stored as ``NAME.csv`` plus ``NAME.meta.json`` (device, software, commit,
date, profile, the config that produced it, the columns and their types, the CSV's row count
and SHA-256). Every value reads back as written (:mod:`decodelab.core.columns`).
The pair is written crash-safe and safe beside other writers and readers (a lock per folder,
the sidecar's rename as the commit): :mod:`decodelab.core.table_io` says how.

Loading merges the shipped reference results (``data/reference/<device>/NAME.csv``) and this
machine's runs (``data/local/NAME.csv``), labels each row's ``origin``, and checks each file
against its sidecar (table name, hash, row count, columns), naming the file and what is wrong
(:class:`DamagedResultError`); files whose columns disagree raise :class:`SchemaMismatchError`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from decodelab.core import paths, table_io
from decodelab.core.columns import declared_floats, read_options, types_of
from decodelab.core.table_io import (
    META_SUFFIX,
    DamagedResultError,
    read_meta,  # noqa: F401 - part of this module's interface
    sha256,
)
from decodelab.core.table_io import atomic_write as _atomic_write  # noqa: F401 - for report.py

ORIGIN = "origin"
# Columns renamed since tables were shipped, per table: {old name: new name}. Loading renames
# them in every file (after the check against its sidecar, which records the old names), so
# committed tables load under today's names unchanged.
RENAMED_COLUMNS: dict[str, dict[str, str]] = {
    "paged_model": {"ms_per_token": "ms_per_step"},  # it always held ms per step of B rows
    "tp": {"ms_per_token": "ms_per_step"},
}
_RUN = ("model", "dtype")  # each of these benches records both in its sidecar's config
_GC = ("gc_pauses", "gc_ms", "gc_longest_ms")
_TAIL = ("decode_step_ms", "itl_p99_x_decode", "steps_over_3x", "jit_compiles", "token_budget")
# Columns added since tables were shipped, per table. A copy written before a column existed
# loads with it: the value its sidecar's config records under that name (the run's model and
# dtype), else missing (NaN: not recorded then), so old and new copies merge.
ADDED_COLUMNS: dict[str, tuple[str, ...]] = {
    **{t: _RUN for t in ("paged_model_kernels", "paged_model_linear", "paged_model_gemm",
                         "paged_attention", "paged_prefill")},
    "serve_offline": (*_GC, *_TAIL, "prefill_buckets"), "serve_online": (*_GC, *_TAIL),
    "serve_steps": ("gc_ms", "issue_ms", "wait_ms", "device_ms"),
}
# Columns added with the value every older row had, per table: {column: value}.
ADDED_VALUES: dict[str, dict[str, Any]] = {
    "paged_attention": {"lens": "uniform"},  # mixed contexts were measured from then on
}


class SchemaMismatchError(ValueError):
    """Two files of one table disagree on their columns."""


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
    where a number came from; the sidecar holds the full device and software description and
    each column's type, by which every value reads back exactly (:mod:`decodelab.core.columns`).
    """
    from decodelab.core.device import collect_info

    info = info if info is not None else collect_info()
    rows = rows if isinstance(rows, pd.DataFrame) else list(rows)
    frame = to_frame(rows)
    frame.insert(0, "device", info.label)
    frame.insert(1, "torch_version", info.torch_version)
    types = types_of(frame, declared_floats(rows))
    frame = frame.astype({c: "float64" for c, t in types.items() if t == "float"})
    out = Path(out_dir) if out_dir is not None else paths.local_dir()
    csv_path = out / f"{name}.csv"
    buf = io.StringIO()
    frame.to_csv(buf, index=False)
    data = buf.getvalue().encode()
    meta = {
        "table": name,
        "columns": list(frame.columns),
        "column_types": types,
        "rows": len(frame),
        "sha256": sha256(data),
        "profile": profile,
        "created_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": _plain(info),
        "config": _plain(config),
    }
    table_io.commit(csv_path, data, meta)
    return csv_path


def table_files(name: str, *, reference: Path | None = None, local: Path | None = None
                ) -> list[tuple[str, Path]]:
    """(origin, path) of every stored copy of table ``name``: references first, then local.
    A copy is its CSV or its sidecar (a write interrupted before the CSV's rename)."""
    reference = reference if reference is not None else paths.reference_dir()
    local = local if local is not None else paths.local_dir()
    folders = sorted({p.parent for pattern in (f"*/{name}.csv", f"*/{name}{META_SUFFIX}")
                      for p in reference.glob(pattern)})
    found = [(f"reference/{f.name}", f / f"{name}.csv") for f in folders]
    if (local / f"{name}.csv").exists() or (local / f"{name}{META_SUFFIX}").exists():
        found.append(("local", local / f"{name}.csv"))
    return found


def _parse(path: Path, data: bytes, meta: dict[str, Any]) -> pd.DataFrame:
    """The CSV as a frame, by the sidecar's column types; by pandas' guess for a sidecar from
    before types were recorded (the shipped tables of the earlier phases)."""
    types = meta.get("column_types")
    try:
        typed = {} if types is None else read_options(types)
        # index_col=False: a row longer than the header is an error, not a shifted index
        return pd.read_csv(io.BytesIO(data), index_col=False, **typed)
    except ValueError as exc:  # bad column_types, pandas' parser errors, a bad value, bad UTF-8
        raise DamagedResultError(f"{path}: cannot be parsed as CSV ({exc})") from None


def _read_checked(path: Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The table and its sidecar, each column checked against the sidecar's list."""
    meta, data = table_io.read_pair(path)
    frame = _parse(path, data, meta)
    meta_cols = meta["columns"]
    for col in frame.columns:
        if col not in meta_cols:
            raise SchemaMismatchError(f"{path}: column {col!r} is not in its metadata's columns")
    for col in meta_cols:
        if col not in frame.columns:
            raise SchemaMismatchError(f"{path}: column {col!r} of its metadata is missing")
    rows = meta.get("rows")
    if rows is not None and rows != len(frame):
        raise DamagedResultError(f"{path}: {len(frame)} rows, its sidecar records {rows}")
    return frame, meta


def _today(name: str, frame: pd.DataFrame, meta: dict[str, Any]) -> pd.DataFrame:
    """A copy under today's columns: renamed (``RENAMED_COLUMNS``), added ones filled from its
    sidecar's config or missing (``ADDED_COLUMNS``), or with the value older rows had
    (``ADDED_VALUES``)."""
    frame = frame.rename(columns=RENAMED_COLUMNS.get(name, {}))
    config = meta.get("config") or {}
    for col in ADDED_COLUMNS.get(name, ()):
        if col not in frame:
            frame[col] = config.get(col, math.nan)
    for col, value in ADDED_VALUES.get(name, {}).items():
        if col not in frame:
            frame[col] = value
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
        frame = _today(name, *_read_checked(path))
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


def stored_tables(names: Iterable[str], *, origins: Iterable[str] | None = None,
                  problems: dict[str, str] | None = None) -> dict[str, pd.DataFrame]:
    """Each table of ``names`` that has a stored copy (of ``origins``, filtered by prefix as
    :func:`load_table` does), loaded by :func:`load_table`, by name; the others are left out.
    A copy that cannot be read raises; given ``problems``, its table is left out instead and
    the reason recorded there (``problems[name] = "unreadable: ..."``)."""
    wanted = None if origins is None else tuple(origins)
    out = {}
    for name in names:
        if not any(o.startswith("" if wanted is None else wanted) for o, _ in table_files(name)):
            continue
        try:
            out[name] = load_table(name, origins=wanted)
        except (SchemaMismatchError, ValueError, OSError) as exc:
            if problems is None:
                raise
            problems[name] = f"unreadable: {exc}"
    return out


def stamped(rows: Iterable[Any], **columns: Any) -> list[Any]:
    """``rows`` (dataclass instances) with the run's columns filled in: a field named in
    ``columns`` that still holds its placeholder (the field's default; NaN counts as equal to
    NaN) takes the value given, one stamped before (a table written again with rows added)
    keeps its own. A field without a default is no run column: TypeError."""
    out = []
    for row in rows:
        defaults = {f.name: f.default for f in dataclasses.fields(row)}
        fill = {}
        for name, value in columns.items():
            default, now = defaults[name], getattr(row, name)
            if default is dataclasses.MISSING:
                raise TypeError(f"{type(row).__name__}.{name} has no placeholder default: "
                                "it is no run column")
            if now == default or (now != now and default != default):
                fill[name] = value
        out.append(dataclasses.replace(row, **fill) if fill else row)
    return out


def origin_label(origin: str) -> str:
    """A row's :data:`ORIGIN` in words: 'reference/h200' -> 'H200 (shipped reference)',
    'reference/h200x2' -> '2× H200 (shipped reference)', 'local' -> 'this machine'."""
    if not origin.startswith("reference/"):
        return "this machine"
    name = origin.split("/", 1)[1]
    base, _, count = name.rpartition("x")  # '<device>x<N>': N GPUs of one host
    device = f"{count}× {base.upper()}" if base and count.isdecimal() else name.upper()
    return f"{device} (shipped reference)"
