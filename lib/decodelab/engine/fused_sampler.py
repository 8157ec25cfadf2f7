"""The fused sampler: penalties, temperature, top-k, top-p, min-p, the draw and the step's
bookkeeping for a whole batch in Triton kernels, without sorting the vocabulary (GPU only,
imported lazily). It computes ``sampler``'s rule (same kept set, same token-id-order draw
from the same uniform); float sums run in another order, so a uniform or a top-p mass within
rounding of a boundary may resolve the other way.

Row x chunk kernels run one program per TOKENS_PER_PROGRAM tokens of a row; row kernels one
program per row. Every row kind reads its logits a few times, in parallel over its chunks:

1. ``stats_kernel`` (row x chunk): the penalised logits z (stored for rows with penalties
   only), the chunk's maximum m_c, its first argmax, a NaN / +inf flag (each lane keeping
   its own over the tiles: one reduction per program), and for sampling rows the chunk's
   mass against its maximum, sum of exp((z - m_c) / T) (a second loop over the tiles just
   read).
2. ``histogram_kernel`` (row x chunk): min-p alone: the chunk's kept mass (e >= min_p, with
   e = exp((z - z_max) / T)). Rows with a top-k or a top-p: the count of the chunk's tokens in
   each of NB coarse gap bins of h = (z_max - z) / T (its float bits: exponent and 3 mantissa
   bits, so a bin's tokens are a range of z, their e within a factor exp(h / 8)). Integer
   counts: no order to depend on. (Triton's histogram is the dearest part of a pass: on an
   H100 at batch 128 a pass counting 128 bins took 51.5 us against 11.3 us for one summing
   exp over the same logits, and 32 bins still 38.4 us; 2048 bins would cost far more.)
3. ``plan_kernel`` (row), coarse: the bins that must hold the threshold, made once per row
   (the programs of the next passes load it instead of each making it from the row's
   histograms). Top-k: bin bk, the first whose running count reaches k (exact). Top-p:
   bins lo .. hi where the running mass must cross P = top_p * (top-k mass), from bounds on
   each bin's mass (its count times its least and its largest e; the exact total less what
   the later bins can hold at most). Where those bins hold more candidates than the small
   sort, a refined window: coarse bins lo .. bk split into NB bins of up to 7 more mantissa
   bits.
4. ``refine_kernel`` (row x chunk), rows with a window: the chunk's histogram of the window
   and its exact mass before the window.
5. ``plan_kernel`` (row), fine: from the window's histograms, the same bounds pin the
   crossing to a bin or three (on flat rows whose 0.9 nucleus holds tens of thousands of
   tokens that leaves hundreds of candidates); then each chunk's offset in the row's
   candidate buffer, from the histograms.
6. ``gather_kernel`` (row x chunk): the candidates (tokens of bins lo .. hi and bk) into the
   row's buffer in token order from the chunk's offset (no atomics), and the exact mass of
   the tokens before bin lo and between bins hi and bk.
7. ``solve_kernel`` (row): sorting the candidates in registers (a sort of SMALL_BUF,
   2 SMALL_BUF or BUF values, the least that holds them) gives tau_k (the k-th value, every
   tie kept) and tau_p (the smallest value whose mass strictly above it, counted from the
   exact mass before the candidates, is below P: a tie group whole), when they fit and the
   crossing lies among them; else, rarely (more than BUF candidates: a huge tie group, a
   top-k deep in -inf tokens), exact passes over the row (bisection on the order-preserving
   integer key of z). Where the candidates decide it, each chunk's kept mass follows from
   them and the exact mass before them (min-p permitting).
8. ``kept_kernel`` (row x chunk), the other rows with a threshold: the chunk's kept mass.
9. ``pick_kernel`` (row x chunk): the draw by the inverse CDF in token-id order. Every
   program of a row finds, from the chunks' kept masses (plain rows: their masses of step 1
   rescaled by exp((m_c - z_max) / T)), the chunk where the running mass reaches u * total;
   that chunk's program scans its tokens for the first whose running mass reaches it (or,
   within rounding of the chunk's end, its last kept token). Greedy and non-finite rows:
   chunk 0 takes the argmax. The owner writes the output row, ``last_token[slot]`` and the
   penalty count of the sampled token.

Plain temperature is then two passes over the logits (steps 1 and 9), min-p alone three,
a row with a top-k or a top-p four, five where it refines a window (one more where min-p
cuts into the tokens above the candidates, or exact passes found the threshold). The
batch's mode says whether any row has a top-k or top-p (``SamplerMode.filters``) or a min-p
(``min_p``); the kernels no row needs are not launched, so a batch of plain rows is two
launches. The kernels read a row's sampling inputs from its packed ``RowSampling`` words
(``RowParams.block``, one pointer) at offsets the schema gives. The sizes
(TOKENS_PER_PROGRAM, TILE, BUF, SMALL_BUF) are read at each launch, so tests scale them to
small vocabularies.
A row's work depends only on its own logits and parameters: the same token alone or in any
batch, with or without penalties in other rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from decodelab.engine.row_sampling import ROW_WORDS, RowField

if TYPE_CHECKING:  # the reference imports this module lazily: no circle
    from decodelab.engine.sampler import PenaltyState, RowParams, SamplerMode


TOKENS_PER_PROGRAM = 8192  # tokens of a row each program of the row x chunk kernels reads
TILE = 2048  # tokens a program holds at once
BUF = 4096  # candidates a row's program sorts in registers (SMALL_BUF when they fit it)
SMALL_BUF = 1024
# Warps of a row x chunk program and of a row's solve program (its sort). Swept on an H100
# (V = 128,256, batches 32 and 128): 8 warps per program were 9-14% slower at batch 128;
# 4,096-token programs slower at 128, 16,384-token ones 3-4% faster there on filtered rows
# but up to 50% slower at 32; 1,024-, 4,096- and 8,192-token tiles no faster than 2,048;
# 4 solve warps slower, 16 within 1%.
WARPS = 4
SOLVE_WARPS = 8
# Gap bins of h = (z_max - z) / T >= 0 by its float bits (in its order, so a bin's tokens
# are a range of z). Coarse: exponent and 3 mantissa bits, from 2^-9 (bin 0 below) over 16
# octaves (bin 127: h >= 112, e = exp(-h) < 1e-48). A refined window of w coarse bins splits
# them into NB bins of 2^(13 + ceil(log2 w)) bits: up to 7 more mantissa bits.
COARSE_BASE = tl.constexpr((127 - 9) << 3)  # (bits of 2^-9) >> 20: coarse bin 1
HB_LO = tl.constexpr(((127 - 9) << 3) - 1 << 20)  # the least bits kept: coarse bin 0's first
HB_HI = tl.constexpr((((127 - 9) << 3) + 127 << 20) - 1)  # the most: coarse bin 127's last
BINS = 128  # bins of a histogram: coarse bins, or a refined window
NB = tl.constexpr(BINS)
PLAN_WORDS = tl.constexpr(12)  # int32 per row: ``_store_plan``'s ten, its path, kept found
BOUND_SLACK = tl.constexpr(1e-4)  # relative widening of the mass bounds (float32 sums, exp)
# A row's sampling inputs: its RowSampling words at these offsets (one pointer, ``rows_ptr``)
ROW_STRIDE = tl.constexpr(ROW_WORDS)
F_TOP_K = tl.constexpr(RowField.TOP_K.value)
F_TOP_P = tl.constexpr(RowField.TOP_P.value)
F_MIN_P = tl.constexpr(RowField.MIN_P.value)
F_REPETITION_PENALTY = tl.constexpr(RowField.REPETITION_PENALTY.value)
F_PRESENCE_PENALTY = tl.constexpr(RowField.PRESENCE_PENALTY.value)
F_FREQUENCY_PENALTY = tl.constexpr(RowField.FREQUENCY_PENALTY.value)
F_GREEDY = tl.constexpr(RowField.GREEDY.value)
F_INV_TEMPERATURE = tl.constexpr(RowField.INV_TEMPERATURE.value)
F_UNIFORM = tl.constexpr(RowField.UNIFORM.value)
F_SLOT = tl.constexpr(RowField.SLOT.value)
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
def gap_bits(h):
    """The bits of h = (z_max - z) / T >= 0 (-0.0 included), clamped to the coarse bins'."""
    return tl.minimum(tl.maximum(h.to(tl.int32, bitcast=True), HB_LO), HB_HI)


