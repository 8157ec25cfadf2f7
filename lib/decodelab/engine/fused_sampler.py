"""The fused sampler: penalties, temperature, top-k, top-p, min-p, the draw and the step's
bookkeeping for a whole batch in Triton kernels, without sorting the vocabulary (GPU only,
imported lazily). It computes ``sampler``'s rule (same kept set, same token-id-order draw
from the same uniform); float sums run in another order, so a uniform or a top-p mass within
rounding of a boundary may resolve the other way.

Row x chunk kernels run one program per TOKENS_PER_PROGRAM tokens of a row; row kernels one
program per row. Every row kind reads its logits a few times, in parallel over its chunks:

1. ``stats_kernel`` (row x chunk): the penalised logits z (stored for rows with penalties
   only), the chunk's maximum m_c, its first argmax, a NaN / +inf flag, and for sampling
   rows the chunk's mass against its own maximum, sum of exp((z - m_c) / T) (online, tile by
   tile).
2. ``histogram_kernel`` (row x chunk): min-p alone: the chunk's kept mass (e >= min_p, with
   e = exp((z - z_max) / T)). Rows with a top-k or a top-p: the gap g = z_max - z in NB bins
   (the float's bits: exponent and 3 mantissa bits, so a bin's tokens are a range of z) and
   the chunk's mass. Integer counts: no order to depend on.
3. ``gather_kernel`` (row x chunk), rows with a top-k or a top-p: from the row's histogram,
   the gap bin b* (the first that holds the top-k, or for a row without top-k the last
   whose tokens fit BUF), then each chunk copies its tokens with bin <= b* into the row's
   buffer in token order, at the offset the histograms give (no atomics), and reports the
   largest z it left out.
4. ``solve_kernel`` (row), rows with a top-k or a top-p: if the threshold provably lies in
   the buffer, sorting its values (at most BUF, in registers) gives tau_k and tau_p; else
   exact passes over the row (bisection on the order-preserving integer key of z).
5. ``kept_kernel`` (row x chunk), rows with a threshold: the chunk's kept mass.
6. ``pick_kernel`` (row x chunk): the draw by the inverse CDF in token-id order. Every
   program of a row finds, from the chunks' kept masses (plain rows: their masses of step 1
   rescaled by exp((m_c - z_max) / T)), the chunk where the running mass reaches u * total;
   that chunk's program scans its tokens for the first whose running mass reaches it (or,
   within rounding of the chunk's end, its last kept token). Greedy and non-finite rows:
   chunk 0 takes the argmax. The owner writes the output row, ``last_token[slot]`` and the
   penalty count of the sampled token.

Plain temperature is then two passes over the logits (steps 1 and 6), min-p alone three.
A row's work depends only on its own logits and parameters: the same token alone or in any
batch, with or without penalties in other rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from decodelab.engine.requests import GREEDY_BELOW

if TYPE_CHECKING:  # the reference imports this module lazily: no circle
    from decodelab.engine.sampler import PenaltyState, RowParams, SamplerMode


TOKENS_PER_PROGRAM = 8192  # tokens of a row each program of the row x chunk kernels reads
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
                 freq_ptr, temp_ptr, invt_ptr, cmax_ptr, carg_ptr, cbad_ptr, cnorm_ptr, V, C,
                 PENALTIES: tl.constexpr, SAMPLING: tl.constexpr, PER_PROGRAM: tl.constexpr,
                 TILE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    best = tl.full((), float("-inf"), tl.float32)
    arg = tl.full((), 0, tl.int32)
    bad = tl.full((), 0, tl.int32)
    norm = tl.full((), 0.0, tl.float32)  # sum of exp((z - best) / T) over the tiles so far
    sampling = tl.load(temp_ptr + row) >= GREEDY
    invt = tl.load(invt_ptr + row)
    for t in range(0, PER_PROGRAM, TILE):
        offs = c * PER_PROGRAM + t + tl.arange(0, TILE)
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
        arg = tl.where(m > best, c * PER_PROGRAM + t + a, arg)
        if SAMPLING:  # noqa: SIM102 - a compile-time branch around a run-time one
            if sampling:  # the chunk's mass against its running maximum (online softmax)
                new = tl.maximum(best, m)
                scale = tl.where(new == float("-inf"), 0.0, tl.exp((best - new) * invt))
                add = tl.where(mask & (new > float("-inf")), tl.exp((z - new) * invt), 0.0)
                norm = norm * scale + tl.sum(add, axis=0)
        best = tl.maximum(best, m)
    tl.store(cmax_ptr + row * C + c, best)
    tl.store(carg_ptr + row * C + c, arg)
    tl.store(cbad_ptr + row * C + c, bad)
    tl.store(cnorm_ptr + row * C + c, norm)


@triton.jit
def row_max(cmax_ptr, row, C, CP2: tl.constexpr):
    ch = tl.arange(0, CP2)
    return tl.max(tl.load(cmax_ptr + row * C + ch, mask=ch < C, other=float("-inf")), axis=0)


@triton.jit
def filtered(topk_ptr, topp_ptr, row, V):
    """The row has a threshold to find: a top-k or a top-p."""
    return (tl.load(topk_ptr + row) < V) | (tl.load(topp_ptr + row) < 1.0)


@triton.jit
def scan_chunk(l_ptr, l_stride, w_ptr, pen, row, c, V, zmax, invt, tau, min_p, run, target,
               PENALTIES: tl.constexpr, PER_PROGRAM: tl.constexpr, TILE: tl.constexpr):
    """Chunk ``c``'s kept tokens (z >= tau, e >= min_p) in id order, their mass running on from
    ``run``: (the running mass after the chunk, the first id at which it reaches ``target``
    or V, the last kept id of nonzero mass or -1). Tiles after the target are skipped."""
    found = tl.full((), V, tl.int64)
    last = tl.full((), -1, tl.int64)
    for t in range(0, PER_PROGRAM, TILE):
        if run < target:
            offs = (c * PER_PROGRAM + t + tl.arange(0, TILE)).to(tl.int64)
            mask = offs < V
            z = load_z(l_ptr, l_stride, w_ptr, pen, row, offs, mask, V, PENALTIES)
            e = tl.exp((z - zmax) * invt)
            keep = mask & (z >= tau) & (e >= min_p)
            cum = tl.cumsum(tl.where(keep, e, 0.0), axis=0) + run  # (TILE,) non-decreasing
            found = tl.minimum(found, tl.min(tl.where(mask & (cum >= target), offs, V), axis=0))
            last = tl.maximum(last, tl.max(tl.where(keep & (e > 0.0), offs, -1), axis=0))
            run = tl.max(cum, axis=0)
    return run, found, last


@triton.jit
def histogram_kernel(l_ptr, l_stride, w_ptr, rep_ptr, pres_ptr, freq_ptr, temp_ptr, invt_ptr,
                     topk_ptr, topp_ptr, minp_ptr, cmax_ptr, hist_ptr, cmass_ptr, ckept_ptr, V,
                     C, PENALTIES: tl.constexpr, PER_PROGRAM: tl.constexpr, TILE: tl.constexpr,
                     CP2: tl.constexpr, NB: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    if (tl.load(temp_ptr + row) >= GREEDY) & ~filtered(topk_ptr, topp_ptr, row, V):
        min_p = tl.load(minp_ptr + row)
        if min_p > 0.0:  # min-p alone: the chunk's kept mass, for the draw
            pen = has_penalties(rep_ptr, pres_ptr, freq_ptr, row)
            kept, _, _ = scan_chunk(l_ptr, l_stride, w_ptr, pen, row, c, V,
                                    row_max(cmax_ptr, row, C, CP2), tl.load(invt_ptr + row),
                                    float("-inf"), min_p, 0.0, float("inf"), PENALTIES,
                                    PER_PROGRAM, TILE)
            tl.store(ckept_ptr + row * C + c, kept)
    if (tl.load(temp_ptr + row) >= GREEDY) & filtered(topk_ptr, topp_ptr, row, V):
        pen = has_penalties(rep_ptr, pres_ptr, freq_ptr, row)
        zmax = row_max(cmax_ptr, row, C, CP2)
        invt = tl.load(invt_ptr + row)
        counts = tl.zeros((NB,), tl.int32)
        mass = tl.full((), 0.0, tl.float32)
        for t in range(0, PER_PROGRAM, TILE):
            offs = c * PER_PROGRAM + t + tl.arange(0, TILE)
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
def gather_kernel(l_ptr, l_stride, w_ptr, rep_ptr, pres_ptr, freq_ptr, temp_ptr, topk_ptr,
                  topp_ptr, cmax_ptr, hist_ptr, bufz_ptr, cout_ptr, V, C,
                  PENALTIES: tl.constexpr, PER_PROGRAM: tl.constexpr, TILE: tl.constexpr,
                  CP2: tl.constexpr, NB: tl.constexpr, BUF: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    if (tl.load(temp_ptr + row) >= GREEDY) & filtered(topk_ptr, topp_ptr, row, V):
        pen = has_penalties(rep_ptr, pres_ptr, freq_ptr, row)
        bstar, per_chunk, _, _ = cutoff_bin(hist_ptr, topk_ptr, row, V, C, CP2, NB, BUF)
        fits = tl.sum(per_chunk, axis=0) <= BUF
        off = tl.sum(tl.where(tl.arange(0, CP2) < c, per_chunk, 0), axis=0)
        zmax = row_max(cmax_ptr, row, C, CP2)
        left_out = tl.full((), float("-inf"), tl.float32)
        for t in range(0, PER_PROGRAM, TILE):
            offs = c * PER_PROGRAM + t + tl.arange(0, TILE)
            mask = offs < V
            z = load_z(l_ptr, l_stride, w_ptr, pen, row, offs, mask, V, PENALTIES)
            inb = mask & (gap_bin(z, zmax, NB) <= bstar)
            if fits:
                pos = row * BUF + off + tl.cumsum(inb.to(tl.int32), axis=0) - 1
                tl.store(bufz_ptr + pos, z, mask=inb)
            off += tl.sum(inb.to(tl.int32), axis=0)
            left_out = tl.maximum(left_out, tl.max(tl.where(mask & ~inb, z, float("-inf")),
                                                    axis=0))
        tl.store(cout_ptr + row * C + c, left_out)


@triton.jit
def _above(l_ptr, l_stride, w_ptr, pen, row, V, zmax, invt, t, PENALTIES: tl.constexpr,
           TILE: tl.constexpr):
    """(count, mass) of the row's tokens with key(z) >= t: one pass over the row."""
    cnt = tl.full((), 0, tl.int32)
    mass = tl.full((), 0.0, tl.float32)
    for start in range(0, V, TILE):
        offs = start + tl.arange(0, TILE)
        mask = offs < V
        z = load_z(l_ptr, l_stride, w_ptr, pen, row, offs, mask, V, PENALTIES)
        sel = mask & (order_key(z) >= t)
        cnt += tl.sum(sel.to(tl.int32), axis=0)
        mass += tl.sum(tl.where(sel, tl.exp((z - zmax) * invt), 0.0), axis=0)
    return cnt, mass


