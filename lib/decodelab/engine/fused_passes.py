"""The row x chunk passes of the fused sampler (``fused_sampler`` has the whole design), and
the Triton helpers both files share: the order-preserving key of a float, the gap bins, the
load of a row's (penalised) logits, the cut-off bin that the histogram gives. GPU only,
imported lazily.
"""

from __future__ import annotations

import triton
import triton.language as tl

from decodelab.engine.requests import GREEDY_BELOW

CHUNK = 8192  # tokens per program of the row x chunk kernels
TILE = 2048
NB = 128  # gap bins
BUF = 1024  # candidates a row's program solves in registers
BIN_BASE = tl.constexpr((119 << 3) - 1)  # (bits of 2^-8) >> 20, less one: bin 0 is g < 2^-8
GREEDY = tl.constexpr(GREEDY_BELOW)
KEY_NINF = tl.constexpr(-2139095041)  # order_key(-inf)


@triton.jit
def order_key(z):
    """float32 -> int32 in the same order (NaN aside; -0.0 is made +0.0 on load)."""
    b = z.to(tl.int32, bitcast=True)
    return b ^ ((b >> 31) & 0x7FFFFFFF)


@triton.jit
def from_key(k):
    k = k.to(tl.int32)
    return (k ^ ((k >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)


@triton.jit
def gap_bin(z, zmax, NB: tl.constexpr):
    g = zmax - z  # >= 0: its int bits are in its order
    b = (g.to(tl.int32, bitcast=True) >> 20) - BIN_BASE
    return tl.minimum(tl.maximum(b, 0), NB - 1)


@triton.jit
def has_penalties(rep_ptr, pres_ptr, freq_ptr, row):
    return ((tl.load(rep_ptr + row) != 1.0) | (tl.load(pres_ptr + row) != 0.0)
            | (tl.load(freq_ptr + row) != 0.0))


@triton.jit
def load_z(l_ptr, l_stride, w_ptr, pen, row, offs, mask, V, PENALTIES: tl.constexpr):
    """z of tokens ``offs`` of ``row``: the penalised copy for a row with penalties."""
    z = tl.load(l_ptr + row * l_stride + offs, mask=mask, other=float("-inf")).to(tl.float32)
    if PENALTIES:  # noqa: SIM102 - a compile-time branch around a run-time one
        if pen:
            z = tl.load(w_ptr + row * V + offs, mask=mask, other=float("-inf"))
    return tl.where(z == 0.0, 0.0, z)


@triton.jit
def stats_kernel(l_ptr, l_stride, w_ptr, counts_ptr, prompt_ptr, slot_ptr, rep_ptr, pres_ptr,
           freq_ptr, cmax_ptr, carg_ptr, cbad_ptr, V, C,
           PENALTIES: tl.constexpr, CHUNK: tl.constexpr, TILE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    best = tl.full((), float("-inf"), tl.float32)
    arg = tl.full((), 0, tl.int32)
    bad = tl.full((), 0, tl.int32)
    for t in range(0, CHUNK, TILE):
        offs = c * CHUNK + t + tl.arange(0, TILE)
        mask = offs < V
        z = tl.load(l_ptr + row * l_stride + offs, mask=mask, other=float("-inf")).to(tl.float32)
        if PENALTIES:  # noqa: SIM102 - a compile-time branch around a run-time one
            if has_penalties(rep_ptr, pres_ptr, freq_ptr, row):
                slot = tl.load(slot_ptr + row).to(tl.int64)
                rep = tl.load(rep_ptr + row)
                cnt = tl.load(counts_ptr + slot * V + offs, mask=mask, other=0)
                seen = (cnt > 0) | (tl.load(prompt_ptr + slot * V + offs, mask=mask, other=0) != 0)
                z = tl.where(seen, tl.where(z > 0, tl.div_rn(z, rep), z * rep), z)
                z = (z - tl.load(freq_ptr + row) * cnt.to(tl.float32)
                     - tl.load(pres_ptr + row) * (cnt > 0).to(tl.float32))
                tl.store(w_ptr + row * V + offs, z, mask=mask)
        z = tl.where(z == 0.0, 0.0, z)
        bad = tl.maximum(bad, tl.max(((z != z) | (z == float("inf"))).to(tl.int32), axis=0))
        m = tl.max(z, axis=0)
        a = tl.argmax(z, axis=0, tie_break_left=True)
        arg = tl.where(m > best, c * CHUNK + t + a, arg)
        best = tl.maximum(best, m)
    tl.store(cmax_ptr + row * C + c, best)
    tl.store(carg_ptr + row * C + c, arg)
    tl.store(cbad_ptr + row * C + c, bad)


@triton.jit
def row_max(cmax_ptr, row, C, CP2: tl.constexpr):
    ch = tl.arange(0, CP2)
    return tl.max(tl.load(cmax_ptr + row * C + ch, mask=ch < C, other=float("-inf")), axis=0)


@triton.jit
def histogram_kernel(l_ptr, l_stride, w_ptr, rep_ptr, pres_ptr, freq_ptr, temp_ptr, invt_ptr,
               cmax_ptr, hist_ptr, cmass_ptr, V, C, PENALTIES: tl.constexpr,
               CHUNK: tl.constexpr, TILE: tl.constexpr, CP2: tl.constexpr, NB: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    if tl.load(temp_ptr + row) >= GREEDY:
        pen = has_penalties(rep_ptr, pres_ptr, freq_ptr, row)
        zmax = row_max(cmax_ptr, row, C, CP2)
        invt = tl.load(invt_ptr + row)
        counts = tl.zeros((NB,), tl.int32)
        mass = tl.full((), 0.0, tl.float32)
        for t in range(0, CHUNK, TILE):
            offs = c * CHUNK + t + tl.arange(0, TILE)
            mask = offs < V
            z = load_z(l_ptr, l_stride, w_ptr, pen, row, offs, mask, V, PENALTIES)
            counts += tl.histogram(gap_bin(z, zmax, NB), NB, mask=mask)
            mass += tl.sum(tl.where(mask, tl.exp((z - zmax) * invt), 0.0), axis=0)
        tl.store(hist_ptr + (row * C + c) * NB + tl.arange(0, NB), counts)
        tl.store(cmass_ptr + row * C + c, mass)


@triton.jit
def cutoff_bin(hist_ptr, topk_ptr, row, V, C, CP2: tl.constexpr, NB: tl.constexpr,
               BUF: tl.constexpr):
    """The row's cut-off gap bin b* from its histogram (the first bin reaching k tokens; with
    no top-k the last whose tokens fit the buffer): (b*, tokens with bin <= b* per chunk
    (CP2,), the row has a top-k, k)."""
    ch = tl.arange(0, CP2)
    bins = tl.arange(0, NB)
    h = tl.load(hist_ptr + (row * C + ch[:, None]) * NB + bins[None, :], mask=ch[:, None] < C,
                other=0)  # (CP2, NB)
    cum = tl.cumsum(tl.sum(h, axis=0), axis=0)  # (NB,) tokens with bin <= b
    k = tl.load(topk_ptr + row)
    has_k = k < V
    first_k = tl.sum((cum < k).to(tl.int32), axis=0)  # the first bin reaching k tokens
    last_fit = tl.sum((cum <= BUF).to(tl.int32), axis=0) - 1
    bstar = tl.where(has_k, first_k, last_fit)
    per_chunk = tl.sum(tl.where(bins[None, :] <= bstar, h, 0), axis=1)
    return bstar, per_chunk, has_k, k


@triton.jit
def gather_kernel(l_ptr, l_stride, w_ptr, rep_ptr, pres_ptr, freq_ptr, temp_ptr, topk_ptr, cmax_ptr,
            hist_ptr, bufz_ptr, bufi_ptr, cout_ptr, V, C, PENALTIES: tl.constexpr,
            CHUNK: tl.constexpr, TILE: tl.constexpr, CP2: tl.constexpr, NB: tl.constexpr,
            BUF: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    if tl.load(temp_ptr + row) >= GREEDY:
        pen = has_penalties(rep_ptr, pres_ptr, freq_ptr, row)
        bstar, per_chunk, _, _ = cutoff_bin(hist_ptr, topk_ptr, row, V, C, CP2, NB, BUF)
        fits = tl.sum(per_chunk, axis=0) <= BUF
        off = tl.sum(tl.where(tl.arange(0, CP2) < c, per_chunk, 0), axis=0)
        zmax = row_max(cmax_ptr, row, C, CP2)
        left_out = tl.full((), float("-inf"), tl.float32)
        for t in range(0, CHUNK, TILE):
            offs = c * CHUNK + t + tl.arange(0, TILE)
            mask = offs < V
            z = load_z(l_ptr, l_stride, w_ptr, pen, row, offs, mask, V, PENALTIES)
            inb = mask & (gap_bin(z, zmax, NB) <= bstar)
            if fits:
                pos = row * BUF + off + tl.cumsum(inb.to(tl.int32), axis=0) - 1
                tl.store(bufz_ptr + pos, z, mask=inb)
                tl.store(bufi_ptr + pos, offs, mask=inb)
            off += tl.sum(inb.to(tl.int32), axis=0)
            left_out = tl.maximum(left_out, tl.max(tl.where(mask & ~inb, z, float("-inf")),
                                                    axis=0))
        tl.store(cout_ptr + row * C + c, left_out)
