"""The paged-cache decode runtime: model config, block pool, paged KV cache, the Llama-family
decoder over it, CUDA-graph decode buckets (phase 4a); requests, scheduler, sampler, engine
(phase 4b).

Names are imported lazily, so ``import decodelab.runtime.block_pool`` (or the scheduler) does
not pull in torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "ModelConfig": "config", "RopeScaling": "config", "named_config": "config",
    "NAMED_CONFIGS": "config",
    "BlockPool": "block_pool", "BlockPoolExhausted": "block_pool",
    "PagedKVCache": "cache", "slots_for": "cache",
    "PagedLlama": "model",
    "Weights": "weights", "random_weights": "weights", "random_state_dict": "weights",
    "load_checkpoint": "weights",
    "DecodeGraphs": "graphs",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'decodelab.runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(f"decodelab.runtime.{_EXPORTS[name]}"), name)