@triton.jit
def _solve_row(l_ptr, l_stride, w_ptr, pen, row, V, zmax, invt, has_k, k, top_p, total_all,
               PENALTIES: tl.constexpr, TILE: tl.constexpr):
    """The threshold by exact passes over the whole row: bisection on the order key of z."""
    hi0 = order_key(zmax).to(tl.int64)
    tk = tl.full((), KEY_NINF, tl.int64)
    total = total_all
    if has_k:
        lo = tk
        hi = hi0
        while lo < hi:  # the largest t with count(key >= t) >= k: the k-th value's key
            mid = lo + (hi - lo + 1) // 2
            cnt, _ = _above(l_ptr, l_stride, w_ptr, pen, row, V, zmax, invt, mid, PENALTIES,
                            TILE)
            if cnt >= k:
                lo = mid
            else:
                hi = mid - 1
        tk = lo
        _, total = _above(l_ptr, l_stride, w_ptr, pen, row, V, zmax, invt, tk, PENALTIES, TILE)
    t = tk
    if top_p < 1.0:
        lo = tk
        hi = hi0
        while lo < hi:  # the smallest t with mass(key > t) < top_p * total
            mid = lo + (hi - lo) // 2
            _, m = _above(l_ptr, l_stride, w_ptr, pen, row, V, zmax, invt, mid + 1, PENALTIES,
                          TILE)
            if m < top_p * total:
                hi = mid
            else:
                lo = mid + 1
        t = lo
    return from_key(t)


