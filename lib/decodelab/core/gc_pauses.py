"""Python's garbage-collector pauses during a block of host work, for a loop that times its
steps on the host clock (a serving loop): one full collection of a heap that holds a long
run's records stops the issuing thread for tens to hundreds of milliseconds, which a step's
wall time then shows as a step a hundred times its median.

    with GcPauses() as pauses:
        ...                                # the timed loop
    pauses.within(t_start, t_end)          # seconds the collector ran in that window

``with frozen_heap():`` is the servers' remedy (vLLM freezes the heap after its start-up):
one collection, then every object alive so far moves to the collector's permanent generation,
so later collections scan only what the loop allocates. On leaving, they move back: a frozen
object in a reference cycle is never freed (an engine and the model it holds, say, whose GPU
memory a later engine then cannot have).
"""

from __future__ import annotations

import bisect
import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Collect once, then exempt every object alive now from collections inside the block."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@dataclass
class GcPauses:
    """Each collection that ran while the block was open: its start and end on
    ``time.perf_counter`` and its generation (0-2)."""

    starts: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    generations: list[int] = field(default_factory=list)
    _open: float | None = None

    def _callback(self, phase: str, info: dict) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._open = now
        elif self._open is not None:
            self.starts.append(self._open)
            self.ends.append(now)
            self.generations.append(int(info.get("generation", -1)))
            self._open = None

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._callback)

    @property
    def count(self) -> int:
        return len(self.starts)

    @property
    def total_s(self) -> float:
        return sum(e - s for s, e in zip(self.starts, self.ends, strict=True))

    @property
    def longest_s(self) -> float:
        return max((e - s for s, e in zip(self.starts, self.ends, strict=True)), default=0.0)

    def within(self, t0: float, t1: float) -> float:
        """Seconds of collection that started in [t0, t1) (collections do not overlap and
        run on the thread that allocates, so each lies inside the step that started it)."""
        lo = bisect.bisect_left(self.starts, t0)
        hi = bisect.bisect_left(self.starts, t1)
        return sum(self.ends[i] - self.starts[i] for i in range(lo, hi))
