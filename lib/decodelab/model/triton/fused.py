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
                       H: tl.constexpr, HKV: tl.constexpr, HALF: tl.constexpr, BS: tl.constexpr,
                       PDL: tl.constexpr):
    _pdl_enter(PDL)
    t = tl.program_id(0)
    head = tl.program_id(1)  # 0 .. H-1: a query head; H .. H+HKV-1: a KV head
    D: tl.constexpr = 2 * HALF
    i = tl.arange(0, HALF)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    c = tl.load(cos_ptr + pos * HALF + i).to(tl.float32)
    s = tl.load(sin_ptr + pos * HALF + i).to(tl.float32)
    src = qkv_ptr + t.to(tl.int64) * stride_t + head * D  # q heads, then k heads, then v heads
    x1 = tl.load(src + i).to(tl.float32)
    x2 = tl.load(src + HALF + i).to(tl.float32)
    r1 = (x1 * c - x2 * s).to(q_out_ptr.dtype.element_ty)
    r2 = (x2 * c + x1 * s).to(q_out_ptr.dtype.element_ty)
    if head < H:
        dst = q_out_ptr + (t.to(tl.int64) * H + head) * D
        tl.store(dst + i, r1)
        tl.store(dst + HALF + i, r2)
    else:
        slot = tl.load(slot_ptr + t).to(tl.int64)
        ok = (i * 0 + slot) >= 0  # padding rows (slot -1) store nothing
        slot = tl.maximum(slot, 0)
        kvh = head - H
        off = (slot // BS) * stride_kb + kvh * stride_kh + (slot % BS) * stride_kt
        tl.store(k_ptr + off + i, r1, mask=ok)
        tl.store(k_ptr + off + HALF + i, r2, mask=ok)
        vsrc = src + HKV * D
        tl.store(v_ptr + off + i, tl.load(vsrc + i), mask=ok)
        tl.store(v_ptr + off + HALF + i, tl.load(vsrc + HALF + i), mask=ok)


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
    _rope_write_kernel[(t, h + hkv)](
        q, positions, cos, sin, slot_mapping, q_out, kc, vc, q.stride(0), kc.stride(0),
        kc.stride(1), kc.stride(2), H=h, HKV=hkv, HALF=d // 2, BS=cache.block_size, PDL=pdl,
        num_warps=1, **launch_kw(pdl))
    return q_out
