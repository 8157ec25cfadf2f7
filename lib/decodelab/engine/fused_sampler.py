"""The fused sampler: penalties, temperature, top-k, top-p, min-p, the draw and the step's
bookkeeping for a whole batch in four Triton kernels, without sorting the vocabulary (GPU
only, imported lazily). It computes ``sampler``'s rule (same kept set, same token-id-order
draw from the same uniform); float sums run in another order, so a uniform or a top-p mass
within rounding of a boundary may resolve the other way.

1. ``stats_kernel`` (row x chunk of CHUNK tokens): the penalised logits z (stored for rows with
   penalties only), the chunk's maximum, its first argmax, a NaN / +inf flag.
2. ``histogram_kernel`` (row x chunk): the gap g = z_max - z of each token in NB bins (the float's
   bits: exponent and 3 mantissa bits, so a bin's tokens are a range of z), per chunk, and
   the chunk's mass sum of e = exp((z - z_max) / T). Integer counts: no order to depend on.
3. ``gather_kernel`` (row x chunk): from the row's histogram, the gap bin b* (the first that holds
   the top-k, or for a row without top-k the last whose tokens fit BUF), then each chunk
   copies its tokens with bin <= b* into the row's buffer in token order, at the offset the
   histograms give (no atomics), and reports the largest z it left out.
4. ``_solve`` (one program per row): greedy rows take the argmax. A sampling row whose kept
   set provably lies in its buffer solves there without sorting: for each buffer value, the
   count and the mass of the buffer values strictly greater (blocks of PAIRS x PAIRS pairs,
   n^2 for n candidates, small) give tau_k (the least value with fewer than k above it) and
   tau_p (the least with a mass above below top_p times the top-k mass), then the draw runs
   over the buffer in id order; any other row (top-k beyond the buffer, a nucleus larger
   than it, min-p or no filter at all over a flat row) takes exact passes over its row:
   bisection on the order-preserving integer key of z for tau_k and tau_p (32 passes each at
   most), and two passes for the draw. Then the output row, ``last_token[slot]`` and the
   penalty count of the sampled token.

A row's work depends only on its own logits and parameters: the same token alone or in any
batch, with or without penalties in other rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from decodelab.engine.fused_passes import (
    BUF,
    CHUNK,
    GREEDY,
    NB,
    TILE,
    gather_kernel,
    has_penalties,
    histogram_kernel,
    plan,
    solve_row,
    stats_kernel,
)

PAIRS = 64  # the buffer solve's blocks of value pairs, PAIRS x PAIRS

if TYPE_CHECKING:  # the reference imports this module lazily: no circle
    from decodelab.engine.sampler import PenaltyState, RowParams, SamplerMode


@triton.jit
def _greater(bufz_ptr, row, n, zi, zmax, invt, MASS: tl.constexpr, IB: tl.constexpr,
             JB: tl.constexpr, BUF: tl.constexpr):
    """For values zi (IB,): how many buffer values are strictly greater, and their mass."""
    cnt = tl.zeros((IB,), tl.int32)
    mass = tl.zeros((IB,), tl.float32)
    for j0 in range(0, n, JB):
        offs = j0 + tl.arange(0, JB)
        zj = tl.load(bufz_ptr + row * BUF + offs, mask=offs < n, other=float("-inf"))
        gt = (zj[None, :] > zi[:, None]) & (offs < n)[None, :]  # (IB, JB)
        cnt += tl.sum(gt.to(tl.int32), axis=1)
        if MASS:
            ej = tl.exp((zj - zmax) * invt)
            mass += tl.sum(tl.where(gt, ej[None, :], 0.0), axis=1)
    return cnt, mass


@triton.jit
def _buffer_block(bufz_ptr, row, n, i0, zmax, invt, IB: tl.constexpr, BUF: tl.constexpr):
    offs = i0 + tl.arange(0, IB)
    valid = offs < n
    z = tl.load(bufz_ptr + row * BUF + offs, mask=valid, other=float("-inf"))
    return z, tl.where(valid, tl.exp((z - zmax) * invt), 0.0), valid


@triton.jit
def _solve_buffer(bufz_ptr, bufi_ptr, row, n, zmax, invt, has_k, k, top_p, min_p, u,
                  total_all, left_out, IB: tl.constexpr, JB: tl.constexpr, BUF: tl.constexpr):
    """The row's buffer (its n tokens of the gap bins <= b*, in id order): (token, threshold,
    True if the kept set lies in the buffer, i.e. the result holds). No sort: each value's
    count and mass of strictly greater values, blocks of IB x JB pairs (n is small)."""
    tk = tl.full((), float("inf"), tl.float32)
    total_k = tl.full((), 0.0, tl.float32)
    buf_mass = tl.full((), 0.0, tl.float32)
    for i0 in range(0, n, IB):  # tau_k: the least value with fewer than k values above it
        z, e, valid = _buffer_block(bufz_ptr, row, n, i0, zmax, invt, IB, BUF)
        buf_mass += tl.sum(e, axis=0)
        if has_k:
            above, _ = _greater(bufz_ptr, row, n, z, zmax, invt, False, IB, JB, BUF)
            in_k = valid & (above < k)
            tk = tl.minimum(tk, tl.min(tl.where(in_k, z, float("inf")), axis=0))
            total_k += tl.sum(tl.where(in_k, e, 0.0), axis=0)
    tk = tl.where(has_k, tk, float("-inf"))
    total = tl.where(has_k, total_k, total_all)
    tp = tl.full((), float("-inf"), tl.float32)
    if top_p < 1.0:  # tau_p: the least value of the top-k set with mass above < top_p * total
        tp = tl.full((), float("inf"), tl.float32)
        for i0 in range(0, n, IB):
            z, e, valid = _buffer_block(bufz_ptr, row, n, i0, zmax, invt, IB, BUF)
            _, above = _greater(bufz_ptr, row, n, z, zmax, invt, True, IB, JB, BUF)
            keep = valid & (z >= tk) & (above < top_p * total)
            tp = tl.minimum(tp, tl.min(tl.where(keep, z, float("inf")), axis=0))
    tau = tl.maximum(tk, tp)
    # tokens left out of the buffer are below all of it: the kept set lies inside if top-k
    # stops above them, min-p drops them, or the top-p mass is reached inside
    e_out = tl.exp((left_out - zmax) * invt)
    inside = (has_k | (left_out == float("-inf")) | (e_out < min_p)
              | ((top_p < 1.0) & (buf_mass >= top_p * total)))
    kept = tl.full((), 0.0, tl.float32)
    for i0 in range(0, n, IB):  # the kept mass, then the draw: running sums in id order
        z, e, valid = _buffer_block(bufz_ptr, row, n, i0, zmax, invt, IB, BUF)
        cum = tl.cumsum(tl.where(valid & (z >= tau) & (e >= min_p), e, 0.0), axis=0) + kept
        kept = tl.max(cum, axis=0)
    run = tl.full((), 0.0, tl.float32)
    pos = tl.full((), 0, tl.int32)
    for i0 in range(0, n, IB):
        z, e, valid = _buffer_block(bufz_ptr, row, n, i0, zmax, invt, IB, BUF)
        cum = tl.cumsum(tl.where(valid & (z >= tau) & (e >= min_p), e, 0.0), axis=0) + run
        pos += tl.sum((cum < u * kept).to(tl.int32), axis=0)
        run = tl.max(cum, axis=0)
    return tl.load(bufi_ptr + row * BUF + pos), tau, inside


@triton.jit(do_not_specialize=["step"])
def _solve(l_ptr, l_stride, w_ptr, rep_ptr, pres_ptr, freq_ptr, temp_ptr, invt_ptr, topk_ptr,
           topp_ptr, minp_ptr, u_ptr, slot_ptr, cmax_ptr, carg_ptr, cbad_ptr, hist_ptr,
           cmass_ptr, cout_ptr, bufz_ptr, bufi_ptr, out_ptr, tau_ptr, last_ptr, counts_ptr, V, C,
           step, PENALTIES: tl.constexpr, SAMPLING: tl.constexpr,
           TILE: tl.constexpr, CP2: tl.constexpr, NB: tl.constexpr, BUF: tl.constexpr,
           PAIRS: tl.constexpr):
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
            _, per_chunk, has_k, k = plan(hist_ptr, topk_ptr, row, V, C, CP2, NB, BUF)
            n = tl.sum(per_chunk, axis=0)
            total_all = tl.sum(tl.load(cmass_ptr + row * C + ch, mask=ch < C, other=0.0), axis=0)
            left_out = tl.max(tl.load(cout_ptr + row * C + ch, mask=ch < C,
                                      other=float("-inf")), axis=0)
            inside = zmax != zmax  # False (a tensor, as the branch below assigns)
            if (n >= 1) & (n <= BUF):
                token, tau, inside = _solve_buffer(bufz_ptr, bufi_ptr, row, n, zmax, invt, has_k,
                                                   k, top_p, min_p, u, total_all, left_out,
                                                   PAIRS, PAIRS, BUF)
            if not inside:
                token, tau = solve_row(l_ptr, l_stride, w_ptr, pen, row, V, zmax, invt, has_k,
                                        k, top_p, min_p, u, total_all, PENALTIES, TILE)
    token = tl.where(bad, 0, token.to(tl.int64))
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
    c = triton.cdiv(v, CHUNK)
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
    grid, kw = (b, c), dict(PENALTIES=pen, CHUNK=CHUNK, TILE=TILE)
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
                 SAMPLING=sampling, TILE=TILE, CP2=cp2, NB=NB, BUF=BUF, PAIRS=PAIRS, num_warps=4)
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
