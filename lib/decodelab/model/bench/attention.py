"""Paged decode attention against its peer, SDPA over a contiguous cache (table ``paged_attention``).

For each (batch, context) at a model's attention shapes (heads, KV heads, head dim):

- ``paged``: our Triton paged attention over a shuffled block table (K/V read in place);
- ``sdpa_contiguous``: ``torch.nn.functional.scaled_dot_product_attention`` over a contiguous
  (B, Hkv, T, D) cache of the same K/V with ``enable_gqa=True``, at its best: every SDPA backend
  that accepts the shapes is timed and the fastest is kept (its name in ``detail``).

Both are validated against the gather reference before timing. Each timed call reads another
layer's K/V (as a decode step does), from enough copies that they do not fit in L2; the calls
are captured in a CUDA graph and timed by replay, so a short call's launch gap is not counted.
``kv_gb_s`` = bytes of K and V attended / time per layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from decodelab.core.capture import capture, warm_up
from decodelab.core.timing import summarize, time_graph_replays
from decodelab.model.attention import paged_decode_attention_ref
from decodelab.model.config import ModelConfig

ATTENTION_TABLE = "paged_attention"
ROTATE_BYTES = 256 << 20  # K/V bytes cycled through per timed call: several times the L2
MAX_COPIES = 16
BF16_RTOL = 2e-2  # bf16 inputs, fp32 softmax on both sides


@dataclass(frozen=True, slots=True)
class AttentionRow:
    impl: str  # "paged" or "sdpa_contiguous"
    batch: int
    context: int
    heads: int
    kv_heads: int
    head_dim: int
    block_size: int
    us_per_layer: float
    us_q1: float
    us_q3: float
    kv_bytes: int  # K and V attended per layer
    kv_gb_s: float
    max_rel_err: float  # against the gather reference
    detail: str = ""
    model: str = ""  # the run's (stamped when the bench ends)
    dtype: str = ""


@dataclass(frozen=True, slots=True)
class _Layer:
    k_pool: torch.Tensor  # (num_blocks, Hkv, block_size, D)
    v_pool: torch.Tensor
    block_tables: torch.Tensor  # (B, M) int32, shuffled blocks
    k: torch.Tensor  # (B, Hkv, T, D) the same K/V, contiguous
    v: torch.Tensor


def _layer(batch: int, context: int, cfg: ModelConfig, block_size: int, dtype: torch.dtype,
           gen: torch.Generator) -> _Layer:
    dev, hkv, d = gen.device, cfg.num_kv_heads, cfg.head_dim
    width = -(-context // block_size)
    num_blocks = batch * width
    k_pool = torch.randn((num_blocks, hkv, block_size, d), generator=gen, device=dev).to(dtype)
    v_pool = torch.randn((num_blocks, hkv, block_size, d), generator=gen, device=dev).to(dtype)
    bt = torch.randperm(num_blocks, generator=gen, device=dev).view(batch, width).int()
    # (B, M, Hkv, bs, D) -> (B, Hkv, M * bs, D), cut to the context: the contiguous peer's cache.
    k = k_pool[bt.long()].permute(0, 2, 1, 3, 4).reshape(batch, hkv, width * block_size, d)
    v = v_pool[bt.long()].permute(0, 2, 1, 3, 4).reshape(batch, hkv, width * block_size, d)
    return _Layer(k_pool, v_pool, bt, k[:, :, :context].contiguous(),
                  v[:, :, :context].contiguous())


def _sdpa_backends():
    from torch.nn.attention import SDPBackend

    return {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}


def _sdpa(q: torch.Tensor, layer: _Layer, scale: float, backend) -> torch.Tensor:
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel([backend]):
        out = F.scaled_dot_product_attention(q[:, :, None], layer.k, layer.v, scale=scale,
                                             enable_gqa=True)  # (B, H, 1, D)
    return out[:, :, 0]


def _rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.float() - ref.float()).norm() / ref.float().norm())


def _timed(fn, layers: list, repeats: int) -> tuple[float, float, float]:
    """µs per call (median, q1, q3) from CUDA-graph replays of one call per layer copy: the
    graph removes launch gaps, so short calls are timed on the device, not the host."""
    warm_up(lambda: [fn(layer) for layer in layers])
    graph, _ = capture(lambda: [fn(layer) for layer in layers])
    samples = [time_graph_replays(graph, reps=5) / len(layers) for _ in range(repeats)]
    stats = summarize(samples)
    return stats.median * 1e6, stats.q1 * 1e6, stats.q3 * 1e6


def attention_rows(cfg: ModelConfig, batches, contexts, *, block_size: int = 16,
                   dtype: torch.dtype = torch.bfloat16, repeats: int = 15
                   ) -> list[AttentionRow]:
    """Validate, then time paged attention and the SDPA peer at every batch x context (CUDA)."""
    from decodelab.model.triton.attention import paged_decode_attention

    gen = torch.Generator(device="cuda").manual_seed(0)
    scale = cfg.head_dim ** -0.5
    rows = []
    for batch in batches:
        for context in contexts:
            kv_bytes = 2 * batch * context * cfg.num_kv_heads * cfg.head_dim * dtype.itemsize
            copies = max(1, min(MAX_COPIES, math.ceil(ROTATE_BYTES / kv_bytes)))
            layers = [_layer(batch, context, cfg, block_size, dtype, gen) for _ in range(copies)]
            q = torch.randn((batch, cfg.num_heads, cfg.head_dim), generator=gen,
                            device="cuda").to(dtype)
            lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
            first = layers[0]
            ref = paged_decode_attention_ref(q, first.k_pool, first.v_pool, first.block_tables,
                                             lens, scale)

            def paged(layer, q=q, lens=lens):
                return paged_decode_attention(q, layer.k_pool, layer.v_pool,
                                              layer.block_tables, lens, scale)

            candidates = {"paged": {"": paged}, "sdpa_contiguous": {
                name: (lambda layer, q=q, b=backend: _sdpa(q, layer, scale, b))
                for name, backend in _sdpa_backends().items()}}
            shape = dict(batch=batch, context=context, heads=cfg.num_heads,
                         kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                         block_size=block_size, kv_bytes=kv_bytes)
            for impl, variants in candidates.items():
                best = None
                for name, fn in variants.items():
                    try:
                        err = _rel_err(fn(first), ref)
                    except RuntimeError:  # this SDPA backend refuses these shapes
                        continue
                    if err > BF16_RTOL:
                        raise AssertionError(f"{impl} {name} attention vs reference at batch "
                                             f"{batch}, context {context}: {err:.3g}")
                    us, q1, q3 = _timed(fn, layers, repeats)
                    if best is None or us < best.us_per_layer:
                        best = AttentionRow(impl, us_per_layer=us, us_q1=q1, us_q3=q3,
                                            kv_gb_s=kv_bytes / us / 1e3, max_rel_err=err,
                                            detail=name, **shape)
                if best is None:
                    raise RuntimeError(f"no {impl} variant ran at batch {batch}, context "
                                       f"{context}")
                rows.append(best)
            del layers
            torch.cuda.empty_cache()
    return rows
