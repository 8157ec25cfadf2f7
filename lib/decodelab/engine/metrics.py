"""What the engine measures about itself: a per-step breakdown, errors by class, request latency.

Phases of one step (host clock, seconds):

    schedule  the scheduler's plan and applying it to the block pool
    prepare   filling the step's inputs (pinned mirrors, one async copy each) and prefill inputs
    forward   issuing the model: prefill and the decode graph replay (or eager decode)
    sample    issuing the sampler, the last-token scatter and the penalty update
    update    starting the device->host copy of the tokens and recording its event
    emit      processing the previous step's tokens: stop checks, streaming, retiring
    sync_wait the part of ``emit`` spent blocked on the device (a synchronisation stall)

and ``device``, the device time of the step's own kernels (``device_clock``, CUDA events
around its launch): with async output the host wall of a step that issues a large prefill is
short, and the step after it waits for that prefill; ``device`` charges it to its own step.

With ``sync_phases`` the engine synchronises the device after every phase, so each phase
includes its device time (a diagnostic mode: the pipeline no longer overlaps).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from decodelab.engine.requests import Sequence

NAN = float("nan")
PHASES = ("schedule", "prepare", "forward", "sample", "update", "emit")  # in the order they run
PHASE_COLS = tuple(f"{p}_us" for p in PHASES)  # their columns (µs) in table runtime_steps


@dataclass(slots=True)
class StepRecord:
    step: int
    batch: int  # decode rows
    bucket: int  # decode rows after padding to the graph bucket (0: no decode this step)
    prefill_rows: int  # prefill chunks (whole prompts without chunked prefill)
    prefill_tokens: int  # their tokens (chunked: batch + this <= max_num_batched_tokens)
    # one field per PHASES entry, in that order (tests/test_table_rows.py holds them to it)
    schedule: float = 0.0
    prepare: float = 0.0
    forward: float = 0.0
    sample: float = 0.0
    update: float = 0.0
    emit: float = 0.0
    sync_wait: float = 0.0
    wall: float = 0.0  # host clock from the start of this step to the start of the next
    device: float = NAN  # the device time of the step's own work (device_clock; NaN on a CPU)

    @property
    def host(self) -> float:
        """Host time of the step outside the forward pass and outside stalls."""
        return sum(getattr(self, p) for p in PHASES if p != "forward") - self.sync_wait

    @property
    def issue(self) -> float:
        """Host time issuing the step: every phase before ``emit`` (the forward's too)."""
        return sum(getattr(self, p) for p in PHASES if p != "emit")


class PhaseClock:
    """Charges the host time since the previous mark to a phase of one step's record (after
    ``sync``, if given: the ``sync_phases`` diagnostic)."""

    __slots__ = ("rec", "sync", "t")

    def __init__(self, rec: StepRecord, t0: float, sync: Callable[[], None] | None) -> None:
        self.rec, self.t, self.sync = rec, t0, sync

    def mark(self, phase: str) -> None:
        if self.sync is not None:
            self.sync()
        t1 = time.perf_counter()
        setattr(self.rec, phase, getattr(self.rec, phase) + t1 - self.t)
        self.t = t1

    def restart(self) -> None:
        """The next phase starts now (the time since the last mark is charged to none)."""
        self.t = time.perf_counter()


@dataclass(frozen=True, slots=True)
class RequestRecord:
    request_id: str
    status: str
    finish_reason: str
    prompt_tokens: int
    output_tokens: int
    preemptions: int
    ttft_s: float  # arrival -> first token seen by the host (NaN if none)
    tpot_s: float  # (last token - first token) / (tokens - 1) (NaN under two tokens)
    e2e_s: float

    @classmethod
    def of(cls, seq: Sequence) -> RequestRecord:
        """The record of a request that has ended."""
        n = len(seq.output)
        first, last = seq.t_first_token, seq.t_last_token
        ttft = first - seq.t_arrival if first is not None else NAN
        tpot = ((last - first) / (n - 1) if n > 1 and first is not None and last is not None
                else NAN)
        return cls(seq.request_id, seq.status.value, seq.finish_reason or "", seq.num_prompt, n,
                   seq.num_preemptions, ttft, tpot, (seq.t_done or NAN) - seq.t_arrival)


class Metrics:
    """Per-step records (the last ``keep_steps``), per-request records, errors by class."""

    def __init__(self, keep_steps: int = 100_000, keep_requests: int = 100_000) -> None:
        self.steps: deque[StepRecord] = deque(maxlen=keep_steps)
        self.requests: deque[RequestRecord] = deque(maxlen=keep_requests)
        self.errors: Counter[str] = Counter()  # error class -> count
        self.outcomes: Counter[str] = Counter()  # finished / aborted / failed
        self.tokens_out = 0

    def error(self, kind: str) -> None:
        self.errors[kind] += 1
