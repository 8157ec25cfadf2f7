"""``TritonOps``: the decode step's operations (and prefill's attention) on Triton kernels,
with the same methods and contracts as ``model.TorchOps``, so the model swaps one for the
other. With ``pdl`` every Triton kernel of a step of up to ``pdl_policy.MAX_ROWS`` tokens is
launched with programmatic dependent launch (:mod:`.pdl`): each one becomes resident while the
one before drains, and the matmuls stream their first weight tile early."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from decodelab.model.pdl_policy import for_rows
from decodelab.model.triton import invariant
from decodelab.model.triton.attention import paged_decode_attention
from decodelab.model.triton.attention_plan import row_order, whole_rows_table
from decodelab.model.triton.fused import rms_norm_rows, rope_write, silu_mul
from decodelab.model.triton.linear import add_norm_gemv
from decodelab.model.triton.matmul_choice import MatmulChoice, tunable
from decodelab.model.triton.prefill_attention import paged_prefill_attention
from decodelab.model.triton.row_rank import longest_first


class TritonOps:
    """Fused kernels with the same methods and contracts as ``model.TorchOps``."""

    batch_invariant = False

    def __init__(self, pdl: bool = False, linear_choice: dict | None = None) -> None:
        self.pdl = pdl
        self.matmul = MatmulChoice(pdl, linear_choice)

    def tune(self, weights, rows: Sequence[int] = (1,)) -> None:
        """Pick cuBLAS or a Triton tile for every matmul shape of these weights at each row
        count (those without Triton candidates stay on cuBLAS)."""
        for m in filter(tunable, rows):
            for lw in weights.layers:
                if lw.qkv_bias is None:
                    self.matmul.tune(lw.qkv, rows=m)
                self.matmul.tune(lw.o, rows=m)
                self.matmul.tune(lw.gate_up, rows=m)
                self.matmul.tune(lw.down, swiglu=True, rows=m)
            self.matmul.tune(weights.lm_head, rows=m, out_dtype=torch.float32)

    def linear(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None
               ) -> torch.Tensor:
        return torch.nn.functional.linear(x, w, bias) if bias is not None else self.matmul(x, w)

    def swiglu_linear(self, gate_up: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return self.matmul(gate_up.contiguous(), w, swiglu=True)

    def logits(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """The LM head, written in fp32 by the matmul itself (no cast kernel after it). With
        the per-token RoPE kernel, on an H100 (Llama-3.2-1B bf16, graph step, context 512):
        71 µs less per step at 128 rows (2,339 -> 2,268), 150 at 256, none at 1-8 rows."""
        return self.matmul(x, w, out_dtype=torch.float32)

    def add_norm_linear(self, h: torch.Tensor, x: torch.Tensor | None, norm_w: torch.Tensor,
                        eps: float, w: torch.Tensor, bias: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """(h + x, linear(rms_norm(h + x), w)); ``x`` None: no add. One row whose matmul runs
        as a gemv: one kernel (the norm in the gemv's prologue); else the norm kernel, then
        the matmul."""
        tile = self.matmul.tile(w, False, 1) if h.shape[0] == 1 and bias is None else None
        if tile is not None:
            res = x.contiguous() if x is not None else None
            return add_norm_gemv(h.contiguous(), res, norm_w, eps, w, tile, pdl=self._pdl(1))
        if x is None:
            return h, self.linear(self.rms_norm(h, norm_w, eps), w, bias)
        h, normed = self.add_rms_norm(h, x, norm_w, eps)
        return h, self.linear(normed, w, bias)

    def _pdl(self, rows: int) -> bool:
        return for_rows(self.pdl, rows)

    def rms_norm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        return rms_norm_rows(x.contiguous(), None, w, eps, pdl=self._pdl(x.shape[0]))

    def add_rms_norm(self, h: torch.Tensor, x: torch.Tensor, w: torch.Tensor, eps: float
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """h += x in place (h is the residual stream the model owns); returns (h, norm(h))."""
        return h, rms_norm_rows(h, x.contiguous(), w, eps, pdl=self._pdl(h.shape[0]))

    def rope_write(self, q, k, v, positions, cos, sin, cache, layer: int, slot_mapping
                   ) -> torch.Tensor:
        return rope_write(q, k, v, positions, cos, sin, cache, layer, slot_mapping,
                          pdl=self._pdl(q.shape[0]))

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return silu_mul(gate_up, pdl=self._pdl(gate_up.shape[0]))

    @staticmethod
    def decode_order(context_lens: torch.Tensor, kv_heads: int) -> torch.Tensor | None:
        """The rows longest first, for every layer this step (one launch)."""
        return row_order(context_lens, kv_heads, sort=longest_first)

    whole_rows_table = staticmethod(whole_rows_table)  # the narrow table (no merge), or 0

    def decode_attention(self, q, k_cache, v_cache, block_tables, context_lens, scale,
                         order=None) -> torch.Tensor:
        return paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale,
                                      pdl=self._pdl(q.shape[0]), row_order=order)

    def prefill_attention(self, q, k_cache, v_cache, block_tables, query_starts, starts, scale
                          ) -> torch.Tensor:
        return paged_prefill_attention(q, k_cache, v_cache, block_tables, query_starts, starts,
                                       scale)


class InvariantOps(TritonOps):
    """``TritonOps`` whose reductions run in one order whatever the batch (:mod:`.invariant`):
    one matmul kernel and tile for every row count (no cuBLAS, no gemv at one row, nothing to
    time: no tile is chosen, so ``add_norm_linear`` runs the norm kernel, then this matmul),
    decode and prefill attention through one kernel in fixed splits, the SwiGLU product by its
    per-row kernel before the matmul. The norms, RoPE and the cache write are ``TritonOps``'
    per-row kernels. Every kernel follows ``pdl`` as ``TritonOps``' do (PDL changes when a
    kernel starts, never what it computes)."""

    batch_invariant = True

    def __init__(self, pdl: bool = False) -> None:
        super().__init__(pdl)

    def tune(self, weights, rows: Sequence[int] = (1,)) -> None:
        """Nothing to choose: the kernel is the same for every row count."""

    def linear(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None
               ) -> torch.Tensor:
        y = invariant.matmul(x.contiguous(), w, pdl=self._pdl(x.shape[0]))
        return y if bias is None else y + bias

    def swiglu_linear(self, gate_up: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        pdl = self._pdl(gate_up.shape[0])  # both kernels per-row invariant
        return invariant.matmul(silu_mul(gate_up.contiguous(), pdl=pdl), w, pdl=pdl)

    def logits(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return invariant.matmul(x.contiguous(), w, pdl=self._pdl(x.shape[0]),
                                out_dtype=torch.float32)

    decode_order = staticmethod(lambda context_lens, kv_heads: None)  # fixed splits, batch order
    whole_rows_table = staticmethod(lambda rows, kv_heads, device: 0)  # fixed-size splits always

    def decode_attention(self, q, k_cache, v_cache, block_tables, context_lens, scale,
                         order=None) -> torch.Tensor:
        return invariant.decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale,
                                          pdl=self._pdl(q.shape[0]))

    def prefill_attention(self, q, k_cache, v_cache, block_tables, query_starts, starts, scale
                          ) -> torch.Tensor:
        return invariant.prefill_attention(q, k_cache, v_cache, block_tables, query_starts,
                                           starts, scale, pdl=self._pdl(q.shape[0]))
