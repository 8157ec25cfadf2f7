"""Single-row matmuls (batch-1 decode) in Triton, chosen per weight shape against cuBLAS.

At batch 1 every linear layer is a matrix-vector product bounded by reading the weight once.
cuBLAS's kernels for these shapes launch few thread blocks for the narrow projections (q/k/v,
o) and split the long one (down) with a separate reduction, reaching about half of the copy
bandwidth there (measured: see the ``paged_model_kernels`` table). ``gemv`` spreads the rows of
W over many programs, streams K in chunks, and can compute SwiGLU's silu(gate) * up on the fly
from the (1, 2f) gate/up vector, so the down projection needs no separate activation kernel.
Under programmatic dependent launch (``pdl``) a gemv loads its first weight tile before it
waits for the kernel that produces x: the weights stream while that kernel drains.

``LinearPlan`` times each candidate (cuBLAS and a few tile shapes) once per weight shape on
the device — device time inside a CUDA graph, cycling over weight copies larger than the L2
cache, i.e. as the captured step runs it — and keeps the fastest, so a shape where cuBLAS wins
stays on cuBLAS. Decisions are made at model construction, before any graph capture, and never
change afterwards.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from decodelab.core.timing import time_graph_replays
from decodelab.model.triton.fused import silu_mul
from decodelab.model.triton.pdl import launch_kw

# (BLOCK_N, BLOCK_K, num_warps) candidates; cuBLAS is always a candidate too. Wide K chunks
# put a whole row block's bytes in flight in one load (a batch-1 matmul is latency-bound per
# program); narrow ones give more iterations to overlap.
TILES = ((8, 512, 4), (16, 256, 4), (4, 1024, 4), (4, 2048, 4), (2, 2048, 4), (8, 2048, 8),
         (2, 4096, 8), (1, 8192, 8))
# Bytes of weight copies cycled through while timing, so timed calls stream from HBM as in a
# real step instead of hitting the L2 cache.
TIMING_BYTES = 512 << 20


@triton.jit
def _gemv_x(x_ptr, cols, kmask, K, SWIGLU: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """The input chunk at ``cols`` in fp32; with SWIGLU silu(gate) * up, rounded as
    F.silu(gate) * up would round."""
    if SWIGLU:
        g = tl.load(x_ptr + cols, mask=kmask, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + K + cols, mask=kmask, other=0.0).to(tl.float32)
        act = (g / (1.0 + tl.exp(-g))).to(OUT_DTYPE).to(tl.float32)
        return (act * u).to(OUT_DTYPE).to(tl.float32)
    return tl.load(x_ptr + cols, mask=kmask, other=0.0).to(tl.float32)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, y_ptr, N, K, stride_w, SWIGLU: tl.constexpr,
                 EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 PDL: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_w
    dt: tl.constexpr = y_ptr.dtype.element_ty
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
    acc = w.to(tl.float32) * _gemv_x(x_ptr, cols, kmask, K, SWIGLU, dt)[None, :]
    for k0 in range(BLOCK_K, K, BLOCK_K):  # acc (BLOCK_N, BLOCK_K): reduced once, at the end
        cols = k0 + tl.arange(0, BLOCK_K)
        kmask = cols < K
        if EVEN_K:
            w = tl.load(w_rows + cols[None, :], mask=rmask[:, None], other=0.0)
        else:
            w = tl.load(w_rows + cols[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0)
        acc += w.to(tl.float32) * _gemv_x(x_ptr, cols, kmask, K, SWIGLU, dt)[None, :]
    tl.store(y_ptr + rows, tl.sum(acc, axis=1).to(dt), mask=rmask)


def gemv(x: torch.Tensor, w: torch.Tensor, tile: tuple[int, int, int], *,
         swiglu: bool = False, pdl: bool = False) -> torch.Tensor:
    """x (1, K) (or (1, 2K) gate|up with ``swiglu``), w (N, K) -> (1, N)."""
    n, k = w.shape
    block_n, block_k, warps = tile
    y = torch.empty((1, n), dtype=w.dtype, device=w.device)
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x, w, y, n, k, w.stride(0), SWIGLU=swiglu, EVEN_K=k % block_k == 0, BLOCK_N=block_n,
        BLOCK_K=block_k, PDL=pdl, num_warps=warps, num_stages=3, **launch_kw(pdl))
    return y


def _cublas(x: torch.Tensor, w: torch.Tensor, swiglu: bool) -> torch.Tensor:
    return F.linear(silu_mul(x) if swiglu else x, w)


def _time_us(fn, n_weights: int, reps: int = 3) -> float:
    """Device time per call of ``fn(i)`` (i cycles over ``n_weights`` weight copies), from
    CUDA-graph replays so host launch cost is not counted, as in the captured decode step."""
    calls = max(n_weights, 16)
    for i in range(n_weights):
        fn(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i % n_weights)
    return time_graph_replays(graph, reps) * 1e6 / calls  # µs per call


class LinearPlan:
    """Per weight shape (and SwiGLU flag): the fastest of cuBLAS and the ``gemv`` tiles at one
    row; more rows always go to cuBLAS. With ``pdl`` the gemv tiles are launched (and timed)
    with programmatic dependent launch, as back-to-back kernels of a step run them."""

    def __init__(self, pdl: bool = False, choice: dict | None = None) -> None:
        self.pdl = pdl
        # (n, k, swiglu) -> gemv tile, or None for cuBLAS; a given ``choice`` is kept untimed
        self.choice: dict[tuple[int, int, bool], tuple[int, int, int] | None] = dict(choice or {})
        self.timings: dict[tuple[int, int, bool], dict[str, float]] = {}

    def tune(self, w: torch.Tensor, swiglu: bool = False) -> None:
        key = (*w.shape, swiglu)
        if key in self.choice:
            return
        width = w.shape[1] * (2 if swiglu else 1)
        x = torch.randn((1, width), dtype=w.dtype, device=w.device)
        ref = _cublas(x, w, swiglu)
        nbytes = w.numel() * w.element_size()
        ws = [w] + [w.clone() for _ in range(max(0, min(32, TIMING_BYTES // nbytes) - 1))]
        times = {"cublas": _time_us(lambda i: _cublas(x, ws[i], swiglu), len(ws))}
        best, best_us = None, times["cublas"]
        for tile in TILES:
            if tile[1] > triton.next_power_of_2(w.shape[1]):
                continue
            out = gemv(x, w, tile, swiglu=swiglu, pdl=self.pdl)
            err = float((out.float() - ref.float()).abs().max() / ref.float().abs().max())
            if err > 2e-2:  # a wrong kernel never wins on speed
                raise AssertionError(f"gemv {tile} on {tuple(w.shape)}: rel err {err:.3g}")
            us = _time_us(lambda i, tile=tile: gemv(x, ws[i], tile, swiglu=swiglu, pdl=self.pdl),
                          len(ws))
            times[f"gemv_{tile[0]}x{tile[1]}w{tile[2]}"] = us
            if us < best_us:
                best, best_us = tile, us
        self.choice[key], self.timings[key] = best, times
        ws.clear()  # give the timing copies back
        torch.cuda.empty_cache()

    def __call__(self, x: torch.Tensor, w: torch.Tensor, swiglu: bool = False) -> torch.Tensor:
        tile = self.choice.get((*w.shape, swiglu)) if x.shape[0] == 1 else None
        if tile is None:
            return _cublas(x, w, swiglu)
        return gemv(x, w, tile, swiglu=swiglu, pdl=self.pdl)
