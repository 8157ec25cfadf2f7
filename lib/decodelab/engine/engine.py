"""The execution loop: schedule -> prepare -> forward -> sample -> update -> emit -> retire.

One :meth:`Engine.step`:

1. the scheduler's plan is applied to the block pool (preempt, grow, admit): under a budget
   of ``max_num_batched_tokens`` per step, decode rows first, then prefill chunks;
2. the step's prefill chunks run in one varlen call, and a sequence whose last chunk this is
   samples its first token; running ones take one decode step and are sampled in one batched
   call. With graphs that is one input copy and three graph replays (stage, forward, sample:
   ``step_graphs``), and the chunks replay their token bucket's prefill graph where
   ``prefill_graphs`` are given (``model.prefill_graphs``); without, the same work eagerly;
3. sampled tokens are scattered into the per-slot ``last_token`` table on the device (the
   next step's inputs read it there) and copied asynchronously into pinned host memory, one
   int64 per row (-1: its logits were not finite);
4. the *previous* step's tokens are processed: its copy's event is waited on (by now it has
   long finished, the device is already running this step), then stop conditions are checked
   once for the whole batch, tokens streamed, and finished requests retired.

The host therefore never stalls the device to decide anything: it learns a token one step
after it was sampled, and a request that stops costs one extra (discarded) decode row.
Every exit (finished, aborted, failed, an error in the step itself) goes through
:meth:`Engine._retire`, which frees the request's blocks and slot exactly once and sets the
status before any callback sees the end: a request's stream ends with exactly one finished
event, whose status is its handle's (a finished request's last token, or an end event).

Steps 2 and 3 are issued by ``runner.ModelRunner``, timed on the device (``device_clock``);
the token copies and the queue of steps not yet processed are ``output.TokenOutput``.
"""

from __future__ import annotations

import time

import torch

from decodelab.core.validate import ConfigError
from decodelab.engine.config import EngineConfig
from decodelab.engine.device_clock import DeviceClock
from decodelab.engine.metrics import Metrics, PhaseClock, RequestRecord, StepRecord
from decodelab.engine.output import Pending, TokenOutput
from decodelab.engine.plan import SchedulePlan, advance, apply_plan
from decodelab.engine.protocols import ForwardGraphs, Prefill, RuntimeModel
from decodelab.engine.requests import (
    InvalidRequestError,
    Limits,
    Request,
    Sequence,
    Status,
    admit,
    check_arrival_time,
)
from decodelab.engine.runner import ModelRunner
from decodelab.engine.scheduler import Scheduler, SchedulerConfig
from decodelab.engine.stream import (
    CallbackError,
    Callbacks,
    NonFiniteLogitsError,
    RequestError,
    RequestHandle,
    TokenEvent,
    stop_reason,
)

# A request without a seed gets engine seed * SEED_STRIDE + its arrival number: a prime larger
# than any run's number of requests, so no two (engine seed, arrival) pairs share a seed.
SEED_STRIDE = 1_000_003


