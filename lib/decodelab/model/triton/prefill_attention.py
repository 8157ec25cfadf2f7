"""Varlen paged prefill attention in Triton: one launch per pack, K/V read through the block
table, one compiled kernel for every packing.

One program per (query block, KV head). It takes BLOCK_Q consecutive tokens of one
chunk and the G query heads that share one KV head as one (BLOCK_Q * GP, D) tile (row r:
token r // GP, head r % GP; GP = G padded to a power of two), so each K/V tile is loaded once
for the whole group. It walks positions 0 .. its last token's position of its own sequence in
tiles of BLOCK_N, each position's block looked up in the block table (K/V read in place from
the pool: any block order, a partly filled last block, any start), with an online softmax
(running max and sum in fp32) and both products on tensor cores from sm_80 (FMA on sm_75).
The chunk's own K/V are in the cache already (the model writes them first), so the chunks and
decode steps before it are attended the same way as its own tokens. Tiles that end before the program's first query
position need no mask; the rest mask key position > query position (start offset included).

No per-shape compilation (the cold cost of SDPA's per-length execution plans): chunk offsets,
starts and lengths are read from device tensors, the block-table width is not specialized on,
and the grid depends on the row count T and the chunk count n alone, never on the lengths:
chunk i's query blocks are programs ``query_starts[i] // BLOCK_Q + i`` onwards (room for
``cdiv(len, BLOCK_Q)`` of them before chunk i + 1's), so ``T // BLOCK_Q + n`` programs cover
any pack, each finding its chunk by counting the starts at or below its own. A CUDA graph of a
padded pack (``model.prefill_graphs``: rows past the chunks, empty chunks at the end) replays
any pack of up to its rows and chunks. The constexprs are the tile sizes (fixed
here, chosen for sm_90, never autotuned: a per-shape autotune would be that cold cost again;
narrower only where they would not fit the GPU's shared memory, ``tiles_for``), head dim,
group and block size (fixed per model), and the dtype. Imported lazily: GPU only (or
Triton's interpreter). Launched without programmatic dependent launch: prefill is compute-bound.

    paged_prefill_attention(q (T, H, D), k_cache, v_cache (num_blocks, Hkv, block_size, D),
                            block_tables (n, M) int32, query_starts (n+1,) int32,
                            starts (n,) int32, scale)
        -> (T, H, D) in q's dtype; same contract as attention.paged_prefill_attention_ref.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from decodelab.model.triton import attention_plan

ROWS = 128  # query rows (tokens x padded group) per program: the tensor-core M tile
BLOCK_N = 64  # K/V positions per tile
WARPS = 4
STAGES = 2
CHUNK_TILE = 256  # chunk starts a program reads at a time while it finds its chunk
# Where (ROWS, BLOCK_N, STAGES) would not fit the GPU's shared memory per block (a T4's 64 KiB
# with head_dim 128 or a float32 cache, an L4's 99 KiB with head_dim 128), the first of these
# that does; one stage costs nothing below sm_80 (no asynchronous copies to pipeline).
NARROWER = ((ROWS, BLOCK_N, 1), (ROWS, 32, 1), (64, 64, 1), (64, 32, 1), (32, 32, 1),
            (32, 16, 1))


def shared_bytes(rows: int, block_n: int, stages: int, row_bytes: int) -> int:
    """An upper bound of the shared memory Triton 3.6 gives the kernel, in K/V row bytes (head
    dim x dtype bytes): the q tile and its dot operand (2 x rows), K and V tiles for each stage
    and one more (measured at 1.0-0.6 of it over sm_75 to sm_90; ``tests/test_triton_aot.py``
    checks every bench shape's compiled kernel against the GPU's limit)."""
    return (2 * rows + 2 * (stages + 1) * block_n) * row_bytes


def tiles_for(row_bytes: int, shared: int | None, group_rows: int = 1) -> tuple[int, int, int]:
    """(rows, BLOCK_N, STAGES) for K/V rows of ``row_bytes`` and ``shared`` bytes per block
    (None: no limit, as in the interpreter); rows stay >= ``group_rows`` (the padded group)."""
    fitting = [c for c in ((ROWS, BLOCK_N, STAGES), *NARROWER) if c[0] >= group_rows]
    for tiles in fitting:
        if shared is None or shared_bytes(*tiles, row_bytes) <= shared:
            return tiles
    return fitting[-1]

@triton.jit
def _attend_tile(q, acc, m_i, l_i, k_head, v_head, bt_row, kv0, ctx, qpos, scale_log2,
                 stride_kb, stride_kt, D: tl.constexpr, BS: tl.constexpr,
                 BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr):
    """One K/V tile (positions kv0 .. kv0 + BLOCK_N - 1) into the running softmax of q."""
    kpos = kv0 + tl.arange(0, BLOCK_N)
    d = tl.arange(0, D)
    inside = kpos < ctx  # always true where not CAUSAL: those tiles end before every query
    blk = tl.load(bt_row + kpos // BS, mask=inside, other=0).to(tl.int64)
    off = blk * stride_kb + (kpos % BS) * stride_kt  # (BLOCK_N,) each position's K/V row
    k = tl.load(k_head + off[:, None] + d[None, :], mask=inside[:, None], other=0.0)
    v = tl.load(v_head + off[:, None] + d[None, :], mask=inside[:, None], other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2  # (ROWS, BLOCK_N) log2
    if CAUSAL:
        s = tl.where(kpos[None, :] <= qpos[:, None], s, float("-inf"))
    # Every row has a finite max from tile 0 on (key 0 precedes every query), so a later tile
    # that a row masks entirely leaves it as it was: alpha = 1, p = 0.
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, m_new, l_i


@triton.jit
def chunk_of(w, qs_ptr, n, BLOCK_Q: tl.constexpr, CHUNK_TILE: tl.constexpr):
    """The chunk whose query blocks hold program ``w``: the last i with
    ``query_starts[i] // BLOCK_Q + i <= w`` (those firsts increase with i)."""
    count = 0
    for c0 in range(0, n, CHUNK_TILE):
        i = c0 + tl.arange(0, CHUNK_TILE)
        first = tl.load(qs_ptr + i, mask=i < n, other=0) // BLOCK_Q + i
        count += tl.sum(((first <= w) & (i < n)).to(tl.int32), axis=0)
    return count - 1


