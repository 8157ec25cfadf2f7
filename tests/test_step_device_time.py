"""Each engine step's own device time (engine.device_clock) and the Triton compiles of a run
(core.jit_watch): what bench serve uses to tell a step's own cost from the step before's and
a cold shape from any other slow step."""

from __future__ import annotations

import math
import time
from types import SimpleNamespace

import pytest
import torch

from decodelab.core import jit_watch
from decodelab.core.jit_watch import JitCompiles
from decodelab.engine.bench.serve_floor import StepFloor, StepWork
from decodelab.engine.bench.serve_rows import StepTrace
from decodelab.engine.config import EngineConfig
from decodelab.engine.device_clock import DeviceClock
from decodelab.engine.engine import Engine
from decodelab.engine.metrics import StepRecord
from decodelab.engine.requests import Request, SamplingParams
from decodelab.model.config import named_config
from decodelab.model.kv_cache import PagedKVCache
from decodelab.model.llama import PagedLlama
from decodelab.model.weights import random_weights


def _engine(device: str) -> Engine:
    cfg = named_config("tiny")
    model = PagedLlama(cfg, random_weights(cfg, 0, device=device),
                       PagedKVCache(cfg, 64, 8, device=device))
    return Engine(model, EngineConfig(max_num_seqs=4, max_model_len=64, use_graphs=False))


def _serve(eng: Engine) -> list[StepRecord]:
    for i in range(3):
        eng.submit(Request(f"r{i}", tuple(range(1, 6 + 7 * i)),
                           SamplingParams(max_new_tokens=5)))
    eng.run()
    eng.device_clock.settle(wait=True)
    return list(eng.metrics.steps)


def test_on_a_cpu_the_clock_records_nothing_and_a_step_is_its_wall():
    steps = _serve(_engine("cpu"))
    assert steps and all(math.isnan(s.device) for s in steps)
    floor = StepFloor(1e-3, 0.0, 0.0, 0.0)
    trace = StepTrace(StepWork(), 0, 2e-3, floor, 0.0)
    assert trace.own_s == 2e-3  # no device time: the wall
    assert StepTrace(StepWork(), 0, 2e-3, floor, 0.0, device_s=5e-4).own_s == 5e-4


def test_a_disabled_clock_hands_out_no_events():
    clock = DeviceClock(torch.device("cpu"))
    rec = StepRecord(0, 1, 1, 0, 0)
    clock.stop(rec, clock.start())
    clock.settle(wait=True)
    assert math.isnan(rec.device)


@pytest.mark.gpu
def test_on_a_gpu_every_step_with_work_gets_its_own_device_time():
    """Every step that launched work has a device span; the spans of one stream's steps do not
    overlap (a step's end event comes before the next one's start), so together they fit in
    the run's time: no step is charged the one before's work. (A first launch's Triton compile
    lies inside its step's span: the device idles while the host compiles.)"""
    eng = _engine("cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    steps = _serve(eng)
    elapsed = time.perf_counter() - t0
    timed = [s for s in steps if s.batch or s.prefill_rows]
    assert timed and all(s.device > 0.0 for s in timed), [s.device for s in timed]
    assert sum(s.device for s in timed) <= elapsed
    assert not eng.device_clock._open  # every pair read back


def test_the_watch_counts_each_specialisation_and_chains_the_hook_before(monkeypatch):
    runtime = SimpleNamespace(jit_post_compile_hook=None)
    seen = []
    runtime.jit_post_compile_hook = lambda **kw: seen.append(kw["fn"].name)
    monkeypatch.setattr(jit_watch, "_runtime_knobs", lambda: runtime)
    before = runtime.jit_post_compile_hook
    with JitCompiles() as compiles:
        hook = runtime.jit_post_compile_hook
        assert hook is not before
        for name in ("_attn", "_attn", "_mm"):
            hook(key="k", repr="r", fn=SimpleNamespace(name=name), compile={},
                 is_manual_warmup=False, already_compiled=False)
    assert runtime.jit_post_compile_hook is before  # put back
    assert compiles.count == 3 and compiles.kernels == {"_attn": 2, "_mm": 1}
    assert compiles.describe() == "3 (_attn 2, _mm 1)"
    assert seen == ["_attn", "_attn", "_mm"]  # the hook before still saw every compile


def test_without_the_hook_the_watch_says_it_watched_nothing(monkeypatch):
    monkeypatch.setattr(jit_watch, "_runtime_knobs", lambda: None)
    with JitCompiles() as compiles:
        pass
    assert compiles.count is None and compiles.describe() == "not watched"


def test_triton_3_6_has_the_hook_the_watch_uses():
    pytest.importorskip("triton")
    assert jit_watch._runtime_knobs() is not None
    with JitCompiles() as compiles:
        pass
    assert compiles.count == 0 and compiles.describe() == "0"
