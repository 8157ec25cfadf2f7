"""Sampled tokens on their way to the host: pinned buffers, one event per buffer, the queue.

Each launched step's tokens are copied asynchronously from the device into one of two pinned
buffers, which alternate: decode rows in columns ``0 .. rows-1``, prefill rows from column
``rows`` on (one int64 per row; -1: its logits were not finite). The buffer's event is
recorded after the copy; the host processes a step's tokens later (:meth:`take`), waiting on
that event only, never on the whole device. With async output the engine takes step t's tokens
after step t+1 has been launched, so the buffer step t+1 writes is not the one it reads.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import torch

from decodelab.engine.requests import Sequence


@dataclass(slots=True)
class Pending:
    """A launched step whose tokens the host has not processed yet."""

    rows: list[Sequence]
    cols: list[int]  # column of each row in the pinned output buffer
    buf: int
    event: torch.cuda.Event | None


class TokenOutput:
    def __init__(self, rows: int, device: torch.device) -> None:
        pin = device.type == "cuda"
        self.prefill_col = rows  # first column of prefill rows
        # (2 buffers, decode columns then prefill columns): tokens, -1 = non-finite logits
        self.tokens = torch.zeros(2, 2 * rows, dtype=torch.int64, pin_memory=pin)
        self._flip = 0
        # one reusable event per buffer: it marks when that buffer's copy has landed
        self._events = [torch.cuda.Event() for _ in range(2)] if pin else [None, None]
        self.pending: deque[Pending] = deque()

    def next_buffer(self) -> int:
        """The buffer the next launched step writes."""
        buf = self._flip
        self._flip ^= 1
        return buf

    def copy(self, out: torch.Tensor, buf: int, lo: int, n: int) -> None:
        """Start copying the first ``n`` tokens of ``out`` into columns ``lo .. lo+n-1``."""
        self.tokens[buf, lo:lo + n].copy_(out[:n], non_blocking=True)

    def launched(self, rows: list[Sequence], cols: list[int], buf: int) -> None:
        """Queue a step whose copies into ``buf`` have all been issued."""
        event = self._events[buf]
        if event is not None:
            event.record()
        self.pending.append(Pending(rows, cols, buf, event))

    def take(self) -> tuple[Pending, list[int], float]:
        """The oldest pending step, its buffer's tokens, and the seconds spent waiting for
        its copy to land (a synchronisation stall)."""
        pend = self.pending.popleft()
        waited = 0.0
        if pend.event is not None:
            t0 = time.perf_counter()
            pend.event.synchronize()
            waited = time.perf_counter() - t0
        return pend, self.tokens[pend.buf].tolist(), waited
