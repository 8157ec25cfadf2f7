"""Batch-invariant kernels: a row's outputs are computed in one order whatever else is in the
batch, so a request's logits are the same bits alone, in any batch, in any graph bucket, and
from prefill as from decode (``ops.InvariantOps`` runs the model on them).

A GPU forward depends on its batch where a kernel's reduction order does: cuBLAS and the
matmul choice pick other tiles (or split K) for other row counts, and decode attention splits
the context in a number of parts chosen from the batch. Here:

- **matmul** (:func:`matmul`): one kernel (``skinny``'s, tiled over the rows) and one tile for
  every row count, from 1 row to a prefill pack, per weight shape (``tile_for``: the tile
  depends on N alone). A program computes
  BLOCK_M rows x BLOCK_N columns, streams K in BLOCK_K chunks in order and accumulates in fp32
  (no split K), so each output element is the same chain of tensor-core products whatever
  the other rows; a row's place in its tile does not change its products.
- **decode attention** (:func:`decode_attention`): the context is cut in splits of a fixed
  SPLIT positions (not a fixed number of splits), each walked in fixed tiles, and the splits
  a row uses are merged one after another in order (``_merge_splits_in_order_kernel``), so
  the result depends on the row's context length and K/V alone, not on the batch nor the
  block table's width. Prefill attends through the same kernel, one row per chunk token
  (:func:`prefill_attention`), so prefill and decode give a position the same bits.

Norms, RoPE, the cache write and the SwiGLU product are per-row kernels already
(``fused``): invariant as they are. Imported lazily: GPU only (or Triton's interpreter).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from decodelab.model.triton import attention, attention_plan, skinny

BLOCK_M = 64  # rows per program: the tensor-core M of one warp group on sm_90
BLOCK_K = 64
WARPS, STAGES = 4, 3
SPLIT = 256  # context positions per attention split
ATTN = attention_plan.LaunchConfig(tile=64, stages=3, warps=2)


def tile_for(n: int) -> int:
    """BLOCK_N of a weight with ``n`` output columns: narrow tiles where N is small (more
    programs to stream the weight), whatever the number of rows."""
    return 32 if n <= 4096 else 64


def stages_for(block_n: int, elem_bytes: int, shared: int | None) -> int:
    """Pipeline stages whose x and w tiles fit ``shared`` bytes per block (None: no limit):
    STAGES where they fit (a T4's 64 KiB holds fewer fp32 ones). It depends on the GPU and the
    dtype, never on the rows, so every row count runs one compiled kernel."""
    stages = STAGES
    while stages > 1 and shared is not None and (
            stages * (BLOCK_M + block_n) * BLOCK_K * elem_bytes > shared):
        stages -= 1
    return stages


def matmul(x: torch.Tensor, w: torch.Tensor, *, swiglu: bool = False) -> torch.Tensor:
    """x (M, K) (or (M, 2K) gate|up with ``swiglu``), w (N, K) -> (M, N) in w's dtype, any M:
    the skinny kernel in fixed tiles of BLOCK_M rows."""
    n, k = w.shape
    if x.stride(1) != 1 or w.stride(1) != 1 or x.shape[1] != k * (2 if swiglu else 1):
        raise ValueError(f"invariant.matmul: x {tuple(x.shape)}, w {tuple(w.shape)}: need "
                         "x's width K (2K with swiglu) and contiguous last dims")
    block_n = tile_for(n)
    stages = stages_for(block_n, w.element_size(), attention_plan.shared_per_block(w.device))
    return skinny.tiled(x, w, (block_n, BLOCK_K, WARPS, stages), BLOCK_M, swiglu=swiglu)


@triton.jit
def _merge_splits_in_order_kernel(m_ptr, l_ptr, acc_ptr, lens_ptr, out_ptr, stride_ob,
                                  stride_oh, D: tl.constexpr, SPLITS: tl.constexpr,
                                  SPLIT: tl.constexpr):
    """One program per (row, head): the row's used splits (ceil(context / SPLIT)) merged in
    split order, starting from the first (no zero added for an unused one)."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    H = tl.num_programs(1)
    d = tl.arange(0, D)
    base = (b * H + h) * SPLITS
    used = tl.maximum(tl.cdiv(tl.load(lens_ptr + b), SPLIT), 1)
    m_max = tl.load(m_ptr + base)
    for s in range(1, used):
        m_max = tl.maximum(m_max, tl.load(m_ptr + base + s))
    w = tl.exp2(tl.load(m_ptr + base) - m_max)
    l_sum = tl.load(l_ptr + base) * w
    acc = tl.load(acc_ptr + base * D + d) * w
    for s in range(1, used):
        w = tl.exp2(tl.load(m_ptr + base + s) - m_max)
        l_sum += tl.load(l_ptr + base + s) * w
        acc += tl.load(acc_ptr + (base + s) * D + d) * w
    o = acc / l_sum
    tl.store(out_ptr + b * stride_ob + h * stride_oh + d, o.to(out_ptr.dtype.element_ty))


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float
                     ) -> torch.Tensor:
    """``attention.paged_decode_attention``'s contract, in fixed splits of SPLIT positions."""
    b, h, d = q.shape
    splits = triton.cdiv(block_tables.shape[1] * k_cache.shape[2], SPLIT)  # the widest row's
    launch = attention_plan.fitted(ATTN, d * k_cache.element_size(),
                                   attention_plan.shared_per_block(q.device))
    out, m, lsum, acc = attention.split_pass(q, k_cache, v_cache, block_tables, context_lens,
                                             scale, splits, launch, split_size=SPLIT)
    _merge_splits_in_order_kernel[(b, h)](m, lsum, acc, context_lens, out, out.stride(0),
                                          out.stride(1), D=d, SPLITS=splits, SPLIT=SPLIT,
                                          num_warps=1)
    return out


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      block_tables: torch.Tensor, query_starts: torch.Tensor,
                      starts: torch.Tensor, scale: float) -> torch.Tensor:
    """``prefill_attention.paged_prefill_attention``'s contract through the decode kernel: token
    j of chunk i is a decode row over its own sequence's table with context starts[i] + j + 1,
    the same call its position would be in a decode step."""
    t = q.shape[0]
    token = torch.arange(t, device=q.device, dtype=query_starts.dtype)
    chunk = torch.searchsorted(query_starts[1:], token, right=True)  # chunk of each token
    context = (starts[chunk] + token - query_starts[chunk] + 1).to(torch.int32)
    return decode_attention(q, k_cache, v_cache, block_tables[chunk].contiguous(), context,
                            scale)
