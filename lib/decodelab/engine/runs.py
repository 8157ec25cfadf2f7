"""The measurements behind ``bench_engine``: steady engine runs, the bare forward step, the
sampler alone, a Poisson workload, and their result rows."""

from __future__ import annotations

import contextlib
import random
import statistics
import time
from dataclasses import dataclass, field, replace

import torch

from decodelab.core.capture import capture, warm_up
from decodelab.core.timing import TimingConfig, time_cuda, time_host
from decodelab.engine.batch import prefill_params
from decodelab.engine.config import EngineConfig
from decodelab.engine.engine import Engine
from decodelab.engine.metrics import StepRecord
from decodelab.engine.requests import InvalidRequestError, Request, SamplingParams, Sequence
from decodelab.engine.rows import ErrorRow, RequestRow, SamplerRow
from decodelab.engine.sampler import (
    PenaltyState,
    SamplerMode,
    choose_mode,
    sample,
    sample_step,
)
from decodelab.model.block_pool import blocks_needed

NAN = float("nan")
# Tokens each steady request may produce beyond the counted steps: count_ops profiles 5 more
# steps after them, and the batch must still be full and decoding in every one.
TAIL_TOKENS = 16
# Mixed rows of the steady batch: every row has its own temperature, top-k and top-p.
MIXED = (dict(temperature=0.8, top_k=50, top_p=0.9), dict(temperature=1.0, top_k=20),
         dict(temperature=0.7, top_k=100, top_p=0.95, min_p=0.05),
         dict(temperature=1.1, top_k=40, top_p=0.8))


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


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def steady_requests(vocab: int, batch: int, prompt_len: int, new_tokens: int) -> list[Request]:
    rng = random.Random(0)
    return [Request(f"s{i}", tuple(rng.randrange(vocab) for _ in range(prompt_len)),
                    SamplingParams(**MIXED[i % len(MIXED)], seed=i, ignore_eos=True,
                                   max_new_tokens=new_tokens)) for i in range(batch)]


def count_ops(fn, steps: int, dev: torch.device) -> tuple[float, float]:
    """(device ops, launch calls) per call of ``fn`` from the profiler; NaN without CUDA."""
    if dev.type != "cuda":
        return NAN, NAN
    from torch.profiler import ProfilerActivity, profile

    launch_names = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel",
                    "cuLaunchKernelEx", "cudaGraphLaunch", "cudaMemcpyAsync")
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                fn()
            torch.cuda.synchronize()
        events = prof.events()
        ops = sum(1 for e in events if e.device_type.name == "CUDA")
        launches = sum(1 for e in events if e.name in launch_names)
        return ops / steps, launches / steps
    except Exception:  # noqa: BLE001 - the profiler is optional; the timing stands alone
        return NAN, NAN


