"""Where one decode step's device time goes, per kernel: the profiler over a graph step (table
``paged_model_kernels``: batch 1), run in a fresh process so that CUPTI stays out of the rest.

Any batch from the command line, e.g. 128 rows at context 512 on Llama-3.2-1B::

    python -c "from decodelab.model.bench.kernels import kernel_profile_isolated as k; \
      [print(r) for r in k('llama-3.2-1b', 'bfloat16', 16, 32, {}, 512, batch=128)]"
"""

from __future__ import annotations

import torch

from decodelab.core.profiler import in_fresh_process, kernel_times, profile_steps
from decodelab.model.graphs import DecodeGraphs
from decodelab.model.kv_cache import PagedKVCache, decode_inputs
from decodelab.model.llama import PagedLlama


def kernel_profile(graphs: DecodeGraphs, cache: PagedKVCache, context: int = 512,
                   steps: int = 5, batch: int = 1) -> list[dict]:
    """Device time per kernel of one graph step of ``batch`` rows at ``context`` (profiler,
    device activity only, after 3 warm-up steps; averaged over steps)."""
    tables, args = decode_inputs(cache, batch, context)
    args = (torch.ones_like(args[0]), *args[1:])  # token id 1, as before
    events = profile_steps(lambda: graphs.run(*args), steps, cuda=True, cpu=False, warmup=3)
    for table in tables:
        cache.pool.free(table)
    times = kernel_times(events.key_averages(), steps)
    total = sum(us for *_, us in times) or 1.0
    return [dict(kernel=name[:120], calls_per_step=n, us_per_step=us, batch=batch,
                 context=context, share=us / total) for name, n, us in times]


def _profiled_step(model_name: str, dtype: str, block_size: int, width: int,
                   context: int, linear_choice: dict, batch: int) -> list[dict]:
    """Child-process body of :func:`kernel_profile_isolated`: a graph of ``batch`` rows,
    profiled. Without programmatic dependent launch: overlapped kernels would count their
    waits as their time."""
    from decodelab.model.config import named_config
    from decodelab.model.weights import random_weights

    config = named_config(model_name)
    weights = random_weights(config, 0, dtype=getattr(torch, dtype), device="cuda")
    cache = PagedKVCache(config, batch * width + 8, block_size, dtype=getattr(torch, dtype),
                         device="cuda")
    model = PagedLlama(config, weights, cache, pdl=False, linear_choice=linear_choice)
    graphs = DecodeGraphs(model, buckets=(batch,), max_blocks_per_seq=width)
    return kernel_profile(graphs, cache, context, batch=batch)


def kernel_profile_isolated(model_name: str, dtype: str, block_size: int, width: int,
                            linear_choice: dict, context: int = 512, batch: int = 1
                            ) -> list[dict]:
    """:func:`kernel_profile` in a fresh process, with the matmul kernels ``linear_choice``
    names (the timed model's, so the profile shows its kernels). A fresh process because the
    profiler (CUPTI) stays attached to the process that used it and slows every later launch,
    which would skew the timings of the phases that run after this one."""
    return in_fresh_process(_profiled_step, model_name, dtype, block_size, width, context,
                            linear_choice, batch)
