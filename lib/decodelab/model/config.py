"""The shape of a Llama-family decoder: a frozen, validated dataclass.

Built by name (``named_config("llama-3.2-1b")``, ``named_config("tiny")``) or from a Hugging Face
``config.json`` (``ModelConfig.from_hf_config_json(path)``); ``to_hf_dict()`` goes the other way
so the same shape can be handed to ``transformers`` for the reference checks.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from decodelab.core.validate import ConfigError, check_float, check_int

# model_type values whose checkpoints use Llama's layout; Qwen2 adds a bias to q, k and v.
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """Llama-3-style frequency scaling of the rotary embedding (``rope_type: llama3``)."""

    factor: float = 32.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        check_float("RopeScaling", "factor", self.factor, 1.0, 1e6)
        check_float("RopeScaling", "low_freq_factor", self.low_freq_factor, 0.0, 1e6, low_open=True)
        check_float("RopeScaling", "high_freq_factor", self.high_freq_factor, 0.0, 1e6,
                    low_open=True)
        if self.high_freq_factor <= self.low_freq_factor:
            raise ConfigError(f"RopeScaling.high_freq_factor={self.high_freq_factor!r}: must be "
                              f"> low_freq_factor={self.low_freq_factor!r}")
        check_int("RopeScaling", "original_max_position_embeddings",
                  self.original_max_position_embeddings, 1)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shapes and constants of one decoder. ``head_dim`` 0 means hidden_size // num_heads."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int = 0
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2-style bias on q, k and v (not on o)
    name: str = "custom"

    def __post_init__(self) -> None:
        owner = "ModelConfig"
        for field, low in (("vocab_size", 2), ("hidden_size", 1), ("intermediate_size", 1),
                           ("num_layers", 1), ("num_heads", 1), ("num_kv_heads", 1),
                           ("max_position_embeddings", 1)):
            check_int(owner, field, getattr(self, field), low)
        check_int(owner, "head_dim", self.head_dim, 0)
        if self.head_dim == 0:
            if self.hidden_size % self.num_heads:
                raise ConfigError(f"{owner}.num_heads={self.num_heads}: must divide hidden_size="
                                  f"{self.hidden_size} when head_dim is not given")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.head_dim % 2:
            raise ConfigError(f"{owner}.head_dim={self.head_dim}: must be even (rotary pairs)")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"{owner}.num_kv_heads={self.num_kv_heads}: must divide "
                              f"num_heads={self.num_heads}")
        check_float(owner, "rms_norm_eps", self.rms_norm_eps, 0.0, 1.0, low_open=True)
        check_float(owner, "rope_theta", self.rope_theta, 1.0, 1e12)

    @property
    def group_size(self) -> int:
        """Query heads per KV head (grouped-query attention)."""
        return self.num_heads // self.num_kv_heads

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def num_parameters(self) -> int:
        """Parameter count (the embedding counted once when tied)."""
        d, f = self.hidden_size, self.intermediate_size
        attn = d * (self.q_size + 2 * self.kv_size) + self.q_size * d
        if self.attention_bias:
            attn += self.q_size + 2 * self.kv_size
        layer = attn + 3 * d * f + 2 * d
        head = 0 if self.tie_word_embeddings else self.vocab_size * d
        return self.vocab_size * d + self.num_layers * layer + d + head

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Bytes of K and V that one token occupies across all layers."""
        return 2 * self.num_layers * self.kv_size * dtype_bytes

    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any], name: str = "custom") -> ModelConfig:
        model_type = hf.get("model_type", "llama")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(f"config.json model_type={model_type!r}: must be one of "
                              f"{', '.join(SUPPORTED_MODEL_TYPES)}")
        if hf.get("sliding_window") and hf.get("use_sliding_window", model_type == "mistral"):
            raise ConfigError("config.json sliding_window: sliding-window attention is not "
                              "supported (must be null)")
        if hf.get("mlp_bias") or (model_type != "qwen2" and hf.get("attention_bias")):
            raise ConfigError("config.json mlp_bias/attention_bias: only Qwen2-style q/k/v "
                              "biases are supported (must be false for Llama and Mistral)")
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        theta = float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type == "llama3":
            scaling = RopeScaling(float(rope["factor"]), float(rope["low_freq_factor"]),
                                  float(rope["high_freq_factor"]),
                                  int(rope["original_max_position_embeddings"]))
        elif rope_type == "default":
            scaling = None
        else:
            raise ConfigError(f"config.json rope_type={rope_type!r}: must be 'default' or 'llama3'")
        heads = int(hf["num_attention_heads"])
        return cls(
            vocab_size=int(hf["vocab_size"]), hidden_size=int(hf["hidden_size"]),
            intermediate_size=int(hf["intermediate_size"]),
            num_layers=int(hf["num_hidden_layers"]), num_heads=heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or heads),
            head_dim=int(hf.get("head_dim") or 0), rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=theta, rope_scaling=scaling,
            max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=model_type == "qwen2", name=name)

    @classmethod
    def from_hf_config_json(cls, path: str | Path) -> ModelConfig:
        """Read a Hugging Face ``config.json`` (a file, or a checkpoint folder holding one)."""
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        return cls.from_hf_dict(json.loads(path.read_text()), name=path.parent.name)

    def to_hf_dict(self) -> dict[str, Any]:
        """The same shape as ``transformers`` config keywords: LlamaConfig's, or Qwen2Config's
        when ``attention_bias`` (Llama's own attention_bias would also bias o_proj)."""
        rope: dict[str, Any] = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling is not None:
            s = self.rope_scaling
            rope = {"rope_type": "llama3", "rope_theta": self.rope_theta, "factor": s.factor,
                    "low_freq_factor": s.low_freq_factor, "high_freq_factor": s.high_freq_factor,
                    "original_max_position_embeddings": s.original_max_position_embeddings}
        return dict(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                    intermediate_size=self.intermediate_size, num_hidden_layers=self.num_layers,
                    num_attention_heads=self.num_heads, num_key_value_heads=self.num_kv_heads,
                    head_dim=self.head_dim, rms_norm_eps=self.rms_norm_eps,
                    rope_theta=self.rope_theta, rope_scaling=rope, rope_parameters=rope,
                    max_position_embeddings=self.max_position_embeddings,
                    tie_word_embeddings=self.tie_word_embeddings,
                    attention_bias=self.attention_bias, hidden_act="silu")


