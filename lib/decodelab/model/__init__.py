"""Phase 4a — a Llama-family decoder over a paged KV cache.

config, weights (random or from a checkpoint), block_pool (torch-free block accounting),
kv_cache (the paged cache and slot mapping), attention (the reference), llama (the decoder),
graphs (CUDA-graph decode per batch bucket), compare (comparisons and tolerances), modes and
analysis (the ``paged_model`` table's mode names and its numbers, pandas), bench/ (the bench's
room); triton/ holds the fused kernels.

The main classes are importable from here, each module imported on first use
(:mod:`decodelab.core.lazy`): ``import decodelab.model.block_pool`` stays torch-free.
"""

from decodelab.core.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "ModelConfig": "config",
    "named_config": "config",
    "Weights": "weights",
    "random_weights": "weights",
    "load_checkpoint": "weights",
    "BlockPool": "block_pool",
    "PagedKVCache": "kv_cache",
    "PagedLlama": "llama",
    "greedy_generate": "llama",
    "DecodeGraphs": "graphs",
})
