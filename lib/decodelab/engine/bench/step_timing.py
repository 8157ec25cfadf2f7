"""Steady runs of ``bench runtime``: the engine decoding a full batch of mixed rows, and the
bare forward step it is compared with, timed in chunks of steps with one synchronisation each.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field

import torch

from decodelab.core.profiler import profile_steps
from decodelab.core.timing import device_sync
from decodelab.engine.config import EngineConfig
from decodelab.engine.engine import Engine
from decodelab.engine.metrics import StepRecord
from decodelab.engine.requests import Request, SamplingParams
from decodelab.model.block_pool import blocks_needed
from decodelab.model.kv_cache import decode_inputs

NAN = float("nan")
# Tokens each steady request may produce beyond the counted steps: count_ops profiles 5 more
# steps after them, and the batch must still be full and decoding in every one.
TAIL_TOKENS = 16
# Mixed rows of the steady batch: every row has its own temperature, top-k and top-p.
MIXED = (dict(temperature=0.8, top_k=50, top_p=0.9), dict(temperature=1.0, top_k=20),
         dict(temperature=0.7, top_k=100, top_p=0.95, min_p=0.05),
         dict(temperature=1.1, top_k=40, top_p=0.8))
# Plain-temperature rows, the serving workload's (bench serve): no filter to find.
PLAIN = (dict(temperature=0.6),)


@dataclass(slots=True)
class RunResult:
    walls: list[float]  # seconds per step, one sample per chunk
    host: float  # median host seconds per step
    records: list[StepRecord] = field(default_factory=list)
    device_ops: float = NAN  # device operations (kernels, copies) per step, profiler
    launches: float = NAN  # launch API calls per step (kernels and graphs), profiler

    @property
    def wall(self) -> float:
        return statistics.median(self.walls)


def steady_requests(vocab: int, batch: int, prompt_len: int, new_tokens: int,
                    mix: tuple[dict, ...] = MIXED) -> list[Request]:
    rng = random.Random(0)
    return [Request(f"s{i}", tuple(rng.randrange(vocab) for _ in range(prompt_len)),
                    SamplingParams(**mix[i % len(mix)], seed=i, ignore_eos=True,
                                   max_new_tokens=new_tokens)) for i in range(batch)]


def count_ops(fn, steps: int, dev: torch.device) -> tuple[float, float]:
    """(device ops, launch calls) per call of ``fn`` from the profiler; NaN without CUDA."""
    if dev.type != "cuda":
        return NAN, NAN
    launch_names = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel",
                    "cuLaunchKernelEx", "cudaGraphLaunch", "cudaMemcpyAsync")
    try:
        events = profile_steps(fn, steps, cuda=True)
        ops = sum(1 for e in events if e.device_type.name == "CUDA")
        launches = sum(1 for e in events if e.name in launch_names)
        return ops / steps, launches / steps
    except Exception:  # noqa: BLE001 - the profiler is optional; the timing stands alone
        return NAN, NAN


def time_engine(model, graphs, ecfg: EngineConfig, batch: int, cfg, *, ops: bool = True,
                mix: tuple[dict, ...] = MIXED) -> RunResult:
    """Steady decode of ``batch`` rows (sampling settings ``mix`` in turn): warm up
    (admission, prefill), then time chunks."""
    dev = torch.device(model.device)
    eng = Engine(model, ecfg, graphs)
    reqs = steady_requests(model.config.vocab_size, batch, cfg.prompt_len,
                           cfg.steady_steps + TAIL_TOKENS, mix)
    handles = [eng.submit(r) for r in reqs]
    for _ in range(cfg.warmup_steps):
        eng.step()
    device_sync(dev)
    first = len(eng.metrics.steps)
    walls = []
    for _ in range(cfg.chunks):
        t0 = time.perf_counter()
        for _ in range(cfg.chunk_steps):
            eng.step()
        device_sync(dev)
        walls.append((time.perf_counter() - t0) / cfg.chunk_steps)
    records = list(eng.metrics.steps)[first:]
    if any(r.batch != batch for r in records):
        raise RuntimeError(f"steady run at batch {batch} was not steady: "
                           f"{sorted({r.batch for r in records})}")
    n_ops, launches = count_ops(eng.step, 5, dev) if ops else (NAN, NAN)
    for h in handles:
        h.abort()
    if eng.pool.num_free != eng.pool.num_total:
        raise RuntimeError("engine leaked cache blocks in the steady run")
    host = statistics.median(r.host + r.forward for r in records)
    return RunResult(walls, host, records, n_ops, launches)


def time_bare_forward(model, graphs, batch: int, context: int, cfg, *, ops: bool = True
                      ) -> RunResult:
    """The forward step alone (graph replay with its input copies, or eager decode)."""
    cache, dev = model.cache, torch.device(model.device)
    width = blocks_needed(cfg.max_model_len, cache.block_size)
    tables, args = decode_inputs(cache, batch, context, width=width)
    fn = (lambda: graphs.run(*args)) if graphs is not None else (lambda: model.decode(*args))
    walls, hosts = [], []
    for _ in range(cfg.warmup_steps):
        fn()
    device_sync(dev)
    for _ in range(cfg.chunks):
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(cfg.chunk_steps):
            fn()
        hosts.append((time.thread_time() - c0) / cfg.chunk_steps)
        device_sync(dev)
        walls.append((time.perf_counter() - t0) / cfg.chunk_steps)
    n_ops, launches = count_ops(fn, 5, dev) if ops else (NAN, NAN)
    for t in tables:
        cache.pool.free(t)
    return RunResult(walls, statistics.median(hosts), [], n_ops, launches)
