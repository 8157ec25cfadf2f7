"""Matmuls of a few rows (batched decode, 2 to :data:`MAX_ROWS` tokens) in Triton.

At batch 8-64 a projection is still bound by reading its weight once: y (M, N) = x (M, K) @
W^T is a thin GEMM whose M rows fit one tensor-core tile. ``skinny`` gives each program
BLOCK_N rows of W and all M rows of x (padded to BLOCK_M >= 16, the smallest tensor-core M),
streams K in chunks and accumulates x @ W^T in fp32, on tensor cores from sm_80 (below, on a
T4, Triton 3.6 compiles the dot to FMA instructions, and cuBLAS's fp16 tensor cores usually
win the timing): W is read exactly once,
x (a few KB) from cache. With ``swiglu`` the input is silu(gate) * up of a (M, 2K) gate|up
matrix, computed per chunk (no separate activation kernel). ``matmul_choice.MatmulChoice``
times it against cuBLAS per weight shape and row count, inside a CUDA graph, and keeps the
faster.
Imported lazily: GPU only (or Triton's interpreter).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from decodelab.model.triton.pdl import launch_kw

# Above this cuBLAS's own tiles are the better fit: only cuBLAS is timed. On an H200 at
# Llama-3.2-1B shapes, this kernel in row tiles of 32-128 (N tiles 32-128, K tiles 64-128)
# lost to cuBLAS at every shape from 96 to 256 rows (o-proj 6.8-9.4 against 6.4-6.7 µs,
# gate|up 24-32 against 20-26 µs, the LM head 145-300 against 140-196 µs).
MAX_ROWS = 64
# (BLOCK_N, BLOCK_K, num_warps, num_stages): a few shapes between many narrow programs (more in
# flight across the GPU) and fewer wide ones (longer contiguous reads per row).
TILES = ((16, 256, 4, 4), (32, 128, 4, 4), (32, 256, 4, 3), (64, 128, 4, 3))


# M follows the rows (a prefill pack's tokens in ``tiled``): not specialised, so a pack whose
# token count is first a multiple of 16 compiles nothing.
@triton.jit(do_not_specialize=["M"])
def _skinny_kernel(x_ptr, w_ptr, y_ptr, M, N, K, stride_x, stride_w, stride_y,
                   SWIGLU: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # x comes from the kernel before
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    dt: tl.constexpr = x_ptr.dtype.element_ty  # the model's dtype (y may be wider: logits)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)  # one M tile here; ``tiled``: more
    nmask, mmask = n < N, m < M
    w_rows = w_ptr + n.to(tl.int64)[:, None] * stride_w
    x_rows = x_ptr + m.to(tl.int64)[:, None] * stride_x
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        c = k0 + tl.arange(0, BLOCK_K)
        kmask = c < K
        w = tl.load(w_rows + c[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
        xmask = mmask[:, None] & kmask[None, :]
        if SWIGLU:  # silu(gate) * up, rounded as F.silu(gate) * up would round
            g = tl.load(x_rows + c[None, :], mask=xmask, other=0.0).to(tl.float32)
            u = tl.load(x_rows + K + c[None, :], mask=xmask, other=0.0).to(tl.float32)
            act = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
            x = (act * u).to(dt)
        else:
            x = tl.load(x_rows + c[None, :], mask=xmask, other=0.0)
        acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)  # (BLOCK_M, BLOCK_N)
    out = y_ptr + m.to(tl.int64)[:, None] * stride_y + n[None, :]
    tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])


def skinny(x: torch.Tensor, w: torch.Tensor, tile: tuple[int, int, int, int], *,
           swiglu: bool = False, pdl: bool = False, out_dtype: torch.dtype | None = None
           ) -> torch.Tensor:
    """x (M, K) (or (M, 2K) gate|up with ``swiglu``), w (N, K) -> (M, N), 2 <= M <= MAX_ROWS,
    in ``out_dtype`` (default w's: float32 gives the fp32 accumulator unrounded)."""
    rows = x.shape[0]
    if not 1 <= rows <= MAX_ROWS or x.stride(1) != 1 or w.stride(1) != 1:
        raise ValueError(f"skinny: {rows} rows (allowed 1..{MAX_ROWS}), contiguous last dims")
    return tiled(x, w, tile, max(16, triton.next_power_of_2(rows)), swiglu=swiglu, pdl=pdl,
                 out_dtype=out_dtype)


def tiled(x: torch.Tensor, w: torch.Tensor, tile: tuple[int, int, int, int], block_m: int, *,
          swiglu: bool = False, pdl: bool = False, out_dtype: torch.dtype | None = None
          ) -> torch.Tensor:
    """The same kernel over any number of rows, in tiles of ``block_m`` rows (one program per
    BLOCK_N columns and tile): ``skinny`` is its single tile; ``invariant.matmul`` picks the
    tile by the rows (``invariant.matmul_tile``)."""
    rows, (n, k) = x.shape[0], w.shape
    block_n, block_k, warps, stages = tile
    y = torch.empty((rows, n), dtype=out_dtype or w.dtype, device=w.device)
    _skinny_kernel[(triton.cdiv(n, block_n), triton.cdiv(rows, block_m))](
        x, w, y, rows, n, k, x.stride(0), w.stride(0), y.stride(0), SWIGLU=swiglu,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        # fp32 weights get exact products (the reference's precision), not tf32
        PRECISION="ieee" if w.dtype == torch.float32 else "tf32", PDL=pdl, num_warps=warps,
        num_stages=stages, **launch_kw(pdl))
    return y
