"""One way to run a region under ``torch.profiler``, for every phase.

    events = profile_steps(fn, steps, cuda=True)   # torch EventList of the counted calls
    events.key_averages()                          # the same, one row per operation name

Which events count (device kernels, launch calls, top-level ATen ops, per-op host and device
time) is each caller's business; this module only decides how the window is recorded.

Profile after timing: once a process has profiled, CUPTI stays attached and slows every later
launch (pytorch/pytorch#144455), so a phase times first, profiles last (or in a fresh process).
"""

from __future__ import annotations

from collections.abc import Callable

from decodelab.core.timing import device_sync


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
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = (([ProfilerActivity.CPU] if cpu else [])
                  + ([ProfilerActivity.CUDA] if cuda else []))
    for _ in range(warmup):
        fn()
    if warmup and cuda:
        device_sync()
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
