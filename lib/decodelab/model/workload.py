"""What the model benches (and tensor parallelism's) run on and feed: the device a profile
measures, decode inputs over the paged cache, and the copy bandwidth of the same run."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from decodelab.core.device import has_cuda
from decodelab.core.timing import TimingConfig, cpu_threads, time_cuda, time_host
from decodelab.model.kv_cache import PagedKVCache

T = TypeVar("T")


def on_bench_device(profile: str, body: Callable[[torch.device], T]) -> T:
    """``body(device)`` on the device a profile measures: the GPU for ``gpu`` on a CUDA machine,
    else the CPU with one torch thread (see ``timing.cpu_threads``: a tiny model's small ops)."""
    if profile == "gpu" and has_cuda():
        return body(torch.device("cuda"))
    with cpu_threads(1):
        return body(torch.device("cpu"))


def copy_bandwidth_gb_s(device: torch.device, nbytes: int, cfg: TimingConfig) -> float:
    """Device-to-device (or host memory) copy rate, bytes read + written per second / 1e9."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).uniform_()
    dst = torch.empty_like(src)
    if device.type == "cuda":
        t = time_cuda(lambda: dst.copy_(src), cfg).device_stats().median
    else:
        t = time_host(lambda: dst.copy_(src), cfg).wall_stats().median
    return 2 * nbytes / t / 1e9


def decode_inputs(cache: PagedKVCache, batch: int, context: int,
                  gen: torch.Generator | None = None):
    """B sequences with ``context`` tokens each (the last one new this step): static tensors.
    Returns (block tables to free, decode arguments). ``gen``, a seeded CPU generator, draws the
    token ids (processes that must feed the same ids pass equally seeded generators)."""
    bs = cache.block_size
    tables = [cache.pool.allocate(cache.pool.blocks_needed(context)) for _ in range(batch)]
    bt = cache.block_table_tensor(tables)
    pos = torch.full((batch,), context - 1, dtype=torch.int64, device=cache.device)
    rows = torch.arange(batch, device=cache.device)
    slots = bt[rows, pos // bs].long() * bs + pos % bs
    if gen is None:
        ids = torch.randint(0, cache.config.vocab_size, (batch,), device=cache.device)
    else:
        ids = torch.randint(0, cache.config.vocab_size, (batch,), generator=gen).to(cache.device)
    return tables, (ids, pos, slots, bt, (pos + 1).int())
