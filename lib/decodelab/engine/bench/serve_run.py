"""One serving run of ``bench serve``: requests submitted open-loop at their arrival times by
the bench's own loop, which calls ``Engine.step`` and submits whatever has arrived.

What each step computed is observed, not changed: the model is wrapped so that each prefill
call's chunks (their lengths and cached starts) are seen, and the scheduler so that each plan's
decode rows (each row's context) are; both wrappers delegate everything else. Each request's
token callback stamps the host time of every token (the inter-token latencies). A step's wall
time runs from its start to the next step's start, or to the loop going idle (nothing left to
do until the next arrival).

During each run the heap is frozen (``core.gc_pauses.frozen_heap``: the earlier runs' records
and the model's objects leave the collector's view, as a server freezes its heap after start-up)
and every collection during the run is recorded, per step and in total: a step's wall time
includes any collection that started in it. So is every Triton kernel specialised during the
run (``core.jit_watch``: a cold shape), and each step's device time (the engine's device
clock).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import torch
from tqdm import tqdm

from decodelab.core.gc_pauses import GcPauses, frozen_heap
from decodelab.core.jit_watch import JitCompiles
from decodelab.core.timing import device_sync
from decodelab.engine.bench.serve_floor import Ceilings, StepFloor, StepWork, step_floor
from decodelab.engine.bench.serve_rows import RunTrace, StepTrace
from decodelab.engine.bench.serve_workload import ServeRequest
from decodelab.engine.config import EngineConfig
from decodelab.engine.engine import Engine
from decodelab.engine.metrics import StepRecord
from decodelab.engine.requests import Request, SamplingParams


class _WorkTap:
    """The work of the current step, accumulated by the two wrappers and taken after it."""

    def __init__(self) -> None:
        self.work = StepWork()

    def take(self) -> StepWork:
        work, self.work = self.work, StepWork()
        return work


class _ModelTap:
    """The served model (or its prefill graphs); each prefill call's chunks are added to the
    tap."""

    def __init__(self, model, tap: _WorkTap) -> None:
        self._model, self._tap = model, tap

    def __getattr__(self, name: str):
        return getattr(self._model, name)

    def prefill(self, token_ids, block_tables, *rest, **kw):
        starts = rest[0] if rest else kw.get("starts")
        lens = [len(t) for t in token_ids]
        self._tap.work += StepWork.chunks(lens, list(starts) if starts is not None
                                          else [0] * len(lens))
        return self._model.prefill(token_ids, block_tables, *rest, **kw)


class _PlanTap:
    """The engine's scheduler; each plan's decode rows (their contexts) are added to the tap."""

    def __init__(self, scheduler, tap: _WorkTap) -> None:
        self._scheduler, self._tap = scheduler, tap

    def __getattr__(self, name: str):
        return getattr(self._scheduler, name)

    def schedule(self, *args, **kw):
        plan = self._scheduler.schedule(*args, **kw)
        # a decode row writes position context_launched - 1 and attends every one before it
        self._tap.work += StepWork.decode([s.context_launched for s, _ in plan.decode])
        return plan


class ServeEngine:
    """An engine over ``model`` whose steps' work is observed (module docstring)."""

    def __init__(self, model, ecfg: EngineConfig, graphs, floor: Callable[[StepWork], StepFloor],
                 prefill_graphs=None) -> None:
        self.tap = _WorkTap()
        self.engine = Engine(_ModelTap(model, self.tap), ecfg, graphs,
                             prefill_graphs and _ModelTap(prefill_graphs, self.tap))
        self.engine.scheduler = _PlanTap(self.engine.scheduler, self.tap)
        self.floor = floor
        self.device = torch.device(model.device)

    def run(self, name: str, reqs: list[ServeRequest], temperature: float) -> RunTrace:
        """Serve ``reqs`` (arrival times relative to the run's start) until all have ended."""
        eng = self.engine
        times: list[list[float]] = [[] for _ in reqs]
        todo = [Request(f"{name}-{i}", r.prompt, SamplingParams(
            temperature=temperature, ignore_eos=True, max_new_tokens=r.output_len, seed=i),
            on_token=_stamp(times[i])) for i, r in enumerate(reqs)]
        ended_before, tokens_before = len(eng.metrics.requests), eng.metrics.tokens_out
        steps: list[tuple[StepWork, StepRecord, float, float]] = []  # (.., wall, gc s)
        bar = tqdm(total=sum(r.output_len for r in reqs), desc=f"serve {name}", unit="tok",
                   file=sys.stderr, mininterval=2.0, leave=False)
        device_sync(self.device)
        with frozen_heap(), GcPauses() as pauses, JitCompiles() as compiles:
            t0 = time.perf_counter()
            # (start, work, record) of the last step, its wall not yet known
            i, open_step = 0, None
            while i < len(reqs) or eng.has_work:
                now = time.perf_counter()
                while i < len(reqs) and t0 + reqs[i].arrival_s <= now:
                    eng.submit(todo[i], arrival_time=t0 + reqs[i].arrival_s)
                    i += 1
                if eng.has_work:
                    t_step = time.perf_counter()
                    if open_step is not None:
                        steps.append(self._close(open_step, t_step, pauses))
                    eng.step()
                    open_step = (t_step, self.tap.take(), eng.metrics.steps[-1])
                    bar.update(eng.metrics.tokens_out - tokens_before - bar.n)
                elif i < len(reqs):
                    if open_step is not None:
                        steps.append(self._close(open_step, time.perf_counter(), pauses))
                        open_step = None
                    time.sleep(max(0.0, t0 + reqs[i].arrival_s - time.perf_counter()))
            device_sync(self.device)
            t_end = time.perf_counter()
        eng.device_clock.settle(wait=True)
        if compiles.count:  # a cold shape: name its kernels, so a slow step can be traced
            print(f"[serve] {name}: Triton specialised {compiles.describe()} during the run",
                  flush=True)
        if open_step is not None:
            steps.append(self._close(open_step, t_end, pauses))
        bar.close()
        ended = list(eng.metrics.requests)[ended_before:]
        if len(ended) != len(reqs) or eng.pool.num_free != eng.pool.num_total:
            raise RuntimeError(f"serve run {name}: {len(ended)} of {len(reqs)} requests ended, "
                               f"{eng.pool.num_total - eng.pool.num_free} cache blocks still held")
        return RunTrace(tuple(ended), tuple(tuple(t) for t in times),
                        tuple(StepTrace(w, rec.bucket, wall, self.floor(w), gc_s,
                                        rec.issue, rec.sync_wait, rec.device)
                              for w, rec, wall, gc_s in steps),
                        t_end - t0, pauses.count, pauses.total_s, pauses.longest_s,
                        eng.cfg.max_num_batched_tokens, compiles.count)

    @staticmethod
    def _close(open_step, t_next: float, pauses: GcPauses
               ) -> tuple[StepWork, StepRecord, float, float]:
        start, work, rec = open_step
        if rec.batch != work.decode_rows:
            raise RuntimeError(f"serve: step {rec.step} decoded {rec.batch} rows, the plan "
                               f"observed {work.decode_rows}")
        return work, rec, t_next - start, pauses.within(start, t_next)


def _stamp(times: list[float]):
    def on_token(ev) -> None:
        if ev.token is not None:
            times.append(time.perf_counter())
    return on_token


def floor_of(mcfg, dtype_bytes: int, ceilings: Ceilings) -> Callable[[StepWork], StepFloor]:
    """The step floor function of one model, dtype and set of measured ceilings."""
    return lambda work: step_floor(mcfg, dtype_bytes, work, ceilings)
