"""Timing statistics and timers, checked exactly with fake clocks."""

import numpy as np
import pytest

from decodelab.core.timing import TimingConfig, auto_inner, bootstrap_ci, summarize, time_host


class FakeClock:
    """A clock that advances by a scripted amount each time ``tick`` is called."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_summarize_exact_quantiles():
    st = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert st.median == 3.0
    assert st.q1 == 2.0 and st.q3 == 4.0 and st.iqr == 2.0
    assert st.min == 1.0 and st.n == 5
    assert st.mean == pytest.approx(22.0)
    assert st.ci_low <= st.median <= st.ci_high


def test_summarize_rejects_empty_and_nonfinite():
    with pytest.raises(ValueError, match="at least one"):
        summarize([])
    with pytest.raises(ValueError, match="non-finite"):
        summarize([1.0, float("nan")])


def test_bootstrap_ci_is_deterministic_and_brackets_median():
    rng = np.random.default_rng(1)
    x = rng.normal(10.0, 1.0, size=200)
    lo, hi = bootstrap_ci(x, seed=3)
    assert (lo, hi) == bootstrap_ci(x, seed=3)
    assert lo < np.median(x) < hi
    assert hi - lo < 0.6  # ~2.5 sigma/sqrt(n) for the median of 200 normals


def test_bootstrap_ci_single_sample_and_bad_level():
    assert bootstrap_ci([5.0]) == (5.0, 5.0)
    with pytest.raises(ValueError, match="level"):
        bootstrap_ci([1.0, 2.0], level=1.5)


def test_time_host_with_fake_clocks_is_exact():
    wall, cpu = FakeClock(), FakeClock()
    calls = []

    def fn():
        calls.append(1)
        wall.now += 3e-6  # each call: 3 us of wall, 2 us of host CPU
        cpu.now += 2e-6

    def sync():
        wall.now += 10e-6  # the sync waits 10 us for the device

    cfg = TimingConfig(warmup=4, repeats=5, inner=10)
    t = time_host(fn, cfg, sync=sync, wall_clock=wall, cpu_clock=cpu)
    assert len(calls) == 4 + 5 * 10
    assert t.host == pytest.approx((2e-6,) * 5)
    assert t.wall == pytest.approx((3e-6 + 1e-6,) * 5)  # the sync's 10 us spread over 10 calls
    assert t.device is None
    assert t.wall_stats().median == pytest.approx(4e-6)


def test_time_host_before_each_runs_untimed_before_every_sample():
    wall, cpu = FakeClock(), FakeClock()
    events = []

    def fn():
        events.append("call")
        wall.now += 1e-6

    def before_each():
        events.append("before")
        wall.now += 1.0  # slow, but outside every sample
        cpu.now += 1.0

    t = time_host(fn, TimingConfig(warmup=1, repeats=3, inner=2), before_each=before_each,
                  wall_clock=wall, cpu_clock=cpu)
    assert events == ["call"] + ["before", "call", "call"] * 3
    assert t.wall == pytest.approx((1e-6,) * 3) and t.host == pytest.approx((0.0,) * 3)


@pytest.mark.parametrize("field,value", [("warmup", -1), ("repeats", 0), ("inner", 0),
                                         ("inner", 1.5), ("repeats", True)])
def test_timing_config_rejects_bad_values(field, value):
    kwargs = {"warmup": 1, "repeats": 1, "inner": 1, field: value}
    with pytest.raises(ValueError, match=field):
        TimingConfig(**kwargs)


def test_auto_inner_reaches_target():
    wall = FakeClock()

    def fn():
        wall.now += 1e-4

    assert auto_inner(fn, target_s=1e-3, wall_clock=wall) == 16


def test_stats_scaled():
    st = summarize([1.0, 2.0, 3.0]).scaled(1e6)
    assert st.median == 2e6 and st.n == 3


def test_cpu_threads_restores_the_thread_count():
    import torch

    from decodelab.core.timing import cpu_threads

    before = torch.get_num_threads()
    with cpu_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), cpu_threads(1):
        raise RuntimeError("inside")
    assert torch.get_num_threads() == before


@pytest.mark.gpu
def test_time_graph_replays_is_positive_and_scales_with_work():
    import torch

    from decodelab.core.timing import time_graph_replays

    x = torch.randn(4096, 4096, device="cuda")
    x @ x  # create the cuBLAS handle and workspace before capture
    torch.cuda.synchronize()
    graphs = []
    for n in (1, 4):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(n):
                x @ x
        graphs.append(g)
    one, four = (time_graph_replays(g, 5) for g in graphs)
    assert 0 < one < four
