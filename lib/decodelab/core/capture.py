"""CUDA-graph capture helpers shared by every phase that captures: warm up on a side stream,
then capture one call."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def warm_up(fn: Callable[[], object], times: int = 1) -> None:
    """Run ``fn`` ``times`` on a side stream ordered after the work already issued, as
    ``torch.cuda.graphs`` advises before a capture (cuBLAS handles, Triton compilation,
    allocator state are created outside the graph)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(times):
            fn()
    torch.cuda.current_stream().wait_stream(side)


def capture(fn: Callable[[], T], *, pool=None) -> tuple[torch.cuda.CUDAGraph, T]:
    """Capture one call of ``fn`` (warm it up first); returns the graph and what the captured
    call returned (the static outputs each replay rewrites)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph, out
