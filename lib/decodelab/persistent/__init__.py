"""Phase 3 — the persistent kernel: the whole decode loop inside one launch.

- :mod:`.kernel` (+ :mod:`.library`, the ctypes binding): variants, launch plan, launch.
- :mod:`.validation`: a launch against the eager torch reference, before any timing.
- :mod:`.sweep`, :mod:`.measure`, :mod:`.rows`, :mod:`.model`, :mod:`.profile`: what the bench
  measures, how, the rows it writes, the latency models, the CUDA tools over the standalone check.
- :mod:`.analysis`: the seed comparison, the model check, the stage breakdown (pandas).
- :mod:`.bench`, :mod:`.notebook`: the registered bench and notebook 03's parameters.
"""
