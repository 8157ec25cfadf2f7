"""Result tables under real concurrent processes: a reader beside a writer, two writers on one
table, and a writer killed (SIGKILL) at any point of its commit. Every loop has a fixed count
and every child process a join timeout, so a regression fails in seconds instead of hanging."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from dataclasses import asdict, dataclass

import pytest

from decodelab.core import results

CTX = mp.get_context("fork")  # children start in milliseconds (spawn re-imports pandas)
JOIN_S = 60.0  # far above what each child needs (about a second); reached only on a hang


@dataclass(frozen=True)
class FakeInfo:
    label: str = "cpu"
    torch_version: str = "test"


@dataclass(frozen=True)
class Narrow:
    mode: str
    i: int


@dataclass(frozen=True)
class Wide:
    mode: str
    i: int
    extra: float


def _version(tag: str, i: int = 0) -> list:
    """Two shapes of one table: a mix of the two (new sidecar, old CSV) is never valid."""
    if tag == "a":
        return [Narrow("a", i)] * 3
    return [Wide(tag, i, 0.5)] * 5


def _write(folder, tag: str, i: int = 0) -> None:
    results.write_table("demo", _version(tag, i), out_dir=folder, info=FakeInfo())


def _records(folder) -> list[dict]:
    table = results.load_table("demo", reference=folder / "none", local=folder)
    return table.drop(columns=["origin", "device", "torch_version"]).to_dict("records")


def _expected(tag: str, i: int = 0) -> list[dict]:
    return [asdict(r) for r in _version(tag, i)]


def _writer(folder, tags: tuple[str, ...], n: int, queue) -> None:
    """Write the table ``n`` times, cycling through ``tags``; report the failures."""
    errors = []
    for i in range(n):
        try:
            _write(folder, tags[i % len(tags)], i)
        except Exception as exc:  # noqa: BLE001 - counted and reported to the test
            errors.append(f"{type(exc).__name__}: {exc}")
    queue.put(("writer", errors))


def _reader(folder, n: int, queue) -> None:
    """Load the table ``n`` times; each load must be one whole version, never a mix."""
    errors = []
    for _ in range(n):
        try:
            got = _records(folder)
        except Exception as exc:  # noqa: BLE001 - counted and reported to the test
            errors.append(f"{type(exc).__name__}: {exc}")
            continue
        if got != _expected(got[0]["mode"], got[0]["i"]):
            errors.append(f"mixed content: {got}")
    queue.put(("reader", errors))


def _run(*targets) -> dict[str, list[list[str]]]:
    """Start every (function, args) in its own process; their reports by kind."""
    queue = CTX.Queue()
    procs = [CTX.Process(target=fn, args=(*args, queue)) for fn, args in targets]
    for p in procs:
        p.start()
    reports: dict[str, list[list[str]]] = {}
    for _ in procs:
        kind, errors = queue.get(timeout=JOIN_S)
        reports.setdefault(kind, []).append(errors)
    for p in procs:
        p.join(timeout=JOIN_S)
        assert p.exitcode == 0, f"child {p.pid} exited with {p.exitcode}"
    return reports


def _files(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_reader_beside_a_writer_sees_one_whole_version_and_no_errors(tmp_path):
    """120 rewrites alternating two shapes, 300 loads at the same time: no write fails, no
    load fails or sees a mix (before the fix: FileNotFoundError on NAME.csv.new, false
    'damaged' errors)."""
    _write(tmp_path, "a")
    reports = _run((_writer, (tmp_path, ("a", "b"), 120)), (_reader, (tmp_path, 300)))
    assert reports["writer"] == [[]]
    assert reports["reader"] == [[]]
    assert _files(tmp_path) == ["demo.csv", "demo.meta.json"]


def test_two_writers_both_succeed_and_the_last_commit_wins(tmp_path):
    """Two processes rewrite one table 80 times each: none fails, and the table left is the
    last write of one of them, whole, with no temporary file beside it."""
    reports = _run((_writer, (tmp_path, ("b",), 80)), (_writer, (tmp_path, ("c",), 80)))
    assert reports["writer"] == [[], []]
    got = _records(tmp_path)
    assert got in (_expected("b", 79), _expected("c", 79))
    assert _files(tmp_path) == ["demo.csv", "demo.meta.json"]


def _kill_at(folder, nth: int) -> None:
    """Rewrite the table as version b and SIGKILL this process at its nth fsync or rename
    (this child's own ``os``: the test process is untouched)."""
    calls = []

    def dying(real):
        def call(*args):
            calls.append(args)
            if len(calls) == nth:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*args)
        return call

    os.fsync, os.replace = dying(os.fsync), dying(os.replace)
    _write(folder, "b")


@pytest.mark.parametrize("nth", range(1, 7))
def test_a_writer_killed_mid_commit_leaves_the_old_or_the_new_table(tmp_path, nth):
    """SIGKILL at each fsync and rename of a rewrite (6 of them): the old or the new version
    loads, the lock dies with the writer, and the next write leaves no temporary file."""
    _write(tmp_path, "a")
    proc = CTX.Process(target=_kill_at, args=(tmp_path, nth))
    proc.start()
    proc.join(timeout=JOIN_S)
    assert proc.exitcode == -signal.SIGKILL
    assert _records(tmp_path) in (_expected("a"), _expected("b"))
    assert [o for o, _ in results.table_files("demo", reference=tmp_path / "none",
                                              local=tmp_path)] == ["local"]
    _write(tmp_path, "c")
    assert _records(tmp_path) == _expected("c")
    assert _files(tmp_path) == ["demo.csv", "demo.meta.json"]


def _write_forever(folder, queue) -> None:
    queue.put("started")
    for i in range(100_000):  # bounded; the test kills it long before
        _write(folder, ("a", "b")[i % 2], i)


def test_a_writer_killed_at_random_times_never_leaves_a_damaged_table(tmp_path):
    """12 writers, each killed after a different delay in its write loop: every time the
    table loads as one whole version and a fresh write tidies what the dead one left."""
    _write(tmp_path, "a")
    for k in range(12):
        queue = CTX.Queue()
        proc = CTX.Process(target=_write_forever, args=(tmp_path, queue))
        proc.start()
        queue.get(timeout=JOIN_S)
        time.sleep(0.02 + 0.007 * k)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(timeout=JOIN_S)
        got = _records(tmp_path)
        assert got in (_expected("a", got[0]["i"]), _expected("b", got[0]["i"])), got
    _write(tmp_path, "c")
    assert _files(tmp_path) == ["demo.csv", "demo.meta.json"]
