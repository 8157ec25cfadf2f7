"""core.profiler.profile_steps keeps Kineto's trace markers (``USDT: ... profiler_start`` and
``profiler_stop``, one line each per trace on stderr) out of the terminal and the notebooks,
and passes every other line written to stderr meanwhile."""

from __future__ import annotations

import os
import threading

import torch

from decodelab.core.profiler import TRACE_MARKER, _forward, profile_steps

MARKERS = [b"USDT:2026-12-01 21:03:06 13498:13498 SyncActivityProfilerHandler.cpp:52] "
           b"profiler_start\n",
           b"USDT:2026-12-01 21:03:06 13498:13498 SyncActivityProfilerHandler.cpp:59] "
           b"profiler_stop\n"]


def test_the_filter_drops_exactly_the_markers():
    others = [b"STAGE:2026-12-01 21:03:22 1:1 SyncActivityProfilerHandler.cpp:51] Completed\n",
              b"ERROR: CUPTI could not be initialised\n", b"USDT: a line that is not a marker\n",
              b"a last line without its newline"]
    read_in, write_in = os.pipe()
    read_out, write_out = os.pipe()
    thread = threading.Thread(target=_forward, args=(read_in, write_out))
    thread.start()
    stream = [others[0], MARKERS[0], others[1], others[2], MARKERS[1], others[3]]
    data = b"".join(stream)
    for i in range(0, len(data), 7):  # in pieces that split lines, as a pipe may deliver them
        os.write(write_in, data[i:i + 7])
    os.close(write_in)
    thread.join(timeout=10)
    received = b""
    while chunk := os.read(read_out, 65536):
        received += chunk
    os.close(read_out)
    assert received == b"".join(others)
    assert all(TRACE_MARKER.match(m) for m in MARKERS)


def test_profile_steps_prints_no_marker_and_passes_other_lines(capfd):
    a = torch.randn(8, 8)

    def step():
        os.write(2, b"a line of our own\n")
        torch.mm(a, a)

    profile_steps(step, 2, cuda=False)
    profile_steps(step, 2, cuda=False, discard=1)
    err = capfd.readouterr().err
    assert "profiler_start" not in err and "profiler_stop" not in err
    assert err.count("a line of our own\n") == 5
    os.write(2, b"after\n")  # stderr is ours again
    assert capfd.readouterr().err == "after\n"