@triton.jit
def _solve_buffer(bufz_ptr, row, n, zmax, invt, has_k, k, top_p, total_all, left_out,
                  BUF: tl.constexpr):
    """The row's buffer (its n largest-gap-bin tokens, in id order): (threshold, True if it
    is decided inside the buffer, i.e. the result holds)."""
    offs = tl.arange(0, BUF)
    valid = offs < n
    z = tl.load(bufz_ptr + row * BUF + offs, mask=valid, other=float("-inf"))
    sz = from_key(tl.sort(order_key(z), descending=True))  # values, descending
    se = tl.where(valid, tl.exp((sz - zmax) * invt), 0.0)
    tk = tl.where(has_k, tl.max(tl.where(offs == k - 1, sz, float("-inf")), axis=0),
                  float("-inf"))
    in_k = valid & (sz >= tk)
    c = tl.cumsum(tl.where(in_k, se, 0.0), axis=0)
    total = tl.where(has_k, tl.max(c, axis=0), total_all)
    n_k = tl.sum(in_k.to(tl.int32), axis=0)
    last = tl.sum(((c < top_p * total) & (offs < n_k - 1)).to(tl.int32), axis=0)
    tp = tl.where(top_p < 1.0, tl.max(tl.where(offs == last, sz, float("-inf")), axis=0),
                  float("-inf"))
    # tokens left out of the buffer are below all of it: the threshold lies inside if top-k
    # stops above them or the top-p mass is reached inside
    inside = (has_k | (left_out == float("-inf"))
              | ((top_p < 1.0) & (tl.max(c, axis=0) >= top_p * total)))
    return tl.maximum(tk, tp), inside