@triton.jit
def bit_edges(first, end):
    """(lower, upper) h of the bins holding bits first .. end - 1 (clamped bits: the first
    coarse bin starts at h = 0, the last never ends)."""
    lower = tl.where(first <= HB_LO, 0.0, first.to(tl.float32, bitcast=True))
    upper = tl.where(end > HB_HI, float("inf"), tl.minimum(end, HB_HI).to(tl.float32,
                                                                           bitcast=True))
    return lower, upper


@triton.jit
def coarse_bin(hb):
    return (hb >> 20) - (COARSE_BASE - 1)


@triton.jit
def bin_index(hb, refined, a, shift):
    """A token's bin from its gap bits: its coarse bin, or in a refined window from coarse
    bin a on, its bits >> shift counted from the window's first (negative before it)."""
    return tl.where(refined, (hb >> shift) - ((a + COARSE_BASE - 1) << (20 - shift)),
                    coarse_bin(hb))


@triton.jit
def word(rows_ptr, row, FIELD: tl.constexpr):
    """An int32 field of the row's RowSampling."""
    return tl.load(rows_ptr + row * ROW_STRIDE + FIELD)


@triton.jit
def real(rows_ptr, row, FIELD: tl.constexpr):
    """A float32 field of the row's RowSampling (its bits in the int32 block)."""
    return word(rows_ptr, row, FIELD).to(tl.float32, bitcast=True)


@triton.jit
def sampling_row(rows_ptr, row):
    return word(rows_ptr, row, F_GREEDY) == 0


@triton.jit
def has_penalties(rows_ptr, row):
    return ((real(rows_ptr, row, F_REPETITION_PENALTY) != 1.0)
            | (real(rows_ptr, row, F_PRESENCE_PENALTY) != 0.0)
            | (real(rows_ptr, row, F_FREQUENCY_PENALTY) != 0.0))


@triton.jit
def load_z(l_ptr, l_stride, w_ptr, pen, row, offs, mask, V, PENALTIES: tl.constexpr):
    """z of tokens ``offs`` of ``row``: the penalised copy for a row with penalties."""
    z = tl.load(l_ptr + row * l_stride + offs, mask=mask, other=float("-inf")).to(tl.float32)
    if PENALTIES:  # noqa: SIM102 - a compile-time branch around a run-time one
        if pen:
            z = tl.load(w_ptr + row * V + offs, mask=mask, other=float("-inf"))
    return tl.where(z == 0.0, 0.0, z)


