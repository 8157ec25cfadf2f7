"""The batch-invariance bench's configuration and the model it builds (:mod:`.invariance`'s
checks and :mod:`.invariance_cost`'s timings share them)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from decodelab.core.validate import check_int, check_int_list
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



def build_model(cfg: InvarianceConfig, layers: int | None, invariant: bool, blocks: int,
                device: str = "cuda") -> PagedLlama:
    """``cfg.model`` (with ``layers`` layers; None: all) over a pool of ``blocks`` blocks."""
    mcfg = named_config(cfg.model, **({"num_layers": layers} if layers else {}))
    dtype, dev = getattr(torch, cfg.dtype), torch.device(device)
    cache = PagedKVCache(mcfg, blocks, cfg.block_size, dtype=dtype, device=dev)
    return PagedLlama(mcfg, random_weights(mcfg, 0, dtype=dtype, device=dev), cache,
                      batch_invariant=invariant)
