"""Phase 4a — a Llama-family decoder over a paged KV cache.

config, weights (random or from a checkpoint), block_pool (torch-free block accounting),
kv_cache (the paged cache and slot mapping), attention (the reference), llama (the decoder),
graphs (CUDA-graph decode per batch bucket), check (comparisons and tolerances), bench;
triton/ holds the fused kernels.
"""