@triton.jit
def stats_kernel(l_ptr, l_stride, w_ptr, counts_ptr, prompt_ptr, rows_ptr, cmax_ptr, carg_ptr,
                 cbad_ptr, cnorm_ptr, V, C, PENALTIES: tl.constexpr, SAMPLING: tl.constexpr,
                 PER_PROGRAM: tl.constexpr, TILE: tl.constexpr):
    """Each lane keeps its own maximum, first argmax and flag over the tiles (one reduction
    per program, not per tile); a sampling row then sums its chunk's mass against the
    chunk's maximum in a second loop over the same tiles (cached: just read)."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    best = tl.full((TILE,), float("-inf"), tl.float32)
    arg = tl.zeros((TILE,), tl.int32)
    bad = tl.zeros((TILE,), tl.int32)
    pen = has_penalties(rows_ptr, row)
    for t in range(0, PER_PROGRAM, TILE):
        offs = c * PER_PROGRAM + t + tl.arange(0, TILE)
        mask = offs < V
        z = tl.load(l_ptr + row * l_stride + offs, mask=mask, other=float("-inf")).to(tl.float32)
        if PENALTIES:  # noqa: SIM102 - a compile-time branch around a run-time one
            if pen:
                slot = word(rows_ptr, row, F_SLOT).to(tl.int64)
                rep = real(rows_ptr, row, F_REPETITION_PENALTY)
                cnt = tl.load(counts_ptr + slot * V + offs, mask=mask, other=0)
                seen = (cnt > 0) | (tl.load(prompt_ptr + slot * V + offs, mask=mask, other=0) != 0)
                z = tl.where(seen, tl.where(z > 0, tl.div_rn(z, rep), z * rep), z)
                z = (z - real(rows_ptr, row, F_FREQUENCY_PENALTY) * cnt.to(tl.float32)
                     - real(rows_ptr, row, F_PRESENCE_PENALTY) * (cnt > 0).to(tl.float32))
                tl.store(w_ptr + row * V + offs, z, mask=mask)
        z = tl.where(z == 0.0, 0.0, z)
        bad = tl.maximum(bad, ((z != z) | (z == float("inf"))).to(tl.int32))
        arg = tl.where(z > best, offs, arg)  # strictly: a lane keeps its first maximum
        best = tl.maximum(best, z)
    m = tl.max(best, axis=0)
    tl.store(cmax_ptr + row * C + c, m)
    tl.store(carg_ptr + row * C + c, tl.min(tl.where(best == m, arg, V), axis=0))
    tl.store(cbad_ptr + row * C + c, tl.max(bad, axis=0))
    norm = tl.full((), 0.0, tl.float32)  # sum of exp((z - m) / T) over the chunk
    if SAMPLING:  # noqa: SIM102 - a compile-time branch around a run-time one
        if sampling_row(rows_ptr, row) & (m > float("-inf")):
            invt = real(rows_ptr, row, F_INV_TEMPERATURE)
            tl.debug_barrier()  # a penalised row reads back the z it stored above
            mass = tl.zeros((TILE,), tl.float32)
            for t in range(0, PER_PROGRAM, TILE):
                offs = c * PER_PROGRAM + t + tl.arange(0, TILE)
                mask = offs < V
                z = load_z(l_ptr, l_stride, w_ptr, pen, row, offs, mask, V, PENALTIES)
                mass += tl.where(mask, tl.exp((z - m) * invt), 0.0)
            norm = tl.sum(mass, axis=0)
    tl.store(cnorm_ptr + row * C + c, norm)


@triton.jit
def filtered(rows_ptr, row, V):
    """The row has a threshold to find: a top-k or a top-p."""
    return (word(rows_ptr, row, F_TOP_K) < V) | (real(rows_ptr, row, F_TOP_P) < 1.0)


@triton.jit
def scan_chunk(l_ptr, l_stride, w_ptr, pen, row, c, V, zmax, invt, tau, min_p, run, target,
               PENALTIES: tl.constexpr, PER_PROGRAM: tl.constexpr, TILE: tl.constexpr):
    """Chunk ``c``'s kept tokens (z >= tau, e >= min_p) in id order, their mass running on from
    ``run``: (the running mass after the chunk, the first id at which it reaches ``target``
    or V, the last kept id of nonzero mass or -1). Tiles after the target are skipped."""
    run = tl.full((), 0.0, tl.float32) + run  # a tensor even for a literal: the loop carries it
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
def histogram_kernel(l_ptr, l_stride, w_ptr, rows_ptr, cmax_ptr, cbad_ptr, hist_ptr, ckept_ptr, V,
                     C, PENALTIES: tl.constexpr, PER_PROGRAM: tl.constexpr, TILE: tl.constexpr,
                     CP2: tl.constexpr):
    """Rows with a top-k or a top-p: the chunk's count of tokens per coarse bin (int16: a
    chunk holds fewer than 2^15 tokens). Min-p alone: the chunk's kept mass, for the draw."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    zmax, bad = row_max_bad(cmax_ptr, cbad_ptr, row, C, CP2)
    if sampling_row(rows_ptr, row) & ~bad:
        pen = has_penalties(rows_ptr, row)
        invt = real(rows_ptr, row, F_INV_TEMPERATURE)
        min_p = real(rows_ptr, row, F_MIN_P)
        if filtered(rows_ptr, row, V):
            counts = tl.zeros((NB,), tl.int32)
            for t in range(0, PER_PROGRAM, TILE):
                offs = c * PER_PROGRAM + t + tl.arange(0, TILE)
                mask = offs < V
                z = load_z(l_ptr, l_stride, w_ptr, pen, row, offs, mask, V, PENALTIES)
                counts += tl.histogram(coarse_bin(gap_bits(-((z - zmax) * invt))), NB, mask=mask)
            tl.store(hist_ptr + (row * C + c) * NB + tl.arange(0, NB), counts.to(tl.int16))
        elif min_p > 0.0:
            kept, _, _ = scan_chunk(l_ptr, l_stride, w_ptr, pen, row, c, V, zmax, invt,
                                    float("-inf"), min_p, 0.0, float("inf"), PENALTIES,
                                    PER_PROGRAM, TILE)
            tl.store(ckept_ptr + row * C + c, kept)


@triton.jit
def chunk_masses(cmax_ptr, cnorm_ptr, row, C, zmax, invt, CP2: tl.constexpr):
    """(CP2,) each chunk's mass sum of e = exp((z - z_max) / T): its mass against its own
    maximum (``stats_kernel``) times exp((m_c - z_max) / T)."""
    ch = tl.arange(0, CP2)
    maxes = tl.load(cmax_ptr + row * C + ch, mask=ch < C, other=float("-inf"))
    norm = tl.load(cnorm_ptr + row * C + ch, mask=ch < C, other=0.0)
    return tl.where(maxes > float("-inf"), norm * tl.exp((maxes - zmax) * invt), 0.0)


@triton.jit
def _chunk_counts(hist_ptr, row, C, below, CP2: tl.constexpr):
    """(CP2, NB) the histograms of the row's chunks before chunk ``below`` (0 elsewhere), in
    one load: a loop over the chunks would wait for each in turn."""
    ch = tl.arange(0, CP2)[:, None]
    bins = tl.arange(0, NB)[None, :]
    return tl.load(hist_ptr + (row * C + ch) * NB + bins,  # (bins < NB): the mask's 2D shape
                   mask=(ch < below) & (bins < NB), other=0).to(tl.int32)


@triton.jit
def _row_counts(hist_ptr, row, C, CP2: tl.constexpr):
    """(NB,) the row's counts per bin: its chunks' histograms summed."""
    return tl.sum(_chunk_counts(hist_ptr, row, C, C, CP2), axis=0)