def time_engine(model, graphs, ecfg: EngineConfig, batch: int, cfg, *, ops: bool = True
                ) -> RunResult:
    """Steady decode of ``batch`` rows: warm up (admission, prefill), then time chunks."""
    dev = torch.device(model.device)
    eng = Engine(model, ecfg, graphs)
    reqs = steady_requests(model.config.vocab_size, batch, cfg.prompt_len, cfg.steady_steps + TAIL_TOKENS)
    handles = [eng.submit(r) for r in reqs]
    for _ in range(cfg.warmup_steps):
        eng.step()
    _sync(dev)
    first = len(eng.metrics.steps)
    walls = []
    for _ in range(cfg.chunks):
        t0 = time.perf_counter()
        for _ in range(cfg.chunk_steps):
            eng.step()
        _sync(dev)
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
    bs = cache.block_size
    tables = [cache.pool.allocate(cache.pool.blocks_needed(context)) for _ in range(batch)]
    bt = cache.block_table_tensor(tables, width=blocks_needed(cfg.max_model_len, bs))
    pos = torch.full((batch,), context - 1, dtype=torch.int64, device=dev)
    rows = torch.arange(batch, device=dev)
    slots = bt[rows, pos // bs].long() * bs + pos % bs
    ids = torch.randint(0, model.config.vocab_size, (batch,), device=dev)
    args = (ids, pos, slots, bt, (pos + 1).int())
    fn = (lambda: graphs.run(*args)) if graphs is not None else (lambda: model.decode(*args))
    walls, hosts = [], []
    for _ in range(cfg.warmup_steps):
        fn()
    _sync(dev)
    for _ in range(cfg.chunks):
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(cfg.chunk_steps):
            fn()
        hosts.append((time.thread_time() - c0) / cfg.chunk_steps)
        _sync(dev)
        walls.append((time.perf_counter() - t0) / cfg.chunk_steps)
    n_ops, launches = count_ops(fn, 5, dev) if ops else (NAN, NAN)
    for t in tables:
        cache.pool.free(t)
    return RunResult(walls, statistics.median(hosts), [], n_ops, launches)


def validate_engine(model, graphs, base: EngineConfig) -> float:
    """Greedy tokens of the engine with graphs vs the eager engine (a full bucket of 8 rows);
    on a CPU, of the engine vs its synchronous, dynamic-input variant. Returns the fraction
    of equal tokens; raises below 0.9 (a wiring bug breaks every row from its first step)."""
    rng = random.Random(1)
    reqs = [Request(f"v{i}", tuple(rng.randrange(model.config.vocab_size)
                                   for _ in range(rng.randint(5, 40))),
                    SamplingParams(temperature=0.0, max_new_tokens=12, ignore_eos=True))
            for i in range(8)]
    other = (replace(base, use_graphs=False) if graphs is not None
             else replace(base, async_output=False, static_inputs=False))

    def tokens(ecfg):
        eng = Engine(model, ecfg, graphs)
        hs = [eng.submit(r) for r in reqs]
        eng.run()
        return [t for h in hs for t in h.tokens]

    a, b = tokens(base), tokens(other)
    agree = sum(x == y for x, y in zip(a, b, strict=True)) / len(a)
    if agree < 0.9:
        raise AssertionError(f"engine tokens agree with the reference on only {agree:.0%}")
    return agree


def validate_step_graphs(model, graphs, base: EngineConfig, batch: int, steps: int = 12) -> int:
    """The engine's captured sampler against its eager body, every decode step of a run with
    mixed rows (top-k/top-p/min-p, greedy, penalties): same logits and parameters, the same
    tokens and tables. Returns the steps checked; raises on the first disagreement."""
    eng = Engine(model, base, graphs)
    reqs = steady_requests(model.config.vocab_size, batch, 24, steps + 4)
    reqs[0] = replace(reqs[0], params=replace(reqs[0].params, temperature=0.0))
    reqs[1] = replace(reqs[1], params=replace(reqs[1].params, repetition_penalty=1.2,
                                                frequency_penalty=0.3))
    handles = [eng.submit(r) for r in reqs]
    checked = 0
    for _ in range(steps):
        eng.step()
        sg = eng.step_graphs
        if sg.last is not None and eng.metrics.steps[-1].batch:
            if not sg.check(*sg.last):
                raise AssertionError(f"captured sampler disagrees with the eager one at {sg.last}")
            checked += 1
    for h in handles:
        h.abort()
    if not checked:
        raise AssertionError("no decode step reached the captured sampler")
    for (bucket, mode), sel in eng.step_graphs.selections.items():
        print(f"[bench] runtime: bucket {bucket}, k_cand {mode.k_cand}: two-stage selection "
              f"{sel['two_stage_us']:.0f} us, direct {sel['direct_us']:.0f} us -> "
              f"{'two-stage' if sel['chunk'] else 'direct'}", flush=True)
    if eng.step_graphs.failed:
        print(f"[bench] runtime: {eng.step_graphs.failed} step graph captures FAILED; those "
              "bodies ran eagerly (same tokens, more host time)", flush=True)
    return checked


def bench_logits(model, batch: int) -> torch.Tensor:
    """Realistic logits (batch, vocab): the model's prediction after short random prompts."""
    rng = random.Random(2)
    pool = model.cache.pool
    prompts = [[rng.randrange(model.config.vocab_size) for _ in range(8)] for _ in range(batch)]
    tables = [pool.allocate(pool.blocks_needed(8)) for _ in range(batch)]
    logits = model.prefill(prompts, tables)
    for t in tables:
        pool.free(t)
    return logits


def sampler_rows(logits: torch.Tensor, dev: torch.device) -> list[SamplerRow]:
    """Device time of the engine's sample step alone (the sampler with its last-token scatter
    and packed output); partial selection validated against the full sort first."""
    b, vocab = logits.shape
    reqs = steady_requests(vocab, b, 1, 8)
    seqs = [Sequence(r, arrival=i, seed=i, slot=i) for i, r in enumerate(reqs)]
    params = prefill_params(seqs, dev)
    pen = PenaltyState.empty(b + 1, vocab, dev)
    last = torch.zeros(b + 1, dtype=torch.int64, device=dev)
    out = torch.zeros(b, dtype=torch.int64, device=dev)
    mode = choose_mode([False] * b, [r.params.top_k for r in reqs], [False] * b, vocab)
    modes = {"partial_topk": mode, "partial_topk_direct": replace(mode, chunk=0),
             "full_sort": replace(mode, k_cand=0, chunk=0),
             "greedy": SamplerMode(True, False, 0), "partial_topk_penalties": replace(
                 mode, penalties=True)}
    full, _ = sample(logits, params, modes["full_sort"], pen)
    agree = min((sample(logits, params, modes[m], pen)[0] == full).float().mean().item()
                for m in ("partial_topk", "partial_topk_direct"))
    if agree < 0.9:  # exact by construction; a stray tie at the candidate edge may differ
        raise AssertionError(f"partial selection agrees with the full sort on {agree:.0%}")
    tcfg = TimingConfig(5, 20, 10)
    rows = []
    for name, m in modes.items():
        def fn(m=m):
            sample_step(logits, params, m, pen, last, out)
            return (out,)
        if dev.type == "cuda":
            t = time_cuda(fn, tcfg)
            issued_s, host_s = t.device_stats().median, t.host_stats().median
            device_s = _graph_device_time(fn, tcfg)
        else:
            t = time_host(fn, tcfg)
            issued_s = device_s = t.wall_stats().median
            host_s = t.host_stats().median
        rows.append(SamplerRow(name, b, vocab, m.k_cand, device_us=device_s * 1e6,
                               issued_us=issued_s * 1e6, host_us=host_s * 1e6,
                               partial_vs_sort_agree=agree))
    return rows


def _graph_device_time(fn, tcfg: TimingConfig) -> float:
    """Device time of ``fn``'s kernels back to back: ``fn`` captured in a CUDA graph and
    replayed, so the host's launch rate cannot stretch it; checked against the eager result.
    NaN if capture fails (the eager-issued time is still reported)."""
    try:
        want = [t.clone() for t in fn()]
        warm_up(fn)
        graph, got = capture(fn)
        graph.replay()
        torch.cuda.synchronize()
        if not all(torch.equal(a, b) for a, b in zip(got, want, strict=True)):
            raise AssertionError("captured sampler disagrees with the eager sampler")
        return time_cuda(graph.replay, tcfg).device_stats().median
    except Exception as exc:  # noqa: BLE001 - optional diagnostic
        print(f"[bench] runtime: sampler graph timing skipped: {exc}", flush=True)
        return NAN


def _faults(eng: Engine, i: int):
    """Every tenth request fails in one way: its callback raises (3), it is aborted (6), its
    logits turn non-finite (8). The others must not notice."""
    rid = f"w{i}"
    if i % 10 == 3:
        def raising(ev):
            if ev.index == 4:
                raise ConnectionError("client disconnected")
        return raising
    if i % 10 == 6:
        def aborting(ev):
            if ev.index == 3:
                eng.abort(rid)
        return aborting
    return None


def _poison(rows, logits) -> None:
    for r, seq in enumerate(rows):
        if seq.arrival % 10 == 8 and seq.launched >= 2:
            logits[r].fill_(float("nan"))


def poisson_workload(model, graphs, base: EngineConfig, cfg
                     ) -> tuple[list[RequestRow], list[ErrorRow]]:
    """Requests arriving as a Poisson process, ~10% failing in each error class, plus two
    malformed ones. Returns (per-request rows: TTFT/TPOT, status, reason, overall throughput;
    outcome and error counts by class)."""
    rng = random.Random(3)
    vocab, dev = model.config.vocab_size, torch.device(model.device)
    eng = Engine(model, base, graphs)
    eng.logits_hook = _poison
    t, arrivals, reqs = 0.0, [], []
    for i in range(cfg.workload_requests):
        t += rng.expovariate(cfg.workload_rate)
        arrivals.append(t)
        params = dict(temperature=0.0) if i % 5 == 0 else MIXED[i % len(MIXED)]
        reqs.append(Request(f"w{i}", tuple(rng.randrange(vocab) for _ in range(
            rng.randint(*cfg.workload_prompt))), SamplingParams(
                **params, seed=i, ignore_eos=True,
                max_new_tokens=rng.randint(*cfg.workload_output)), on_token=_faults(eng, i)))
    for bad in (Request("bad0", ()), Request("bad1", (vocab,))):
        with contextlib.suppress(InvalidRequestError):  # counted by the engine's metrics
            eng.submit(bad)
    i, t0 = 0, time.perf_counter()
    while i < len(reqs) or eng.has_work:
        now = time.perf_counter() - t0
        while i < len(reqs) and arrivals[i] <= now:
            eng.submit(reqs[i], arrival_time=t0 + arrivals[i])
            i += 1
        if eng.has_work:
            eng.step()
        elif i < len(reqs):
            time.sleep(max(0.0, arrivals[i] - now))
    _sync(dev)
    duration = time.perf_counter() - t0
    if eng.pool.num_free != eng.pool.num_total:
        raise RuntimeError("the workload leaked cache blocks")
    throughput = eng.metrics.tokens_out / duration
    requests = [RequestRow.of(r, cfg.workload_rate, duration, throughput)
                for r in eng.metrics.requests]
    counts = [ErrorRow("error", k, v) for k, v in sorted(eng.metrics.errors.items())]
    counts += [ErrorRow("outcome", k, v) for k, v in sorted(eng.metrics.outcomes.items())]
    return requests, counts
