"""Reference attention over the paged cache (plain torch, any device) and varlen prefill.

- ``paged_decode_attention_ref``: one query token per sequence; gathers each sequence's K/V
  blocks through its block table into a dense copy, masks positions past ``context_lens`` and
  runs softmax attention in fp32. Static shapes, so it is also graph-capturable.
- ``prefill_attention``: causal attention of a packed batch of prompts of different lengths
  (no padding; each prompt attends only to itself).

Grouped-query attention: query head ``h`` reads KV head ``h // group_size``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def paged_decode_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               block_tables: torch.Tensor, context_lens: torch.Tensor,
                               scale: float) -> torch.Tensor:
    """q (B, H, D); k_cache, v_cache (num_blocks, Hkv, block_size, D) of one layer;
    block_tables (B, M) int; context_lens (B,) int -> (B, H, D) in q's dtype."""
    b, h, d = q.shape
    _, hkv, bs, _ = k_cache.shape
    m = block_tables.shape[1]
    idx = block_tables.long()
    # (B, M, Hkv, bs, D) -> (B, Hkv, M * bs, D): positions in order along the sequence.
    k = k_cache[idx].permute(0, 2, 1, 3, 4).reshape(b, hkv, m * bs, d).float()
    v = v_cache[idx].permute(0, 2, 1, 3, 4).reshape(b, hkv, m * bs, d).float()
    qg = q.float().view(b, hkv, h // hkv, d)  # (B, Hkv, G, D)
    scores = torch.einsum("bkgd,bktd->bkgt", qg, k) * scale
    valid = torch.arange(m * bs, device=q.device)[None, :] < context_lens[:, None]  # (B, T)
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    out = torch.einsum("bkgt,bktd->bkgd", torch.softmax(scores, dim=-1), v)
    return out.reshape(b, h, d).to(q.dtype)


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      seq_lens: Sequence[int], scale: float) -> torch.Tensor:
    """q (T, H, D), k, v (T, Hkv, D) packed prompt after prompt (sum(seq_lens) == T) -> (T, H, D)."""
    group = q.shape[1] // k.shape[1]
    outs, start = [], 0
    for n in seq_lens:
        # (1, H, n, D) per prompt; KV heads repeated to the query heads they serve.
        qs = q[start:start + n].transpose(0, 1)[None]
        ks = k[start:start + n].transpose(0, 1).repeat_interleave(group, dim=0)[None]
        vs = v[start:start + n].transpose(0, 1).repeat_interleave(group, dim=0)[None]
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale)
        outs.append(o[0].transpose(0, 1))
        start += n
    return torch.cat(outs, dim=0)
