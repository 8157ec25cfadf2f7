"""core.gc_pauses: the collector's pauses are recorded with their times, attributed to the
window they started in, and the recorder leaves gc.callbacks as it found them."""

from __future__ import annotations

import gc
import time
import weakref

import pytest

from decodelab.core.gc_pauses import GcPauses, frozen_heap


def test_collections_are_recorded_and_attributed_to_their_window():
    before, enabled = list(gc.callbacks), gc.isenabled()
    gc.disable()  # only the two collections below
    try:
        t0 = time.perf_counter()
        with GcPauses() as pauses:
            gc.collect(0)
            t_mid = time.perf_counter()
            gc.collect(2)
        t1 = time.perf_counter()
    finally:
        if enabled:
            gc.enable()
    assert gc.callbacks == before
    assert pauses.count == 2 and pauses.generations == [0, 2]
    assert t0 <= pauses.starts[0] <= pauses.ends[0] <= t_mid <= pauses.starts[1] <= t1
    assert pauses.total_s > 0.0 and pauses.longest_s <= pauses.total_s
    assert pauses.within(t0, t_mid) + pauses.within(t_mid, t1) == pytest.approx(pauses.total_s)
    assert pauses.within(t1, t1 + 1.0) == 0.0


class _Node:
    me: object = None


def test_frozen_objects_leave_the_collectors_view_inside_the_block_only():
    cycle = []
    cycle.append(cycle)  # reachable: alive after the freeze
    with frozen_heap():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
    garbage = _Node()
    garbage.me = garbage  # a cycle frozen in the block, unreachable after it
    alive = weakref.ref(garbage)
    with frozen_heap():
        del garbage
        gc.collect()
        assert alive() is not None  # frozen: not collected
    gc.collect()
    assert alive() is None
