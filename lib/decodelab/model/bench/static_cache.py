"""The ``compile_static`` peer: plain torch decode over a static contiguous KV cache, compiled
with ``torch.compile(mode="max-autotune", fullgraph=True)`` (autotuned GEMMs, fused
element-wise kernels and a CUDA graph: the recipe of gpt-fast and of the PyTorch docs for
low-latency decode).

Same model, same weights (the tensors are shared, not copied) and the same rounding as
``model.TorchOps``; only the cache differs: per layer one (B, Hkv, T, D) tensor of K and one
of V instead of pages. The cache holds exactly ``context`` positions and every row decodes at
position ``context - 1``, so attention covers the whole cache and needs no mask. The G query
heads that share a KV head are folded into SDPA's query length ((B, Hkv, G, D) against
(B, Hkv, T, D)): each K/V is read once on the flash/cuDNN path. (``enable_gqa=True`` or
repeating K/V per query head falls back to a path that copies the cache every step.)

    peer = StaticCacheLlama(config, weights, cos, sin, batch, context)
    peer.load_from_paged(cache, block_tables)   # same K/V as a paged sequence set (validation)
    logits = peer(input_ids (B,) int64)         # -> (B, vocab) float32, at position context-1
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from decodelab.model.config import ModelConfig
from decodelab.model.kv_cache import PagedKVCache
from decodelab.model.llama import TorchOps
from decodelab.model.weights import Weights


class StaticCacheLlama(nn.Module):
    """One decode step at position ``context - 1`` over a contiguous cache of ``context``.

    Weights and caches are registered buffers: ``torch.compile`` treats them as static
    addresses, so its CUDA graph captures the in-place cache write instead of falling back to
    eager on a mutated input."""

    def __init__(self, config: ModelConfig, weights: Weights, cos: torch.Tensor,
                 sin: torch.Tensor, batch: int, context: int) -> None:
        super().__init__()
        if config.attention_bias:
            raise ValueError("StaticCacheLlama: attention biases are not supported")
        self.config, self.context = config, context
        dev, dtype = weights.embed.device, weights.embed.dtype
        # One (B, Hkv, T, D) buffer per layer, written at a tensor index: inductor then updates
        # it in place (a slice of one all-layer buffer was copied whole at every write).
        shape = (batch, config.num_kv_heads, context, config.head_dim)
        for i in range(config.num_layers):
            self.register_buffer(f"l{i}_k", torch.zeros(shape, dtype=dtype, device=dev))
            self.register_buffer(f"l{i}_v", torch.zeros(shape, dtype=dtype, device=dev))
        self.register_buffer("write_pos", torch.tensor([context - 1], device=dev))
        for name, t in (("embed", weights.embed), ("final_norm", weights.final_norm),
                        ("lm_head", weights.lm_head), ("cos", cos[context - 1]),
                        ("sin", sin[context - 1])):
            self.register_buffer(name, t)
        for i, lw in enumerate(weights.layers):
            for name in ("attn_norm", "qkv", "o", "mlp_norm", "gate_up", "down"):
                self.register_buffer(f"l{i}_{name}", getattr(lw, name))

    @torch.no_grad()
    def load_from_paged(self, cache: PagedKVCache, block_tables: torch.Tensor) -> None:
        """Copy each row's first ``context`` positions from the paged cache (B, M) tables."""
        c, bs = self.context, cache.block_size
        blocks = block_tables[:, :-(-c // bs)].long()  # (B, nb)
        for layer in range(self.config.num_layers):
            for src, dst in ((cache.k[layer], self._w(layer, "k")),
                             (cache.v[layer], self._w(layer, "v"))):
                pages = src[blocks]  # (B, nb, Hkv, bs, D)
                b, nb, hkv, _, d = pages.shape
                dst.copy_(pages.permute(0, 2, 1, 3, 4).reshape(b, hkv, nb * bs, d)[:, :, :c])

    def _w(self, i: int, name: str) -> torch.Tensor:
        return getattr(self, f"l{i}_{name}")

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        cfg, eps = self.config, self.config.rms_norm_eps
        b = input_ids.shape[0]
        h = F.embedding(input_ids, self.embed)  # (B, d)
        cos, sin = self.cos[None, :].expand(b, -1), self.sin[None, :].expand(b, -1)
        for i in range(cfg.num_layers):
            x = TorchOps.rms_norm(h, self._w(i, "attn_norm"), eps)
            q, k, v = F.linear(x, self._w(i, "qkv")).split(
                [cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
            q = TorchOps.rope(q.view(b, cfg.num_heads, cfg.head_dim), cos, sin)
            k = TorchOps.rope(k.view(b, cfg.num_kv_heads, cfg.head_dim), cos, sin)
            kc, vc = self._w(i, "k"), self._w(i, "v")  # (B, Hkv, T, D)
            kc[:, :, self.write_pos] = k[:, :, None]
            vc[:, :, self.write_pos] = v.view(b, cfg.num_kv_heads, 1, cfg.head_dim)
            a = F.scaled_dot_product_attention(
                q.view(b, cfg.num_kv_heads, cfg.group_size, cfg.head_dim), kc,
                vc)  # (B, Hkv, G, D): head h = kv head h // G, as in the model
            h = h + F.linear(a.reshape(b, cfg.q_size), self._w(i, "o"))
            x = TorchOps.rms_norm(h, self._w(i, "mlp_norm"), eps)
            h = h + F.linear(TorchOps.silu_mul(F.linear(x, self._w(i, "gate_up"))),
                             self._w(i, "down"))
        return F.linear(TorchOps.rms_norm(h, self.final_norm, eps), self.lm_head).float()