def rope_inv_freq(config: ModelConfig):
    """Inverse frequencies (head_dim // 2,) in fp32, Llama-3 scaling applied when configured."""
    import torch

    d = config.head_dim
    inv = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    s = config.rope_scaling
    if s is None:
        return inv
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv
    # Long wavelengths are slowed by `factor`, short ones kept, the band between interpolated.
    scaled = torch.where(wavelen > low_wavelen, inv / s.factor, inv)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


NAMED_CONFIGS: dict[str, ModelConfig] = {
    "llama-3.2-1b": ModelConfig(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32,
        num_kv_heads=8, head_dim=64, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling=RopeScaling(32.0, 1.0, 4.0, 8192), max_position_embeddings=131072,
        tie_word_embeddings=True, name="llama-3.2-1b"),
    # Llama-3.1-8B's shapes: 16 GB of bf16 weights, the model that needs more than one GPU's
    # bandwidth to decode fast (the tensor-parallel study).
    "llama-3.1-8b": ModelConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
        num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling=RopeScaling(8.0, 1.0, 4.0, 8192), max_position_embeddings=131072,
        tie_word_embeddings=False, name="llama-3.1-8b"),
    # Small enough for CPU tests in fp32, but with every feature switched on (GQA, llama3 rope).
    "tiny": ModelConfig(
        vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=3, num_heads=8,
        num_kv_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling=RopeScaling(8.0, 1.0, 4.0, 64), max_position_embeddings=1024,
        tie_word_embeddings=True, name="tiny"),
}


def named_config(name: str, **overrides: Any) -> ModelConfig:
    """A named shape, optionally with some fields replaced (e.g. ``tie_word_embeddings=False``)."""
    if name not in NAMED_CONFIGS:
        raise ConfigError(f"model config name={name!r}: must be one of {', '.join(NAMED_CONFIGS)}")
    return replace(NAMED_CONFIGS[name], **overrides) if overrides else NAMED_CONFIGS[name]
