"""The floor of one engine step from the work it did, and of a run as the sum over its steps.

A step's work (:class:`StepWork`): decode rows, each attending its context (its new token
included), and prefill chunks, each of n new tokens after ``start`` positions already cached
(a whole prompt: start 0). From the model's shape (:class:`~decodelab.model.config.ModelConfig`):

    weight bytes   every weight read once (the head; the embedding table too where it is the
                   tied head), plus one embedding row per token  (``ModelConfig.num_parameters``)
    linear FLOPs   2 x (layer matmul weights) x tokens + 2 x vocab x hidden x logit rows
                   (the head runs at each decode row and at each chunk's last position only)
    K/V bytes      ``kv_bytes_per_token`` x (each decode row's context + each chunk's start + n):
                   the cached K/V read once, the new K/V written once
    attention      4 x layers x heads x head_dim x (query, key) pairs (QK^T and PV, one
    FLOPs          multiply-add each): a decode row's context; a chunk's n x start + n(n+1)/2

    floor = max(weight bytes / bandwidth, linear FLOPs / matmul rate)
          + max(K/V bytes / bandwidth, attention FLOPs / matmul rate)

Each term is the time no kernel can beat on the measured ceilings (:class:`Ceilings`); the two
parts add because a layer's attention needs the q, k, v its matmuls make and its next matmul
needs the attention's output (the layer-serial order every step here runs). A decode step is
read-bound (weights, then K/V); a prefill step is FLOP-bound: its floor is its FLOPs at the
matmul rate, taken as the rate attention could reach too. Imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from decodelab.core.validate import check_choice, check_float
from decodelab.model.config import ModelConfig

BANDWIDTHS = ("read", "copy")  # which measured bandwidth the floor uses (the higher one)


@dataclass(frozen=True, slots=True)
class StepWork:
    """What one step computed. ``prefill_cached``: positions already cached before the
    chunks, summed; ``prefill_pairs``: (query, key) pairs of the chunks' causal attention."""

    decode_rows: int = 0
    decode_context: int = 0
    prefill_rows: int = 0
    prefill_tokens: int = 0
    prefill_cached: int = 0
    prefill_pairs: int = 0

    @classmethod
    def decode(cls, contexts: list[int]) -> StepWork:
        return cls(decode_rows=len(contexts), decode_context=sum(contexts))

    @classmethod
    def chunks(cls, lens: list[int], starts: list[int]) -> StepWork:
        return cls(prefill_rows=len(lens), prefill_tokens=sum(lens), prefill_cached=sum(starts),
                   prefill_pairs=sum(n * s + n * (n + 1) // 2
                                     for n, s in zip(lens, starts, strict=True)))

    def __add__(self, other: StepWork) -> StepWork:
        return StepWork(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    @property
    def kind(self) -> str:
        """decode, prefill, mixed (both in one step), or emit (no forward: tokens processed)."""
        if self.decode_rows and self.prefill_rows:
            return "mixed"
        return "decode" if self.decode_rows else "prefill" if self.prefill_rows else "emit"

    @property
    def tokens(self) -> int:
        """Tokens through the layers."""
        return self.decode_rows + self.prefill_tokens

    @property
    def logit_rows(self) -> int:
        return self.decode_rows + self.prefill_rows

    @property
    def kv_tokens(self) -> int:
        return self.decode_context + self.prefill_cached + self.prefill_tokens

    @property
    def attention_pairs(self) -> int:
        return self.decode_context + self.prefill_pairs


def layer_matmul_params(cfg: ModelConfig) -> int:
    """Weights of every layer's matmuls (q, k, v, o, gate, up, down), all layers."""
    d = cfg.hidden_size
    return cfg.num_layers * (d * (cfg.q_size + 2 * cfg.kv_size) + cfg.q_size * d
                             + 3 * d * cfg.intermediate_size)


def weight_bytes(cfg: ModelConfig, tokens: int, dtype_bytes: int) -> int:
    """Bytes of weights a step over ``tokens`` tokens must read: every parameter but an untied
    embedding table, of which only the tokens' rows."""
    table = cfg.vocab_size * cfg.hidden_size
    read = cfg.num_parameters() - (0 if cfg.tie_word_embeddings else table)
    return (read + tokens * cfg.hidden_size) * dtype_bytes


def linear_flops(cfg: ModelConfig, tokens: int, logit_rows: int) -> int:
    return 2 * layer_matmul_params(cfg) * tokens + 2 * cfg.vocab_size * cfg.hidden_size * logit_rows


def attention_flops(cfg: ModelConfig, pairs: int) -> int:
    return 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * pairs


@dataclass(frozen=True, slots=True)
class Ceilings:
    """The measured rates the floor uses: ``gb_s`` (bytes per second / 1e9, the higher of the
    read and the copy bandwidth: ``bandwidth`` says which), ``tflop_s`` (matmul rate)."""

    gb_s: float
    tflop_s: float
    bandwidth: str

    def __post_init__(self) -> None:
        check_float("Ceilings", "gb_s", self.gb_s, 0.0, 1e6, low_open=True)
        check_float("Ceilings", "tflop_s", self.tflop_s, 0.0, 1e6, low_open=True)
        check_choice("Ceilings", "bandwidth", self.bandwidth, BANDWIDTHS)


@dataclass(frozen=True, slots=True)
class StepFloor:
    """The four bounds of one step, seconds (module docstring)."""

    weights_s: float
    linear_s: float
    kv_s: float
    attention_s: float

    @property
    def s(self) -> float:
        return max(self.weights_s, self.linear_s) + max(self.kv_s, self.attention_s)

    @property
    def bound(self) -> str:
        """Which bound sets the step's larger part: bytes or flops."""
        if self.s == 0.0:
            return "none"
        lin, att = max(self.weights_s, self.linear_s), max(self.kv_s, self.attention_s)
        bytes_bound = self.weights_s >= self.linear_s if lin >= att else self.kv_s >= self.attention_s
        return "bytes" if bytes_bound else "flops"


def step_floor(cfg: ModelConfig, dtype_bytes: int, work: StepWork, ceilings: Ceilings
               ) -> StepFloor:
    if work.tokens == 0:
        return StepFloor(0.0, 0.0, 0.0, 0.0)
    bw, rate = ceilings.gb_s * 1e9, ceilings.tflop_s * 1e12
    return StepFloor(weight_bytes(cfg, work.tokens, dtype_bytes) / bw,
                     linear_flops(cfg, work.tokens, work.logit_rows) / rate,
                     cfg.kv_bytes_per_token(dtype_bytes) * work.kv_tokens / bw,
                     attention_flops(cfg, work.attention_pairs) / rate)
