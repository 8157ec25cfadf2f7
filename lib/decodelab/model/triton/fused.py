"""Fused Triton kernels for the decode step's small operations (GPU only, imported lazily).

At batch 1 a decode step reads ~2.5 GB of weights in 4 matmuls per layer; everything else is
tiny, and as separate torch ops it would be ~30 kernel launches per layer whose fixed cost
adds up to more than the matmuls' memory time. Fused here, one kernel each:

- ``add_rms_norm``: residual add (in place, rounded to the model dtype as transformers does)
  then RMSNorm of the sum; ``rms_norm`` without the add (at batch 1 only the final norm: the
  others run inside the next gemv, see ``linear.add_norm_gemv``).
- ``rope_write``: rotary embedding of q and k, and the store of k and v into the paged cache
  at their slots (slot -1, a padding row, stores nothing).
- ``silu_mul``: SwiGLU's silu(gate) * up (batches > 1; at batch 1 the down projection's gemv
  computes it on the fly, see ``linear``).

``ops.TritonOps`` gathers them behind the same methods as ``model.TorchOps``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from decodelab.model.kv_cache import PagedKVCache
from decodelab.model.triton.pdl import enter as _pdl_enter
from decodelab.model.triton.pdl import launch_kw


@triton.jit
def _add_rms_norm_kernel(h_ptr, x_ptr, w_ptr, y_ptr, n, eps, HAS_X: tl.constexpr,
                         BLOCK: tl.constexpr, PDL: tl.constexpr):
    _pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64) * n
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    h = tl.load(h_ptr + row + offs, mask=mask, other=0.0)
    if HAS_X:
        h = (h.to(tl.float32) + tl.load(x_ptr + row + offs, mask=mask, other=0.0).to(tl.float32))
        h = h.to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + row + offs, h, mask=mask)
    hf = h.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(hf * hf, axis=0) / n + eps)
    y = (hf * rstd).to(y_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row + offs, (w * y).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rope_write_kernel(qkv_ptr, pos_ptr, cos_ptr, sin_ptr, slot_ptr, q_out_ptr, k_ptr, v_ptr,
                       stride_t, stride_kb, stride_kh, stride_kt,
                       H: tl.constexpr, HKV: tl.constexpr, HP: tl.constexpr,
                       HALF: tl.constexpr, BS: tl.constexpr, PDL: tl.constexpr):
    """One program per token: its H query and HKV key heads rotated as one (HP, HALF) tile
    pair (HP = H + HKV padded to a power of two), q stored, k and v stored at the token's
    cache slot. The token's position, slot and cos/sin row are read once for all its heads."""
    _pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    D: tl.constexpr = 2 * HALF
    head = tl.arange(0, HP)  # 0 .. H-1: query heads; H .. H+HKV-1: key heads
    i = tl.arange(0, HALF)
    live = head < H + HKV
    pos = tl.load(pos_ptr + t).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    c = tl.load(cos_ptr + pos * HALF + i).to(tl.float32)[None, :]
    s = tl.load(sin_ptr + pos * HALF + i).to(tl.float32)[None, :]
    src = qkv_ptr + t * stride_t + head[:, None] * D + i[None, :]  # q heads, then k, then v
    x1 = tl.load(src, mask=live[:, None], other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=live[:, None], other=0.0).to(tl.float32)
    r1 = (x1 * c - x2 * s).to(q_out_ptr.dtype.element_ty)
    r2 = (x2 * c + x1 * s).to(q_out_ptr.dtype.element_ty)
    is_q = (head < H)[:, None]
    dst = q_out_ptr + (t * H + head[:, None]) * D + i[None, :]
    tl.store(dst, r1, mask=is_q)
    tl.store(dst + HALF, r2, mask=is_q)
    # key head j = head - H; a padding row (slot -1) stores nothing
    is_k = ((head >= H) & live & (slot >= 0))[:, None]
    kvh = tl.maximum(head - H, 0)[:, None]
    slot = tl.maximum(slot, 0)
    off = (slot // BS) * stride_kb + kvh * stride_kh + (slot % BS) * stride_kt + i[None, :]
    tl.store(k_ptr + off, r1, mask=is_k)
    tl.store(k_ptr + off + HALF, r2, mask=is_k)
    vsrc = src + HKV * D  # key head j's value head sits HKV heads later in the row
    tl.store(v_ptr + off, tl.load(vsrc, mask=is_k, other=0.0), mask=is_k)
    tl.store(v_ptr + off + HALF, tl.load(vsrc + HALF, mask=is_k, other=0.0), mask=is_k)


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, f, BLOCK: tl.constexpr, PDL: tl.constexpr):
    _pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < f
    g = tl.load(gu_ptr + row * 2 * f + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * 2 * f + f + cols, mask=mask, other=0.0).to(tl.float32)
    # Round silu(g) to the model dtype before the product, as F.silu(gate) * up does.
    act = (g / (1.0 + tl.exp(-g))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * f + cols, (act * u).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm_rows(h: torch.Tensor, x: torch.Tensor | None, w: torch.Tensor, eps: float, *,
                  pdl: bool = False) -> torch.Tensor:
    t, n = h.shape
    y = torch.empty_like(h)
    block = triton.next_power_of_2(n)
    _add_rms_norm_kernel[(t,)](h, x if x is not None else h, w, y, n, eps, HAS_X=x is not None,
                               BLOCK=block, PDL=pdl, num_warps=min(16, max(1, block // 256)),
                               **launch_kw(pdl))
    return y


def silu_mul(gate_up: torch.Tensor, *, pdl: bool = False) -> torch.Tensor:
    t, two_f = gate_up.shape
    f = two_f // 2
    out = torch.empty((t, f), dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _silu_mul_kernel[(t, triton.cdiv(f, block))](gate_up.contiguous(), out, f, BLOCK=block,
                                                  PDL=pdl, num_warps=4, **launch_kw(pdl))
    return out


def rope_write(q, k, v, positions, cos, sin, cache: PagedKVCache, layer: int,
               slot_mapping, *, pdl: bool = False) -> torch.Tensor:
    """q (T, H, D), k, v (T, Hkv, D): views of one (T, (H + 2 Hkv) D) qkv matrix."""
    t, h, d = q.shape
    hkv = k.shape[1]
    # q is the first column block of qkv, so its data pointer is qkv's row 0.
    if k.data_ptr() != q.data_ptr() + h * d * q.element_size():
        raise ValueError("rope_write expects q, k, v as consecutive views of one qkv matrix")
    q_out = torch.empty((t, h, d), dtype=q.dtype, device=q.device)
    kc, vc = cache.k[layer], cache.v[layer]
    heads = triton.next_power_of_2(h + hkv)
    _rope_write_kernel[(t,)](
        q, positions, cos, sin, slot_mapping, q_out, kc, vc, q.stride(0), kc.stride(0),
        kc.stride(1), kc.stride(2), H=h, HKV=hkv, HP=heads, HALF=d // 2, BS=cache.block_size,
        PDL=pdl, num_warps=max(1, min(8, heads * d // 512)), **launch_kw(pdl))
    return q_out
