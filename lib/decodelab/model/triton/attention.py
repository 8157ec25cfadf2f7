"""Paged decode attention in Triton: K/V read through the block table, never gathered.

One program per (sequence, KV head, context split). The G query heads that share the KV head
are one (GP, D) tile (GP = G padded to 16, the smallest tensor-core M), so each K/V position
is read once for the whole group and both products run on tensor cores from sm_80 (on a T4,
sm_75, Triton 3.6 compiles them to FMA instructions): scores = q @ K^T and acc += p @ V, with
an online softmax (running max, sum) in fp32. The program walks its share
of the context in tiles of TILE positions: each position's block is looked up in the block
table, so K and V are read in place from the pool (any block order, a partially filled last
block, any context length). When (sequence, KV head) pairs are too few to fill the GPU, the
context is split, and a long context is cut into splits of at most ``max_chunk`` positions
(so a serving batch of mixed lengths does not wait on its longest row); a second kernel merges
a row's splits in order (flash-decoding). A batch that fills the GPU unsplit comes with
``row_order`` (the rows longest first, :func:`.attention_plan.row_order`): programs take rows
in that order, a row's chunks and KV heads launched together, each row whole where the block
table is narrow (``UNCAPPED_TABLE``: no merge then). The GPU starts programs about in launch
order, so the longest rows start first and the short ones fill in behind them instead of a
long row started last holding up the step. Which program serves a row changes nothing it
computes. Without an order the rows are the grid's fastest axis. Policy: :mod:`.attention_plan`.
Shapes are static and the context length is read from device memory, so it runs under CUDA
graphs. Imported lazily: GPU only (or Triton's interpreter).

    paged_decode_attention(q (B, H, D), k_cache, v_cache (num_blocks, Hkv, block_size, D),
                           block_tables (B, M) int32, context_lens (B,) int32, scale)
        -> (B, H, D) in q's dtype; same contract as attention.paged_decode_attention_ref.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from decodelab.model.triton.attention_plan import (
    MIN_GROUP_ROWS,
    LaunchConfig,
    grid_splits,
    merge_lanes,
    plan,
)
from decodelab.model.triton.pdl import enter as _pdl_enter
from decodelab.model.triton.pdl import launch_kw


@triton.jit
def kv_tile(k_head, v_head, bt_row, t, tmask, d, stride_kb, stride_kt, BS: tl.constexpr):
    """The K and V rows (TILE, D) of context positions ``t`` through a block-table row; masked
    positions read as zeros (their scores are masked to -inf by the caller)."""
    blk = tl.load(bt_row + t // BS, mask=tmask, other=0).to(tl.int64)
    row = blk * stride_kb + (t % BS) * stride_kt  # (TILE,) offset of each position's K/V
    k = tl.load(k_head + row[:, None] + d[None, :], mask=tmask[:, None], other=0.0)
    v = tl.load(v_head + row[:, None] + d[None, :], mask=tmask[:, None], other=0.0)
    return k, v


@triton.jit
def softmax_tile(q, k, v, valid, m_i, l_i, acc, scale_log2, PRECISION: tl.constexpr):
    """One tile of online softmax: the rows' scores against ``k`` (positions not ``valid``
    masked to -inf, log2 units), the running max ``m_i``, sum ``l_i`` and ``acc`` rescaled and
    this tile's p @ v added, fp32. A row that has seen no valid position yet keeps m = -inf
    and adds zeros (no NaN)."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # (rows, TILE), fp32 accumulate
    s = tl.where(valid, s * scale_log2, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def split_chunk(ctx, SPLITS: tl.constexpr, TILE: tl.constexpr, MAX_CHUNK: tl.constexpr):
    """(positions per split, splits used) of a row of ``ctx`` positions: ``SPLITS`` chunks of
    whole tiles, each at most ``MAX_CHUNK``; at least one split, even for an empty row."""
    chunk = tl.minimum(tl.cdiv(tl.cdiv(ctx, SPLITS), TILE) * TILE, MAX_CHUNK)
    chunk = tl.maximum(chunk, TILE)
    return chunk, tl.maximum(tl.cdiv(ctx, chunk), 1)


@triton.jit
def _attn_split_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, order_ptr, out_ptr, m_ptr, l_ptr,
                       acc_ptr, scale_log2, stride_qb, stride_qh, stride_kb, stride_kh, stride_kt,
                       stride_bt, stride_ob, stride_oh,
                       G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
                       TILE: tl.constexpr, SPLITS: tl.constexpr, MAX_CHUNK: tl.constexpr,
                       STAGES: tl.constexpr, PRECISION: tl.constexpr, ORDERED: tl.constexpr,
                       PDL: tl.constexpr):
    _pdl_enter(PDL)  # q and the newest K/V come from the kernel before
    kvh = tl.program_id(1)
    if ORDERED:  # grid (split, KV head, rank): rank by rank, each row's programs together
        split = tl.program_id(0)
        b = tl.load(order_ptr + tl.program_id(2))
        n_splits = tl.num_programs(0)
    else:  # grid (row, KV head, split): the rows fastest
        b = tl.program_id(0)
        split = tl.program_id(2)
        n_splits = tl.num_programs(2)
    ctx = tl.load(lens_ptr + b)
    chunk, used = split_chunk(ctx, SPLITS, TILE, MAX_CHUNK)
    if split < used:
        start = split * chunk
        end = tl.minimum(start + chunk, ctx)
        g = tl.arange(0, GP)
        d = tl.arange(0, D)
        heads = kvh * G + g  # (GP,) query heads served by this KV head; rows >= G are padding
        gmask = g < G
        q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
                    mask=gmask[:, None], other=0.0)  # (GP, D)
        m_i = tl.full([GP], float("-inf"), tl.float32)
        l_i = tl.zeros([GP], tl.float32)
        acc = tl.zeros([GP, D], tl.float32)
        kv_head = k_ptr + kvh * stride_kh
        v_head = v_ptr + kvh * stride_kh
        n_tiles = tl.cdiv(tl.maximum(end - start, 0), TILE)
        for i in tl.range(0, n_tiles, num_stages=STAGES):
            t = start + i * TILE + tl.arange(0, TILE)
            tmask = t < end
            k, v = kv_tile(kv_head, v_head, bt_ptr + b * stride_bt, t, tmask, d, stride_kb,
                           stride_kt, BS)
            m_i, l_i, acc = softmax_tile(q, k, v, tmask[None, :], m_i, l_i, acc, scale_log2,
                                         PRECISION)
        if used == 1:  # the whole row in one split: the output, as the merge would write it
            o = acc / l_i[:, None]
            tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :],
                     o.to(out_ptr.dtype.element_ty), mask=gmask[:, None])
        else:
            # Partials: m, l (B, H, S); acc (B, H, S, D), S = the grid's splits.
            H = tl.num_programs(1) * G
            part = (b * H + heads) * n_splits + split  # (GP,)
            tl.store(m_ptr + part, m_i, mask=gmask)
            tl.store(l_ptr + part, l_i, mask=gmask)
            tl.store(acc_ptr + part[:, None] * D + d[None, :], acc, mask=gmask[:, None])


