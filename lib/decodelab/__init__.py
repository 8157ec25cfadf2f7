"""decodelab: where the time of iterative LLM decode goes, layer by layer."""

__version__ = "0.1.0"
