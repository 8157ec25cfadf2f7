"""Streaming to clients: token events, per-request handles (iterators), and stop checks."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from decodelab.engine.requests import Sequence, Status

if TYPE_CHECKING:
    from decodelab.engine.engine import Engine


class RequestError(RuntimeError):
    """Why one request (only) failed, recorded on it (``RequestHandle.exception``); the engine
    and the other requests go on. ``reason`` is the request's ``finish_reason``."""

    reason: ClassVar[str]


class CallbackError(RequestError):
    """A request's streaming callback raised (the client's exception is its ``__cause__``)."""

    reason = "callback_error"


class NonFiniteLogitsError(RequestError):
    """A request's logits held NaN or infinity when its next token was sampled."""

    reason = "non_finite_logits"


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One emitted token (``token`` set) or the end of a request (``finished``), or both."""

    request_id: str
    token: int | None
    index: int  # position of ``token`` in the output (or the output length at the end)
    finished: bool
    status: str  # running / finished / aborted / failed
    reason: str | None = None  # eos, stop, length, aborted, callback_error, non_finite_logits, ...
    error: str | None = None

    def plain(self) -> tuple:
        """The fields as an exact tuple of plain values, the form a handle keeps its events
        in until they are iterated: the garbage collector stops tracking such a tuple at its
        first pass, an event object it tracks for life. A server whose clients take tokens
        by callback alone never iterates, and its requests' events (one per token) would
        otherwise be tens of thousands of objects for every later collection to scan."""
        return (self.request_id, self.token, self.index, self.finished, self.status,
                self.reason, self.error)


def stop_reason(seq: Sequence, token: int, eos: int | None, max_model_len: int) -> str | None:
    """Why ``seq`` ends after ``token`` (already appended to its output), or None."""
    p, out = seq.params, seq.output
    if eos is not None and token == eos and not p.ignore_eos:
        return "eos"
    if token in p.stop_token_ids:
        return "stop"
    for s in p.stop_sequences:
        if len(out) >= len(s) and tuple(out[-len(s):]) == s:
            return "stop"
    if len(out) >= p.max_new_tokens or seq.num_prompt + len(out) >= max_model_len:
        return "length"
    return None


class Callbacks:
    """Runs requests' ``on_token`` callbacks and knows while one runs, so that the engine can
    refuse to be driven from inside one (a nested step would process later tokens before the
    rest of the current step's, reordering other requests' streams)."""

    def __init__(self) -> None:
        self.running: str | None = None  # the request whose callback runs now

    def run(self, seq: Sequence, event: TokenEvent) -> Exception | None:
        """Call ``seq``'s callback with ``event``; what it raised, or None."""
        outer, self.running = self.running, seq.request_id  # callbacks nest through abort()
        try:
            seq.request.on_token(event)
        except Exception as exc:  # noqa: BLE001 - the client's error, for the engine to record
            return exc
        finally:
            self.running = outer
        return None

    def refuse_reentry(self, how: str = "") -> None:
        """RuntimeError if a callback is running: a callback may submit() and abort(), never
        step the engine."""
        if self.running is not None:
            raise RuntimeError(f"Engine.step() called from inside a request callback (on_token "
                               f"of {self.running!r}){how}: a callback may submit() and "
                               "abort(), never drive the engine")


class RequestHandle:
    """The client's view of one request: its status, its tokens, and an iterator of events.

    Iterating drives the engine until this request's next event is available, so
    ``for ev in engine.submit(req): print(ev.token)`` streams one request while the engine
    serves all the others too. Iterating from inside a request callback is refused before
    any event is taken (the iterator drives ``Engine.step()``).
    """

    def __init__(self, seq: Sequence, engine: Engine) -> None:
        self._seq, self._engine = seq, engine

    @property
    def request_id(self) -> str:
        return self._seq.request_id

    @property
    def status(self) -> Status:
        return self._seq.status

    @property
    def done(self) -> bool:
        return self._seq.status.done

    @property
    def tokens(self) -> list[int]:
        return list(self._seq.output)

    @property
    def finish_reason(self) -> str | None:
        return self._seq.finish_reason

    @property
    def error(self) -> str | None:
        """``"ExceptionClass: message"`` of :attr:`exception`, or None."""
        return self._seq.error

    @property
    def exception(self) -> Exception | None:
        """What failed this request: a :class:`RequestError` (callback, non-finite logits) or
        the exception of a step that failed; None unless its status is failed."""
        return self._seq.failure

    @property
    def num_preemptions(self) -> int:
        return self._seq.num_preemptions

    def abort(self) -> bool:
        return self._engine.abort(self.request_id)

    def __iter__(self) -> Iterator[TokenEvent]:
        self._engine.callbacks.refuse_reentry(f", iterating RequestHandle({self.request_id!r})")
        events = self._seq.events
        while True:
            while events:
                ev = TokenEvent(*events.popleft())
                yield ev
                if ev.finished:
                    return
            if self.done:
                return
            self._engine.step()

    def __repr__(self) -> str:
        return (f"RequestHandle({self.request_id!r}, {self.status.value}, "
                f"{len(self._seq.output)} tokens, reason={self.finish_reason!r})")