@triton.jit
def merge_partials(m_ptr, l_ptr, acc_ptr, base, used, D: tl.constexpr, LANES: tl.constexpr):
    """The (D,) output of one row and head from its splits 0..used-1 (partials m, l, acc at
    ``base``...), LANES splits per load in split order; unused lanes add exact zeros, so the
    result depends on ``used`` and LANES alone. Split 0 holds a position (a finite m)."""
    d = tl.arange(0, D)
    m_run = tl.full([], float("-inf"), tl.float32)
    l_run = tl.zeros([], tl.float32)
    acc_run = tl.zeros([D], tl.float32)
    for first in range(0, used, LANES):
        s = first + tl.arange(0, LANES)
        live = s < used
        m = tl.load(m_ptr + base + s, mask=live, other=float("-inf"))
        m_new = tl.maximum(m_run, tl.max(m, axis=0))
        w = tl.exp2(m - m_new)  # unused lanes: exp2(-inf) = 0
        alpha = tl.exp2(m_run - m_new)
        l_run = l_run * alpha + tl.sum(tl.load(l_ptr + base + s, mask=live, other=0.0) * w,
                                       axis=0)
        acc = tl.load(acc_ptr + (base + s)[:, None] * D + d[None, :], mask=live[:, None],
                      other=0.0)
        acc_run = acc_run * alpha + tl.sum(acc * w[:, None], axis=0)
        m_run = m_new
    return acc_run / l_run


