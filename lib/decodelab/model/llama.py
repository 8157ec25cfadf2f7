"""A Llama-family decoder over the paged KV cache: RMSNorm, RoPE (Llama-3 scaling), GQA, SwiGLU.

Interface (stable; the runtime engine builds on exactly this):

    model = PagedLlama(config, weights, cache, backend="auto")  # "torch" | "triton" | "auto"
    model.prefill(token_ids: list[list[int]], block_tables: list[list[int]],
                  starts: list[int] | None = None)
        -> logits (n_seqs, vocab) float32 at each chunk's last position.
        ``token_ids[i]`` are the new tokens of sequence i (a chunk, or a whole prompt), at
        positions starts[i] .. starts[i] + len - 1 (``starts`` None: all 0, whole prompts);
        positions before starts[i] must already be in the cache (an earlier chunk, decode
        steps). The chunk's K/V are written to the slots its block table gives (the table must
        already hold ceil((start + len) / block_size) blocks), then each chunk token attends
        causally to positions 0 .. its own of its own sequence, read from the paged cache.
        Bad inputs raise ValueError before any device work (``prefill_pack.check_chunks``).
        ``prefill_packed(pack)`` runs a pack already on the device: with the Triton backend
        nothing in it depends on the lengths on the host, so it runs under a CUDA graph per
        token bucket too (``decodelab.model.prefill_graphs.PrefillGraphs``).
    model.decode(input_ids (B,) int64, positions (B,) int64, slot_mapping (B,) int64,
                 block_tables (B, max_blocks) int32, context_lens (B,) int32)
        -> logits (B, vocab) float32.
        One new token per row at ``positions`` (0-based); its K/V go to ``slot_mapping``
        (slot -1: a padding row, writes nothing); attention covers positions
        0 .. context_lens - 1 (normally positions + 1, i.e. including the new token).
        All inputs are device tensors of static shape, so the same code runs eagerly and under
        a CUDA graph (see ``decodelab.model.graphs.DecodeGraphs``).

``backend="triton"`` (CUDA only) swaps in fused kernels for the norms, RoPE + cache write, the
SwiGLU product, paged decode and prefill attention (one varlen kernel per pack, any lengths,
no per-shape plan), and matmuls of 1 to 64 rows where they beat cuBLAS (``model.triton``:
``ops``, ``attention``, ``prefill_attention``, ``linear``, ``skinny``, ``matmul_choice``,
``fused``); ``"torch"`` is the plain reference the tests compare with ``transformers``.
At batch 1 the residual add and RMSNorm before the q/k/v and gate/up projections run inside
their gemv (``ops.add_norm_linear``). On sm_90 and newer the kernels of a captured step use
programmatic dependent launch (``pdl``; ``pdl=False`` turns it off, to measure what it
removes; ``linear_choice=other.ops.matmul.choice`` then keeps the other model's matmul kernels,
so only the launches differ). ``batch_invariant=True`` (Triton on CUDA) runs every reduction
in one order whatever the batch (``model.triton.invariant``): a request's logits are the same
bits alone or in any batch, in any graph bucket, and from prefill as from decode, at the cost
of one matmul kernel for every row count instead of the fastest per shape. Constructing a
"triton" model times each batch-1 matmul candidate on the device once (seconds, Triton
compilation included); ``tune_rows(rows)`` does the same for steps of more rows
(``DecodeGraphs`` calls it with its buckets); every choice is fixed before any graph is captured.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from decodelab.core.validate import ConfigError, check_bool, check_choice
from decodelab.model.attention import paged_decode_attention_ref, paged_prefill_attention_ref
from decodelab.model.config import ModelConfig, rope_inv_freq
from decodelab.model.kv_cache import PagedKVCache, slots_at
from decodelab.model.prefill_pack import PrefillPack, pack_prefill
from decodelab.model.weights import Weights


class TorchOps:
    """Plain-torch layer pieces, written to round exactly as ``transformers`` does."""

    batch_invariant = False  # the CPU's matmuls may block K by the row count

    @staticmethod
    def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return w * xf.to(x.dtype)

    @classmethod
    def add_rms_norm(cls, h: torch.Tensor, x: torch.Tensor, w: torch.Tensor, eps: float
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """Residual add then norm: (h + x, rms_norm(h + x))."""
        h = h + x
        return h, cls.rms_norm(h, w, eps)

    @classmethod
    def add_norm_linear(cls, h: torch.Tensor, x: torch.Tensor | None, norm_w: torch.Tensor,
                        eps: float, w: torch.Tensor, bias: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """(h + x, linear(rms_norm(h + x), w)); ``x`` None: no add (the first layer)."""
        h = h if x is None else h + x
        return h, cls.linear(cls.rms_norm(h, norm_w, eps), w, bias)

    @staticmethod
    def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x (T, heads, D); cos, sin (T, D/2) at each token's position. Half-split rotation."""
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        c, s = cos[:, None, :], sin[:, None, :]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)

    @classmethod
    def rope_write(cls, q, k, v, positions, cos, sin, cache: PagedKVCache, layer: int,
                   slot_mapping) -> torch.Tensor:
        """Rotate q and k, store k and v in the cache; returns rotated q (T, H, D)."""
        c, s = cos[positions], sin[positions]
        cache.write(layer, cls.rope(k, c, s), v, slot_mapping)
        return cls.rope(q, c, s)

    @staticmethod
    def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
        """(T, 2f) -> silu(gate) * up, (T, f)."""
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    @staticmethod
    def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None
               ) -> torch.Tensor:
        return F.linear(x, w, bias)

    @classmethod
    def swiglu_linear(cls, gate_up: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """The MLP's down projection of silu(gate) * up."""
        return F.linear(cls.silu_mul(gate_up), w)

    @staticmethod
    def logits(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """The LM head in the model dtype, then float32, as ``transformers`` rounds it."""
        return F.linear(x, w).float()

    decode_order = staticmethod(lambda context_lens, kv_heads: None)  # batch order (no sort)
    whole_rows_table = staticmethod(lambda rows, kv_heads, device: 0)  # any table: the same

    @staticmethod
    def decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale, order=None):
        return paged_decode_attention_ref(q, k_cache, v_cache, block_tables, context_lens, scale)

    prefill_attention = staticmethod(paged_prefill_attention_ref)


def _ops(backend: str, device: torch.device, pdl: bool | None, linear_choice: dict | None,
         batch_invariant: bool = False):
    check_choice("PagedLlama", "backend", backend, ("auto", "torch", "triton"))
    check_bool("PagedLlama", "batch_invariant", batch_invariant)
    if backend == "auto":
        backend = "triton" if device.type == "cuda" else "torch"
    if batch_invariant and (backend != "triton" or device.type != "cuda"):
        raise ConfigError(f"PagedLlama.batch_invariant=True: needs the Triton backend on a CUDA "
                          f"device (backend {backend!r}, cache on {device}); the torch path is "
                          "batch-invariant only from identical logits on (README: Determinism)")
    if batch_invariant and linear_choice:
        raise ConfigError("PagedLlama.batch_invariant=True: takes no linear_choice (one matmul "
                          "kernel serves every row count)")
    if backend == "torch":
        return TorchOps
    if device.type != "cuda":
        raise ConfigError(f"PagedLlama.backend='triton': needs a CUDA device, cache is on {device}")
    from decodelab.model.triton import pdl as pdl_support
    from decodelab.model.triton.ops import InvariantOps, TritonOps

    if pdl and not pdl_support.supported(device):
        major, minor = torch.cuda.get_device_capability(device)
        raise ConfigError(f"PagedLlama.pdl=True: programmatic dependent launch needs sm_90 or "
                          f"newer; {device} is sm_{major}{minor}")
    pdl = pdl_support.supported(device) if pdl is None else pdl
    return InvariantOps(pdl) if batch_invariant else TritonOps(pdl, linear_choice)


class PagedLlama:
    """The decoder's forward over a paged cache (no autograd, no nn.Module: weights are data)."""

    def __init__(self, config: ModelConfig, weights: Weights, cache: PagedKVCache, *,
                 backend: str = "auto", pdl: bool | None = None,
                 linear_choice: dict | None = None, batch_invariant: bool = False) -> None:
        if cache.config != config:
            raise ConfigError("PagedLlama: the cache was built for another model config")
        self.config, self.weights, self.cache = config, weights, cache
        self.device = cache.device
        self.dtype = weights.embed.dtype
        self.ops = _ops(backend, self.device, pdl, linear_choice, batch_invariant)
        self.backend = "torch" if self.ops is TorchOps else "triton"
        if self.backend == "triton":
            self.ops.tune(weights)  # per-shape matmul choice, fixed before any graph capture
        self.scale = config.head_dim ** -0.5
        # (max_positions, D/2) rotary tables, computed in fp32 and rounded to the model dtype
        # as transformers does.
        pos = torch.arange(config.max_position_embeddings, dtype=torch.float32)
        freqs = pos[:, None] * rope_inv_freq(config)[None, :]
        self.cos = freqs.cos().to(self.device, self.dtype)
        self.sin = freqs.sin().to(self.device, self.dtype)

    def tune_rows(self, rows: Sequence[int]) -> None:
        """Choose the matmul kernels for steps of these row counts now (the Triton backend
        times its candidates; a no-op for torch). Graphs call it with their batch buckets
        before capturing; an untuned row count runs cuBLAS."""
        if self.backend == "triton":
            self.ops.tune(self.weights, rows)

    @property
    def batch_invariant(self) -> bool:
        """True: a request's logits do not depend on the batch (``batch_invariant=True``)."""
        return self.ops.batch_invariant

    # ------------------------------------------------------------------ shared layer stack
    def _forward(self, ids: torch.Tensor, attend: Callable) -> torch.Tensor:
        """ids (T,) -> final-normed hidden states (T, d). ``attend(layer, q, k, v)`` -> (T, H, D)
        does RoPE, the cache write and attention, which differ between prefill and decode."""
        cfg, w, ops, eps = self.config, self.weights, self.ops, self.config.rms_norm_eps
        t = ids.shape[0]
        h = self._embed(ids)  # (T, d) residual stream
        mlp = None  # the previous layer's MLP output, added to h by the next norm
        for i, lw in enumerate(w.layers):
            h, qkv = ops.add_norm_linear(h, mlp, lw.attn_norm, eps, lw.qkv, lw.qkv_bias)
            q, k, v = qkv.split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
            a = attend(i, q.view(t, cfg.num_heads, cfg.head_dim),
                       k.view(t, cfg.num_kv_heads, cfg.head_dim),
                       v.view(t, cfg.num_kv_heads, cfg.head_dim))
            o = self._reduce(ops.linear(a.reshape(t, cfg.q_size), lw.o))
            h, gate_up = ops.add_norm_linear(h, o, lw.mlp_norm, eps, lw.gate_up)
            mlp = self._reduce(ops.swiglu_linear(gate_up, lw.down))
        return ops.add_rms_norm(h, mlp, w.final_norm, eps)[1]

    # Hooks a tensor-parallel subclass overrides (``decodelab.parallel.model``): on one device the
    # embedding is a lookup, the row-parallel sums are identities and the head is local.
    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weights.embed)

    def _reduce(self, partial: torch.Tensor) -> torch.Tensor:
        """Sum of a row-parallel matmul's partial outputs over the tensor-parallel ranks."""
        return partial

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        """(T, vocab) float32 (Triton: the fp32 accumulator; torch: rounded first; ``ops``)."""
        return self.ops.logits(x, self.weights.lm_head)

    # ------------------------------------------------------------------ public forward passes
    @torch.inference_mode()
    def prefill(self, token_ids: Sequence[Sequence[int]], block_tables: Sequence[Sequence[int]],
                starts: Sequence[int] | None = None) -> torch.Tensor:
        """Chunks of new tokens (whole prompts where ``starts`` is None), packed without
        padding -> logits (n, vocab) float32 at each chunk's last position (see module doc)."""
        return self.prefill_packed(pack_prefill(
            self.cache, token_ids, block_tables, starts, vocab_size=self.config.vocab_size,
            max_positions=self.config.max_position_embeddings))

    @torch.inference_mode()
    def prefill_packed(self, pack: PrefillPack) -> torch.Tensor:
        """:meth:`prefill` of a pack already on the device (``prefill_graphs`` captures it)."""
        cache, ops = self.cache, self.ops

        def attend(layer, q, k, v):
            # K/V to the cache first: each chunk then reads its own and its earlier positions
            # from there, in one call for the whole pack.
            q = ops.rope_write(q, k, v, pack.positions, self.cos, self.sin, cache, layer,
                               pack.slot_mapping)
            return ops.prefill_attention(q, cache.k[layer], cache.v[layer], pack.block_tables,
                                         pack.query_starts, pack.starts, self.scale)

        return self._logits(self._forward(pack.ids, attend)[pack.last])

    @torch.inference_mode()
    def decode(self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
               block_tables: torch.Tensor, context_lens: torch.Tensor) -> torch.Tensor:
        """One token per row over the paged cache -> logits (B, vocab) float32 (see module doc)."""
        cache, ops = self.cache, self.ops
        order = ops.decode_order(context_lens, self.config.num_kv_heads)

        def attend(layer, q, k, v):
            q = ops.rope_write(q, k, v, positions, self.cos, self.sin, cache, layer, slot_mapping)
            return ops.decode_attention(q, cache.k[layer], cache.v[layer], block_tables,
                                        context_lens, self.scale, order)

        return self._logits(self._forward(input_ids, attend))


