"""Paged decode attention in Triton: K/V read through the block table, never gathered.

One program per (sequence, KV head, context split). It loads the G query heads that share the
KV head once, walks its share of the context in tiles of TILE positions — each position's
block looked up in the block table, so K and V are read in place from the pool — and keeps an
online softmax (running max, sum and weighted V) in fp32. With more than one split (short
batches: too few (sequence, head) pairs to fill the GPU) a second kernel merges the splits'
partial results (flash-decoding). Shapes are static and the context length is read from device
memory, so it runs under CUDA graphs. Imported lazily: GPU only.

    paged_decode_attention(q (B, H, D), k_cache, v_cache (num_blocks, Hkv, block_size, D),
                           block_tables (B, M) int32, context_lens (B,) int32, scale)
        -> (B, H, D) in q's dtype; same contract as attention.paged_decode_attention_ref.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

TILE = 32  # context positions per inner-loop step


@triton.jit
def _attn_split_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, out_ptr, m_ptr, l_ptr, acc_ptr,
                       scale_log2, stride_qb, stride_qh, stride_kb, stride_kh, stride_kt,
                       stride_bt, stride_ob, stride_oh,
                       G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
                       TILE: tl.constexpr, SPLITS: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(lens_ptr + b)
    chunk = tl.cdiv(tl.cdiv(ctx, SPLITS), TILE) * TILE
    start = split * chunk
    end = tl.minimum(start + chunk, ctx)
    g = tl.arange(0, GP)
    d = tl.arange(0, D)
    heads = kvh * G + g  # (GP,) query heads served by this KV head
    gmask = g < G
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
                mask=gmask[:, None], other=0.0).to(tl.float32)  # (GP, D)
    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, D], tl.float32)
    kv_head = k_ptr + kvh * stride_kh
    v_head = v_ptr + kvh * stride_kh
    for t0 in range(start, end, TILE):
        t = t0 + tl.arange(0, TILE)
        tmask = t < end
        blk = tl.load(bt_ptr + b * stride_bt + t // BS, mask=tmask, other=0).to(tl.int64)
        row = blk * stride_kb + (t % BS) * stride_kt  # (TILE,) offset of each position's K/V
        k = tl.load(kv_head + row[:, None] + d[None, :], mask=tmask[:, None],
                    other=0.0).to(tl.float32)  # (TILE, D)
        # V issued with K: both loads in flight before the softmax needs either.
        v = tl.load(v_head + row[:, None] + d[None, :], mask=tmask[:, None],
                    other=0.0).to(tl.float32)  # (TILE, D)
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale_log2  # (GP, TILE), log2 units
        s = tl.where(tmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m_i = m_new
    if SPLITS == 1:
        o = acc / l_i[:, None]
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=gmask[:, None])
    else:
        # Partials: m, l (B, H, SPLITS); acc (B, H, SPLITS, D). An empty split leaves m=-inf, l=0.
        H = tl.num_programs(1) * G
        part = (b * H + heads) * SPLITS + split  # (GP,)
        tl.store(m_ptr + part, m_i, mask=gmask)
        tl.store(l_ptr + part, l_i, mask=gmask)
        tl.store(acc_ptr + part[:, None] * D + d[None, :], acc, mask=gmask[:, None])


@triton.jit
def _merge_splits_kernel(m_ptr, l_ptr, acc_ptr, out_ptr, stride_ob, stride_oh,
                         D: tl.constexpr, SPLITS: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    H = tl.num_programs(1)
    s = tl.arange(0, SPLITS)
    d = tl.arange(0, D)
    base = (b * H + h) * SPLITS
    m = tl.load(m_ptr + base + s)
    m_max = tl.max(m, axis=0)
    w = tl.exp2(m - m_max)  # empty splits: exp2(-inf) = 0
    l_sum = tl.sum(tl.load(l_ptr + base + s) * w, axis=0)
    acc = tl.load(acc_ptr + (base + s)[:, None] * D + d[None, :])
    o = tl.sum(acc * w[:, None], axis=0) / l_sum
    tl.store(out_ptr + b * stride_ob + h * stride_oh + d, o.to(out_ptr.dtype.element_ty))


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def num_splits(batch: int, kv_heads: int, max_context: int, device: torch.device) -> int:
    """Context splits so that about two programs per SM run, at most one per tile (power of 2).
    Depends only on static shapes, so a captured graph keeps a valid choice."""
    sms = _sm_count(device.index or 0) if device.type == "cuda" else 8
    want = max(1, -(-2 * sms // (batch * kv_heads)))
    cap = max(1, -(-max_context // TILE))
    splits = 1
    while splits * 2 <= min(want, cap, 64):
        splits *= 2
    return splits


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           scale: float) -> torch.Tensor:
    b, h, d = q.shape
    _, hkv, bs, _ = k_cache.shape
    if d & (d - 1) or k_cache.stride(3) != 1 or q.stride(2) != 1:
        raise ValueError(f"paged_decode_attention: head_dim {d} must be a power of two with "
                         "contiguous last dims")
    group = h // hkv
    splits = num_splits(b, hkv, block_tables.shape[1] * bs, q.device)
    out = torch.empty((b, h, d), dtype=q.dtype, device=q.device)
    if splits > 1:
        m = torch.empty((b, h, splits), dtype=torch.float32, device=q.device)
        lsum = torch.empty_like(m)
        acc = torch.empty((b, h, splits, d), dtype=torch.float32, device=q.device)
    else:
        m = lsum = acc = out  # unused by the kernel when SPLITS == 1
    _attn_split_kernel[(b, hkv, splits)](
        q, k_cache, v_cache, block_tables, context_lens, out, m, lsum, acc,
        scale * 1.4426950408889634, q.stride(0), q.stride(1), k_cache.stride(0),
        k_cache.stride(1), k_cache.stride(2), block_tables.stride(0), out.stride(0),
        out.stride(1), G=group, GP=triton.next_power_of_2(group), D=d, BS=bs, TILE=TILE,
        SPLITS=splits, num_warps=4)
    if splits > 1:
        _merge_splits_kernel[(b, h)](m, lsum, acc, out, out.stride(0), out.stride(1), D=d,
                                     SPLITS=splits, num_warps=1)
    return out
