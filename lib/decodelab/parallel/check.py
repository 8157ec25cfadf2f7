"""Tensor-parallel correctness: TP=n against TP=1 on the same weights, and a launcher that runs
a function on n spawned ranks (gloo on CPU, NCCL on GPUs) without torchrun (tests, notebooks).

Stated bound (also the GPU test's and ``bench tp``'s): ``TP_BF16_RTOL``, max |logit difference| /
max |TP=1 logit| over the steps, teacher-forced, bf16. The splits change only the order in which
the row-parallel partial sums are added (each rank's partial is rounded to bf16 before the sum,
and NCCL picks its own reduction order), and the residual stream carries that rounding through
every layer: the same kind of difference as between our bf16 logits and ``transformers'``, and
the same bound (``bench_checks.HF_BF16_RTOL``). On the H200 pair, Llama-3.2-1B shapes measured
0.021. fp32 on CPU is checked at 1e-5.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from decodelab.model.compare import HF_BF16_RTOL, prompts, rel_err
from decodelab.model.config import ModelConfig
from decodelab.model.kv_cache import PagedKVCache
from decodelab.model.llama import greedy_generate
from decodelab.model.weights import Weights
from decodelab.parallel.group import TPGroup, disable_multicast, init_world, shutdown
from decodelab.parallel.model import TensorParallelLlama
from decodelab.parallel.progress import log
from decodelab.parallel.rows import TPChecks
from decodelab.parallel.shard import local_config, shard_weights

TP_BF16_RTOL = HF_BF16_RTOL
TP_FP32_RTOL = 1e-5


def unexplained_divergences(ref: tuple[list[list[int]], torch.Tensor],
                            got: tuple[list[list[int]], torch.Tensor], rtol: float) -> list[str]:
    """Free-running greedy runs (tokens, logits (B, steps, V)) may part only at a near tie: at
    the first step where a row's tokens differ, TP=1's margin between its token and the other
    run's must be within ``2 * rtol * max |logit|`` (each side may be off by ``rtol``). Returns
    a description of every divergence that is not such a tie (empty: the runs agree)."""
    problems = []
    for row, (a, b) in enumerate(zip(ref[0], got[0], strict=True)):
        step = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
        if step is None:
            continue
        logits = ref[1][row, step].float()
        margin = float(logits[a[step]] - logits[b[step]])
        allowed = 2 * rtol * float(logits.abs().max())
        if margin > allowed:
            problems.append(f"row {row} step {step}: token {b[step]} instead of {a[step]}, "
                            f"margin {margin:.3g} > {allowed:.3g}")
    return problems


def build_model(config: ModelConfig, full: Weights, group: TPGroup, *, num_blocks: int,
                block_size: int = 16, backend: str = "auto") -> TensorParallelLlama:
    """This rank's model: its weight shard and a KV cache of its KV heads, on its device."""
    dtype = full.embed.dtype
    cache = PagedKVCache(local_config(config, group.size), num_blocks, block_size, dtype=dtype,
                         device=group.device)
    shard = shard_weights(config, full, group.rank, group.size)
    return TensorParallelLlama(config, shard, cache, group, backend=backend)


def greedy(model: TensorParallelLlama, prompts: Sequence[Sequence[int]], new_tokens: int, *,
           step: Callable | None = None, forced: Sequence[Sequence[int]] | None = None
           ) -> tuple[list[list[int]], torch.Tensor]:
    """``greedy_generate`` on every rank of the model's group (all ranks get the same logits)."""
    tokens, logits = greedy_generate(model, prompts, new_tokens, step=step, forced=forced)
    return tokens, logits.cpu()


def _spawned(index: int, fn: Callable, world_size: int, backend: str, store: str,
             result: str, args: tuple) -> None:
    world = init_world(backend, init_method=f"file://{store}", rank=index,
                       world_size=world_size)
    try:
        out = fn(world, *args)
        if world.rank == 0:
            torch.save(out, result)
    except BaseException:
        shutdown(world, together=False)
        raise
    shutdown(world)
    # The rank's work and result are complete. Leave without the interpreter's teardown: gloo's
    # threads can abort a spawned rank in C++ destructors at exit ("terminate called without an
    # active exception", no Python frame; seen in about 1 CPU run in 10 after the group ended).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_on_ranks(fn: Callable[..., Any], world_size: int, *args: Any,
                 backend: str = "gloo") -> Any:
    """Run ``fn(world: TPGroup, *args)`` on ``world_size`` spawned processes; returns rank 0's
    result. ``fn`` must be importable (a module-level function)."""
    import torch.multiprocessing as mp

    disable_multicast()  # inherited by the spawned ranks before NCCL starts there
    with tempfile.TemporaryDirectory() as tmp:
        store, result = os.path.join(tmp, "store"), os.path.join(tmp, "result.pt")
        mp.spawn(_spawned, args=(fn, world_size, backend, store, result, args),
                 nprocs=world_size, join=True)
        return torch.load(result, weights_only=False) if Path(result).exists() else None


def validate_tp(group: TPGroup, model: TensorParallelLlama, graphs, reference: list,
                check_tokens: int) -> TPChecks:
    """Graph against eager, and this TP size against TP=1 (rank 0's first run): raises on a
    disagreement before anything is timed. Every rank ends with the same verdicts."""
    batch = prompts(model.full_config, 4)
    n = check_tokens
    eager = greedy(model, batch, n)
    graph_equals_eager: bool | float = float("nan")
    bound = TP_BF16_RTOL if model.dtype == torch.bfloat16 else TP_FP32_RTOL
    if graphs is not None:
        graph = greedy(model, batch, n, step=graphs.run)
        problems = unexplained_divergences(eager, graph, bound)
        if problems:
            raise AssertionError(f"tp={group.size}: graph decode differs from eager: {problems}")
        graph_equals_eager = graph[0] == eager[0]
        if not graph_equals_eager:
            log(group, "graph and eager greedy runs part at a near tie")
    if group.size == 1:
        reference[0] = eager
        return TPChecks(graph_equals_eager)
    ref_obj = [reference[0]]
    dist.broadcast_object_list(ref_obj, src=0, group=group.group)  # rank 0 ran TP=1
    ref_tokens, ref_logits = ref_obj[0]
    forced = greedy(model, batch, n, forced=ref_tokens)
    err = rel_err(forced[1], ref_logits)
    if err > bound:
        raise AssertionError(f"tp={group.size} logits vs tp=1: {err:.3g} > {bound}")
    return TPChecks(graph_equals_eager, err, eager[0] == ref_tokens)
