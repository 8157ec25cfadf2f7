"""Batch-invariant kernels: a row's outputs are computed in one order whatever else is in the
batch, so a request's logits are the same bits alone, in any batch, in any graph bucket, and
from prefill as from decode (``ops.InvariantOps`` runs the model on them).

A GPU forward depends on its batch where a kernel's reduction order does: cuBLAS and the
matmul choice pick other tiles (or split K) for other row counts, and decode attention splits
the context in a number of parts chosen from the batch. Here:

- **matmul** (:func:`matmul`): one kernel (``skinny``'s, tiled over the rows) from 1 row to a
  prefill pack. A program computes BLOCK_M rows x BLOCK_N columns, streams K in BLOCK_K
  chunks in order and accumulates in fp32 (no split K), so each output element is the same
  chain of tensor-core products whatever the other rows and whatever the tile; the tile grows
  with the rows (``matmul_tile``), which changes how often a weight tile is read, not a bit.
- **attention** (:func:`decode_attention`, :func:`prefill_attention`): one kernel for both.
  The context is cut in splits of a fixed SPLIT positions (not a fixed number of splits),
  each walked in fixed tiles, and the splits a row uses are merged in split order, a fixed
  number per load (``_merge_splits_in_order_kernel``), so the result depends on the row's
  context length and K/V alone, not on the batch nor the block table's width. A program
  holds DECODE_ROWS query rows in decode (one token's GQA group, padded), ROWS in prefill
  (the groups of up to ROWS // group tokens of one chunk, which share the K/V tile loads; a
  position past a token's context is masked), and walks every lanes-th split its rows use
  (``split_lanes``: few lanes at large batches, so no program waits on a split past every
  row's context). Its reductions across positions are tensor-core products (the row sums
  too, ``_softmax_tile``) and maxima, whose bits do not follow the rows per program, so
  prefill and decode give a position the same bits.

Norms, RoPE, the cache write and the SwiGLU product are per-row kernels already
(``fused``): invariant as they are; the SwiGLU product runs before the matmul, not fused in.
With ``pdl`` these kernels launch with programmatic dependent launch as the default ones do
(``pdl_policy``): it changes when a kernel starts, never what it computes.
Imported lazily: GPU only (or Triton's interpreter).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from decodelab.model.triton import attention_plan, skinny
from decodelab.model.triton.attention import kv_tile, merge_partials
from decodelab.model.triton.pdl import enter as _pdl_enter
from decodelab.model.triton.pdl import launch_kw
from decodelab.model.triton.prefill_attention import CHUNK_TILE, chunk_of

STAGES = 4
WIDE_N = 4096  # weights with more output columns (or K) take wider tiles (``matmul_tile``)
SMALL_N = 2048  # and those with at most this many, narrower decode tiles
SPLIT = 256  # context positions per attention split
MERGE_LANES = tl.constexpr(16)  # splits per merge load: 4,096 positions at once
LANE_WAVES = 16  # attention programs per SM for ``split_lanes`` (4: steps up to 15% slower)
ROWS = 64  # query rows per prefill attention program
DECODE_ROWS = 16  # and per decode program: one token's GQA group, the smallest tensor-core tile
ATTN = attention_plan.LaunchConfig(tile=64, stages=3, warps=4)


class MatmulTile(NamedTuple):
    block_m: int  # rows per program
    block_n: int  # weight rows (output columns) per program
    block_k: int  # K chunk per step
    warps: int


def matmul_tile(rows: int, n: int, k: int) -> MatmulTile:
    """The tile of the matmul programs for ``rows`` rows of a weight (n, k). No tile changes a
    row's bits: every tile walks K from 0 in order, chaining the same 16-wide tensor-core
    products into one fp32 accumulator, and a row's products do not depend on the rows beside
    it. Measured on an H200 (bf16; table ``batch_invariance_tiles`` repeats it): every row of
    every Llama-3.2-1B shape the same bits under 23 tiles of 64-256 rows x 32-256 columns x K
    chunks of 64-128 (4,096 rows) and 84 of 16-256 x 16-128 x 64-256 (64 rows). Chosen so:

    - up to 64 rows (decode): narrow tiles with long K chunks where N is small, 16 columns
      where N is at most SMALL_N (more programs in flight to stream the weight: down at 64
      rows 13.8 against 17.5 µs in 32 columns, o 5.4 against 6.4), wide ones where N is large;
    - the LM head and gate|up: 128-row tiles at 65-128 rows, 256 above (LM head at 256 rows
      255 against 526 µs in 64-row tiles);
    - qkv, o and down at 65-128 rows: 64 x 32 tiles, K chunks of 256 for down, qkv in 64
      columns (7.5 against 9.2 µs in 32 x 128); at 129-256 rows 64 x 64 x 128 for o and down,
      64 x 128 x 128 for qkv (256 rows: down 25.7 against 31.0 µs in 128 x 32 x 128, o 7.7
      against 8.8, qkv 11.0 against 12.1; ``batch_invariance_tiles``: 2,337 tiles, same bits);
    - above 256 rows (prefill packs): 128 x 128 tiles with K chunks of 64, 256 rows for down
      above 1,024 (at 4,096 rows qkv 143 against 223 µs in decode tiles, o 94 against 165,
      down 244 against 477; cuBLAS 86, 62, 195)."""
    wide, long_k = n > WIDE_N, k > WIDE_N
    if rows <= 64:
        return MatmulTile(64, *((128, 64) if wide else (16 if n <= SMALL_N else 32, 128)), 4)
    if wide:
        return MatmulTile(128 if rows <= 128 else 256, 128, 64, 8)
    if rows <= 128:
        return MatmulTile(64, 32 if n <= SMALL_N else 64, 256 if long_k or n > SMALL_N else 128,
                          4)
    if rows <= 256:
        return MatmulTile(64, 64 if n <= SMALL_N else 128, 128, 4)
    return MatmulTile(256 if long_k and rows > 1024 else 128, 128, 64, 8)


def stages_for(block_m: int, block_n: int, block_k: int, elem_bytes: int, shared: int | None
               ) -> int:
    """Pipeline stages whose x and w tiles fit ``shared`` bytes per block (None: no limit):
    STAGES where they fit (a T4's 64 KiB holds fewer). Stages change when tiles are loaded,
    not the order of a row's products."""
    stages = STAGES
    while stages > 1 and shared is not None and (
            stages * (block_m + block_n) * block_k * elem_bytes > shared):
        stages -= 1
    return stages


def matmul(x: torch.Tensor, w: torch.Tensor, *, pdl: bool = False,
           out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x (M, K), w (N, K) -> (M, N) in ``out_dtype`` (default w's), any M: the skinny kernel in
    the tiles of :func:`matmul_tile`. (SwiGLU's product runs first in ``fused.silu_mul``: in
    this kernel's x tile every program would recompute it, 10x slower at the down projection.)"""
    n, k = w.shape
    if x.stride(1) != 1 or w.stride(1) != 1 or x.shape[1] != k:
        raise ValueError(f"invariant.matmul: x {tuple(x.shape)}, w {tuple(w.shape)}: need "
                         "x's width K and contiguous last dims")
    tile = matmul_tile(x.shape[0], n, k)
    stages = stages_for(tile.block_m, tile.block_n, tile.block_k, w.element_size(),
                        attention_plan.shared_per_block(w.device))
    return skinny.tiled(x, w, (tile.block_n, tile.block_k, tile.warps, stages), tile.block_m,
                        pdl=pdl, out_dtype=out_dtype)


@triton.jit
def _softmax_tile(q, k, v, valid, m_i, l_i, acc, scale_log2, PRECISION: tl.constexpr):
    """``attention.softmax_tile`` with the row sums taken by the tensor cores (p in v's dtype
    against ones, as p @ v takes it): a tl.sum's order follows the register layout, which the
    rows per program change (16 against 64 rows: other bits in 7 of 40 batches on an H200; as
    products 60 of 60 the same), while a dot chains its products in one order."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # (rows, TILE), fp32 accumulate
    s = tl.where(valid, s * scale_log2, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None]).to(v.dtype)
    ones = tl.full((v.shape[0], 16), 1.0, v.dtype)  # 16 equal columns: their max is the sum
    l_i = l_i * alpha + tl.max(tl.dot(p, ones, input_precision=PRECISION), axis=1)
    acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit(do_not_specialize=["chunks", "splits", "stride_bt"])
def _attn_rows_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, qs_ptr, starts_ptr, ctx_ptr, m_ptr,
                      l_ptr, acc_ptr, scale_log2, chunks, splits, stride_qt, stride_qh,
                      stride_kb, stride_kh, stride_kt, stride_bt, G: tl.constexpr,
                      GPOW: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
                      TILE: tl.constexpr, SPLIT: tl.constexpr, STAGES: tl.constexpr,
                      PRECISION: tl.constexpr, DECODE: tl.constexpr, PDL: tl.constexpr,
                      CHUNK_TILE: tl.constexpr):
    """One program per (block of query tokens of one sequence, KV head, lane): ROWS rows, the
    GQA group of each of ROWS // GPOW tokens; lane j of J computes the splits j, j + J, ... its
    rows use, each from fresh (m, l, acc) over the split's positions in TILE tiles, and writes
    each row's partials. Which program computes a split changes nothing in it, so J is free:
    the host picks it to fill the GPU (``split_lanes``) without programs for splits no row
    uses. A row's numbers depend on its query, its context and the K/V alone: the other rows
    only share the tile loads (a position past a row's context is masked to -inf, so a tile
    the row does not need adds exact zeros). DECODE: block b is token b over table row b,
    context lens[b]; else block b is a part of chunk c = ``chunk_of(b)`` (its tokens
    query_starts[c] + ..., contexts starts[c] + j + 1), and each token's context is written to
    ctx for the merge. ``splits`` (the partials' row length) and ``stride_bt`` follow a
    prefill pack's longest context: run-time values, not specialised (a pack would compile the
    kernel again for every 256 positions, or at a new case of 1 or a multiple of 16)."""
    _pdl_enter(PDL)  # q and the newest K/V come from the kernels before
    blk, kvh, lane = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    r = tl.arange(0, ROWS)
    tok = r // GPOW
    g = r % GPOW
    if DECODE:
        table = blk
        token = blk + tok * 0
        live = tok == 0
        ctx = tl.where(live, tl.load(lens_ptr + blk), 0)
    else:
        table = chunk_of(blk, qs_ptr, chunks, ROWS // GPOW, CHUNK_TILE)
        q0 = tl.load(qs_ptr + table)
        first = q0 + (blk - q0 // (ROWS // GPOW) - table) * (ROWS // GPOW)
        token = first + tok
        live = token < tl.load(qs_ptr + table + 1)
        ctx = tl.where(live, tl.load(starts_ptr + table) + token - q0 + 1, 0)
        if lane == 0 and kvh == 0:
            tl.store(ctx_ptr + token, ctx, mask=live & (g == 0))
    rmask = live & (g < G)
    d = tl.arange(0, D)
    heads = kvh * G + g
    q = tl.load(q_ptr + token.to(tl.int64)[:, None] * stride_qt + heads[:, None] * stride_qh
                + d[None, :], mask=rmask[:, None], other=0.0)  # (ROWS, D)
    kv_head = k_ptr + kvh * stride_kh
    v_head = v_ptr + kvh * stride_kh
    H = tl.num_programs(1) * G
    row_part = (token.to(tl.int64) * H + heads) * splits
    for split in range(lane, tl.cdiv(tl.max(ctx, axis=0), SPLIT), tl.num_programs(2)):
        start = split * SPLIT
        end = tl.minimum(start + SPLIT, ctx)  # (ROWS,) past a row's context: masked
        last = tl.max(end, axis=0)
        m_i = tl.full([ROWS], float("-inf"), tl.float32)
        l_i = tl.zeros([ROWS], tl.float32)
        acc = tl.zeros([ROWS, D], tl.float32)
        for i in tl.range(0, tl.cdiv(tl.maximum(last - start, 0), TILE), num_stages=STAGES):
            t = start + i * TILE + tl.arange(0, TILE)
            tmask = t < last
            k, v = kv_tile(kv_head, v_head, bt_ptr + table * stride_bt, t, tmask, d,
                           stride_kb, stride_kt, BS)
            m_i, l_i, acc = _softmax_tile(q, k, v, t[None, :] < end[:, None], m_i, l_i, acc,
                                          scale_log2, PRECISION)  # past a row's context: masked
        part = row_part + split
        used = rmask & (start < ctx)
        tl.store(m_ptr + part, m_i, mask=used)
        tl.store(l_ptr + part, l_i, mask=used)
        tl.store(acc_ptr + part[:, None] * D + d[None, :], acc, mask=used[:, None])


@triton.jit(do_not_specialize=["splits"])
def _merge_splits_in_order_kernel(m_ptr, l_ptr, acc_ptr, lens_ptr, out_ptr, splits, stride_ob,
                                  stride_oh, D: tl.constexpr, SPLIT: tl.constexpr,
                                  PDL: tl.constexpr):
    """One program per (row, head): the row's used splits (ceil(context / SPLIT)) merged in
    split order, MERGE_LANES at a time (``attention.merge_partials``): the same for any batch."""
    _pdl_enter(PDL)
    b = tl.program_id(0)
    h = tl.program_id(1)
    H = tl.num_programs(1)
    used = tl.maximum(tl.cdiv(tl.load(lens_ptr + b), SPLIT), 1)
    o = merge_partials(m_ptr, l_ptr, acc_ptr, (b.to(tl.int64) * H + h) * splits, used, D,
                       MERGE_LANES)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + tl.arange(0, D),
             o.to(out_ptr.dtype.element_ty))


def split_lanes(programs: int, splits: int, sms: int) -> int:
    """Programs per (token block, KV head) along the splits: about LANE_WAVES per SM, at most
    one per split of the widest table row (35 in a serving graph's 545-block table), each
    computing every lanes-th split its rows use; which program computes a split never
    changes its bits."""
    return max(1, min(splits, -(-LANE_WAVES * sms // programs)))


def _attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            block_tables: torch.Tensor, scale: float, *, lens: torch.Tensor | None = None,
            query_starts: torch.Tensor | None = None, starts: torch.Tensor | None = None,
            pdl: bool = False) -> torch.Tensor:
    """Decode (``lens``: one token per table row) or prefill (``query_starts``, ``starts``:
    chunks of tokens) through one kernel and its in-order merge."""
    t, h, d = q.shape
    _, hkv, bs, _ = k_cache.shape
    group = h // hkv
    gpow = triton.next_power_of_2(group)
    decode = lens is not None
    rows = max(DECODE_ROWS, gpow) if decode else ROWS
    if d & (d - 1) or d < 16 or gpow > ROWS or k_cache.stride(3) != 1 or q.stride(2) != 1:
        raise ValueError(f"invariant attention: head_dim {d} (a power of two >= 16), query "
                         f"group {group} (at most {ROWS}), contiguous last dims")
    splits = triton.cdiv(block_tables.shape[1] * bs, SPLIT)  # the widest row's
    if decode:
        blocks, chunks, ctx = t, 1, lens
    else:
        chunks = query_starts.numel() - 1
        blocks = t // (rows // gpow) + chunks
        ctx = torch.zeros(t, dtype=torch.int32, device=q.device)  # rows past the chunks: 0
    m = torch.empty((t, h, splits), dtype=torch.float32, device=q.device)
    lsum = torch.empty_like(m)
    acc = torch.empty((t, h, splits, d), dtype=torch.float32, device=q.device)
    row_bytes, shared = d * k_cache.element_size(), attention_plan.shared_per_block(q.device)
    # the K/V tiles fit what a prefill query tile leaves, in decode too: one TILE for both
    launch = attention_plan.fitted(ATTN, row_bytes, None if shared is None
                                   else shared - ROWS * row_bytes - 1024)
    lanes = split_lanes(blocks * hkv, splits, attention_plan.sm_count(q.device))
    _attn_rows_kernel[(blocks, hkv, lanes)](
        q, k_cache, v_cache, block_tables, ctx, query_starts if not decode else ctx,
        starts if not decode else ctx, ctx, m, lsum, acc, scale * 1.4426950408889634, chunks,
        splits, q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), block_tables.stride(0), G=group, GPOW=gpow, ROWS=rows, D=d, BS=bs,
        TILE=launch.tile, SPLIT=SPLIT, STAGES=launch.stages,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", DECODE=decode, PDL=pdl,
        CHUNK_TILE=CHUNK_TILE, num_warps=launch.warps, **launch_kw(pdl))
    out = torch.empty((t, h, d), dtype=q.dtype, device=q.device)
    _merge_splits_in_order_kernel[(t, h)](m, lsum, acc, ctx, out, splits, out.stride(0),
                                          out.stride(1), D=d, SPLIT=SPLIT, PDL=pdl, num_warps=1,
                                          **launch_kw(pdl))
    return out


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float, *,
                     pdl: bool = False) -> torch.Tensor:
    """``attention.paged_decode_attention``'s contract, in fixed splits of SPLIT positions."""
    return _attend(q, k_cache, v_cache, block_tables, scale, lens=context_lens, pdl=pdl)


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      block_tables: torch.Tensor, query_starts: torch.Tensor,
                      starts: torch.Tensor, scale: float, *, pdl: bool = False
                      ) -> torch.Tensor:
    """``prefill_attention.paged_prefill_attention``'s contract through the decode kernel: each
    token's rows are computed as a decode step at its position would compute them (up to
    ROWS // group tokens of a chunk share a program's K/V tiles)."""
    return _attend(q, k_cache, v_cache, block_tables, scale, query_starts=query_starts,
                   starts=starts, pdl=pdl)