@triton.jit
def solve_kernel(l_ptr, l_stride, w_ptr, rep_ptr, pres_ptr, freq_ptr, temp_ptr, invt_ptr,
                 topk_ptr, topp_ptr, cmax_ptr, cbad_ptr, hist_ptr, cmass_ptr, cout_ptr, bufz_ptr,
                 tau_ptr, V, C, PENALTIES: tl.constexpr, TILE: tl.constexpr, CP2: tl.constexpr,
                 NB: tl.constexpr, BUF: tl.constexpr):
    """One program per row with a top-k or a top-p: its threshold into ``tau``."""
    row = tl.program_id(0).to(tl.int64)
    zmax, bad = row_max_bad(cmax_ptr, cbad_ptr, row, C, CP2)
    if (tl.load(temp_ptr + row) >= GREEDY) & ~bad & filtered(topk_ptr, topp_ptr, row, V):
        ch = tl.arange(0, CP2)
        pen = has_penalties(rep_ptr, pres_ptr, freq_ptr, row)
        invt = tl.load(invt_ptr + row)
        top_p = tl.load(topp_ptr + row)
        _, per_chunk, has_k, k = cutoff_bin(hist_ptr, topk_ptr, row, V, C, CP2, NB, BUF)
        n = tl.sum(per_chunk, axis=0)
        total_all = tl.sum(tl.load(cmass_ptr + row * C + ch, mask=ch < C, other=0.0), axis=0)
        left_out = tl.max(tl.load(cout_ptr + row * C + ch, mask=ch < C, other=float("-inf")),
                          axis=0)
        tau = zmax
        inside = zmax != zmax  # False (a tensor, as the branch below assigns)
        if (n >= 1) & (n <= BUF):
            tau, inside = _solve_buffer(bufz_ptr, row, n, zmax, invt, has_k, k, top_p, total_all,
                                        left_out, BUF)
        if not inside:
            tau = _solve_row(l_ptr, l_stride, w_ptr, pen, row, V, zmax, invt, has_k, k, top_p,
                             total_all, PENALTIES, TILE)
        tl.store(tau_ptr + row, tau)


@triton.jit
def row_max_bad(cmax_ptr, cbad_ptr, row, C, CP2: tl.constexpr):
    """(the row's maximum, True if it holds a NaN or +inf or nothing but -inf)."""
    ch = tl.arange(0, CP2)
    zmax = tl.max(tl.load(cmax_ptr + row * C + ch, mask=ch < C, other=float("-inf")), axis=0)
    bad = ((tl.max(tl.load(cbad_ptr + row * C + ch, mask=ch < C, other=0), axis=0) > 0)
           | (zmax == float("-inf")) | (zmax != zmax))
    return zmax, bad


