"""Soak: thousands of short requests with random arrivals, aborts and faults through the
engine on the exactly batch-invariant fake model (the real tiny Llama is exercised in
test_engine.py; the fake keeps this test to seconds). Nothing leaks, nothing is lost."""

from __future__ import annotations

import gc
import random

import pytest
from fake_runtime_model import FakeModel

from decodelab.engine.config import EngineConfig
from decodelab.engine.engine import Engine
from decodelab.engine.requests import Request, SamplingParams, Status

N_REQUESTS = 3000
POISON = 47


@pytest.mark.parametrize("budget", [4096, 16], ids=["whole", "chunked"])
def test_soak_no_leak_no_loss(budget):
    """Budget 16 (one token per row): bursts of prompts are prefilled in chunks, and aborts
    and preemption hit sequences in the middle of their prefill."""
    rng = random.Random(0)
    model = FakeModel(num_blocks=40, block_size=4, poison=POISON, poison_after=6)
    eng = Engine(model, EngineConfig(max_num_seqs=16, max_model_len=48, keep_steps=500,
                                     seed=3, max_num_batched_tokens=budget))
    prefill, split = model.prefill, []
    model.prefill = lambda ids, tables, starts: (split.append(any(starts)),
                                                 prefill(ids, tables, starts))[1]
    eng.metrics.requests = eng.metrics.requests.__class__(maxlen=500)
    handles = {}
    outcome_reasons = {}
    submitted = 0
    mem_mid = None
    while submitted < N_REQUESTS or eng.has_work:
        for _ in range(rng.choice([0, 0, 1, 2, 4])):  # bursty arrivals
            if submitted >= N_REQUESTS:
                break
            kind = rng.random()
            prompt = tuple(rng.randrange(1, 47) for _ in range(rng.randint(1, 5)))
            if kind < 0.05:
                prompt = (POISON, *prompt)
            params = SamplingParams(temperature=rng.choice([0.0, 0.8]), top_k=rng.choice([0, 5]),
                                    max_new_tokens=rng.randint(1, 10), seed=submitted)

            def cb(ev, raising=kind > 0.95):
                if raising and ev.index == 1:
                    raise RuntimeError("callback fault")
            h = eng.submit(Request(f"q{submitted}", prompt, params, on_token=cb))
            handles[h.request_id] = h
            submitted += 1
        if eng.active and rng.random() < 0.05:
            eng.abort(rng.choice(list(eng.active)))
        eng.step()
        for rid in [r for r, h in handles.items() if h.done]:
            h = handles.pop(rid)
            outcome_reasons[rid] = (h.status, h.finish_reason)
            assert h.finish_reason, f"{rid} ended without a reason"
        if submitted >= N_REQUESTS // 2 and mem_mid is None:
            gc.collect()
            mem_mid = len(gc.get_objects())
    gc.collect()
    mem_end = len(gc.get_objects())
    assert len(outcome_reasons) == N_REQUESTS and not handles
    statuses = {s for s, _ in outcome_reasons.values()}
    assert statuses == {Status.FINISHED, Status.ABORTED, Status.FAILED}
    assert eng.pool.num_free == eng.pool.num_total
    assert not (eng.active or eng.running or eng.waiting or eng.pending)
    assert sorted(eng.free_slots) == list(range(16))
    assert any(split) == (budget == 16)
    total = sum(eng.metrics.outcomes.values())
    assert total == N_REQUESTS
    # live Python objects do not grow with the number of requests served
    assert mem_end < mem_mid + 2_000, f"{mem_end - mem_mid} more live objects than mid-run"
