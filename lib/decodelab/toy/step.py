"""The toy decode step shared by phases 1-3: one definition, one seed.

A step over a batch of B hidden states x (B, H)::

    for l in range(L):  x = tanh(x @ W[l] + b[l])       # L "layers"
    logits = x @ W_out                                   # (B, V)
    token  = argmax(logits, -1)                          # greedy token per row
    x_next = 0.5 * (x + E[token])                        # data-dependent state update

The next state depends on the token, so steps chain and none can be skipped or hoisted.
The eager, graph, multi-step and persistent versions all compute this function on the weights
from :func:`make_weights`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from decodelab.core.validate import ConfigError, check_choice, check_int

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True, slots=True)
class ToyConfig:
    """Shape and precision of the toy step."""

    hidden: int
    layers: int
    batch: int
    vocab: int
    dtype: str = "float32"
    seed: int = 0

    def __post_init__(self) -> None:
        check_int("ToyConfig", "hidden", self.hidden, 1, 16384)
        check_int("ToyConfig", "layers", self.layers, 1, 64)
        check_int("ToyConfig", "batch", self.batch, 1, 4096)
        check_int("ToyConfig", "vocab", self.vocab, 2, 262144)
        check_choice("ToyConfig", "dtype", self.dtype, tuple(DTYPES))
        check_int("ToyConfig", "seed", self.seed, 0, 2**63 - 1)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def with_(self, **changes) -> ToyConfig:
        return replace(self, **changes)

    @property
    def flops_per_step(self) -> int:
        """Multiply-adds x2 of the layers and output projection."""
        return 2 * self.batch * self.hidden * (self.hidden * self.layers + self.vocab)

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights a step must read at least once."""
        n = self.layers * (self.hidden * self.hidden + self.hidden) + 2 * self.hidden * self.vocab
        return n * torch.finfo(self.torch_dtype).bits // 8


NAMED_CONFIGS: dict[str, ToyConfig] = {
    "ultra-light": ToyConfig(hidden=64, layers=4, batch=1, vocab=256),
    "h256": ToyConfig(hidden=256, layers=4, batch=1, vocab=256),
    "medium": ToyConfig(hidden=1024, layers=8, batch=8, vocab=1024),
    "heavy": ToyConfig(hidden=4096, layers=8, batch=32, vocab=4096),
}


def named(name: str) -> ToyConfig:
    if name not in NAMED_CONFIGS:
        raise ConfigError(f"unknown toy config {name!r}; allowed: {', '.join(NAMED_CONFIGS)}")
    return NAMED_CONFIGS[name]


@dataclass(frozen=True, slots=True)
class ToyWeights:
    w: torch.Tensor  # (L, H, H), used as x @ w[l]
    b: torch.Tensor  # (L, H)
    w_out: torch.Tensor  # (H, V)
    embed: torch.Tensor  # (V, H)

    @property
    def device(self) -> torch.device:
        return self.w.device


def make_weights(cfg: ToyConfig, device: torch.device | str = "cpu") -> ToyWeights:
    """Seeded weights, drawn on the CPU in fp32 so every device gets the same values.

    Scaled so that activations stay in tanh's sensitive range and logits are well separated.
    """
    g = torch.Generator().manual_seed(cfg.seed)
    h, n_layers, v = cfg.hidden, cfg.layers, cfg.vocab
    w = torch.randn(n_layers, h, h, generator=g) * (1.5 / h**0.5)
    b = torch.randn(n_layers, h, generator=g) * 0.1
    w_out = torch.randn(h, v, generator=g) * (1.0 / h**0.5)
    embed = torch.randn(v, h, generator=g)
    cast = lambda t: t.to(device=device, dtype=cfg.torch_dtype).contiguous()  # noqa: E731
    return ToyWeights(cast(w), cast(b), cast(w_out), cast(embed))


def initial_state(cfg: ToyConfig, device: torch.device | str = "cpu", seed: int | None = None
                  ) -> torch.Tensor:
    """A seeded starting state x0 (B, H); ``seed`` defaults to cfg.seed + 1."""
    g = torch.Generator().manual_seed(cfg.seed + 1 if seed is None else seed)
    x = torch.randn(cfg.batch, cfg.hidden, generator=g)
    return x.to(device=device, dtype=cfg.torch_dtype)


def step(weights: ToyWeights, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One eager step: returns (x_next (B, H), token (B,) int64). Allocates its outputs."""
    for layer in range(weights.w.shape[0]):
        x = torch.tanh(torch.addmm(weights.b[layer], x, weights.w[layer]))
    token = torch.argmax(x @ weights.w_out, dim=-1)
    return 0.5 * (x + weights.embed[token]), token


def logits_of(weights: ToyWeights, x: torch.Tensor) -> torch.Tensor:
    """The logits (B, V) a step computes from state x (for margin diagnostics)."""
    for layer in range(weights.w.shape[0]):
        x = torch.tanh(torch.addmm(weights.b[layer], x, weights.w[layer]))
    return x @ weights.w_out


@dataclass(frozen=True, slots=True)
class Trajectory:
    tokens: torch.Tensor  # (N, B) int64
    states: torch.Tensor  # (N, B, H): the state after each step


def run_eager(weights: ToyWeights, x0: torch.Tensor, n_steps: int) -> Trajectory:
    """The reference: ``n_steps`` chained eager steps from x0."""
    check_int("run_eager", "n_steps", n_steps, 1)
    tokens, states, x = [], [], x0
    for _ in range(n_steps):
        x, token = step(weights, x)
        tokens.append(token)
        states.append(x)
    return Trajectory(torch.stack(tokens), torch.stack(states))


def state_tolerance(reference: torch.Tensor, dtype: torch.dtype) -> float:
    """Absolute tolerance for comparing states, scaled to the reference's magnitude."""
    rel = 1e-4 if dtype == torch.float32 else 2e-2
    return rel * max(1.0, float(reference.abs().max()))
