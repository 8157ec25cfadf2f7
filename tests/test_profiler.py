"""core.profiler.profile_steps on the CPU: only the counted calls are in its events."""

from __future__ import annotations

import torch

from decodelab.core.profiler import profile_steps


def _mm_calls(events) -> int:
    return sum(1 for e in events if e.name == "aten::mm")


def test_warmup_calls_stay_out_of_the_window():
    a = torch.randn(16, 16)
    calls = []
    events = profile_steps(lambda: calls.append(torch.mm(a, a)), 3, cuda=False, warmup=2)
    assert len(calls) == 5 and _mm_calls(events) == 3
    (avg,) = [e for e in events.key_averages() if e.key == "aten::mm"]
    assert avg.count == 3


def test_discarded_calls_are_profiled_then_dropped_and_meet_runs_once_after_them():
    a = torch.randn(16, 16)
    calls, met = [], []
    events = profile_steps(lambda: calls.append(torch.mm(a, a)), 4, cuda=False, discard=2,
                           meet=lambda: met.append(len(calls)))
    assert len(calls) == 6 and met == [2] and _mm_calls(events) == 4
