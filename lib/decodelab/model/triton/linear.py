"""Single-row matmuls (batch-1 decode) in Triton.

At batch 1 every linear layer is a matrix-vector product bounded by reading the weight once.
cuBLAS's kernels for these shapes launch few thread blocks for the narrow projections (q/k/v,
o) and split the long one (down) with a separate reduction, reaching about half of the copy
bandwidth there (measured: see the ``paged_model_kernels`` table). ``gemv`` spreads the rows of
W over many programs, streams K in chunks, and can compute SwiGLU's silu(gate) * up on the fly
from the (1, 2f) gate/up vector, so the down projection needs no separate activation kernel.
``add_norm_gemv`` also takes the residual add and RMSNorm that precede the q/k/v and gate/up
projections into the gemv's prologue (each program reduces the hidden vector itself, program 0
stores h + res), so at batch 1 no separate norm kernel runs inside the layer stack.
Under programmatic dependent launch (``pdl``) a gemv loads its first weight tile before it
waits for the kernel that produces x: the weights stream while that kernel drains.

``matmul_choice.MatmulChoice`` times the tiles against cuBLAS per weight shape and keeps the
faster.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from decodelab.model.triton.pdl import launch_kw

# (BLOCK_N, BLOCK_K, num_warps) candidates; cuBLAS is always a candidate too. Wide K chunks
# put a whole row block's bytes in flight in one load (a batch-1 matmul is latency-bound per
# program); narrow ones give more iterations to overlap.
TILES = ((8, 512, 4), (16, 256, 4), (4, 1024, 4), (4, 2048, 4), (2, 2048, 4), (8, 2048, 8),
         (2, 4096, 8), (1, 8192, 8))


@triton.jit
def _residual(x_ptr, res_ptr, cols, kmask, HAS_ADD: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """The residual stream's chunk in fp32: h, or h + res rounded to the model dtype (as the
    residual stream is stored)."""
    h = tl.load(x_ptr + cols, mask=kmask, other=0.0).to(tl.float32)
    if HAS_ADD:
        r = tl.load(res_ptr + cols, mask=kmask, other=0.0).to(tl.float32)
        h = (h + r).to(OUT_DTYPE).to(tl.float32)
    return h


@triton.jit
def _gemv_x(x_ptr, res_ptr, nw_ptr, rstd, cols, kmask, K, SWIGLU: tl.constexpr,
            NORM: tl.constexpr, HAS_ADD: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """The input chunk at ``cols`` in fp32, rounded as the unfused torch ops round: with SWIGLU
    silu(gate) * up; with NORM the RMS-normed (h [+ res]) times the norm weight."""
    if SWIGLU:
        g = tl.load(x_ptr + cols, mask=kmask, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + K + cols, mask=kmask, other=0.0).to(tl.float32)
        act = (g / (1.0 + tl.exp(-g))).to(OUT_DTYPE).to(tl.float32)
        return (act * u).to(OUT_DTYPE).to(tl.float32)
    if NORM:
        y = (_residual(x_ptr, res_ptr, cols, kmask, HAS_ADD, OUT_DTYPE) * rstd)
        nw = tl.load(nw_ptr + cols, mask=kmask, other=0.0).to(tl.float32)
        return (nw * y.to(OUT_DTYPE).to(tl.float32)).to(OUT_DTYPE).to(tl.float32)
    return tl.load(x_ptr + cols, mask=kmask, other=0.0).to(tl.float32)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, y_ptr, res_ptr, nw_ptr, h_out_ptr, N, K, stride_w, eps,
                 SWIGLU: tl.constexpr, NORM: tl.constexpr, HAS_ADD: tl.constexpr,
                 EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 PDL: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_w
    dt: tl.constexpr = x_ptr.dtype.element_ty  # the model's dtype (y may be wider: logits)
    cols = tl.arange(0, BLOCK_K)
    kmask = cols < K
    # The first weight tile: no kernel writes weights, so under PDL it streams in while the
    # previous kernel (which produces x) drains.
    if EVEN_K:
        w = tl.load(w_rows + cols[None, :], mask=rmask[:, None], other=0.0)
    else:
        w = tl.load(w_rows + cols[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0)
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if NORM:  # every program reduces the (K,) vector itself; program 0 stores h + res
        ss = tl.zeros([BLOCK_K], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            c = k0 + tl.arange(0, BLOCK_K)
            h = _residual(x_ptr, res_ptr, c, c < K, HAS_ADD, dt)
            if HAS_ADD:
                tl.store(h_out_ptr + c, h.to(dt), mask=(c < K) & (tl.program_id(0) == 0))
            ss += h * h
        rstd = tl.rsqrt(tl.sum(ss, axis=0) / K + eps)
    else:
        rstd = 1.0
    acc = w.to(tl.float32) * _gemv_x(x_ptr, res_ptr, nw_ptr, rstd, cols, kmask, K, SWIGLU,
                                     NORM, HAS_ADD, dt)[None, :]
    for k0 in range(BLOCK_K, K, BLOCK_K):  # acc (BLOCK_N, BLOCK_K): reduced once, at the end
        cols = k0 + tl.arange(0, BLOCK_K)
        kmask = cols < K
        if EVEN_K:
            w = tl.load(w_rows + cols[None, :], mask=rmask[:, None], other=0.0)
        else:
            w = tl.load(w_rows + cols[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0)
        acc += w.to(tl.float32) * _gemv_x(x_ptr, res_ptr, nw_ptr, rstd, cols, kmask, K, SWIGLU,
                                          NORM, HAS_ADD, dt)[None, :]
    tl.store(y_ptr + rows, tl.sum(acc, axis=1).to(y_ptr.dtype.element_ty), mask=rmask)


def _launch(x, w, y, tile, *, res=None, norm_w=None, h_out=None, eps: float = 0.0,
            swiglu: bool = False, pdl: bool = False) -> None:
    n, k = w.shape
    block_n, block_k, warps = tile
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x, w, y, res if res is not None else x, norm_w if norm_w is not None else x,
        h_out if h_out is not None else y, n, k, w.stride(0), eps, SWIGLU=swiglu,
        NORM=norm_w is not None, HAS_ADD=res is not None, EVEN_K=k % block_k == 0,
        BLOCK_N=block_n, BLOCK_K=block_k, PDL=pdl, num_warps=warps, num_stages=3,
        **launch_kw(pdl))


def gemv(x: torch.Tensor, w: torch.Tensor, tile: tuple[int, int, int], *,
         swiglu: bool = False, pdl: bool = False, out_dtype: torch.dtype | None = None
         ) -> torch.Tensor:
    """x (1, K) (or (1, 2K) gate|up with ``swiglu``), w (N, K) -> (1, N) in ``out_dtype``
    (default w's: float32 gives the fp32 sum unrounded)."""
    y = torch.empty((1, w.shape[0]), dtype=out_dtype or w.dtype, device=w.device)
    _launch(x, w, y, tile, swiglu=swiglu, pdl=pdl)
    return y


def add_norm_gemv(h: torch.Tensor, res: torch.Tensor | None, norm_w: torch.Tensor, eps: float,
                  w: torch.Tensor, tile: tuple[int, int, int], *, pdl: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """One kernel for the residual add, RMSNorm and the batch-1 matmul after it:
    h_new = h + res (h itself without ``res``), y = w @ (rms_norm(h_new) * norm_w).
    h (1, K) is not modified; returns (h_new (1, K), y (1, N))."""
    y = torch.empty((1, w.shape[0]), dtype=w.dtype, device=w.device)
    h_new = torch.empty_like(h) if res is not None else h
    _launch(h, w, y, tile, res=res, norm_w=norm_w, h_out=h_new, eps=eps, pdl=pdl)
    return h_new, y
