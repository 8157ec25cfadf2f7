"""The Poisson workload of ``bench runtime`` (tables ``runtime_requests`` and
``runtime_errors``): requests arriving at random, about one in ten failing in each way."""

from __future__ import annotations

import contextlib
import random
import time

import torch

from decodelab.core.timing import device_sync
from decodelab.engine.bench.rows import ErrorRow, RequestRow
from decodelab.engine.bench.step_timing import MIXED
from decodelab.engine.config import EngineConfig
from decodelab.engine.engine import Engine
from decodelab.engine.requests import InvalidRequestError, Request, SamplingParams


def _faults(eng: Engine, i: int):
    """Every tenth request fails in one way: its callback raises (3), it is aborted (6), its
    logits turn non-finite (8). The others must not notice."""
    rid = f"w{i}"
    if i % 10 == 3:
        def raising(ev):
            if ev.index == 4:
                raise ConnectionError("client disconnected")
        return raising
    if i % 10 == 6:
        def aborting(ev):
            if ev.index == 3:
                eng.abort(rid)
        return aborting
    return None


def _poison(rows, logits) -> None:
    for r, seq in enumerate(rows):
        if seq.arrival % 10 == 8 and seq.launched >= 2:
            logits[r].fill_(float("nan"))


def poisson_workload(model, graphs, base: EngineConfig, cfg
                     ) -> tuple[list[RequestRow], list[ErrorRow]]:
    """Requests arriving as a Poisson process, ~10% failing in each error class, plus two
    malformed ones. Returns (per-request rows: TTFT/TPOT, status, reason, overall throughput;
    outcome and error counts by class)."""
    rng = random.Random(3)
    vocab, dev = model.config.vocab_size, torch.device(model.device)
    eng = Engine(model, base, graphs)
    eng.logits_hook = _poison
    t, arrivals, reqs = 0.0, [], []
    for i in range(cfg.workload_requests):
        t += rng.expovariate(cfg.workload_rate)
        arrivals.append(t)
        params = dict(temperature=0.0) if i % 5 == 0 else MIXED[i % len(MIXED)]
        reqs.append(Request(f"w{i}", tuple(rng.randrange(vocab) for _ in range(
            rng.randint(*cfg.workload_prompt))), SamplingParams(
                **params, seed=i, ignore_eos=True,
                max_new_tokens=rng.randint(*cfg.workload_output)), on_token=_faults(eng, i)))
    for bad in (Request("bad0", ()), Request("bad1", (vocab,))):
        with contextlib.suppress(InvalidRequestError):  # counted by the engine's metrics
            eng.submit(bad)
    i, t0 = 0, time.perf_counter()
    while i < len(reqs) or eng.has_work:
        now = time.perf_counter() - t0
        while i < len(reqs) and arrivals[i] <= now:
            eng.submit(reqs[i], arrival_time=t0 + arrivals[i])
            i += 1
        if eng.has_work:
            eng.step()
        elif i < len(reqs):
            time.sleep(max(0.0, arrivals[i] - now))
    device_sync(dev)
    duration = time.perf_counter() - t0
    if eng.pool.num_free != eng.pool.num_total:
        raise RuntimeError("the workload leaked cache blocks")
    throughput = eng.metrics.tokens_out / duration
    requests = [RequestRow.of(r, cfg.workload_rate, duration, throughput)
                for r in eng.metrics.requests]
    counts = [ErrorRow("error", k, v) for k, v in sorted(eng.metrics.errors.items())]
    counts += [ErrorRow("outcome", k, v) for k, v in sorted(eng.metrics.outcomes.items())]
    return requests, counts