@triton.jit
def kept_kernel(l_ptr, l_stride, w_ptr, rep_ptr, pres_ptr, freq_ptr, temp_ptr, invt_ptr,
                topk_ptr, topp_ptr, minp_ptr, cmax_ptr, cbad_ptr, tau_ptr, ckept_ptr, V, C,
                PENALTIES: tl.constexpr, PER_PROGRAM: tl.constexpr, TILE: tl.constexpr,
                CP2: tl.constexpr):
    """Each chunk's kept mass for the rows with a threshold (z >= tau, e >= min_p)."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    zmax, bad = row_max_bad(cmax_ptr, cbad_ptr, row, C, CP2)
    if (tl.load(temp_ptr + row) >= GREEDY) & ~bad & filtered(topk_ptr, topp_ptr, row, V):
        pen = has_penalties(rep_ptr, pres_ptr, freq_ptr, row)
        kept, _, _ = scan_chunk(l_ptr, l_stride, w_ptr, pen, row, c, V, zmax,
                                tl.load(invt_ptr + row), tl.load(tau_ptr + row),
                                tl.load(minp_ptr + row), 0.0, float("inf"), PENALTIES,
                                PER_PROGRAM, TILE)
        tl.store(ckept_ptr + row * C + c, kept)


@triton.jit(do_not_specialize=["step"])
def pick_kernel(l_ptr, l_stride, w_ptr, rep_ptr, pres_ptr, freq_ptr, temp_ptr, invt_ptr,
                topk_ptr, topp_ptr, minp_ptr, u_ptr, slot_ptr, cmax_ptr, carg_ptr, cbad_ptr,
                cnorm_ptr, ckept_ptr, out_ptr, tau_ptr, last_ptr, counts_ptr, V, C, step,
                PENALTIES: tl.constexpr, SAMPLING: tl.constexpr, PER_PROGRAM: tl.constexpr,
                TILE: tl.constexpr, CP2: tl.constexpr):
    """The draw and the step's bookkeeping. Every chunk program of a sampling row finds the
    chunk where the running kept mass (chunks in order) reaches u * total; that chunk's
    program finds the token in it. Greedy and non-finite rows: chunk 0 (the argmax)."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    ch = tl.arange(0, CP2)
    maxes = tl.load(cmax_ptr + row * C + ch, mask=ch < C, other=float("-inf"))
    zmax, bad = row_max_bad(cmax_ptr, cbad_ptr, row, C, CP2)
    owner = c == 0
    token = tl.load(carg_ptr + row * C + tl.argmax(maxes, axis=0, tie_break_left=True))
    tau = zmax
    if SAMPLING:  # noqa: SIM102 - a compile-time branch around a run-time one
        if (tl.load(temp_ptr + row) >= GREEDY) & ~bad:
            invt = tl.load(invt_ptr + row)
            min_p = tl.load(minp_ptr + row)
            filt = filtered(topk_ptr, topp_ptr, row, V)
            plain = ~filt & (min_p <= 0.0)
            # plain rows: each chunk's mass against its own maximum, rescaled to the row's
            norm = tl.load(cnorm_ptr + row * C + ch, mask=ch < C, other=0.0)
            scaled = tl.where(maxes > float("-inf"), norm * tl.exp((maxes - zmax) * invt), 0.0)
            kept = tl.load(ckept_ptr + row * C + ch, mask=(ch < C) & ~plain, other=0.0)
            prefix = tl.cumsum(tl.where(plain, scaled, kept), axis=0)  # (CP2,)
            target = tl.load(u_ptr + row) * tl.max(prefix, axis=0)
            cstar = tl.minimum(tl.sum((prefix < target).to(tl.int32), axis=0), C - 1)
            owner = c == cstar
            if owner:
                tau = tl.where(filt, tl.load(tau_ptr + row), float("-inf"))
                run = tl.sum(tl.where(ch == cstar - 1, prefix, 0.0), axis=0)
                pen = has_penalties(rep_ptr, pres_ptr, freq_ptr, row)
                _, found, last = scan_chunk(l_ptr, l_stride, w_ptr, pen, row, c, V, zmax, invt,
                                            tau, min_p, run, target, PENALTIES, PER_PROGRAM,
                                            TILE)
                # within rounding the chunk's own sum may stop short: its last kept token
                token = tl.where(found < V, found, last).to(tl.int32)
    if owner:
        token = tl.where(bad, 0, token).to(tl.int64)
        tl.store(out_ptr + row, tl.where(bad, -1, token))
        tl.store(tau_ptr + row, tau)
        if step != 0:  # a run-time flag: one compiled kernel for a graph's warm-up and its body
            slot = tl.load(slot_ptr + row)
            tl.store(last_ptr + slot, token)
            if PENALTIES:
                tl.atomic_add(counts_ptr + slot * V + token, 1)