@triton.jit
def _crossing(cnt, cum, lower, upper, before_mass, after_lo, after_hi, total, has_k, k, top_p):
    """Bins (lo, hi, bk) that must hold the threshold, from a histogram (cnt, its running sum
    cum over the tokens before it and its own) whose bins lie between h edges lower, upper,
    with ``before_mass`` the exact mass of the tokens before its first bin and the mass after
    its last between after_lo and after_hi. Top-k: bk, the first bin whose running count
    reaches k. Top-p: the running mass, bounded below (each token at its bin's least e, or
    the total less the most the later bins can hold) and above, must cross P = top_p * (the
    top-k mass) between bins lo and hi. Without top-p, lo = hi = bk; without top-k, bk = hi."""
    bins = tl.arange(0, NB)
    bk = tl.where(has_k, tl.sum((cum < k).to(tl.int32), axis=0), NB - 1)
    lo = bk
    hi = bk
    if top_p < 1.0:
        e_hi = tl.exp(-lower) * (1.0 + BOUND_SLACK)
        e_lo = tl.exp(-upper) * (1.0 - BOUND_SLACK)
        run_lo = tl.cumsum(cnt.to(tl.float32) * e_lo, axis=0)
        run_hi = tl.cumsum(cnt.to(tl.float32) * e_hi, axis=0)
        left_lo = tl.max(run_lo, axis=0) - run_lo + after_lo  # the least after bin b
        left_hi = tl.max(run_hi, axis=0) - run_hi + after_hi
        low = tl.maximum(before_mass + run_lo, total * (1.0 - BOUND_SLACK) - left_hi)
        high = tl.minimum(before_mass + run_hi, total * (1.0 + BOUND_SLACK) - left_lo)
        # the top-k mass: all before bin bk, then at least the rest of k, at most all of bk
        at_bk = tl.sum(tl.where(bins == bk, cnt, 0), axis=0)
        rest_k = (k - (tl.sum(tl.where(bins == bk, cum, 0), axis=0) - at_bk)).to(tl.float32)
        k_lo = (tl.where(bk == 0, before_mass, tl.sum(tl.where(bins == bk - 1, low, 0.0), axis=0))
                + rest_k * tl.sum(tl.where(bins == bk, e_lo, 0.0), axis=0))
        k_hi = tl.sum(tl.where(bins == bk, high, 0.0), axis=0)
        p_lo = top_p * tl.where(has_k, k_lo, total) * (1.0 - BOUND_SLACK)
        p_hi = top_p * tl.where(has_k, k_hi, total) * (1.0 + BOUND_SLACK)
        hi = tl.minimum(tl.sum((low < p_hi).to(tl.int32), axis=0), bk)
        lo = tl.minimum(tl.sum((high < p_lo).to(tl.int32), axis=0), hi)
    return lo, hi, tl.where(has_k, bk, hi)


@triton.jit
def _tally(cnt, n_before, lo, hi, bk):
    """(candidates, tokens before lo, tokens between hi and bk) of bins lo .. hi and bk."""
    bins = tl.arange(0, NB)
    cand = ((bins >= lo) & (bins <= hi)) | (bins == bk)
    return (tl.sum(tl.where(cand, cnt, 0), axis=0),
            n_before + tl.sum(tl.where(bins < lo, cnt, 0), axis=0),
            tl.sum(tl.where((bins > hi) & (bins < bk), cnt, 0), axis=0))


@triton.jit
def coarse_plan(hist_ptr, row, C, k, has_k, top_p, total, CP2: tl.constexpr):
    """From the coarse histograms: (lo, hi, bk, candidates, tokens before lo, tokens between
    hi and bk)."""
    bins = tl.arange(0, NB)
    cnt = _row_counts(hist_ptr, row, C, CP2)
    lower, upper = bit_edges((bins + COARSE_BASE - 1) << 20, (bins + COARSE_BASE) << 20)
    lo, hi, bk = _crossing(cnt, tl.cumsum(cnt, axis=0), lower, upper, 0.0, 0.0, 0.0, total,
                           has_k, k, top_p)
    n, n_skip, n_mid = _tally(cnt, 0, lo, hi, bk)
    return lo, hi, bk, n, n_skip, n_mid


@triton.jit
def window_shift(lo, bk):
    """The bit shift of a refined window over coarse bins lo .. bk: NB bins of 2^shift bits
    cover 2^(shift - 13) >= bk - lo + 1 coarse bins (of 2^20 bits)."""
    width = bk - lo + 1
    return 13 + ((width > 1).to(tl.int32) + (width > 2).to(tl.int32) + (width > 4).to(tl.int32)
                 + (width > 8).to(tl.int32) + (width > 16).to(tl.int32)
                 + (width > 32).to(tl.int32) + (width > 64).to(tl.int32))


@triton.jit
def fine_plan(hist_ptr, chist_ptr, cbefore_ptr, row, C, a, s, last, k, has_k, top_p, total,
              CP2: tl.constexpr):
    """From the refined window's histograms (coarse bins a .. last in bins of 2^s bits), with
    the exact mass before it and the coarse counts after it: ``coarse_plan``'s six values,
    bins counted in the window."""
    bins = tl.arange(0, NB)
    ch = tl.arange(0, CP2)
    coarse = _row_counts(chist_ptr, row, C, CP2)
    n_before = tl.sum(tl.where(bins < a, coarse, 0), axis=0)
    cnt = _row_counts(hist_ptr, row, C, CP2)
    cum = n_before + tl.cumsum(cnt, axis=0)
    first = (a + COARSE_BASE - 1) << 20
    lower, upper = bit_edges(first + (bins << s), first + ((bins + 1) << s))
    before = tl.sum(tl.load(cbefore_ptr + row * C + ch, mask=ch < C, other=0.0), axis=0)
    c_lower, c_upper = bit_edges((bins + COARSE_BASE - 1) << 20, (bins + COARSE_BASE) << 20)
    after = (bins > last).to(tl.float32) * coarse.to(tl.float32)
    after_lo = tl.sum(after * tl.exp(-c_upper), axis=0) * (1.0 - BOUND_SLACK)
    after_hi = tl.sum(after * tl.exp(-c_lower), axis=0) * (1.0 + BOUND_SLACK)
    lo, hi, bk = _crossing(cnt, cum, lower, upper, before, after_lo, after_hi, total, has_k, k,
                           top_p)
    n, n_skip, n_mid = _tally(cnt, n_before, lo, hi, bk)
    return lo, hi, bk, n, n_skip, n_mid


