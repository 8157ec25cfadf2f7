"""Request and sampling-parameter types, and their validation at admission.

A :class:`SamplingParams` checks what it can on its own (ranges that do not depend on the
model); :func:`validate_request` checks the rest against the model and the cache (token ids
inside the vocabulary, a prompt that can ever fit). Both raise :class:`InvalidRequestError`
(a ConfigError) naming the field and the allowed range, before anything enters a batch.

A :class:`Sequence` is the engine's mutable per-request state: token history, what has been
launched on the device but not yet seen by the host, how much of it is in the cache (chunked
prefill), blocks, slot, status and timings.
"""

from __future__ import annotations

import enum
import math
import numbers
import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from decodelab.core.validate import ConfigError, check_bool, check_float, check_int

MAX_SEED = 2**63 - 1
# A temperature below this is greedy (vLLM's rule). Host and device compare the float32 value
# with the float32 of this bound, so both sides agree on every temperature.
GREEDY_BELOW = 1e-5
_GREEDY_BELOW32 = struct.unpack("f", struct.pack("f", GREEDY_BELOW))[0]  # float32, widened
# Dividing a logit by the repetition penalty must stay finite in float32.
MIN_REPETITION_PENALTY = 0.01


class InvalidRequestError(ConfigError):
    """A request rejected at admission; nothing of it entered a batch."""


def _wrap(fn: Callable[[], None]) -> None:
    try:
        fn()
    except InvalidRequestError:
        raise
    except ConfigError as exc:
        raise InvalidRequestError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one request turns logits into tokens, and when it stops.

    ``temperature`` below ``GREEDY_BELOW`` (1e-5, 0 included) is greedy (exact argmax).
    ``top_k == 0`` and ``top_p == 1`` and ``min_p == 0`` switch those filters off. Penalties follow the usual conventions:
    ``repetition_penalty`` (divides positive / multiplies negative logits of every token seen
    in the prompt or the output), ``presence_penalty`` and ``frequency_penalty`` (subtracted
    once / once per occurrence for tokens of the output). ``seed=None`` lets the engine derive
    one from its own seed and the request's arrival number.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_new_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    stop_sequences: tuple[tuple[int, ...], ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        _wrap(self._check)

    def _check(self) -> None:
        own = "SamplingParams"
        check_float(own, "temperature", self.temperature, 0.0, 100.0)
        check_int(own, "top_k", self.top_k, 0)
        check_float(own, "top_p", self.top_p, 0.0, 1.0, low_open=True)
        check_float(own, "min_p", self.min_p, 0.0, 1.0)
        check_float(own, "repetition_penalty", self.repetition_penalty, MIN_REPETITION_PENALTY,
                    100.0)
        check_float(own, "presence_penalty", self.presence_penalty, -2.0, 2.0)
        check_float(own, "frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        if self.seed is not None:
            check_int(own, "seed", self.seed, 0, MAX_SEED)
        check_int(own, "max_new_tokens", self.max_new_tokens, 1)
        if not isinstance(self.stop_token_ids, tuple):
            raise ConfigError(f"{own}.stop_token_ids={self.stop_token_ids!r}: must be a tuple")
        if not isinstance(self.stop_sequences, tuple):
            raise ConfigError(f"{own}.stop_sequences={self.stop_sequences!r}: must be a tuple")
        for seq in self.stop_sequences:
            if not isinstance(seq, tuple) or not seq:
                raise ConfigError(f"{own}.stop_sequences[]={seq!r}: must be a non-empty tuple "
                                  "of token ids")
        check_bool(own, "ignore_eos", self.ignore_eos)

    @property
    def greedy(self) -> bool:
        return _float32(self.temperature) < _GREEDY_BELOW32

    @property
    def uses_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)


def _float32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def _token_id(tok: Any) -> bool:
    """A Python or NumPy integer (not a bool): ids sliced from arrays are welcome."""
    return isinstance(tok, numbers.Integral) and not isinstance(tok, bool)


@dataclass(frozen=True, slots=True)
class Request:
    """A prompt, its sampling parameters and an optional streaming callback."""

    request_id: str
    prompt: tuple[int, ...]
    params: SamplingParams = field(default_factory=SamplingParams)
    # on_token(event) gets each event the handle's iterator gets: one per token, the last one
    # marked finished, or an end event (token None) if the request is aborted or fails. If it
    # raises before the end, this request (only) fails with CallbackError.
    on_token: Callable[[Any], None] | None = None


@dataclass(frozen=True, slots=True)
class Limits:
    """What the model and the cache allow, for admission checks."""

    vocab_size: int
    max_model_len: int  # longest context (prompt + output) one sequence may reach
    eos_token_id: int | None = None


