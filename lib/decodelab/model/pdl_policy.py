"""Where the model launches its Triton kernels with programmatic dependent launch (PDL): the
policy alone, without Triton, so that the bench and the analysis of its tables read the same
rule the kernels follow (:mod:`decodelab.model.triton.pdl` holds the launch itself).

PDL pays where a step is many short kernels. On the H200 (bench paged_model, graph against
graph_no_pdl): at commit c0b2a6b, with PDL at every row count, it saved 111-122 µs per step at
batch 1 and 30 µs at batch 32, and cost 28-87 µs at batch 128, where a few long kernels fill
the step; at abdacfeb002d, with this policy, it saved 89-92 µs at batch 1 and 23-62 µs at
batches 8 and 32. Steps of more rows launch their kernels one after another.
"""

from __future__ import annotations

MAX_ROWS = 32


def for_rows(enabled: bool, rows: int) -> bool:
    """Whether a kernel of a step of ``rows`` tokens uses PDL (see :data:`MAX_ROWS`)."""
    return enabled and rows <= MAX_ROWS