@torch.inference_mode()
def greedy_generate(model: PagedLlama, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
                    step: Callable | None = None, forced: Sequence[Sequence[int]] | None = None
                    ) -> tuple[list[list[int]], torch.Tensor]:
    """Greedy decode of a batch: prefill, then ``max_new_tokens - 1`` decode steps through
    ``step`` (``model.decode`` or ``DecodeGraphs.run``). Returns the new tokens per prompt and
    the logits of every step (B, max_new_tokens, vocab). ``forced`` (B, max_new_tokens) feeds
    those tokens instead of the argmax (teacher forcing: two implementations then see the same
    inputs even where a near-tie flips a token). Blocks are freed on every exit path.
    A reference loop for tests and benchmarks; the runtime engine is the real scheduler."""
    cache, pool, bs = model.cache, model.cache.pool, model.cache.block_size
    step = step or model.decode
    tables: list[list[int]] = []
    try:
        for p in prompts:
            tables.append(pool.allocate(pool.blocks_needed(len(p) + max_new_tokens)))
        logits = model.prefill(prompts, tables)
        bt = cache.block_table_tensor(tables)
        pos = torch.tensor([len(p) for p in prompts], dtype=torch.int64, device=model.device)
        steps = [logits]
        fed = None if forced is None else torch.tensor(forced, device=model.device)
        for i in range(max_new_tokens - 1):
            slots = slots_at(bt, pos, bs)
            tokens = logits.argmax(-1) if fed is None else fed[:, i]
            logits = step(tokens, pos, slots, bt, (pos + 1).int()).clone()
            steps.append(logits)
            pos = pos + 1
    finally:
        for t in tables:
            pool.free(t)
    all_logits = torch.stack(steps, dim=1)
    return all_logits.argmax(-1).tolist(), all_logits
