"""Device bytes of the paged model's pieces, torch-free: what the benches' sizing estimates
(``core.sizing``) are made of, written once for ``paged_model``, ``runtime`` and ``tp``."""

from __future__ import annotations

from collections.abc import Iterable

from decodelab.model.config import ModelConfig


def weight_bytes(config: ModelConfig, dtype_bytes: int) -> int:
    """The weights as the model holds them (the embedding once when tied)."""
    return config.num_parameters() * dtype_bytes


def fused_bytes(config: ModelConfig, dtype_bytes: int) -> int:
    """The fused q/k/v and gate/up matrices ``weights.from_state_dict`` makes: copies beside
    the state dict while it is alive."""
    d, f, layers = config.hidden_size, config.intermediate_size, config.num_layers
    qkv = config.q_size + 2 * config.kv_size
    return layers * (qkv * d + 2 * f * d + (qkv if config.attention_bias else 0)) * dtype_bytes


def build_extra_bytes(config: ModelConfig, dtype_bytes: int) -> int:
    """Bytes beyond the weights while they are built from a random state dict
    (``weights.random_state_dict`` then ``from_state_dict``): the fused copies, and the
    largest tensor drawn in float32 with its scaled copy."""
    largest = max(config.vocab_size, config.intermediate_size, config.q_size) * config.hidden_size
    return fused_bytes(config, dtype_bytes) + 2 * largest * 4


def kv_pool_bytes(config: ModelConfig, num_blocks: int, block_size: int, dtype_bytes: int
                  ) -> int:
    """A ``PagedKVCache`` of ``num_blocks`` blocks (and its scratch block)."""
    return (num_blocks + 1) * block_size * config.kv_bytes_per_token(dtype_bytes)


def logits_bytes(config: ModelConfig, buckets: Iterable[int]) -> int:
    """The float32 logits outputs of decode graphs captured for ``buckets`` (one each)."""
    return sum(buckets) * config.vocab_size * 4
