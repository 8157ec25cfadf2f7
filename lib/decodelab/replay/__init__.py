"""Phase 2 — replay: what a CUDA-graph replay costs, per replay and per node, and how capturing
K steps per graph amortises it.

- :mod:`.measure`: the node sweep and the multi-step sweep, validated before timing.
- :mod:`.interleave`: timing points in interleaved rounds, so drift spreads over every point.
- :mod:`.fit`: weighted least squares with confidence intervals; the quantities the notebook shows.
- :mod:`.tradeoff`: longer graphs against wasted steps when a request stops mid-chunk.
- :mod:`.bench`, :mod:`.notebook`: the registered bench and notebook 02's parameters.
"""
