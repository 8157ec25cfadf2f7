"""How the decoder's weights split across ``tp`` ranks (Megatron-style tensor parallelism).

Per layer, rank r holds:
- q, k, v: the rows of its query heads (H/tp) and KV heads (Hkv/tp), so attention and the
  paged KV cache are local: each rank caches only its own KV heads (column-parallel);
- o: the matching columns (row-parallel), so each rank's o-projection is a partial sum and
  one all-reduce completes it;
- gate and up: rows r*f/tp .. (r+1)*f/tp - 1 of each (column-parallel), down: those columns
  (row-parallel), one more all-reduce;
- the embedding and the head: vocabulary rows r*V/tp .. (r+1)*V/tp - 1 (a lookup masked to the
  rank's rows plus an all-reduce; the logits are all-gathered). A tied head stays tied.
Norm weights are replicated. Nothing is padded: each split must divide evenly, and a KV head is
never split nor replicated (tp must divide num_kv_heads).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from decodelab.core.validate import ConfigError, check_int
from decodelab.model.config import ModelConfig
from decodelab.model.weights import LayerWeights, Weights


def check_tp(config: ModelConfig, tp: int) -> None:
    """Refuse a tensor-parallel size the model's shape cannot split evenly."""
    check_int("tensor parallel", "tp", tp, 1, 64)
    for field in ("num_kv_heads", "num_heads", "intermediate_size", "vocab_size"):
        n = getattr(config, field)
        if n % tp:
            raise ConfigError(f"tensor parallel tp={tp}: must divide {config.name}.{field}={n}")


def local_config(config: ModelConfig, tp: int) -> ModelConfig:
    """The shape one rank computes: its heads and MLP columns. ``vocab_size`` stays global
    (token ids are global); each rank holds vocab_size / tp rows of the embedding and head."""
    check_tp(config, tp)
    if tp == 1:
        return config
    return replace(config, num_heads=config.num_heads // tp,
                   num_kv_heads=config.num_kv_heads // tp,
                   intermediate_size=config.intermediate_size // tp, head_dim=config.head_dim,
                   name=f"{config.name}/tp{tp}")


def _rows(t: torch.Tensor, start: int, n: int) -> torch.Tensor:
    return t.narrow(0, start, n)


def _qkv_rows(config: ModelConfig, t: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    """Rank ``rank``'s q rows, then its k rows, then its v rows (weight or bias)."""
    q, kv = config.q_size // tp, config.kv_size // tp
    parts = (_rows(t, rank * q, q), _rows(t, config.q_size + rank * kv, kv),
             _rows(t, config.q_size + config.kv_size + rank * kv, kv))
    return torch.cat(parts).contiguous()


def shard_layer(config: ModelConfig, lw: LayerWeights, rank: int, tp: int) -> LayerWeights:
    q, f = config.q_size // tp, config.intermediate_size // tp
    gate_up = torch.cat([_rows(lw.gate_up, rank * f, f),
                         _rows(lw.gate_up, config.intermediate_size + rank * f, f)])
    return LayerWeights(
        attn_norm=lw.attn_norm, qkv=_qkv_rows(config, lw.qkv, rank, tp),
        qkv_bias=None if lw.qkv_bias is None else _qkv_rows(config, lw.qkv_bias, rank, tp),
        o=lw.o[:, rank * q:(rank + 1) * q].contiguous(), mlp_norm=lw.mlp_norm,
        gate_up=gate_up.contiguous(), down=lw.down[:, rank * f:(rank + 1) * f].contiguous())


def vocab_range(config: ModelConfig, rank: int, tp: int) -> tuple[int, int]:
    """[start, end) of the vocabulary rows rank ``rank`` holds."""
    n = config.vocab_size // tp
    return rank * n, (rank + 1) * n


def shard_weights(config: ModelConfig, weights: Weights, rank: int, tp: int) -> Weights:
    """Rank ``rank``'s part of the full weights (new tensors; the full ones can be freed)."""
    check_tp(config, tp)
    check_int("shard_weights", "rank", rank, 0, tp - 1)
    if tp == 1:
        return weights
    start, end = vocab_range(config, rank, tp)
    embed = weights.embed[start:end].contiguous()
    head = embed if weights.lm_head is weights.embed else weights.lm_head[start:end].contiguous()
    return Weights(embed=embed, layers=tuple(shard_layer(config, lw, rank, tp)
                                             for lw in weights.layers),
                   final_norm=weights.final_norm, lm_head=head)
