"""Reference attention over the paged cache (plain torch, any device) and varlen prefill.

- ``paged_decode_attention_ref``: one query token per sequence; gathers each sequence's K/V
  blocks through its block table into a dense copy, masks positions past ``context_lens`` and
  runs softmax attention in fp32. Static shapes, so it is also graph-capturable.
- ``paged_prefill_attention_ref``: causal attention of a packed batch of prompt chunks of
  different lengths (no padding), each over its own sequence's K/V read from the paged cache:
  the chunk's own positions (written there first) and every position cached before it, so a
  chunk attends to the chunks and decode steps before it. fp32 softmax, a loop over sequences.

Grouped-query attention: query head ``h`` reads KV head ``h // group_size``.
"""

from __future__ import annotations

import torch


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


def paged_prefill_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                block_tables: torch.Tensor, query_starts: torch.Tensor,
                                starts: torch.Tensor, scale: float) -> torch.Tensor:
    """q (T, H, D) packed chunk after chunk; k_cache, v_cache (num_blocks, Hkv, block_size, D)
    of one layer, already holding every chunk's K/V; block_tables (n, M) int; query_starts
    (n+1,) int, chunk i is rows query_starts[i] .. query_starts[i+1]-1 of q; starts (n,) int,
    chunk i's first token is at position starts[i] -> (T, H, D) in q's dtype.

    Row j of chunk i (position starts[i] + j) attends to positions 0 .. starts[i] + j."""
    _, h, d = q.shape
    _, hkv, bs, _ = k_cache.shape
    out = torch.empty_like(q)
    bounds, cached = query_starts.tolist(), starts.tolist()
    for i, start in enumerate(cached):
        lo, hi = bounds[i], bounds[i + 1]
        n, ctx = hi - lo, start + hi - lo
        blocks = block_tables[i, :-(-ctx // bs)].long()
        # (m, Hkv, bs, D) -> (Hkv, m * bs, D) -> the first ctx positions, in sequence order
        k = k_cache[blocks].transpose(0, 1).reshape(hkv, -1, d)[:, :ctx].float()
        v = v_cache[blocks].transpose(0, 1).reshape(hkv, -1, d)[:, :ctx].float()
        qg = q[lo:hi].float().view(n, hkv, h // hkv, d)  # (n, Hkv, G, D)
        scores = torch.einsum("nkgd,kcd->kgnc", qg, k) * scale  # (Hkv, G, n, ctx)
        rows = start + torch.arange(n, device=q.device)  # each query row's position
        future = torch.arange(ctx, device=q.device)[None, :] > rows[:, None]  # (n, ctx)
        scores = scores.masked_fill(future, float("-inf"))
        o = torch.einsum("kgnc,kcd->nkgd", torch.softmax(scores, dim=-1), v)
        out[lo:hi] = o.reshape(n, h, d).to(q.dtype)
    return out
