"""Which kernel runs each matmul of the decode step: per weight shape and row count, cuBLAS
against the Triton candidates (``linear.gemv`` tiles at one row, ``skinny`` tiles at 2 to
``skinny.MAX_ROWS`` rows), the fastest kept, so a shape where cuBLAS wins stays on cuBLAS.

Each candidate is first checked against cuBLAS (a wrong kernel never wins on speed), then timed
on the device as the captured step runs it: device time inside a CUDA graph, cycling over
weight copies larger than the L2 cache. One row is decided at model construction; more rows
when the model's graphs announce their batch buckets (``PagedLlama.tune_rows``), before any
capture; no decision changes afterwards. A measurement is kept for the process, so a model of
the same shapes built later (a test, the bench's serial comparison) reuses it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from triton.runtime.errors import OutOfResources

from decodelab.core.timing import time_graph_replays
from decodelab.model.pdl_policy import for_rows
from decodelab.model.triton import linear, skinny
from decodelab.model.triton.fused import silu_mul

Key = tuple[int, int, bool, int]  # (n, k, swiglu, rows)
Tile = tuple[int, ...]
# Bytes of weight copies cycled through while timing, so timed calls stream from HBM as in a
# real step instead of hitting the L2 cache.
TIMING_BYTES = 512 << 20
MAX_REL_ERR = 2e-2  # a candidate further than this from cuBLAS (bf16 rounding) is a bug
_MEASURED: dict[tuple, tuple[Tile | None, dict[str, float]]] = {}


def cublas(x: torch.Tensor, w: torch.Tensor, swiglu: bool,
           out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The library's matmul. ``out_dtype`` float32 on CUDA half inputs: cuBLAS writes its fp32
    accumulator (no rounding to the model dtype, no separate cast kernel); elsewhere the
    product in the model dtype, widened."""
    x = silu_mul(x) if swiglu else x
    if w.is_cuda and out_dtype == torch.float32 and w.dtype in (torch.bfloat16, torch.float16):
        return torch.mm(x, w.t(), out_dtype=out_dtype)
    y = F.linear(x, w)
    return y if out_dtype in (None, w.dtype) else y.to(out_dtype)


def tunable(rows: int) -> bool:
    """Row counts with Triton candidates (more rows: cuBLAS, untimed)."""
    return 1 <= rows <= skinny.MAX_ROWS


def candidate_name(rows: int, tile: Tile | None) -> str:
    if tile is None:
        return "cublas"
    if rows == 1:
        return f"gemv_{tile[0]}x{tile[1]}w{tile[2]}"
    return f"skinny_{tile[0]}x{tile[1]}w{tile[2]}s{tile[3]}"


def _run(rows: int) -> Callable:
    return linear.gemv if rows == 1 else skinny.skinny


def _tiles(k: int, rows: int) -> tuple[Tile, ...]:
    if rows == 1:  # a K chunk wider than the row only masks: skip it
        return tuple(t for t in linear.TILES if t[1] <= 1 << (k - 1).bit_length())
    return skinny.TILES


def _time_us(fn: Callable[[int], object], n_weights: int, reps: int = 3) -> float:
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


def _measure(w: torch.Tensor, swiglu: bool, rows: int, pdl: bool, out_dtype: torch.dtype | None
             ) -> tuple[Tile | None, dict[str, float]]:
    """(the fastest tile, or None for cuBLAS; µs per call of every candidate by name, NaN
    where a tile needs more on-chip memory than this GPU has)."""
    x = torch.randn((rows, w.shape[1] * (2 if swiglu else 1)), dtype=w.dtype, device=w.device)
    ref = cublas(x, w, swiglu, out_dtype).float()
    nbytes = w.numel() * w.element_size()
    ws = [w] + [w.clone() for _ in range(max(0, min(32, TIMING_BYTES // nbytes) - 1))]
    times = {"cublas": _time_us(lambda i: cublas(x, ws[i], swiglu, out_dtype), len(ws))}
    best, best_us, run = None, times["cublas"], _run(rows)
    for tile in _tiles(w.shape[1], rows):
        name = candidate_name(rows, tile)
        try:
            out = run(x, w, tile, swiglu=swiglu, pdl=pdl, out_dtype=out_dtype)
        except OutOfResources:  # this tile's pipeline does not fit this GPU: not a candidate
            times[name] = math.nan
            continue
        err = float((out.float() - ref).abs().max() / ref.abs().max())
        if err > MAX_REL_ERR:
            raise AssertionError(f"{name} on {tuple(w.shape)} x {rows} rows: rel err {err:.3g}")
        times[name] = _time_us(
            lambda i, tile=tile: run(x, ws[i], tile, swiglu=swiglu, pdl=pdl,
                                     out_dtype=out_dtype), len(ws))
        if times[name] < best_us:
            best, best_us = tile, times[name]
    ws.clear()  # give the timing copies back
    torch.cuda.empty_cache()
    return best, times


class MatmulChoice:
    """Per (n, k, swiglu, rows): the tile of the fastest Triton candidate, or None (cuBLAS).
    With ``pdl`` the Triton candidates of steps up to ``pdl_policy.MAX_ROWS`` rows are launched (and
    timed) with programmatic dependent launch, as back-to-back kernels of a step run them.
    A weight is tuned in the output dtype it runs in (``out_dtype``: the LM head writes fp32
    logits; every other matmul the model dtype). A given ``choice`` is kept untimed."""

    def __init__(self, pdl: bool = False, choice: dict[Key, Tile | None] | None = None) -> None:
        self.pdl = pdl
        self.choice: dict[Key, Tile | None] = dict(choice or {})
        self.timings: dict[Key, dict[str, float]] = {}

    def tune(self, w: torch.Tensor, swiglu: bool = False, rows: int = 1,
             out_dtype: torch.dtype | None = None) -> None:
        key = (*w.shape, swiglu, rows)
        if key in self.choice or not tunable(rows):
            return
        pdl = for_rows(self.pdl, rows)
        measured = (w.device.index, w.dtype, out_dtype, pdl, key)
        if measured not in _MEASURED:
            _MEASURED[measured] = _measure(w, swiglu, rows, pdl, out_dtype)
        self.choice[key], self.timings[key] = _MEASURED[measured]

    def tile(self, w: torch.Tensor, swiglu: bool, rows: int) -> Tile | None:
        return self.choice.get((*w.shape, swiglu, rows))

    def __call__(self, x: torch.Tensor, w: torch.Tensor, swiglu: bool = False,
                 out_dtype: torch.dtype | None = None) -> torch.Tensor:
        rows = x.shape[0]
        tile = self.tile(w, swiglu, rows)
        if tile is None:
            return cublas(x, w, swiglu, out_dtype)
        return _run(rows)(x, w, tile, swiglu=swiglu, pdl=for_rows(self.pdl, rows),
                          out_dtype=out_dtype)