@triton.jit
def _merge_splits_kernel(m_ptr, l_ptr, acc_ptr, lens_ptr, out_ptr, grid_splits, stride_ob,
                         stride_oh, D: tl.constexpr, SPLITS: tl.constexpr, TILE: tl.constexpr,
                         MAX_CHUNK: tl.constexpr, LANES: tl.constexpr, PDL: tl.constexpr):
    """One program per (row, head): the row's used splits merged LANES at a time in split
    order (a row in one split was written by the split kernel). Unused lanes add exact zeros,
    so the result depends on the row's context and the batch, not on the grid."""
    _pdl_enter(PDL)
    b = tl.program_id(0)
    h = tl.program_id(1)
    H = tl.num_programs(1)
    _, used = split_chunk(tl.load(lens_ptr + b), SPLITS, TILE, MAX_CHUNK)
    if used > 1:
        o = merge_partials(m_ptr, l_ptr, acc_ptr, (b * H + h) * grid_splits, used, D, LANES)
        tl.store(out_ptr + b * stride_ob + h * stride_oh + tl.arange(0, D),
                 o.to(out_ptr.dtype.element_ty))


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           scale: float, launch: LaunchConfig | None = None, *,
                           pdl: bool = False, row_order: torch.Tensor | None = None
                           ) -> torch.Tensor:
    """``launch`` overrides the shape's :func:`attention_plan.plan` (for tuning sweeps);
    ``pdl`` launches both kernels with programmatic dependent launch (see ``pdl``);
    ``row_order`` (B,) int32, a permutation of the rows: the order programs take them in."""
    b, h, d = q.shape
    _, hkv, bs, _ = k_cache.shape
    if d & (d - 1) or k_cache.stride(3) != 1 or q.stride(2) != 1:
        raise ValueError(f"paged_decode_attention: head_dim {d} must be a power of two with "
                         "contiguous last dims")
    if row_order is not None and (row_order.shape != (b,) or row_order.dtype != torch.int32):
        raise ValueError(f"paged_decode_attention: row_order must be ({b},) int32, got "
                         f"{tuple(row_order.shape)} {row_order.dtype}")
    group = h // hkv
    splits, chosen = plan(b, hkv, q.device, d * k_cache.element_size(),
                          table_positions=block_tables.shape[1] * bs)
    launch = launch or chosen
    max_chunk = max(launch.tile, launch.max_chunk // launch.tile * launch.tile)
    grid = grid_splits(splits, block_tables.shape[1] * bs, max_chunk)
    out = torch.empty((b, h, d), dtype=q.dtype, device=q.device)
    if grid > 1:
        m = torch.empty((b, h, grid), dtype=torch.float32, device=q.device)
        lsum = torch.empty_like(m)
        acc = torch.empty((b, h, grid, d), dtype=torch.float32, device=q.device)
    else:
        m = lsum = acc = out  # unused by the kernel when every row has one split
    shape = dict(D=d, SPLITS=splits, TILE=launch.tile, MAX_CHUNK=max_chunk, PDL=pdl)
    ordered = row_order is not None
    _attn_split_kernel[(grid, hkv, b) if ordered else (b, hkv, grid)](
        q, k_cache, v_cache, block_tables, context_lens,
        row_order if ordered else context_lens, out, m, lsum, acc,
        scale * 1.4426950408889634, q.stride(0), q.stride(1), k_cache.stride(0),
        k_cache.stride(1), k_cache.stride(2), block_tables.stride(0), out.stride(0),
        out.stride(1), G=group, GP=max(MIN_GROUP_ROWS, triton.next_power_of_2(group)), BS=bs,
        STAGES=launch.stages, num_warps=launch.warps,
        # fp32 caches get exact products (the reference's precision), not tf32
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", ORDERED=ordered, **shape,
        **launch_kw(pdl))
    if grid > 1:
        _merge_splits_kernel[(b, h)](m, lsum, acc, context_lens, out, grid, out.stride(0),
                                     out.stride(1), LANES=merge_lanes(splits), num_warps=1,
                                     **shape, **launch_kw(pdl))
    return out
