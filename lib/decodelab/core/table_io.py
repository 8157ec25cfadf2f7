"""A result table's two files, committed as one: safe against a crash at any point and beside
other processes writing or reading the same table.

A table ``NAME`` is the pair ``NAME.csv`` + ``NAME.meta.json``; the sidecar records the CSV's
SHA-256, which binds the two. The protocol, the simplest we found that is truly safe:

* **One lock per folder.** A writer holds an exclusive ``flock`` on the folder for its whole
  write, a reader a shared one while it reads the pair. A reader therefore never sees a pair
  mid-commit (no retries, no false "damaged" errors), and two writers commit one after the
  other: both succeed and the last to take the lock wins. The kernel drops the lock of a
  process that dies, so a killed writer blocks no one. (``flock``: Linux and macOS.)
* **The sidecar's rename is the commit.** The writer puts the new CSV in a temporary file of its
  own (``.NAME.csv.<random>.tmp``, fsynced), renames the new sidecar into place (it names that
  file as ``pending_csv``), then renames the CSV into place. A kill -9 before the sidecar's
  rename leaves the old pair; after it, the new sidecar with its pending CSV, which a reader
  takes and puts in place.
* **No stray table.** Temporary files start with a dot and end in ``.tmp``, so no loader takes
  one for a table; those of a killed writer are removed by the next write of that table, after
  its commit (under the lock no other write runs, and the commit supersedes any pending CSV).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

META_SUFFIX = ".meta.json"
PENDING = "pending_csv"  # sidecar key: the committed CSV's temporary name until its rename


class DamagedResultError(ValueError):
    """A result file that does not match its sidecar, or a sidecar that cannot be read."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def meta_path(csv_path: Path) -> Path:
    return csv_path.with_name(csv_path.name.removesuffix(".csv") + META_SUFFIX)


@contextmanager
def locked(folder: Path, *, exclusive: bool) -> Iterator[None]:
    """Hold ``folder``'s lock: exclusive to write a table there, shared to read one."""
    fd = os.open(folder, os.O_RDONLY)  # a folder can be flock-ed like a file
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # drops the lock


def _write_temp(path: Path, data: bytes) -> Path:
    """``data`` fsynced in a new temporary file beside ``path``, named for it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` in one rename: readers see the old or the new file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _write_temp(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    """Make a rename durable (where the platform can open a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def commit(csv_path: Path, data: bytes, meta: dict[str, Any]) -> None:
    """Write the pair: ``data`` as ``csv_path`` and ``meta`` (which records ``data``'s hash)
    as its sidecar, under the folder's exclusive lock."""
    folder = csv_path.parent
    folder.mkdir(parents=True, exist_ok=True)
    with locked(folder, exclusive=True):
        pending = _write_temp(csv_path, data)
        try:
            sidecar = json.dumps({**meta, PENDING: pending.name}, indent=2).encode()
            atomic_write(meta_path(csv_path), sidecar)  # the commit
        except BaseException:
            pending.unlink(missing_ok=True)
            raise
        os.replace(pending, csv_path)
        _fsync_dir(folder)
        _remove_dead_temps(csv_path)


def _remove_dead_temps(csv_path: Path) -> None:
    """Delete the temporary files of killed writes of this table (call under the lock)."""
    name = re.escape(csv_path.name.removesuffix(".csv"))
    ours = re.compile(rf"\.{name}\.(csv|meta\.json)\.[^.]+\.tmp")  # mkstemp's part has no dot
    for path in csv_path.parent.iterdir():
        if ours.fullmatch(path.name):
            path.unlink(missing_ok=True)


def read_meta(csv_path: Path | str) -> dict[str, Any]:
    """The sidecar of ``csv_path``, checked to be a JSON object with a column list, of the
    table that ``csv_path`` names."""
    path = Path(csv_path)
    sidecar = meta_path(path)
    if not sidecar.exists():
        raise FileNotFoundError(f"{path}: metadata sidecar {sidecar.name} is missing")
    try:
        meta = json.loads(sidecar.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DamagedResultError(f"{sidecar}: not valid JSON ({exc}); the sidecar is damaged "
                                 "or was cut short") from None
    if not isinstance(meta, dict):
        raise DamagedResultError(f"{sidecar}: holds a {type(meta).__name__}, must be a JSON "
                                 "object")
    cols = meta.get("columns")
    if not isinstance(cols, list) or not all(isinstance(c, str) for c in cols):
        raise DamagedResultError(f"{sidecar}: 'columns' is {cols!r}, must be a list of column "
                                 "names")
    name = path.name.removesuffix(".csv")
    if meta.get("table", name) != name:  # an old sidecar without the key cannot be checked
        raise DamagedResultError(f"{sidecar}: records table {meta['table']!r}, but is stored as "
                                 f"table {name!r}: the pair of another table was copied or "
                                 "renamed here")
    return meta


def read_pair(csv_path: Path) -> tuple[dict[str, Any], bytes]:
    """The sidecar of ``csv_path`` and the CSV bytes it commits, read under the folder's
    shared lock; an interrupted commit's pending CSV is then put in place."""
    with locked(csv_path.parent, exclusive=False):
        meta = read_meta(csv_path)
        data, from_pending = _committed_csv(csv_path, meta)
    if from_pending:
        _finish_commit(csv_path)
    return meta, data


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _committed_csv(path: Path, meta: dict[str, Any]) -> tuple[bytes, bool]:
    """The CSV bytes the sidecar commits and whether they are still in the pending file.
    Checked against the recorded hash where there is one."""
    want, data = meta.get("sha256"), _read(path)
    if data is not None and (want is None or sha256(data) == want):  # None: a sidecar
        return data, False                                               # from before hashes
    pending = _read(path.with_name(meta[PENDING])) if PENDING in meta else None
    if want is not None and pending is not None and sha256(pending) == want:
        return pending, True
    if data is None:
        raise FileNotFoundError(f"{path}: missing (its sidecar exists)")
    raise DamagedResultError(f"{path}: its content does not match its sidecar (SHA-256 "
                             f"{sha256(data)[:12]}..., recorded {str(want)[:12]}...): the file "
                             "was changed, damaged or cut short")


def _finish_commit(csv_path: Path) -> None:
    """Rename the pending CSV of an interrupted commit into place, if it is still pending."""
    with locked(csv_path.parent, exclusive=True):
        meta = read_meta(csv_path)
        pending = csv_path.with_name(meta[PENDING])
        data = _read(pending)
        if data is None or sha256(data) != meta.get("sha256"):
            return  # another process finished it, or a newer write committed
        try:
            os.replace(pending, csv_path)
        except PermissionError:
            return  # a read-only folder: loading still reads the pending file
        _fsync_dir(csv_path.parent)