@triton.jit
def plan_kernel(rows_ptr, cmax_ptr, cbad_ptr, cnorm_ptr, chist_ptr, hist_ptr, cbefore_ptr,
                plan_ptr, coff_ptr, V, C, FINE: tl.constexpr, CP2: tl.constexpr,
                SMALL_BUF: tl.constexpr):
    """One program per row with a top-k or a top-p: its plan, made once between two passes
    (their programs load it). Coarse (after the histograms): the bins that must hold the
    threshold, and a refined window over coarse bins lo .. bk where those hold more
    candidates than the small sort. Fine (after the window's histograms): the window's plan,
    then each chunk's offset in the row's candidate buffer (the candidates before it)."""
    row = tl.program_id(0).to(tl.int64)
    zmax, bad = row_max_bad(cmax_ptr, cbad_ptr, row, C, CP2)
    if sampling_row(rows_ptr, row) & ~bad & filtered(rows_ptr, row, V):
        invt = real(rows_ptr, row, F_INV_TEMPERATURE)
        k = word(rows_ptr, row, F_TOP_K)
        top_p = real(rows_ptr, row, F_TOP_P)
        total = tl.sum(chunk_masses(cmax_ptr, cnorm_ptr, row, C, zmax, invt, CP2), axis=0)
        if FINE:
            refined, a, s, last, lo, hi, bk, n, n_skip, n_mid = _load_plan(plan_ptr, row)
            if refined:
                lo, hi, bk, n, n_skip, n_mid = fine_plan(hist_ptr, chist_ptr, cbefore_ptr, row,
                                                         C, a, s, last, k, k < V, top_p, total,
                                                         CP2)
                _store_plan(plan_ptr, row, refined, a, s, last, lo, hi, bk, n, n_skip, n_mid)
            bins = tl.arange(0, NB)
            cand_bin = ((bins >= lo) & (bins <= hi)) | (bins == bk)
            counts = _chunk_counts(tl.where(refined, hist_ptr, chist_ptr), row, C, C, CP2)
            per_chunk = tl.sum(tl.where(cand_bin[None, :], counts, 0), axis=1)  # (CP2,)
            ch = tl.arange(0, CP2)
            tl.store(coff_ptr + row * C + ch, tl.cumsum(per_chunk, axis=0) - per_chunk,
                     mask=ch < C)
        else:
            lo, hi, bk, n, n_skip, n_mid = coarse_plan(chist_ptr, row, C, k, k < V, top_p,
                                                       total, CP2)
            # a window of few candidates costs less than a large sort
            _store_plan(plan_ptr, row, n > SMALL_BUF, lo, window_shift(lo, bk), bk, lo, hi, bk,
                        n, n_skip, n_mid)


