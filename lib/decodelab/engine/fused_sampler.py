"""The fused sampler: penalties, temperature, top-k, top-p, min-p, the draw and the step's
bookkeeping for a whole batch in four Triton kernels, without sorting the vocabulary (GPU
only, imported lazily). It computes ``sampler``'s rule (same kept set, same token-id-order
draw from the same uniform); float sums run in another order, so a uniform or a top-p mass
within rounding of a boundary may resolve the other way.

1. ``stats_kernel`` (row x chunk of TOKENS_PER_PROGRAM tokens): the penalised logits z
   (stored for rows with penalties only), the chunk's maximum, its first argmax, a NaN / +inf flag.
2. ``histogram_kernel`` (row x chunk): the gap g = z_max - z of each token in NB bins (the
   float's bits: exponent and 3 mantissa bits, so a bin's tokens are a range of z), per chunk, and
   the chunk's mass sum of e = exp((z - z_max) / T). Integer counts: no order to depend on.
3. ``gather_kernel`` (row x chunk): from the row's histogram, the gap bin b* (the first that
   holds the top-k, or for a row without top-k the last whose tokens fit BUF), then each chunk
   copies its tokens with bin <= b* into the row's buffer in token order, at the offset the
   histograms give (no atomics), and reports the largest z it left out.
4. ``_solve`` (one program per row): greedy rows take the argmax. A sampling row whose kept
   set provably lies in its buffer sorts the buffer's values (at most BUF, in registers) for
   tau_k and tau_p and draws from it; any other row (top-k beyond the buffer, a nucleus
   larger than it, min-p or no filter at all over a flat row) takes exact passes over its
   row: bisection on the order-preserving integer key of z for tau_k and tau_p (32 passes
   each at most), and two passes for the draw. Then the output row, ``last_token[slot]``
   and the penalty count of the sampled token.

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
           freq_ptr, cmax_ptr, carg_ptr, cbad_ptr, V, C,
           PENALTIES: tl.constexpr, PER_PROGRAM: tl.constexpr, TILE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    best = tl.full((), float("-inf"), tl.float32)
    arg = tl.full((), 0, tl.int32)
    bad = tl.full((), 0, tl.int32)
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
               PER_PROGRAM: tl.constexpr, TILE: tl.constexpr, CP2: tl.constexpr, NB: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    if tl.load(temp_ptr + row) >= GREEDY:
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
def gather_kernel(l_ptr, l_stride, w_ptr, rep_ptr, pres_ptr, freq_ptr, temp_ptr, topk_ptr, cmax_ptr,
            hist_ptr, bufz_ptr, bufi_ptr, cout_ptr, V, C, PENALTIES: tl.constexpr,
            PER_PROGRAM: tl.constexpr, TILE: tl.constexpr, CP2: tl.constexpr, NB: tl.constexpr,
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
        for t in range(0, PER_PROGRAM, TILE):
            offs = c * PER_PROGRAM + t + tl.arange(0, TILE)
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
def _cumulate(l_ptr, l_stride, w_ptr, pen, row, V, zmax, invt, t, min_p, target,
              PENALTIES: tl.constexpr, TILE: tl.constexpr):
    """Over the kept tokens in id order: (their mass, how many running sums are < target)."""
    run = tl.full((), 0.0, tl.float32)
    cnt = tl.full((), 0, tl.int32)
    for start in range(0, V, TILE):
        offs = start + tl.arange(0, TILE)
        mask = offs < V
        z = load_z(l_ptr, l_stride, w_ptr, pen, row, offs, mask, V, PENALTIES)
        e = tl.exp((z - zmax) * invt)
        keep = mask & (order_key(z) >= t) & (e >= min_p)
        cum = tl.cumsum(tl.where(keep, e, 0.0), axis=0) + run
        cnt += tl.sum((cum < target).to(tl.int32), axis=0)
        run = tl.max(cum, axis=0)
    return run, cnt


@triton.jit
def _solve_row(l_ptr, l_stride, w_ptr, pen, row, V, zmax, invt, has_k, k, top_p, min_p, u,
               total_all, PENALTIES: tl.constexpr, TILE: tl.constexpr):
    """Exact passes over the whole row: (token, threshold)."""
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
    kept, _ = _cumulate(l_ptr, l_stride, w_ptr, pen, row, V, zmax, invt, t, min_p, -1.0,
                        PENALTIES, TILE)
    _, token = _cumulate(l_ptr, l_stride, w_ptr, pen, row, V, zmax, invt, t, min_p, u * kept,
                         PENALTIES, TILE)
    return token, from_key(t)


@triton.jit
def _solve_buffer(bufz_ptr, bufi_ptr, row, n, zmax, invt, has_k, k, top_p, min_p, u,
                  total_all, left_out, BUF: tl.constexpr):
    """The row's buffer (its n largest-gap-bin tokens, in id order): (token, threshold, True
    if the kept set lies in the buffer, i.e. the result holds)."""
    offs = tl.arange(0, BUF)
    valid = offs < n
    z = tl.load(bufz_ptr + row * BUF + offs, mask=valid, other=float("-inf"))
    e = tl.where(valid, tl.exp((z - zmax) * invt), 0.0)
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
    tau = tl.maximum(tk, tp)
    # tokens left out of the buffer are below all of it: the kept set lies inside if top-k
    # stops above them, min-p drops them, or the top-p mass is reached inside
    e_out = tl.exp((left_out - zmax) * invt)
    inside = (has_k | (left_out == float("-inf")) | (e_out < min_p)
              | ((top_p < 1.0) & (tl.max(c, axis=0) >= top_p * total)))
    cum = tl.cumsum(tl.where(valid & (z >= tau) & (e >= min_p), e, 0.0), axis=0)
    pos = tl.sum((cum < u * tl.max(cum, axis=0)).to(tl.int32), axis=0)
    idx = tl.load(bufi_ptr + row * BUF + offs, mask=valid, other=-1)
    return tl.max(tl.where(offs == pos, idx, -1), axis=0), tau, inside


@triton.jit(do_not_specialize=["step"])
def _solve(l_ptr, l_stride, w_ptr, rep_ptr, pres_ptr, freq_ptr, temp_ptr, invt_ptr, topk_ptr,
           topp_ptr, minp_ptr, u_ptr, slot_ptr, cmax_ptr, carg_ptr, cbad_ptr, hist_ptr,
           cmass_ptr, cout_ptr, bufz_ptr, bufi_ptr, out_ptr, tau_ptr, last_ptr, counts_ptr, V, C,
           step, PENALTIES: tl.constexpr, SAMPLING: tl.constexpr,
           TILE: tl.constexpr, CP2: tl.constexpr, NB: tl.constexpr, BUF: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    ch = tl.arange(0, CP2)
    maxes = tl.load(cmax_ptr + row * C + ch, mask=ch < C, other=float("-inf"))
    zmax = tl.max(maxes, axis=0)
    first = tl.argmax(maxes, axis=0, tie_break_left=True)  # the first chunk holding the max
    token = tl.load(carg_ptr + row * C + first)
    bad = ((tl.max(tl.load(cbad_ptr + row * C + ch, mask=ch < C, other=0), axis=0) > 0)
           | (zmax == float("-inf")) | (zmax != zmax))
    tau = zmax
    if SAMPLING:  # noqa: SIM102 - a compile-time branch around a run-time one
        if (tl.load(temp_ptr + row) >= GREEDY) & ~bad:
            pen = has_penalties(rep_ptr, pres_ptr, freq_ptr, row)
            invt = tl.load(invt_ptr + row)
            top_p = tl.load(topp_ptr + row)
            min_p = tl.load(minp_ptr + row)
            u = tl.load(u_ptr + row)
            _, per_chunk, has_k, k = cutoff_bin(hist_ptr, topk_ptr, row, V, C, CP2, NB, BUF)
            n = tl.sum(per_chunk, axis=0)
            total_all = tl.sum(tl.load(cmass_ptr + row * C + ch, mask=ch < C, other=0.0), axis=0)
            left_out = tl.max(tl.load(cout_ptr + row * C + ch, mask=ch < C,
                                      other=float("-inf")), axis=0)
            inside = zmax != zmax  # False (a tensor, as the branch below assigns)
            if (n >= 1) & (n <= BUF):
                token, tau, inside = _solve_buffer(bufz_ptr, bufi_ptr, row, n, zmax, invt, has_k,
                                                   k, top_p, min_p, u, total_all, left_out, BUF)
            if not inside:
                token, tau = _solve_row(l_ptr, l_stride, w_ptr, pen, row, V, zmax, invt, has_k,
                                        k, top_p, min_p, u, total_all, PENALTIES, TILE)
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
    """Run the four kernels; ``out`` (B,) int64 gets the tokens (-1: non-finite row); returns
    the rows' thresholds (B,) float32 (the row maximum for greedy and bad rows)."""
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
    cmax, cmass, cout = torch.empty(3, b, c, dtype=torch.float32, device=dev)
    carg, cbad = torch.empty(2, b, c, dtype=torch.int32, device=dev)
    tau = torch.empty(b, dtype=torch.float32, device=dev)
    inv_t = p.inv_t()
    grid, kw = (b, c), dict(PENALTIES=pen, PER_PROGRAM=TOKENS_PER_PROGRAM, TILE=TILE)
    pens = (p.repetition, p.presence, p.frequency)
    stats_kernel[grid](logits, logits.stride(0), w, counts, prompt, p.slot, *pens, cmax, carg, cbad,
                 v, c, **kw, num_warps=4, enable_fp_fusion=False)
    sampling = not mode.all_greedy
    hist = torch.empty(b, c, NB, dtype=torch.int32, device=dev) if sampling else carg
    bufz = torch.empty(b, BUF, dtype=torch.float32, device=dev) if sampling else cmax
    bufi = torch.empty(b, BUF, dtype=torch.int32, device=dev) if sampling else carg
    if sampling:
        histogram_kernel[grid](logits, logits.stride(0), w, *pens, p.temperature, inv_t, cmax, hist,
                         cmass, v, c, **kw, CP2=cp2, NB=NB, num_warps=4)
        gather_kernel[grid](logits, logits.stride(0), w, *pens, p.temperature, p.top_k, cmax, hist,
                      bufz, bufi, cout, v, c, **kw, CP2=cp2, NB=NB, BUF=BUF, num_warps=4)
    step = last_token is not None
    _solve[(b,)](logits, logits.stride(0), w, *pens, p.temperature, inv_t, p.top_k, p.top_p,
                 p.min_p, p.uniform, p.slot, cmax, carg, cbad, hist, cmass, cout, bufz, bufi,
                 out, tau, last_token if step else out, counts, v, c, int(step), PENALTIES=pen,
                 SAMPLING=sampling, TILE=TILE, CP2=cp2, NB=NB, BUF=BUF, num_warps=8)
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
