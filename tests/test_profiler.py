"""core.profiler on the CPU: only the counted calls are in profile_steps' events; kernel times
per call from its averages; a call in a fresh process."""

from __future__ import annotations

import operator
import types

import torch

from decodelab.core.profiler import in_fresh_process, kernel_times, profile_steps


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


def test_kernel_times_are_per_call_slowest_first_without_host_only_entries():
    event = types.SimpleNamespace
    averages = [event(key="a", count=10, device_time_total=50.0),
                event(key="b", count=5, device_time_total=0.0),
                event(key="c", count=20, cuda_time_total=80.0)]
    assert kernel_times(averages, calls=5) == [("c", 4.0, 16.0), ("a", 2.0, 10.0)]


def test_a_call_in_a_fresh_process_returns_its_value():
    assert in_fresh_process(operator.add, 2, 3) == 5
