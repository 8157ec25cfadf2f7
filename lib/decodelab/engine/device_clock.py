"""Each step's own device time, from two CUDA events around its launch.

With async output a step's host wall time is not its device time: the host learns a step's
tokens one step later, so a step that issues a large prefill returns at once and the step after
it waits for that prefill. A timing event recorded before a step's first kernel and one after
its last span exactly the device time the step occupied (idle gaps inside it included, none
of the step before), and reading them needs no synchronisation once a later event has landed.
Events are reused: a step's pair goes back to the spare list when it has been read.
"""

from __future__ import annotations

from collections import deque

import torch

from decodelab.engine.metrics import StepRecord


class DeviceClock:
    """``start()`` before a step's launch, ``stop(rec, start)`` after it; ``settle()`` writes
    ``rec.device`` (seconds) for every step whose events have landed. On a CPU it does nothing
    and ``rec.device`` stays NaN."""

    def __init__(self, device: torch.device) -> None:
        self.enabled = device.type == "cuda"
        self._open: deque[tuple[StepRecord, torch.cuda.Event, torch.cuda.Event]] = deque()
        self._spare: list[torch.cuda.Event] = []

    def _event(self) -> torch.cuda.Event:
        return self._spare.pop() if self._spare else torch.cuda.Event(enable_timing=True)

    def start(self) -> torch.cuda.Event | None:
        if not self.enabled:
            return None
        event = self._event()
        event.record()
        return event

    def stop(self, rec: StepRecord, start: torch.cuda.Event | None) -> None:
        if start is None:
            return
        end = self._event()
        end.record()
        self._open.append((rec, start, end))

    def settle(self, wait: bool = False) -> None:
        """Read every step whose end event has landed, oldest first (``wait``: all of them,
        waiting for the device)."""
        while self._open and (wait or self._open[0][2].query()):
            rec, start, end = self._open.popleft()
            end.synchronize()
            rec.device = start.elapsed_time(end) * 1e-3
            self._spare += (start, end)
