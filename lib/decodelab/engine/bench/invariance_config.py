"""The batch-invariance bench's configuration and the model it builds (:mod:`.invariance`'s
checks and :mod:`.invariance_cost`'s timings share them)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from decodelab.core.precision import BYTES, DTYPES, resolve_dtype
from decodelab.core.sizing import Device, Fitted, Option, fit
from decodelab.core.validate import check_choice, check_int, check_int_list
from decodelab.model import memory
from decodelab.model.block_pool import blocks_needed
from decodelab.model.config import named_config
from decodelab.model.kv_cache import PagedKVCache
from decodelab.model.llama import PagedLlama
from decodelab.model.weights import random_weights

NAN = float("nan")


@dataclass(frozen=True, slots=True)
class InvarianceConfig:
    model: str = "llama-3.2-1b"
    check_layers: int = 2  # layers of the checks' model (the cost runs every layer)
    dtype: str = "bfloat16"
    block_size: int = 16
    batches: tuple[int, ...] = (1, 2, 7, 8, 31, 32, 100, 128, 255, 256)
    probe_context: int = 700
    max_context: int = 4096
    engine_requests: int = 64
    engine_tokens: int = 256
    cost_batches: tuple[int, ...] = (1, 8, 32, 128)
    cost_contexts: tuple[int, ...] = (512, 4096)
    cost_prompts: tuple[int, ...] = (512, 2048)  # prompt lengths of the prefill costs
    replays: int = 20

    def __post_init__(self) -> None:
        own = "InvarianceConfig"
        check_int(own, "check_layers", self.check_layers, 1)
        check_int_list(own, "batches", self.batches, 1, 4096)
        check_int_list(own, "cost_batches", self.cost_batches, 1, 4096)
        check_int_list(own, "cost_contexts", self.cost_contexts, 1, self.max_context)
        check_int_list(own, "cost_prompts", self.cost_prompts, 1, self.max_context)
        check_int(own, "probe_context", self.probe_context, 2, self.max_context)
        check_int(own, "engine_requests", self.engine_requests, 1)
        check_int(own, "engine_tokens", self.engine_tokens, 1)
        check_int(own, "replays", self.replays, 1)
        check_choice(own, "dtype", self.dtype, DTYPES)

    @property
    def width(self) -> int:
        """Block-table width of the checks: the longest context."""
        return blocks_needed(self.max_context, self.block_size)

    @property
    def check_blocks(self) -> int:
        """The checks' pool: every batch row at the longest context."""
        return max(self.batches) * self.width + 64

    def cost_width(self, context: int) -> int:
        """Block-table width of the decode cost at ``context``: one block to grow into."""
        return blocks_needed(context, self.block_size) + 1

    def cost_blocks(self, context: int) -> int:
        """The decode cost's pool at ``context``: the largest cost batch there."""
        return max(self.cost_batches) * self.cost_width(context)

    def on_device(self, dtype: str, device: Device | None) -> Fitted[InvarianceConfig]:
        """This config on ``device`` (None: the CPU): ``dtype`` resolved there, the cost's
        batches fitted to its free memory (the largest dropped first)."""
        capability = device.capability if device is not None else None
        cfg = replace(self, dtype=resolve_dtype(dtype, capability, "batch_invariance.dtype"))
        options = []
        for n in range(len(cfg.cost_batches), 0, -1):
            sized = replace(cfg, cost_batches=cfg.cost_batches[:n])
            options.append(Option(sized, sized.peak_bytes(), "cost batches " + ", ".join(
                map(str, sized.cost_batches)) + " x contexts " + ", ".join(
                    map(str, sized.cost_contexts))))
        return fit("batch_invariance", options, device)

    def peak_bytes(self) -> int:
        """Estimated device bytes at the peak: the checks' model (``check_layers`` layers) and
        pool, or every layer with the decode cost's pool, its graphs' logits and the weights
        being built."""
        e = BYTES[self.dtype]
        full = named_config(self.model)
        small = named_config(self.model, num_layers=self.check_layers)
        checks = (memory.weight_bytes(small, e)
                  + memory.kv_pool_bytes(small, self.check_blocks, self.block_size, e))
        cost = (memory.weight_bytes(full, e) + memory.logits_bytes(full, self.cost_batches)
                + memory.kv_pool_bytes(full, self.cost_blocks(max(self.cost_contexts)),
                                       self.block_size, e))
        return max(checks, cost, memory.weight_bytes(full, e) + memory.build_extra_bytes(full, e))



def build_model(cfg: InvarianceConfig, layers: int | None, invariant: bool, blocks: int,
                device: str = "cuda") -> PagedLlama:
    """``cfg.model`` (with ``layers`` layers; None: all) over a pool of ``blocks`` blocks."""
    mcfg = named_config(cfg.model, **({"num_layers": layers} if layers else {}))
    dtype, dev = getattr(torch, cfg.dtype), torch.device(device)
    cache = PagedKVCache(mcfg, blocks, cfg.block_size, dtype=dtype, device=dev)
    return PagedLlama(mcfg, random_weights(mcfg, 0, dtype=dtype, device=dev), cache,
                      batch_invariant=invariant)
