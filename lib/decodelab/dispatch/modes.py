"""One switch over the same toy step: ``make_step(weights, x0, mode)`` for every dispatch mode.

Each mode returns a :class:`Stepper`: calling it advances the state by one toy step; ``state()``
and ``token()`` read the current state (B, H) and the last greedy token (B,), ``reset(x)`` loads
a new state. What each mode includes per step:

- ``eager``: :func:`decodelab.toy.step.step` as plain PyTorch ops, one kernel launch per op.
- ``cuda_graph``: one step captured in a CUDA graph over static buffers
  (:class:`decodelab.toy.graphs.CapturedSteps` with k_steps=1); a step is one ``replay()``.
- ``compile``: ``torch.compile`` default mode (Inductor fusion, no graphs); the state is fed
  from one call's output to the next call's input.
- ``compile_graphs``: ``torch.compile(mode="reduce-overhead")`` (fusion plus CUDA graphs via
  CUDAGraph Trees), used as documented: ``torch.compiler.cudagraph_mark_step_begin()`` before
  each step; the state lives in a buffer marked static (``torch._dynamo.mark_static_address``)
  that the compiled step updates in place, so nothing is cloned or copied in the hot loop.

``setup_s`` is the one-time cost before steady state (capture, or compilation plus the
recording runs), measured with a device synchronisation on both sides.
"""

from __future__ import annotations

import time
from typing import Protocol

import torch

from decodelab.core.timing import device_sync
from decodelab.core.validate import ConfigError, check_choice
from decodelab.toy import step as toy
from decodelab.toy.graphs import CapturedSteps

MODES = ("eager", "cuda_graph", "compile", "compile_graphs")
GRAPH_MODES = ("cuda_graph", "compile_graphs")  # modes that need a CUDA device
# Calls that bring a compiled step to steady state: reduce-overhead warms up once eagerly,
# records the graph on the next call and replays from then on.
COMPILE_WARMUP_CALLS = 3


class Stepper(Protocol):
    mode: str
    setup_s: float

    def __call__(self) -> None: ...

    def reset(self, x: torch.Tensor) -> None: ...

    def state(self) -> torch.Tensor: ...

    def token(self) -> torch.Tensor: ...


class _HeldState:
    """Accessors of a step that holds its state ``_x`` and last token ``_token`` itself."""

    _x: torch.Tensor
    _token: torch.Tensor

    def state(self) -> torch.Tensor:
        return self._x

    def token(self) -> torch.Tensor:
        return self._token


class EagerStep(_HeldState):
    """The baseline: the toy step as plain PyTorch ops (allocates its outputs, no copies)."""

    mode = "eager"

    def __init__(self, weights: toy.ToyWeights, x0: torch.Tensor) -> None:
        self.weights = weights
        self.setup_s = 0.0
        self.reset(x0)

    def __call__(self) -> None:
        self._x, self._token = toy.step(self.weights, self._x)

    def reset(self, x: torch.Tensor) -> None:
        self._x = x.clone()
        self._token = torch.zeros(x.shape[0], dtype=torch.int64, device=x.device)


class GraphStep:
    """One toy step captured as a CUDA graph; every per-step value is a static device tensor."""

    mode = "cuda_graph"

    def __init__(self, weights: toy.ToyWeights, x0: torch.Tensor) -> None:
        device_sync(weights.device)
        t0 = time.perf_counter()
        self.captured = CapturedSteps(weights, x0, k_steps=1)
        device_sync(weights.device)
        self.setup_s = time.perf_counter() - t0

    def __call__(self) -> None:
        self.captured.replay()

    def reset(self, x: torch.Tensor) -> None:
        self.captured.reset(x)

    def state(self) -> torch.Tensor:
        return self.captured.state.x

    def token(self) -> torch.Tensor:
        return self.captured.state.tokens[0]


class CompiledStep(_HeldState):
    """The toy step through ``torch.compile``; ``graphs`` selects mode="reduce-overhead".

    ``compile`` feeds each call's output state to the next call. ``compile_graphs`` keeps the
    state in one static buffer that the compiled step updates in place (as the cuda_graph mode
    does): CUDAGraph Trees frees a step's outputs when the next step begins, so an output may
    not be fed back, and a buffer marked static is neither copied in nor re-recorded.
    """

    def __init__(self, weights: toy.ToyWeights, x0: torch.Tensor, *, graphs: bool) -> None:
        self.mode = "compile_graphs" if graphs else "compile"
        self._graphs = graphs
        # One compiled step at a time: every stepper compiles its body anew (the closure holds
        # other weights), so clear the caches rather than pile up recompiles of one code object;
        # setup_s is then a cold compile for every config and mode alike.
        torch.compiler.reset()
        if graphs:
            self._x = x0.clone()  # (B, H) the state buffer, at one address for the stepper's life
            # The weights and the state buffer never move: CUDAGraph Trees may then skip copying
            # them into static inputs before each replay, and may mutate the state in place.
            for t in (weights.w, weights.b, weights.w_out, weights.embed, self._x):
                torch._dynamo.mark_static_address(t, guard=False)

            def body(x: torch.Tensor) -> torch.Tensor:
                x_next, token = toy.step(weights, x)
                x.copy_(x_next)
                return token

            self._fn = torch.compile(body, mode="reduce-overhead", dynamic=False)
        else:
            def body(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                return toy.step(weights, x)  # weights are closed over: constant across calls

            self._fn = torch.compile(body, dynamic=False)
        device_sync(weights.device)
        t0 = time.perf_counter()
        self.reset(x0)
        for _ in range(COMPILE_WARMUP_CALLS):
            self()
        device_sync(weights.device)
        self.setup_s = time.perf_counter() - t0
        self.reset(x0)

    def __call__(self) -> None:
        if self._graphs:
            # Step boundary: the previous step's outputs (its token) may now be overwritten.
            torch.compiler.cudagraph_mark_step_begin()
            self._token = self._fn(self._x)
        else:
            self._x, self._token = self._fn(self._x)

    def reset(self, x: torch.Tensor) -> None:
        if self._graphs:
            self._x.copy_(x)
        else:
            self._x = x.clone()
        self._token = torch.zeros(x.shape[0], dtype=torch.int64, device=x.device)



def check_mode(mode: str, device: torch.device | str) -> None:
    """Raise ConfigError for an unknown mode or a graph mode without a CUDA device."""
    check_choice("dispatch", "mode", mode, MODES)
    if mode in GRAPH_MODES and torch.device(device).type != "cuda":
        raise ConfigError(f"dispatch mode {mode!r} needs CUDA (CUDA graphs); the weights are on "
                          f"{torch.device(device)}; use mode 'eager' or 'compile' on a CPU")


def make_step(weights: toy.ToyWeights, x0: torch.Tensor, mode: str) -> Stepper:
    """The toy step in dispatch ``mode``, starting from state ``x0`` (B, H)."""
    check_mode(mode, weights.device)
    if x0.device != weights.device or x0.dtype != weights.w.dtype:
        raise ConfigError(f"x0 is {x0.dtype} on {x0.device}; the weights are {weights.w.dtype} "
                          f"on {weights.device}")
    if mode == "eager":
        return EagerStep(weights, x0)
    if mode == "cuda_graph":
        return GraphStep(weights, x0)
    return CompiledStep(weights, x0, graphs=mode == "compile_graphs")
