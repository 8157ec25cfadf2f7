"""The names of the ``paged_model`` table's modes, shared by its bench and every reader of the
table (torch-free)."""

from __future__ import annotations

EAGER = "eager"  # PagedLlama.decode launched op by op
GRAPH = "graph"  # DecodeGraphs.run: one replay per step, PDL between kernels where it applies
SERIAL = "graph_no_pdl"  # the graph step with every kernel waiting for the one before
COMPILED = "compile_static"  # torch.compile (max-autotune) + CUDA graph, static cache
HF_DYNAMIC = "hf_dynamic"  # transformers' generate with its default cache
HF_STATIC = "hf_static"  # ... and with its static cache
OURS = (EAGER, GRAPH)
PEERS = (HF_DYNAMIC, HF_STATIC)
