"""Paged decode attention against its peers (table ``paged_attention``).

For each (batch, context) at a model's attention shapes (heads, KV heads, head dim), with
every row at the context (``lens`` "uniform") and with a serving batch's spread (``lens``
"mixed": each row's context drawn uniformly from 1 to twice the context, seeded):

- ``paged``: our Triton paged attention over a shuffled block table (K/V read in place), its
  programs taking the rows longest first as in the model's step (``attention_plan.row_order``);
- ``paged_uncapped`` (mixed rows): the same kernel with splits of any length (the batch's
  split count only), so the table shows what the split cap of ``attention_plan`` buys;
- ``paged_batch_order`` (mixed rows): the same kernel taking the rows in batch order, so the
  table shows what starting the longest rows first buys;
- ``sdpa_contiguous`` (uniform rows): ``torch.nn.functional.scaled_dot_product_attention``
  over a contiguous (B, Hkv, T, D) cache of the same K/V with ``enable_gqa=True``, at its
  best: every SDPA backend that accepts the shapes is timed and the fastest is kept (its
  name in ``detail``);
- ``flashinfer`` (where the optional ``flashinfer`` package is installed): its paged decode
  wrapper over the same pool and block table, planned for the batch's lengths, with and
  without its tensor-core kernels (the faster kept).

All are validated against the gather reference before timing. Each timed call reads another
layer's K/V (as a decode step does), from enough copies that they do not fit in L2; the calls
are captured in a CUDA graph and timed by replay, so a short call's launch gap is not counted.
``kv_bytes``/``kv_gb_s`` = bytes of K and V attended / time per layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from decodelab.core.capture import capture, warm_up
from decodelab.core.timing import summarize, time_graph_replays
from decodelab.model.attention import paged_decode_attention_ref
from decodelab.model.bench import attention_peers
from decodelab.model.config import ModelConfig

ATTENTION_TABLE = "paged_attention"
ROTATE_BYTES = 256 << 20  # K/V bytes cycled through per timed call: several times the L2
MAX_COPIES = 16
BF16_RTOL = 2e-2  # bf16 inputs, fp32 softmax on both sides
LENS_KINDS = ("uniform", "mixed")


@dataclass(frozen=True, slots=True)
class AttentionRow:
    impl: str  # "paged", "paged_uncapped", "paged_batch_order", "sdpa_contiguous", "flashinfer"
    batch: int
    context: int  # every row's ("uniform"), or the mean of 1..2 x context ("mixed")
    lens: str
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
    k: torch.Tensor | None  # (B, Hkv, T, D) the same K/V, contiguous (uniform contexts only)
    v: torch.Tensor | None


def _layer(bt: torch.Tensor, cfg: ModelConfig, block_size: int, dtype: torch.dtype,
           gen: torch.Generator, context: int, *, contiguous: bool) -> _Layer:
    """A pool of the blocks of block table ``bt`` (B, M), a permutation of 0..B*M-1; with
    ``contiguous``, the same K/V in (B, Hkv, context, D) for SDPA."""
    dev, hkv, d = gen.device, cfg.num_kv_heads, cfg.head_dim
    batch, width = bt.shape
    num_blocks = batch * width
    k_pool = torch.randn((num_blocks, hkv, block_size, d), generator=gen, device=dev).to(dtype)
    v_pool = torch.randn((num_blocks, hkv, block_size, d), generator=gen, device=dev).to(dtype)
    if not contiguous:
        return _Layer(k_pool, v_pool, bt, None, None)
    # (B, M, Hkv, bs, D) -> (B, Hkv, M * bs, D), cut to the context: the contiguous peer's cache.
    k = k_pool[bt.long()].permute(0, 2, 1, 3, 4).reshape(batch, hkv, width * block_size, d)
    v = v_pool[bt.long()].permute(0, 2, 1, 3, 4).reshape(batch, hkv, width * block_size, d)
    return _Layer(k_pool, v_pool, bt, k[:, :, :context].contiguous(),
                  v[:, :, :context].contiguous())


def context_lens(batch: int, context: int, lens: str, gen: torch.Generator) -> torch.Tensor:
    """(B,) int32 on the generator's device: every row at ``context`` ("uniform"), or drawn
    uniformly from 1 to 2 x ``context`` ("mixed", a serving batch's spread)."""
    if lens == "uniform":
        return torch.full((batch,), context, dtype=torch.int32, device=gen.device)
    return torch.randint(1, 2 * context + 1, (batch,), generator=gen, device=gen.device).int()


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
                   dtype: torch.dtype = torch.bfloat16, repeats: int = 15,
                   lens_kinds: tuple[str, ...] = LENS_KINDS) -> list[AttentionRow]:
    """Validate, then time paged attention and its peers at every batch x context x lens
    kind (CUDA)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    scale = cfg.head_dim ** -0.5
    rows = []
    for batch in batches:
        for context in contexts:
            for lens_kind in lens_kinds:
                rows += _point(cfg, batch, context, lens_kind, block_size, dtype, repeats,
                               scale, gen)
                torch.cuda.empty_cache()
    return rows


def _point(cfg: ModelConfig, batch: int, context: int, lens_kind: str, block_size: int,
           dtype: torch.dtype, repeats: int, scale: float, gen: torch.Generator
           ) -> list[AttentionRow]:
    uniform = lens_kind == "uniform"
    lens = context_lens(batch, context, lens_kind, gen)
    width = -(-int(lens.max()) // block_size)  # every row's blocks fit
    bt = torch.randperm(batch * width, generator=gen, device=gen.device).view(batch, width).int()
    kv_bytes = 2 * int(lens.sum()) * cfg.num_kv_heads * cfg.head_dim * dtype.itemsize
    copies = max(1, min(MAX_COPIES, math.ceil(ROTATE_BYTES / kv_bytes)))
    # one block table for every copy (FlashInfer plans once for it); the pools differ
    layers = [_layer(bt, cfg, block_size, dtype, gen, context, contiguous=uniform)
              for _ in range(copies)]
    q = torch.randn((batch, cfg.num_heads, cfg.head_dim), generator=gen,
                    device=gen.device).to(dtype)
    first = layers[0]
    ref = paged_decode_attention_ref(q, first.k_pool, first.v_pool, first.block_tables, lens,
                                     scale)
    candidates = attention_peers.candidates(q, lens, scale, layers, uniform=uniform)
    shape = dict(batch=batch, context=context, lens=lens_kind, heads=cfg.num_heads,
                 kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, block_size=block_size,
                 kv_bytes=kv_bytes)
    rows = []
    for impl, variants in candidates.items():
        best = None
        for name, fn in variants.items():
            try:
                err = _rel_err(fn(first), ref)
            except attention_peers.PeerUnavailable as exc:
                print(f"[bench] attention: {exc}; its rows are left out", flush=True)
                continue
            except RuntimeError:  # this SDPA backend refuses these shapes
                continue
            if err > BF16_RTOL:
                raise AssertionError(f"{impl} {name} attention vs reference at batch {batch}, "
                                     f"context {context} ({lens_kind}): {err:.3g}")
            us, q1, q3 = _timed(fn, layers, repeats)
            if best is None or us < best.us_per_layer:
                best = AttentionRow(impl, us_per_layer=us, us_q1=q1, us_q3=q3,
                                    kv_gb_s=kv_bytes / us / 1e3, max_rel_err=err,
                                    detail=name, **shape)
        if best is None and impl in attention_peers.OPTIONAL:
            continue
        if best is None:
            raise RuntimeError(f"no {impl} variant ran at batch {batch}, context {context}")
        rows.append(best)
    return rows