def validate_request(req: Request, limits: Limits) -> None:
    """Raise InvalidRequestError naming the first bad field; return None if admissible."""
    if not isinstance(req.request_id, str) or not req.request_id:
        raise InvalidRequestError(f"Request.request_id={req.request_id!r} "
                                  f"({type(req.request_id).__name__}): must be a non-empty str")
    own = f"Request[{req.request_id!r}]"
    if not isinstance(req.params, SamplingParams):
        raise InvalidRequestError(f"{own}.params={req.params!r}: must be a SamplingParams")
    if not isinstance(req.prompt, tuple | list) or len(req.prompt) == 0:
        raise InvalidRequestError(f"{own}.prompt: must be a non-empty sequence of token ids")
    v = limits.vocab_size

    def check_ids(name: str, ids: Any) -> None:
        for i, tok in enumerate(ids):
            if not _token_id(tok):
                raise InvalidRequestError(f"{own}.{name}[{i}]={tok!r} ({type(tok).__name__}): "
                                          f"must be an integer token id in [0, {v - 1}]")
            if not 0 <= tok < v:
                raise InvalidRequestError(f"{own}.{name}[{i}]={tok!r}: must be a token id "
                                          f"in [0, {v - 1}]")

    check_ids("prompt", req.prompt)
    check_ids("params.stop_token_ids", req.params.stop_token_ids)
    for j, seq in enumerate(req.params.stop_sequences):
        check_ids(f"params.stop_sequences[{j}]", seq)
    if req.params.top_k > v:
        raise InvalidRequestError(f"{own}.params.top_k={req.params.top_k}: must be in "
                                  f"[0, {v}] (0 = off)")
    # The prompt plus the first sampled token must fit in the context the cache can hold.
    if len(req.prompt) + 1 > limits.max_model_len:
        raise InvalidRequestError(f"{own}.prompt: length {len(req.prompt)} can never fit; "
                                  f"must be in [1, {limits.max_model_len - 1}] tokens")
    if req.on_token is not None and not callable(req.on_token):
        raise InvalidRequestError(f"{own}.on_token={req.on_token!r}: must be callable or None")


def admit(req: Request, limits: Limits) -> Request:
    """The request as the engine keeps it, validated: a list prompt copied into a tuple first,
    so that a client changing its list later cannot bypass :func:`validate_request`."""
    if isinstance(req.prompt, list):
        req = replace(req, prompt=tuple(req.prompt))
    validate_request(req, limits)
    return req


def check_arrival_time(value: Any) -> float:
    """``Engine.submit``'s ``arrival_time`` as a float, or InvalidRequestError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise InvalidRequestError(f"Engine.submit(arrival_time={value!r}) "
                                  f"({type(value).__name__}): must be a finite real number "
                                  "(a time.perf_counter() value; not a bool) or None (now)")
    return float(value)


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"
    FAILED = "failed"

    @property
    def done(self) -> bool:
        return self in (Status.FINISHED, Status.ABORTED, Status.FAILED)


@dataclass(slots=True, eq=False)  # identity: two sequences are never "equal"
class Sequence:
    """The engine's state for one admitted request (mutable; owned by the engine)."""

    request: Request
    arrival: int  # admission order: FCFS and "newest" for preemption
    seed: int
    status: Status = Status.WAITING
    output: list[int] = field(default_factory=list)  # tokens the host has seen
    launched: int = 0  # tokens whose sampling was issued on the device (>= len(output))
    # Tokens of all_tokens() (then of the launched ones) whose K/V the issued steps write into
    # the cache; prefill_len: those this admission prefills (prompt + output when admitted),
    # in chunks, before its first sample. Both 0 while waiting.
    num_computed: int = 0
    prefill_len: int = 0
    blocks: list[int] = field(default_factory=list)  # hold num_computed tokens (+ this step's)
    slot: int = -1  # row slot in the engine's per-slot device tables while running
    finish_reason: str | None = None  # "eos", "stop", "length", "aborted" or an error class
    error: str | None = None
    failure: Exception | None = None  # what failed it (stream.RequestError, a step's error)
    num_preemptions: int = 0
    t_arrival: float = 0.0
    t_first_token: float | None = None
    t_last_token: float | None = None
    t_done: float | None = None
    events: deque = field(default_factory=deque)  # not yet iterated, as TokenEvent.plain()

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    @property
    def num_prompt(self) -> int:
        return len(self.request.prompt)

    @property
    def num_tokens(self) -> int:
        """Tokens the host knows: prompt + output (what a recompute prefills)."""
        return self.num_prompt + len(self.output)

    @property
    def prefilling(self) -> bool:
        """Admitted, and part of the context of this admission not yet prefilled."""
        return self.num_computed < self.prefill_len

    @property
    def context_launched(self) -> int:
        """Tokens in context once every launched step has finished (prompt + launched)."""
        return self.num_prompt + self.launched

    def all_tokens(self) -> list[int]:
        return [*self.request.prompt, *self.output]