def _launch(logits: torch.Tensor, p: RowParams, mode: SamplerMode,
            penalties: PenaltyState | None, out: torch.Tensor, last_token: torch.Tensor | None
            ) -> torch.Tensor:
    """Run the kernels; ``out`` (B,) int64 gets the tokens (-1: non-finite row); returns the
    rows' thresholds (B,) float32 (the row maximum for greedy and bad rows, -inf for rows
    without top-k and top-p)."""
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    b, v = logits.shape
    c = triton.cdiv(v, TOKENS_PER_PROGRAM)
    cp2 = triton.next_power_of_2(c)
    dev = logits.device
    pen = mode.penalties and penalties is not None
    w = torch.empty(b, v, dtype=torch.float32, device=dev) if pen else logits
    counts = penalties.counts if pen else out
    prompt = penalties.in_prompt.view(torch.uint8) if pen else out
    cmax, cnorm, cmass, ckept, cout = torch.empty(5, b, c, dtype=torch.float32, device=dev)
    carg, cbad = torch.empty(2, b, c, dtype=torch.int32, device=dev)
    tau = torch.empty(b, dtype=torch.float32, device=dev)
    inv_t = p.inv_t()
    sampling = not mode.all_greedy
    grid = (b, c)
    kw = dict(PENALTIES=pen, PER_PROGRAM=TOKENS_PER_PROGRAM, TILE=TILE, num_warps=4,
              enable_fp_fusion=False)
    row = (logits, logits.stride(0), w, p.repetition, p.presence, p.frequency, p.temperature,
           inv_t)
    stats_kernel[grid](logits, logits.stride(0), w, counts, prompt, p.slot, p.repetition,
                       p.presence, p.frequency, p.temperature, inv_t, cmax, carg, cbad, cnorm, v,
                       c, SAMPLING=sampling, **kw)
    if sampling:
        hist = torch.empty(b, c, NB, dtype=torch.int32, device=dev)
        bufz = torch.empty(b, BUF, dtype=torch.float32, device=dev)
        histogram_kernel[grid](*row, p.top_k, p.top_p, p.min_p, cmax, hist, cmass, ckept, v, c,
                               CP2=cp2, NB=NB, **kw)
        gather_kernel[grid](*row[:7], p.top_k, p.top_p, cmax, hist, bufz, cout, v, c, CP2=cp2,
                            NB=NB, BUF=BUF, **kw)
        solve_kernel[(b,)](*row, p.top_k, p.top_p, cmax, cbad, hist, cmass, cout, bufz, tau, v,
                           c, PENALTIES=pen, TILE=TILE, CP2=cp2, NB=NB, BUF=BUF, num_warps=8,
                           enable_fp_fusion=False)
        kept_kernel[grid](*row, p.top_k, p.top_p, p.min_p, cmax, cbad, tau, ckept, v, c, CP2=cp2,
                          **kw)
    step = last_token is not None
    pick_kernel[grid](*row, p.top_k, p.top_p, p.min_p, p.uniform, p.slot, cmax, carg, cbad,
                      cnorm, ckept, out, tau, last_token if step else out, counts, v, c,
                      int(step), SAMPLING=sampling, CP2=cp2, **kw)
    return tau


def sample(logits: torch.Tensor, p: RowParams, mode: SamplerMode,
           penalties: PenaltyState | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens (B,) int64 with -1 for a non-finite row, thresholds (B,) float32): no side
    effects. A row keeps z >= threshold with e >= min_p (``sampler.keep_mask``)."""
    out = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
    return out, _launch(logits, p, mode, penalties, out, None)


def sample_step(logits: torch.Tensor, p: RowParams, mode: SamplerMode, penalties: PenaltyState,
                last_token: torch.Tensor, out: torch.Tensor) -> None:
    """``sampler.sample_step`` on the fused kernels (the bookkeeping in the last one)."""
    _launch(logits, p, mode, penalties, out, last_token)
