"""CUDA-graph capture of the toy step over static buffers (phases 1 and 2).

Every per-step value lives in a static device tensor (the state ``x`` and the ``token``);
a captured graph of K chained steps reads ``x``, runs K steps, and leaves the new state in
``x`` and the K tokens in ``tokens``. Nothing is a Python value frozen at capture time, so
re-seeding ``x`` between replays changes what the replay computes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from decodelab.core.capture import capture, warm_up
from decodelab.core.validate import ConfigError, check_int
from decodelab.toy import step as toy


@dataclass(frozen=True, slots=True)
class StaticState:
    x: torch.Tensor  # (B, H) state read and written by every replay
    tokens: torch.Tensor  # (K, B) int64 tokens of the last replay's K steps

    @classmethod
    def like(cls, x0: torch.Tensor, k_steps: int) -> StaticState:
        tokens = torch.zeros(k_steps, x0.shape[0], dtype=torch.int64, device=x0.device)
        return cls(x0.clone(), tokens)


def run_steps_(weights: toy.ToyWeights, state: StaticState) -> None:
    """K chained eager steps in place on the static buffers (the captured body)."""
    x = state.x
    for k in range(state.tokens.shape[0]):
        x, token = toy.step(weights, x)
        state.tokens[k].copy_(token)
    state.x.copy_(x)


class CapturedSteps:
    """K toy steps captured as one CUDA graph; ``replay()`` advances the state by K steps."""

    def __init__(self, weights: toy.ToyWeights, x0: torch.Tensor, k_steps: int, *,
                 pool=None, warmup: int = 3) -> None:
        check_int("CapturedSteps", "k_steps", k_steps, 1, 4096)
        if weights.device.type != "cuda":
            raise ConfigError("CUDA-graph capture needs a CUDA GPU; the weights are on "
                              f"{weights.device}")
        self.weights = weights
        self.k_steps = k_steps
        self.state = StaticState.like(x0, k_steps)
        warm_up(lambda: run_steps_(weights, self.state), warmup)
        self.graph, _ = capture(lambda: run_steps_(weights, self.state), pool=pool)
        self.reset(x0)

    def reset(self, x: torch.Tensor) -> None:
        """Load a new state into the static buffer (takes effect at the next replay)."""
        self.state.x.copy_(x)

    def replay(self) -> None:
        self.graph.replay()
