"""Phase 4b — the serving loop over the paged model: requests, a torch-free scheduler, the
per-row sampler, the static batch, step graphs, streaming, metrics and the engine itself.

``import decodelab.engine.scheduler`` (or ``requests``) does not pull in torch.
"""
