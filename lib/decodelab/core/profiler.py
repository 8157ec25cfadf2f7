"""One way to run a region under ``torch.profiler``, for every phase.

    events = profile_steps(fn, steps, cuda=True)   # torch EventList of the counted calls
    events.key_averages()                          # the same, one row per operation name

Which events count (device kernels, launch calls, top-level ATen ops, per-op host and device
time) is each caller's business; this module only decides how the window is recorded.

Profile after timing: once a process has profiled, CUPTI stays attached and slows every later
launch (pytorch/pytorch#144455), so a phase times first, profiles last (or in a fresh process).

Kineto marks the start and the stop of each trace with a line on stderr (file descriptor 2,
``USDT:<time> <pid>:<tid> SyncActivityProfilerHandler.cpp:52] profiler_start``, and
``profiler_stop``), logged at a severity above ERROR: ``KINETO_LOG_LEVEL`` cannot hide them
without hiding Kineto's errors. While it profiles, ``profile_steps`` sends fd 2 through a pipe
that drops exactly those two lines and passes every other byte on as it comes.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from decodelab.core.timing import device_sync

# Kineto's trace markers, e.g. b"USDT:2026-12-01 21:03:06 13498:13498 Sync...cpp:52] profiler_start"
TRACE_MARKER = re.compile(rb"^USDT:[^\n]*\] profiler_(?:start|stop)\r?\n?$")


def _forward(read_fd: int, write_fd: int) -> None:
    """Copy lines from ``read_fd`` to ``write_fd`` until end of file, less the trace markers;
    then close both."""
    pending = b""
    try:
        while chunk := os.read(read_fd, 65536):
            *lines, pending = (pending + chunk).split(b"\n")
            kept = b"".join(line + b"\n" for line in lines if not TRACE_MARKER.match(line))
            if kept:
                os.write(write_fd, kept)
        if pending and not TRACE_MARKER.match(pending):
            os.write(write_fd, pending)
    finally:
        os.close(read_fd)
        os.close(write_fd)


@contextmanager
def _without_trace_markers() -> Iterator[None]:
    """fd 2 through a filtering pipe for the duration (unchanged where fd 2 is not open)."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    read_fd, write_fd = os.pipe()
    forwarder = threading.Thread(target=_forward, args=(read_fd, os.dup(saved)), daemon=True,
                                 name="profiler-stderr")
    forwarder.start()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    try:
        yield
    finally:
        os.dup2(saved, 2)  # closes the pipe's last write end here: the forwarder ends
        os.close(saved)
        # A process started meanwhile (e.g. a compile worker) may hold the pipe still: the
        # forwarder then keeps passing its lines on, and the profile returns all the same.
        forwarder.join(timeout=5)


def profile_steps(fn: Callable[[], object], steps: int, *, cuda: bool, cpu: bool = True,
                  warmup: int = 0, discard: int = 0, meet: Callable[[], object] | None = None):
    """The profiler's events of ``steps`` calls of ``fn``.

    - ``cuda``: record device activity (kernels, copies, memsets) and synchronise after the
      calls, so every kernel they launched lies inside the window;
    - ``cpu``: record host operators and API calls (ATen ops, kernel and graph launches);
    - ``warmup``: calls before the profiler starts (then a sync on ``cuda``);
    - ``discard``: calls recorded once the profiler runs, then thrown away (its schedule's
      warm-up: its start-up cost stays out of the counted calls); after them a sync on ``cuda``,
      then ``meet()`` (e.g. a barrier of all ranks, so that the counted calls start together).
    """
    from torch.profiler import ProfilerActivity

    activities = (([ProfilerActivity.CPU] if cpu else [])
                  + ([ProfilerActivity.CUDA] if cuda else []))
    for _ in range(warmup):
        fn()
    if warmup and cuda:
        device_sync()
    with _without_trace_markers():
        return _record(fn, steps, activities, cuda, discard, meet)


def _record(fn, steps: int, activities: list, cuda: bool, discard: int, meet):
    from torch.profiler import profile, schedule

    if not discard:
        with profile(activities=activities) as prof:
            for _ in range(steps):
                fn()
            if cuda:
                device_sync()
        return prof.events()
    kept: list = []  # the counted calls' events, handed over when the schedule's cycle ends
    with profile(activities=activities, schedule=schedule(wait=0, warmup=discard, active=steps),
                 on_trace_ready=lambda p: kept.append(p.events())) as prof:
        for i in range(discard + steps):
            fn()
            if i == discard - 1:  # still inside the discarded calls
                if cuda:
                    device_sync()
                if meet is not None:
                    meet()
            prof.step()
        if cuda:
            device_sync()
    return kept[-1]


def kernel_times(averages, calls: int) -> list[tuple[str, float, float]]:
    """(name, launches per call, device µs per call) of each operation in the profiler's
    ``key_averages()`` over ``calls`` calls that took device time, the slowest first."""
    times = [(e.key, e.count / calls,
              (getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0))
              / calls) for e in averages]
    return sorted((t for t in times if t[2] > 0), key=lambda t: -t[2])


def in_fresh_process(fn: Callable, *args):
    """``fn(*args)`` in a spawned process (CUDA does not survive a fork): a profiler attached
    there (CUPTI stays attached) slows no launch of this process."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn, args)