@triton.jit(do_not_specialize=["stride_bt", "n"])
def _prefill_attn_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, qs_ptr, st_ptr, out_ptr, scale_log2, n,
                         stride_qt, stride_qh, stride_kb, stride_kh, stride_kt, stride_bt,
                         stride_ot, stride_oh,
                         G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
                         BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr,
                         CHUNK_TILE: tl.constexpr, PRECISION: tl.constexpr):
    w = tl.num_programs(0) - 1 - tl.program_id(0)  # the costliest (latest) query blocks first
    seq = chunk_of(w, qs_ptr, n, BLOCK_Q, CHUNK_TILE)
    kvh = tl.program_id(1)
    row0 = tl.load(qs_ptr + seq)
    qb = w - (row0 // BLOCK_Q + seq)  # this program's query block within its chunk
    qlen = tl.load(qs_ptr + seq + 1) - row0
    if qb * BLOCK_Q >= qlen:  # room left for a longer chunk, or an empty (padding) chunk
        return
    start = tl.load(st_ptr + seq)
    r = tl.arange(0, BLOCK_Q * GP)
    tok = qb * BLOCK_Q + r // GP  # (ROWS,) token of each row, within the chunk
    g = r % GP
    valid = (tok < qlen) & (g < G)
    qpos = start + tok  # (ROWS,) each row's position in its sequence
    head = kvh * G + g
    d = tl.arange(0, D)
    trow = (row0 + tok).to(tl.int64)
    q = tl.load(q_ptr + trow[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=valid[:, None], other=0.0)  # (ROWS, D)
    m_i = tl.full([BLOCK_Q * GP], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q * GP], tl.float32)
    acc = tl.zeros([BLOCK_Q * GP, D], tl.float32)
    k_head = k_ptr + kvh * stride_kh
    v_head = v_ptr + kvh * stride_kh
    bt_row = bt_ptr + seq.to(tl.int64) * stride_bt
    q_first = start + qb * BLOCK_Q
    ctx = start + tl.minimum(qb * BLOCK_Q + BLOCK_Q, qlen)  # positions this block attends
    unmasked = (q_first // BLOCK_N) * BLOCK_N  # tiles before it precede every query row
    for kv0 in tl.range(0, unmasked, BLOCK_N, num_stages=STAGES):
        acc, m_i, l_i = _attend_tile(q, acc, m_i, l_i, k_head, v_head, bt_row, kv0, ctx, qpos,
                                     scale_log2, stride_kb, stride_kt, D, BS, BLOCK_N, False,
                                     PRECISION)
    for kv0 in tl.range(unmasked, ctx, BLOCK_N):
        acc, m_i, l_i = _attend_tile(q, acc, m_i, l_i, k_head, v_head, bt_row, kv0, ctx, qpos,
                                     scale_log2, stride_kb, stride_kt, D, BS, BLOCK_N, True,
                                     PRECISION)
    o = acc / l_i[:, None]
    tl.store(out_ptr + trow[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
             o.to(out_ptr.dtype.element_ty), mask=valid[:, None])


def _check(q, k_cache, v_cache, block_tables, query_starts, starts) -> None:
    t, h, d = q.shape
    n, hkv = starts.shape[0], k_cache.shape[1]
    if d & (d - 1) or d < 16 or q.stride(2) != 1 or k_cache.stride(3) != 1:
        raise ValueError(f"paged_prefill_attention: head_dim {d} must be a power of two >= 16 "
                         "with contiguous last dims")
    if v_cache.shape != k_cache.shape or v_cache.stride() != k_cache.stride():
        raise ValueError(f"paged_prefill_attention: v_cache {tuple(v_cache.shape)} must have "
                         f"k_cache's shape {tuple(k_cache.shape)} and strides")
    if h % hkv or triton.next_power_of_2(h // hkv) > ROWS:
        raise ValueError(f"paged_prefill_attention: {h} query heads over {hkv} KV heads; need "
                         f"a whole group of at most {ROWS}")
    for name, x in (("block_tables", block_tables), ("query_starts", query_starts),
                    ("starts", starts)):
        if x.dtype != torch.int32 or x.stride(-1) != 1:
            raise ValueError(f"paged_prefill_attention: {name} must be contiguous int32 (one "
                             f"compiled kernel), got {x.dtype}")
    if n < 1 or query_starts.shape != (n + 1,) or block_tables.shape[0] != n:
        raise ValueError(f"paged_prefill_attention: {n} chunks (need at least 1), "
                         f"query_starts {tuple(query_starts.shape)}, block tables "
                         f"{tuple(block_tables.shape)}; need (n+1,) and (n, M)")


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, query_starts: torch.Tensor,
                            starts: torch.Tensor, scale: float) -> torch.Tensor:
    """Rows of q past ``query_starts[n]`` (padding) are left unwritten in the output."""
    _check(q, k_cache, v_cache, block_tables, query_starts, starts)
    t, h, d = q.shape
    hkv, bs = k_cache.shape[1], k_cache.shape[2]
    group = h // hkv
    gp = triton.next_power_of_2(group)
    out = torch.empty_like(q)
    rows, block_n, stages = tiles_for(d * k_cache.element_size(),
                                      attention_plan.shared_per_block(q.device), gp)
    block_q = rows // gp
    n = starts.shape[0]
    _prefill_attn_kernel[(t // block_q + n, hkv)](
        q, k_cache, v_cache, block_tables, query_starts, starts, out,
        scale * 1.4426950408889634, n, q.stride(0), q.stride(1), k_cache.stride(0),
        k_cache.stride(1), k_cache.stride(2), block_tables.stride(0), out.stride(0),
        out.stride(1), G=group, GP=gp, D=d, BS=bs, BLOCK_Q=block_q, BLOCK_N=block_n,
        STAGES=stages, CHUNK_TILE=CHUNK_TILE,
        # fp32 caches get exact products (the reference's precision), not tf32
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=WARPS)
    return out