@triton.jit
def refine_kernel(l_ptr, l_stride, w_ptr, rows_ptr, cmax_ptr, cbad_ptr, plan_ptr, hist_ptr,
                  cbefore_ptr, V, C, PENALTIES: tl.constexpr, PER_PROGRAM: tl.constexpr,
                  TILE: tl.constexpr, CP2: tl.constexpr):
    """Rows whose coarse plan refines a window: the chunk's histogram of the window (coarse
    bins a .. last in NB bins of 2^s bits) and the chunk's exact mass before it."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    refined, a, s, last, _, _, _, _, _, _ = _load_plan(plan_ptr, row)
    if refined:  # only a filtered sampling row with finite logits has a plan
        zmax = row_max_bad(cmax_ptr, cbad_ptr, row, C, CP2)[0]
        invt = real(rows_ptr, row, F_INV_TEMPERATURE)
        pen = has_penalties(rows_ptr, row)
        counts = tl.zeros((NB,), tl.int32)
        before = tl.zeros((TILE,), tl.float32)  # per lane: one reduction at the end
        for t in range(0, PER_PROGRAM, TILE):
            offs = c * PER_PROGRAM + t + tl.arange(0, TILE)
            mask = offs < V
            z = load_z(l_ptr, l_stride, w_ptr, pen, row, offs, mask, V, PENALTIES)
            d = (z - zmax) * invt
            hb = gap_bits(-d)
            coarse = coarse_bin(hb)
            before += tl.where(mask & (coarse < a), tl.exp(d), 0.0)
            inside = mask & (coarse >= a) & (coarse <= last)
            window = (hb >> s) - ((a + COARSE_BASE - 1) << (20 - s))
            counts += tl.histogram(tl.where(inside, window, 0), NB, mask=inside)
        tl.store(hist_ptr + (row * C + c) * NB + tl.arange(0, NB), counts.to(tl.int16))
        tl.store(cbefore_ptr + row * C + c, tl.sum(before, axis=0))


@triton.jit
def _store_plan(plan_ptr, row, refined, a, s, last, lo, hi, bk, n, n_skip, n_mid):
    """A row's plan (PLAN_WORDS int32): its bins are coarse, or a refined window over coarse
    bins a .. last (bins of 2^s bits); lo .. hi and bk the candidates' bins, n of them, n_skip
    tokens before them, n_mid between hi and bk."""
    base = plan_ptr + row * PLAN_WORDS
    tl.store(base + 0, refined.to(tl.int32))
    tl.store(base + 1, a)
    tl.store(base + 2, s)
    tl.store(base + 3, last)
    tl.store(base + 4, lo)
    tl.store(base + 5, hi)
    tl.store(base + 6, bk)
    tl.store(base + 7, n)
    tl.store(base + 8, n_skip)
    tl.store(base + 9, n_mid)


@triton.jit
def _load_plan(plan_ptr, row):
    base = plan_ptr + row * PLAN_WORDS
    return (tl.load(base + 0) != 0, tl.load(base + 1), tl.load(base + 2), tl.load(base + 3),
            tl.load(base + 4), tl.load(base + 5), tl.load(base + 6), tl.load(base + 7),
            tl.load(base + 8), tl.load(base + 9))


@triton.jit
def gather_kernel(l_ptr, l_stride, w_ptr, rows_ptr, cmax_ptr, cbad_ptr, plan_ptr, coff_ptr,
                  bufz_ptr, cabove_ptr, cmid_ptr, V, C, PENALTIES: tl.constexpr,
                  PER_PROGRAM: tl.constexpr, TILE: tl.constexpr, CP2: tl.constexpr,
                  BUF: tl.constexpr):
    """Rows with a top-k or a top-p, on their final plan: the chunk's candidates (z of its
    tokens in bins lo .. hi and bk) into the row's buffer in token order from the chunk's
    offset (no atomics) when they all fit; the chunk's exact mass before bin lo and between
    hi and bk."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    zmax, bad = row_max_bad(cmax_ptr, cbad_ptr, row, C, CP2)
    if sampling_row(rows_ptr, row) & ~bad & filtered(rows_ptr, row, V):
        invt = real(rows_ptr, row, F_INV_TEMPERATURE)
        refined, a, s, _, lo, hi, bk, n, _, _ = _load_plan(plan_ptr, row)
        off = tl.load(coff_ptr + row * C + c)
        pen = has_penalties(rows_ptr, row)
        above = tl.zeros((TILE,), tl.float32)  # per lane: one reduction at the end
        mid = tl.zeros((TILE,), tl.float32)
        for t in range(0, PER_PROGRAM, TILE):
            offs = c * PER_PROGRAM + t + tl.arange(0, TILE)
            mask = offs < V
            z = load_z(l_ptr, l_stride, w_ptr, pen, row, offs, mask, V, PENALTIES)
            d = (z - zmax) * invt
            e = tl.exp(d)
            b = bin_index(gap_bits(-d), refined, a, s)
            above += tl.where(mask & (b < lo), e, 0.0)
            mid += tl.where(mask & (b > hi) & (b < bk), e, 0.0)
            if n <= BUF:
                cand = mask & (((b >= lo) & (b <= hi)) | (b == bk))
                pos = row * BUF + off + tl.cumsum(cand.to(tl.int32), axis=0) - 1
                tl.store(bufz_ptr + pos, z, mask=cand)
                off += tl.sum(cand.to(tl.int32), axis=0)
        tl.store(cabove_ptr + row * C + c, tl.sum(above, axis=0))
        tl.store(cmid_ptr + row * C + c, tl.sum(mid, axis=0))


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
def _solve_candidates(bufz_ptr, row, n, zmax, invt, has_k, k, top_p, total, refined, a, s, hi,
                      bk, n_skip, n_mid, above, mid, V, S: tl.constexpr, BUF: tl.constexpr):
    """The threshold from the row's n candidates (in its buffer, sorted here by value): the
    tokens of bins lo .. hi and of bin bk, with n_skip tokens of mass ``above`` before them
    and n_mid of mass ``mid`` between bins hi and bk. Returns (threshold, True if decided by
    the candidates: the top-p boundary was not before them nor after the bins it may use)."""
    offs = tl.arange(0, S)
    valid = offs < n
    z = tl.load(bufz_ptr + row * BUF + offs, mask=valid, other=float("-inf"))
    sz = from_key(tl.sort(order_key(z), descending=True))  # values, descending
    d = (sz - zmax) * invt
    se = tl.where(valid, tl.exp(d), 0.0)
    # bins lo .. hi, before bin bk's tokens when bk > hi (a top-k below the top-p bins)
    first = valid & (bin_index(gap_bits(-d), refined, a, s) <= hi)
    split = has_k & (bk > hi)
    # the k-th largest: position k - 1 among all tokens, of which n_skip (+ n_mid) are not here
    tk = tl.where(has_k, tl.max(tl.where(offs == k - 1 - n_skip - tl.where(split, n_mid, 0),
                                         sz, float("-inf")), axis=0), float("-inf"))
    in_k = valid & (sz >= tk)
    total_k = tl.where(has_k, above + tl.where(split, mid, 0.0)
                       + tl.sum(tl.where(in_k, se, 0.0), axis=0), total)
    p = top_p * total_k
    c = above + tl.cumsum(tl.where(in_k & first, se, 0.0), axis=0)  # mass down to each value
    # the prefix rule keeps a position while the mass before it is < P; it may reach the
    # last position of bins lo..hi (split), of the top-k set, or of the candidates
    n_lim = tl.sum((in_k & first).to(tl.int32), axis=0)
    last = tl.sum(((c < p) & (offs < n_lim - 1)).to(tl.int32), axis=0)
    tp = tl.max(tl.where(offs == last, sz, float("-inf")), axis=0)
    reached = tl.max(tl.where(offs == n_lim - 1, c, float("-inf")), axis=0) >= p
    tokens_after = split | (~has_k & (n_skip + n < V))  # kept by top-p, were P not reached
    inside = (above < p) & (reached | ~tokens_after)
    tau = tl.where(top_p < 1.0, tl.maximum(tk, tp), tk)
    return tau, (top_p >= 1.0) | inside


@triton.jit
def _kept_from_candidates(bufz_ptr, counts_ptr, cabove_ptr, ckept_ptr, row, n, C, zmax, invt,
                          tau, min_p, lo, hi, bk, CP2: tl.constexpr, BUF: tl.constexpr,
                          SMALL_BUF: tl.constexpr):
    """Each chunk's kept mass without another pass over the logits: the exact mass of its
    tokens before bin lo (all kept: the caller checked that min-p spares them) and of its
    candidates at or above tau. The buffer holds the candidates in token order, chunk after
    chunk, as many of each as its histogram counts in the candidates' bins."""
    ch = tl.arange(0, CP2)
    bins = tl.arange(0, NB)
    cand_bin = ((bins >= lo) & (bins <= hi)) | (bins == bk)
    per_chunk = tl.sum(tl.where(cand_bin[None, :], _chunk_counts(counts_ptr, row, C, C, CP2), 0),
                       axis=1)
    ends = tl.cumsum(per_chunk, axis=0)  # (CP2,) where each chunk's candidates end
    kept = tl.load(cabove_ptr + row * C + ch, mask=ch < C, other=0.0)
    for start in range(0, n, SMALL_BUF):
        offs = start + tl.arange(0, SMALL_BUF)
        z = tl.load(bufz_ptr + row * BUF + offs, mask=offs < n, other=float("-inf"))
        e = tl.exp((z - zmax) * invt)
        e = tl.where((offs < n) & (z >= tau) & (e >= min_p), e, 0.0)
        chunk = tl.sum((offs[:, None] >= ends[None, :]).to(tl.int32), axis=1)
        kept += tl.sum(tl.where(chunk[:, None] == ch[None, :], e[:, None], 0.0), axis=0)
    tl.store(ckept_ptr + row * C + ch, kept, mask=ch < C)


