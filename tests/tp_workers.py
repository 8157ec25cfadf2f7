"""Functions run on every rank of a spawned tensor-parallel group (module-level: picklable)."""

from __future__ import annotations

import torch

from decodelab.model.block_pool import blocks_needed
from decodelab.model.config import named_config
from decodelab.model.weights import random_weights
from decodelab.parallel.check import build_model, greedy
from decodelab.parallel.group import TPGroup

PROMPTS = [[5, 17, 99, 3, 250, 8], [42], [7, 7, 300, 12, 1, 9, 88, 2, 31, 400, 64, 5, 6]]
NEW_TOKENS = 12


def tiny_greedy(world: TPGroup, overrides: dict, forced=None, skip_comm: bool = False):
    """Greedy tokens and logits of the tiny model (seed 1, fp32) split over the whole world."""
    config = named_config("tiny", **overrides)
    full = random_weights(config, seed=1)
    model = build_model(config, full, world, num_blocks=64, block_size=4, backend="torch")
    if skip_comm:
        model = model.with_group(world.without_comm())
    tokens, logits = greedy(model, PROMPTS, NEW_TOKENS, forced=forced)
    free = model.cache.pool.num_free == model.cache.pool.num_total
    return tokens, logits, free


def nccl_matches_tp1(world: TPGroup, model_name: str, new_tokens: int):
    """bf16 on GPUs: TP=world (graph and eager) against TP=1 on rank 0, same weights."""
    from decodelab.model.compare import prompts
    from decodelab.model.graphs import DecodeGraphs
    from decodelab.parallel.group import sub_group

    config = named_config(model_name)
    full = random_weights(config, seed=0, dtype=torch.bfloat16, device=world.device)
    batch = prompts(config, 8)
    width = blocks_needed(max(map(len, batch)) + new_tokens, 16)
    ref = None
    solo = sub_group(world, 1)
    if solo is not None:
        m1 = build_model(config, full, solo, num_blocks=8 * width + 8)
        g1 = DecodeGraphs(m1, (8,), width)
        ref = greedy(m1, batch, new_tokens, step=g1.run)
        del g1, m1
    world.barrier()
    model = build_model(config, full, world, num_blocks=8 * width + 8)
    del full
    graphs = DecodeGraphs(model, (8,), width)
    eager = greedy(model, batch, new_tokens)
    graph = greedy(model, batch, new_tokens, step=graphs.run)
    shared = [ref[0] if ref is not None else None]
    torch.distributed.broadcast_object_list(shared, src=0)  # every rank feeds TP=1's tokens
    forced = greedy(model, batch, new_tokens, step=graphs.run, forced=shared[0])
    del graphs
    torch.cuda.synchronize()
    return ref, eager, graph, forced


def fits_on_ranks(world: TPGroup, frees: list[int]):
    """Every rank's memory decision for the tiny model when rank r has ``frees[r]`` bytes free
    (gathered on every rank): the tightest rank must decide for all."""
    from decodelab.parallel import bench
    from decodelab.parallel.config import TPBenchConfig

    bench.free_bytes = lambda device: frees[world.rank]
    fits = bench._fits(TPBenchConfig.for_profile("smoke"), world, named_config("tiny"),
                       torch.float32, 3)
    out: list = [None] * world.size
    torch.distributed.all_gather_object(out, [(f.tp, f.runs, f.free) for f in fits])
    return out
