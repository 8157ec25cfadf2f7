"""The engine's sample step timed alone (table ``runtime_sampler``): each candidate selection of
the torch sampler and, on a GPU with Triton, the fused sampler (``fused``: the same rows;
``fused_mixed``: every fourth row greedy, every third with penalties), on the same realistic
logits, validated against the full sort first."""

from __future__ import annotations

import random
from dataclasses import replace

import torch

from decodelab.core.capture import capture, warm_up
from decodelab.core.timing import TimingConfig, time_cuda, time_host
from decodelab.engine.batch import prefill_params
from decodelab.engine.bench.rows import SamplerRow
from decodelab.engine.bench.step_timing import NAN, steady_requests
from decodelab.engine.requests import Sequence
from decodelab.engine.sampler import (
    PenaltyState,
    RowParams,
    SamplerMode,
    choose_mode,
    fused,
    sample,
    sample_step,
    use_fused,
)


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
    mode = choose_mode([False] * b, [r.params.top_k for r in reqs], [False] * b, vocab,
                       top_p=[r.params.top_p for r in reqs], min_p=[r.params.min_p for r in reqs])
    modes = {"partial_topk": mode, "partial_topk_direct": replace(mode, chunk=0),
             "full_sort": replace(mode, k_cand=0, chunk=0),
             "greedy": SamplerMode(True, False, 0), "partial_topk_penalties": replace(
                 mode, penalties=True)}
    row_params = {}  # the rows' parameters where they are not ``params``
    if use_fused("auto", dev):
        modes |= {"fused": fused(mode), "fused_penalties": fused(modes["partial_topk_penalties"]),
                  "fused_greedy": fused(modes["greedy"]),
                  "fused_mixed": fused(replace(mode, penalties=True, any_greedy=True))}
        row_params |= {"fused_mixed": _mixed(params, pen)}
    full, _ = sample(logits, params, modes["full_sort"], pen)
    agree = min((sample(logits, params, modes[m], pen)[0] == full).float().mean().item()
                for m in ("partial_topk", "partial_topk_direct", "fused") if m in modes)
    if agree < 0.9:  # the same rule; a uniform within rounding of a boundary may differ
        raise AssertionError(f"partial selection or the fused sampler agrees with the full sort "
                             f"on {agree:.0%}")
    if "fused_mixed" in modes:  # mixed rows: the fused kernels against the reference
        m = replace(modes["fused_mixed"], fused=False)
        ref, _ = sample(logits, row_params["fused_mixed"], m, pen)
        mixed_agree = (sample(logits, row_params["fused_mixed"], modes["fused_mixed"], pen)[0]
                       == ref).float().mean().item()
        print(f"[bench] runtime: fused sampler equals the reference on {agree:.0%} of top-k rows, "
              f"{mixed_agree:.0%} of mixed rows", flush=True)
        agree = min(agree, mixed_agree)
        if mixed_agree < 0.9:
            raise AssertionError(f"fused sampler agrees with the reference on {mixed_agree:.0%}")
    tcfg = TimingConfig(5, 20, 10)
    rows = []
    for name, m in modes.items():
        def fn(m=m, p=row_params.get(name, params)):  # noqa: B008 - bound per variant
            sample_step(logits, p, m, pen, last, out)
            return (out,)
        if dev.type == "cuda":
            t = time_cuda(fn, tcfg)
            issued_s, host_s = t.device_stats().median, t.host_stats().median
            device_s = graph_device_time(fn, tcfg)
        else:
            t = time_host(fn, tcfg)
            issued_s = device_s = t.wall_stats().median
            host_s = t.host_stats().median
        rows.append(SamplerRow(name, b, vocab, m.k_cand, device_us=device_s * 1e6,
                               issued_us=issued_s * 1e6, host_us=host_s * 1e6,
                               partial_vs_sort_agree=agree))
    return rows


def _mixed(p: RowParams, pen: PenaltyState) -> RowParams:
    """The same rows with every fourth greedy and every third penalised (copies). The
    penalised rows' slots count every token once already, so the step's own counting (each
    timed call adds one) leaves their penalised logits, and so a replay's tokens, unchanged."""
    q = RowParams(p.block.clone())
    q.greedy[::4], q.inv_temperature[::4] = 1, 1.0
    q.repetition_penalty[::3], q.presence_penalty[::3] = 1.2, 0.3
    pen.counts[q.slot[::3]] = 1
    return q


def graph_device_time(fn, tcfg: TimingConfig) -> float:
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