@triton.jit
def solve_kernel(l_ptr, l_stride, w_ptr, rows_ptr, cmax_ptr, cbad_ptr, cnorm_ptr, plan_ptr,
                 bufz_ptr, cabove_ptr, cmid_ptr, chist_ptr, hist_ptr, ckept_ptr, tau_ptr, V, C,
                 PENALTIES: tl.constexpr, TILE: tl.constexpr, CP2: tl.constexpr,
                 BUF: tl.constexpr, SMALL_BUF: tl.constexpr, MID_BUF: tl.constexpr):
    """One program per row with a top-k or a top-p: its threshold into ``tau``, from the
    sorted candidates where they fit and decide it (a sort of SMALL_BUF, MID_BUF or BUF), else
    by exact passes over the row. Where the candidates decide it and min-p spares every token
    before them, the chunks' kept masses too (plan word 11 says so; ``kept_kernel`` skips the
    row)."""
    row = tl.program_id(0).to(tl.int64)
    zmax, bad = row_max_bad(cmax_ptr, cbad_ptr, row, C, CP2)
    if sampling_row(rows_ptr, row) & ~bad & filtered(rows_ptr, row, V):
        ch = tl.arange(0, CP2)
        invt = real(rows_ptr, row, F_INV_TEMPERATURE)
        k = word(rows_ptr, row, F_TOP_K)
        has_k = k < V
        top_p = real(rows_ptr, row, F_TOP_P)
        total = tl.sum(chunk_masses(cmax_ptr, cnorm_ptr, row, C, zmax, invt, CP2), axis=0)
        refined, a, s, _, lo, hi, bk, n, n_skip, n_mid = _load_plan(plan_ptr, row)
        above = tl.sum(tl.load(cabove_ptr + row * C + ch, mask=ch < C, other=0.0), axis=0)
        mid = tl.sum(tl.load(cmid_ptr + row * C + ch, mask=ch < C, other=0.0), axis=0)
        tau = zmax
        inside = zmax != zmax  # False (a tensor, as the branches below assign)
        if n <= SMALL_BUF:  # the sort's cost grows as S log^2 S: the least size that holds n
            tau, inside = _solve_candidates(bufz_ptr, row, n, zmax, invt, has_k, k, top_p,
                                            total, refined, a, s, hi, bk, n_skip, n_mid, above,
                                            mid, V, SMALL_BUF, BUF)
        elif n <= MID_BUF:
            tau, inside = _solve_candidates(bufz_ptr, row, n, zmax, invt, has_k, k, top_p,
                                            total, refined, a, s, hi, bk, n_skip, n_mid, above,
                                            mid, V, MID_BUF, BUF)
        elif n <= BUF:
            tau, inside = _solve_candidates(bufz_ptr, row, n, zmax, invt, has_k, k, top_p,
                                            total, refined, a, s, hi, bk, n_skip, n_mid, above,
                                            mid, V, BUF, BUF)
        if not inside:
            pen = has_penalties(rows_ptr, row)
            tau = _solve_row(l_ptr, l_stride, w_ptr, pen, row, V, zmax, invt, has_k, k, top_p,
                             total, PENALTIES, TILE)
        # the least e of a token before bin lo: min-p keeps them all if at most that
        first = tl.where(refined, ((a + COARSE_BASE - 1) << 20) + (lo << s),
                         (lo + COARSE_BASE - 1) << 20)
        lower, _ = bit_edges(first, first + 1)
        min_p = real(rows_ptr, row, F_MIN_P)
        if inside & (min_p <= tl.exp(-lower) * (1.0 - BOUND_SLACK)):
            _kept_from_candidates(bufz_ptr, tl.where(refined, hist_ptr, chist_ptr), cabove_ptr,
                                  ckept_ptr, row, n, C, zmax, invt, tau, min_p, lo, hi, bk, CP2,
                                  BUF, SMALL_BUF)
            tl.store(plan_ptr + row * PLAN_WORDS + 11, 1)
        tl.store(tau_ptr + row, tau)
        path = tl.where(inside, refined.to(tl.int32), 2)  # the coarse bins, a window, passes
        tl.store(plan_ptr + row * PLAN_WORDS + 10, path)


@triton.jit
def row_max_bad(cmax_ptr, cbad_ptr, row, C, CP2: tl.constexpr):
    """(the row's maximum, True if it holds a NaN or +inf or nothing but -inf)."""
    ch = tl.arange(0, CP2)
    zmax = tl.max(tl.load(cmax_ptr + row * C + ch, mask=ch < C, other=float("-inf")), axis=0)
    bad = ((tl.max(tl.load(cbad_ptr + row * C + ch, mask=ch < C, other=0), axis=0) > 0)
           | (zmax == float("-inf")) | (zmax != zmax))
    return zmax, bad