class Engine:
    """Continuous batching of ``model`` (see :class:`~decodelab.engine.protocols.RuntimeModel`),
    with ``graphs`` (:class:`~decodelab.engine.protocols.ForwardGraphs`) replayed for decode
    and ``prefill_graphs`` (:class:`~decodelab.engine.protocols.Prefill`, e.g.
    ``PrefillGraphs``) run for prefill chunks when ``config.use_graphs``."""

    def __init__(self, model: RuntimeModel, config: EngineConfig | None = None,
                 graphs: ForwardGraphs | None = None, prefill_graphs: Prefill | None = None
                 ) -> None:
        config = config if config is not None else EngineConfig()
        # a model without the attribute (a test's stand-in) makes no such promise
        if config.batch_invariant and not getattr(model, "batch_invariant", False):
            raise ConfigError("EngineConfig.batch_invariant=True: the model's logits depend on "
                              "the batch; build it with PagedLlama(..., batch_invariant=True) "
                              "(Triton on CUDA)")
        self.model, self.cfg = model, config
        cache = model.cache
        self.pool = cache.pool
        self.device = torch.device(model.device)
        self.vocab = model.config.vocab_size
        max_len = config.context_limit(self.vocab, cache.capacity_tokens,
                                       model.config.max_position_embeddings)
        self.scheduler = Scheduler(SchedulerConfig(
            cache.block_size, config.max_num_seqs, max_len, config.max_num_batched_tokens,
            config.chunked_prefill, config.steady_prefill_tokens))
        self.limits = Limits(self.vocab, max_len, config.eos_token_id)
        rows = config.max_num_seqs
        self.output = TokenOutput(rows, self.device)
        self.runner = ModelRunner(model, config, graphs,
                                  self.scheduler.config.blocks_needed(max_len), self.output,
                                  prefill_graphs)
        self.pending = self.output.pending
        self.free_slots = list(range(rows - 1, -1, -1))
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.active: dict[str, Sequence] = {}
        self.metrics = Metrics(config.keep_steps)
        self.device_clock = DeviceClock(self.device)
        self.callbacks = Callbacks()
        self._sync = (torch.cuda.synchronize if config.sync_phases and self.device.type == "cuda"
                      else None)
        self._arrivals = self._steps = 0
        self._t_last_step: float | None = None

    @property
    def logits_hook(self):
        """Fault injection for tests and demos: ``logits_hook(rows, logits)`` may edit a step's
        logits in place before sampling. None (the default) costs nothing."""
        return self.runner.logits_hook

    @logits_hook.setter
    def logits_hook(self, hook) -> None:
        self.runner.logits_hook = hook

    # ------------------------------------------------------------------ client side
    def submit(self, request: Request, *, arrival_time: float | None = None) -> RequestHandle:
        """Validate and queue a request (its prompt copied first: :func:`admit`); an
        InvalidRequestError leaves the engine untouched. ``arrival_time`` (a ``perf_counter``
        value, default now) is when the request arrived, the start of its time to first token."""
        try:
            request = admit(request, self.limits)
            t_arrival = (time.perf_counter() if arrival_time is None
                         else check_arrival_time(arrival_time))
            if request.request_id in self.active:
                raise InvalidRequestError(f"Request.request_id={request.request_id!r}: must be "
                                          "unique among active requests")
        except InvalidRequestError:
            self.metrics.error("invalid_request")
            raise
        p = request.params
        seed = p.seed if p.seed is not None else (self.cfg.seed * SEED_STRIDE + self._arrivals)
        seq = Sequence(request, arrival=self._arrivals, seed=seed, t_arrival=t_arrival)
        self._arrivals += 1
        self.waiting.append(seq)
        self.active[request.request_id] = seq
        return RequestHandle(seq, self)

    def abort(self, request_id: str) -> bool:
        """End a request now (its blocks are freed): True. False if it is unknown or has
        ended (a request ends with its final token, before that token's callback runs)."""
        seq = self.active.get(request_id)
        if seq is None:
            return False
        self._retire(seq, Status.ABORTED, "aborted")
        return True

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.pending)

    def run(self, max_steps: int | None = None) -> int:
        """Step until every request is done (or ``max_steps``); return the steps taken."""
        n = 0
        while self.has_work and (max_steps is None or n < max_steps):
            self.step()
            n += 1
        return n

    # ------------------------------------------------------------------ the loop
    @torch.inference_mode()
    def step(self) -> None:
        """One step of the loop (the module docstring). Refused with a RuntimeError inside a
        request callback (directly, through :meth:`run` or a handle's iterator): raised there,
        it fails that callback's request with callback_error unless the callback catches it;
        nothing of the engine or the other requests has changed."""
        self.callbacks.refuse_reentry()
        t_start = time.perf_counter()
        if self._t_last_step is not None and self.metrics.steps:
            self.metrics.steps[-1].wall = t_start - self._t_last_step
        self._t_last_step = t_start
        plan = self.scheduler.schedule(self.running, self.waiting, self.pool.num_free)
        self._apply(plan)
        n = len(plan.decode)
        rec = StepRecord(self._steps, n, self.runner.bucket(n) if n else 0, len(plan.prefill),
                         sum(c.tokens for c in plan.prefill))
        self._steps += 1
        clock = PhaseClock(rec, t_start, self._sync)
        clock.mark("schedule")
        queued = False
        if plan.decode or plan.prefill:
            queued = self._launch(clock, plan)
        elif not self.pending and (self.waiting or self.running):
            raise RuntimeError("scheduler stalled: requests wait, nothing runs or is pending")
        clock.restart()
        keep = 1 if (self.cfg.async_output and queued) else 0  # a step of chunks samples none
        while len(self.pending) > keep:
            self._process(*self.output.take(), rec)
        self.device_clock.settle()
        clock.mark("emit")
        self.metrics.steps.append(rec)

    def _apply(self, plan: SchedulePlan) -> None:
        apply_plan(plan, self.pool, self.running, self.waiting)
        batch = self.runner.batch
        for seq in plan.preempt:  # before admissions: their slots are free again
            self._release(seq)
        for seq in plan.admit:
            seq.slot = self.free_slots.pop()
            batch.assign(seq)
        for seq, n in [*plan.decode, *((c.seq, c.blocks) for c in plan.prefill)]:
            if n:  # the blocks just added (again, harmlessly, for an admitted sequence)
                batch.set_blocks(seq, len(seq.blocks) - n)

    def _launch(self, clock: PhaseClock, plan: SchedulePlan) -> bool:
        """Issue the plan's step, timed on the device; True if it queued tokens for the host."""
        buf, started = self.output.next_buffer(), self.device_clock.start()
        try:
            rows, cols = self.runner.launch(plan, clock.rec.bucket, buf, clock)
        except Exception as exc:  # noqa: BLE001 - a failed step fails its rows, not the engine
            for seq in [*(c.seq for c in plan.prefill), *(s for s, _ in plan.decode)]:
                self._retire(seq, Status.FAILED, "step_error", exc)
            return False
        advance(plan)
        if rows:
            self.output.launched(rows, cols, buf)
        self.device_clock.stop(clock.rec, started)
        clock.mark("update")
        return bool(rows)

    # ------------------------------------------------------------------ emit and retire
    def _process(self, pend: Pending, toks: list[int], waited: float, rec: StepRecord) -> None:
        rec.sync_wait += waited
        for seq, col in zip(pend.rows, pend.cols, strict=True):
            if seq.status.done:
                continue  # ended after this step was launched: its row is discarded
            if toks[col] < 0:
                self._fail(seq, NonFiniteLogitsError(
                    f"logits of token {len(seq.output)} were not finite"))
                continue
            self._accept(seq, toks[col])

    def _accept(self, seq: Sequence, token: int) -> None:
        now = time.perf_counter()
        seq.output.append(token)
        if seq.t_first_token is None:
            seq.t_first_token = now
        seq.t_last_token = now
        self.metrics.tokens_out += 1
        reason = stop_reason(seq, token, self.limits.eos_token_id, self.limits.max_model_len)
        if reason is not None:  # ended before its callback runs: an abort() from it is refused
            self._retire(seq, Status.FINISHED, reason, notify=False)
        self._deliver(seq, TokenEvent(seq.request_id, token, len(seq.output) - 1,
                                      reason is not None, seq.status.value, reason))

    def _deliver(self, seq: Sequence, event: TokenEvent) -> None:
        """Stream ``event`` to the iterator and the callback. A raising callback fails its
        request (only), which then ends with a failed event; one that raises once its request
        has ended changes nothing (its end event is out) and is counted."""
        seq.events.append(event.plain())
        exc = None if seq.request.on_token is None else self.callbacks.run(seq, event)
        if exc is None:
            return
        if seq.status.done:
            self.metrics.error("callback_error_at_end")
            return
        err = CallbackError(f"on_token raised {type(exc).__name__}: {exc}")
        err.__cause__ = exc
        self._fail(seq, err)

    def _release(self, seq: Sequence) -> None:
        """Give back blocks and slot (a preempted sequence keeps its output and waits)."""
        if seq.blocks:
            self.pool.free(seq.blocks)
            seq.blocks = []
        if seq.slot >= 0:
            self.free_slots.append(seq.slot)
            seq.slot = -1

    def _fail(self, seq: Sequence, err: RequestError) -> None:
        """End ``seq`` (only) with ``err`` recorded: its class names the reason."""
        self._retire(seq, Status.FAILED, err.reason, err)

    def _retire(self, seq: Sequence, status: Status, reason: str,
                failure: Exception | None = None, *, notify: bool = True) -> None:
        if seq.status.done:
            return
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        self._release(seq)
        self.active.pop(seq.request_id, None)
        error = None if failure is None else f"{type(failure).__name__}: {failure}"
        seq.status, seq.finish_reason, seq.error, seq.failure = status, reason, error, failure
        seq.t_done = time.perf_counter()
        self.metrics.outcomes[status.value] += 1
        if status is Status.FAILED:
            self.metrics.error(reason)
        self.metrics.requests.append(RequestRecord.of(seq))
        if notify:
            self._deliver(seq, TokenEvent(seq.request_id, None, len(seq.output), True,
                                          status.value, reason, error))
