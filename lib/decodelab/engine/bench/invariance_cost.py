"""Table ``batch_invariance_cost``: what the batch-invariant switch costs on the GPU, measured
by ``invariance.write_invariance`` after its checks. The decode step's device time per
graph replay at each batch and context, and one prompt's eager prefill at each length, the
default kernels against the invariant ones (``ratio``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from decodelab.core.timing import TimingConfig, time_cuda, time_graph_replays
from decodelab.engine.bench.invariance_config import NAN, InvarianceConfig, build_model
from decodelab.model.block_pool import blocks_needed
from decodelab.model.graphs import DecodeGraphs
from decodelab.model.kv_cache import slots_at
from decodelab.model.llama import PagedLlama


@dataclass(frozen=True, slots=True)
class InvarianceCostRow:
    step: str  # "decode": a decode step of ``batch`` rows; "prefill": one prompt of ``context``
    batch: int
    context: int
    default_us: float  # the step's device time (decode: graph replay), default kernels
    invariant_us: float
    ratio: float  # invariant / default
    model: str = ""
    dtype: str = ""
    bench_s: float = NAN


def _prefill_us(model: PagedLlama, prompt: list[int], table: list[int], reps: int) -> float:
    """Median device time of one eager prefill of ``prompt`` (after two warm-up calls)."""
    timing = time_cuda(lambda: model.prefill([prompt], [table]), TimingConfig(2, reps, 1))
    return timing.device_stats().median * 1e6


def step_costs(cfg: InvarianceConfig) -> list[InvarianceCostRow]:
    """The decode step's device time per replay and one prompt's prefill time, default against
    invariant kernels."""
    bs = cfg.block_size
    out = []
    for context in cfg.cost_contexts:
        width = cfg.cost_width(context)
        times = {}
        for invariant in (False, True):
            model = build_model(cfg, None, invariant, cfg.cost_blocks(context))
            model.cache.k.normal_()
            model.cache.v.normal_()
            graphs = DecodeGraphs(model, buckets=cfg.cost_batches, max_blocks_per_seq=width)
            for batch in cfg.cost_batches:
                tables = [list(range(i * width, (i + 1) * width)) for i in range(batch)]
                bt = model.cache.block_table_tensor(tables, width=width)
                pos = torch.full((batch,), context - 1, device=model.device)
                args = (torch.randint(0, model.config.vocab_size, (batch,), device=model.device),
                        pos, slots_at(bt, pos, bs), bt, (pos + 1).int())
                graphs.run(*args)  # stage the inputs; the replays below reuse them
                graph = graphs.graphs[graphs.bucket_for(batch)]
                times[invariant, batch] = time_graph_replays(graph, cfg.replays) * 1e6
            del graphs, model
            torch.cuda.empty_cache()
        for batch in cfg.cost_batches:
            d, i = times[False, batch], times[True, batch]
            out.append(InvarianceCostRow("decode", batch, context, d, i, i / d))
            print(f"[bench] batch_invariance: batch {batch} context {context}: {d:.0f} us "
                  f"default, {i:.0f} us invariant = {i / d:.3f}x", flush=True)
    rng = random.Random(1)
    longest = max(cfg.cost_prompts)
    times = {}
    for invariant in (False, True):
        model = build_model(cfg, None, invariant, blocks_needed(longest, bs))
        table = list(range(model.cache.num_blocks))
        for n in cfg.cost_prompts:
            prompt = [rng.randrange(model.config.vocab_size) for _ in range(n)]
            times[invariant, n] = _prefill_us(model, prompt, table, cfg.replays // 4 + 1)
        del model
        torch.cuda.empty_cache()
    for n in cfg.cost_prompts:
        d, i = times[False, n], times[True, n]
        out.append(InvarianceCostRow("prefill", 1, n, d, i, i / d))
        print(f"[bench] batch_invariance: prefill of {n} tokens: {d:.0f} us default, {i:.0f} us "
              f"invariant = {i / d:.3f}x", flush=True)
    return out