@triton.jit
def kept_kernel(l_ptr, l_stride, w_ptr, rows_ptr, cmax_ptr, cbad_ptr, tau_ptr, plan_ptr,
                ckept_ptr, V, C, PENALTIES: tl.constexpr, PER_PROGRAM: tl.constexpr,
                TILE: tl.constexpr, CP2: tl.constexpr):
    """Each chunk's kept mass for the rows with a threshold (z >= tau, e >= min_p) whose
    masses ``solve_kernel`` did not find from the candidates."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    zmax, bad = row_max_bad(cmax_ptr, cbad_ptr, row, C, CP2)
    done = tl.load(plan_ptr + row * PLAN_WORDS + 11) != 0
    if sampling_row(rows_ptr, row) & ~bad & filtered(rows_ptr, row, V) & ~done:
        pen = has_penalties(rows_ptr, row)
        kept, _, _ = scan_chunk(l_ptr, l_stride, w_ptr, pen, row, c, V, zmax,
                                real(rows_ptr, row, F_INV_TEMPERATURE), tl.load(tau_ptr + row),
                                real(rows_ptr, row, F_MIN_P), 0.0, float("inf"), PENALTIES,
                                PER_PROGRAM, TILE)
        tl.store(ckept_ptr + row * C + c, kept)


@triton.jit(do_not_specialize=["step"])
def pick_kernel(l_ptr, l_stride, w_ptr, rows_ptr, cmax_ptr, carg_ptr, cbad_ptr, cnorm_ptr,
                ckept_ptr, out_ptr, tau_ptr, last_ptr, counts_ptr, V, C, step,
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
        if sampling_row(rows_ptr, row) & ~bad:
            invt = real(rows_ptr, row, F_INV_TEMPERATURE)
            min_p = real(rows_ptr, row, F_MIN_P)
            filt = filtered(rows_ptr, row, V)
            plain = ~filt & (min_p <= 0.0)
            # plain rows: each chunk's mass against its own maximum, rescaled to the row's
            scaled = chunk_masses(cmax_ptr, cnorm_ptr, row, C, zmax, invt, CP2)
            kept = tl.load(ckept_ptr + row * C + ch, mask=(ch < C) & ~plain, other=0.0)
            prefix = tl.cumsum(tl.where(plain, scaled, kept), axis=0)  # (CP2,)
            target = real(rows_ptr, row, F_UNIFORM) * tl.max(prefix, axis=0)
            cstar = tl.minimum(tl.sum((prefix < target).to(tl.int32), axis=0), C - 1)
            owner = c == cstar
            if owner:
                tau = tl.where(filt, tl.load(tau_ptr + row), float("-inf"))
                run = tl.sum(tl.where(ch == cstar - 1, prefix, 0.0), axis=0)
                pen = has_penalties(rows_ptr, row)
                _, found, last = scan_chunk(l_ptr, l_stride, w_ptr, pen, row, c, V, zmax, invt,
                                            tau, min_p, run, target, PENALTIES, PER_PROGRAM,
                                            TILE)
                # within rounding the chunk's own sum may stop short: its last kept token
                token = tl.where(found < V, found, last).to(tl.int32)
    if owner:
        # a new name: a variable may not change its type inside a branch
        tok = tl.where(bad, 0, token).to(tl.int64)
        tl.store(out_ptr + row, tl.where(bad, -1, tok))
        tl.store(tau_ptr + row, tau)
        if step != 0:  # a run-time flag: one compiled kernel for a graph's warm-up and its body
            slot = word(rows_ptr, row, F_SLOT).to(tl.int64)
            tl.store(last_ptr + slot, tok)
            if PENALTIES:
                tl.atomic_add(counts_ptr + slot * V + tok, 1)


def _launch(logits: torch.Tensor, p: RowParams, mode: SamplerMode,
            penalties: PenaltyState | None, out: torch.Tensor, last_token: torch.Tensor | None,
            paths: torch.Tensor | None = None) -> torch.Tensor:
    """Run the kernels; ``out`` (B,) int64 gets the tokens (-1: non-finite row); returns the
    rows' thresholds (B,) float32 (the row maximum for greedy and bad rows, -inf for rows
    without top-k and top-p). ``paths`` (B,) int32, if given, gets for each row with a top-k
    or a top-p how its threshold was found (for tests): 0 from the candidates of coarse bins,
    1 of a refined window, 2 by exact passes over the row."""
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
    # per row and chunk: maximum, mass against it, kept mass, exact masses before the
    # refined window, before the candidates and between their two bin ranges; first argmax
    # and the NaN / +inf flag
    cmax, cnorm, ckept, cbefore, cabove, cmid = torch.empty(6, b, c, dtype=torch.float32,
                                                            device=dev)
    carg, cbad, coff = torch.empty(3, b, c, dtype=torch.int32, device=dev)  # coff: buffer offset
    tau = torch.empty(b, dtype=torch.float32, device=dev)
    sampling = not mode.all_greedy
    grid = (b, c)
    kw = dict(PENALTIES=pen, PER_PROGRAM=TOKENS_PER_PROGRAM, TILE=TILE, num_warps=WARPS,
              enable_fp_fusion=False)
    row = (logits, logits.stride(0), w, p.block.contiguous())  # (B, ROW_WORDS): one pointer
    stats_kernel[grid](*row[:3], counts, prompt, row[3], cmax, carg, cbad, cnorm, v, c,
                       SAMPLING=sampling, **kw)
    if sampling:
        chist, hist = torch.empty(2, b, c, BINS, dtype=torch.int16, device=dev)  # coarse, window
        plan = torch.zeros(b, int(PLAN_WORDS), dtype=torch.int32, device=dev)
        bufz = torch.empty(b, BUF, dtype=torch.float32, device=dev)
        # kernels no row of this batch needs are not launched (the mode says which)
        if mode.filters or mode.min_p:
            histogram_kernel[grid](*row, cmax, cbad, chist, ckept, v, c, CP2=cp2, **kw)
        if mode.filters:
            plans = (row[3], cmax, cbad, cnorm, chist, hist, cbefore, plan, coff, v, c)
            plan_kernel[(b,)](*plans, FINE=False, CP2=cp2, SMALL_BUF=SMALL_BUF, num_warps=WARPS,
                              enable_fp_fusion=False)
            refine_kernel[grid](*row, cmax, cbad, plan, hist, cbefore, v, c, CP2=cp2, **kw)
            plan_kernel[(b,)](*plans, FINE=True, CP2=cp2, SMALL_BUF=SMALL_BUF, num_warps=WARPS,
                              enable_fp_fusion=False)
            gather_kernel[grid](*row, cmax, cbad, plan, coff, bufz, cabove, cmid, v, c, CP2=cp2,
                                BUF=BUF, **kw)
            solve_kernel[(b,)](*row, cmax, cbad, cnorm, plan, bufz, cabove, cmid, chist, hist,
                               ckept, tau, v, c,
                               PENALTIES=pen, TILE=TILE, CP2=cp2, BUF=BUF,
                               SMALL_BUF=SMALL_BUF, MID_BUF=min(2 * SMALL_BUF, BUF),
                               num_warps=SOLVE_WARPS, enable_fp_fusion=False)
            kept_kernel[grid](*row, cmax, cbad, tau, plan, ckept, v, c, CP2=cp2, **kw)
        if paths is not None:
            paths.copy_(plan[:, 10])
    step = last_token is not None
    pick_kernel[grid](*row, cmax, carg, cbad, cnorm, ckept, out, tau, last_token if step else out,
                      counts, v, c, int(step), SAMPLING=sampling, CP2=cp2, **kw)
    return tau


def sample(logits: torch.Tensor, p: RowParams, mode: SamplerMode,
           penalties: PenaltyState | None = None, paths: torch.Tensor | None = None
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens (B,) int64 with -1 for a non-finite row, thresholds (B,) float32): no side
    effects. A row keeps z >= threshold with e >= min_p (``sampler.keep_mask``)."""
    out = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
    return out, _launch(logits, p, mode, penalties, out, None, paths)


def sample_step(logits: torch.Tensor, p: RowParams, mode: SamplerMode, penalties: PenaltyState,
                last_token: torch.Tensor, out: torch.Tensor) -> None:
    """``sampler.sample_step`` on the fused kernels (the bookkeeping in the last one)."""
    _launch(logits, p, mode, penalties, out, last_token)
