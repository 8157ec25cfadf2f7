"""Tables ``batch_invariance`` and ``batch_invariance_cost``: the batch-invariant switch
(``PagedLlama(..., batch_invariant=True)``, ``EngineConfig(batch_invariant=True)``) checked
bit for bit and priced on one GPU, in one run. GPU only (the switch needs Triton on CUDA).

Checks (``batch_invariance``: one row per check and batch; ``identical`` of ``compared``, and
the largest difference seen, 0 where every compared value is the same bits):

- ``decode_alone_vs_batch``: a probe request's decode logits alone and at a random row of a
  batch of B, the other rows at random contexts up to the table's width;
- ``graph_bucket``: the same through the decode graphs, the probe alone (bucket 1) and in each
  larger bucket (padded rows included), against the eager step alone;
- ``prefill_vs_decode``: a prompt's last logits from one prefill, from two chunks, and from a
  decode step after the prompt less its last token;
- ``engine_tokens``: requests served alone and all together by the engine (graphs, chunked
  prefill under a small token budget, a KV pool small enough to preempt), greedy and seeded
  sampling: requests whose tokens are identical; the batched run's preemptions in
  ``detail``.

Cost (``batch_invariance_cost``, :mod:`.invariance_cost`): the decode step's device time per
graph replay at each batch and context, and one prompt's eager prefill at each length
(``step``), the default kernels against the invariant ones (``ratio``).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from decodelab.core.results import stamped, write_table
from decodelab.engine.bench.invariance_config import NAN, InvarianceConfig, build_model
from decodelab.engine.bench.invariance_cost import step_costs
from decodelab.engine.config import EngineConfig
from decodelab.engine.engine import Engine
from decodelab.engine.requests import Request, SamplingParams
from decodelab.model.graphs import DecodeGraphs
from decodelab.model.kv_cache import slots_at
from decodelab.model.llama import PagedLlama

GRAPH_BUCKETS = (1, 8, 32, 128)  # below the largest batch, which is a bucket too


@dataclass(frozen=True, slots=True)
class InvarianceRow:
    check: str
    batch: int
    compared: int
    identical: int
    max_abs_diff: float
    detail: str = ""
    model: str = ""
    dtype: str = ""
    bench_s: float = NAN


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def _decode_batch(model: PagedLlama, width: int, probe: tuple, batch: int, rng: random.Random):
    """Decode inputs of ``batch`` rows with the probe (token, table, context) at a random row;
    the other rows at random contexts over blocks the probe does not use."""
    token, table, context = probe
    bs, n = model.cache.block_size, model.cache.num_blocks
    mine = set(table)
    others = [b for b in range(n) if b not in mine]
    at = rng.randrange(batch)
    rows = []
    for i in range(batch):
        if i == at:
            rows.append((token, table, context))
        else:
            ctx = rng.randint(1, width * bs)
            rows.append((rng.randrange(model.config.vocab_size),
                         rng.sample(others, -(-ctx // bs)), ctx))
    dev = model.device
    ids = torch.tensor([r[0] for r in rows], device=dev)
    bt = model.cache.block_table_tensor([r[1] for r in rows], width=width)
    pos = torch.tensor([r[2] - 1 for r in rows], device=dev)
    return at, (ids, pos, slots_at(bt, pos, bs), bt, (pos + 1).int())


def logit_checks(cfg: InvarianceConfig, model: PagedLlama) -> list[InvarianceRow]:
    """``decode_alone_vs_batch``, ``graph_bucket`` (CUDA only) and ``prefill_vs_decode`` on
    ``model``."""
    rng = random.Random(0)
    bs = cfg.block_size
    width = cfg.width
    model.cache.k.normal_()  # every slot a batch row may attend holds finite values
    model.cache.v.normal_()
    prompt = [rng.randrange(model.config.vocab_size) for _ in range(cfg.probe_context)]
    table = model.cache.pool.allocate(-(-cfg.probe_context // bs))
    rows: list[InvarianceRow] = []
    # prefill vs decode, which also leaves the probe's K/V in the cache
    whole = model.prefill([prompt], [table])[0]
    cut = cfg.probe_context // 3
    model.prefill([prompt[:cut]], [table])
    chunked = model.prefill([prompt[cut:]], [table], [cut])[0]
    model.prefill([prompt[:-1]], [table])
    probe = (prompt[-1], table, cfg.probe_context)
    _, args = _decode_batch(model, width, probe, 1, rng)
    alone = model.decode(*args)[0].clone()
    for name, got in (("chunked prefill", chunked), ("decode step", alone)):
        rows.append(InvarianceRow("prefill_vs_decode", 1, 1, int(torch.equal(got, whole)),
                                  _diff(got, whole), f"one prefill vs {name}"))
    for batch in cfg.batches:
        at, args = _decode_batch(model, width, probe, batch, rng)
        got = model.decode(*args)[at]
        rows.append(InvarianceRow("decode_alone_vs_batch", batch, 1,
                                  int(torch.equal(got, alone)), _diff(got, alone),
                                  f"probe at row {at}"))
    if model.device.type == "cuda":
        # buckets between the batches: most batches replay a bucket with padding rows
        buckets = tuple(b for b in GRAPH_BUCKETS if b < max(cfg.batches)) + (max(cfg.batches),)
        graphs = DecodeGraphs(model, buckets=buckets, max_blocks_per_seq=width)
        for batch in cfg.batches:
            at, args = _decode_batch(model, width, probe, batch, rng)
            got = graphs.run(*args)[at]
            rows.append(InvarianceRow("graph_bucket", batch, 1, int(torch.equal(got, alone)),
                                      _diff(got, alone), f"bucket {graphs.bucket_for(batch)}"))
        del graphs
    model.cache.pool.free(table)
    return rows


def _requests(cfg: InvarianceConfig, vocab: int, sampled: bool) -> list[Request]:
    rng = random.Random(1)
    reqs = []
    for i in range(cfg.engine_requests):
        longest = min(600, cfg.max_context - cfg.engine_tokens)
        prompt = tuple(rng.randrange(vocab) for _ in range(rng.randint(min(16, longest), longest)))
        params = (SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=i,
                                 max_new_tokens=cfg.engine_tokens, ignore_eos=True) if sampled
                  else SamplingParams(temperature=0.0, max_new_tokens=cfg.engine_tokens,
                                      ignore_eos=True))
        reqs.append(Request(f"{'s' if sampled else 'g'}{i}", prompt, params))
    return reqs


def _serve(model: PagedLlama, graphs, ecfg: EngineConfig, reqs: list[Request]
           ) -> tuple[dict[str, list[int]], int]:
    eng = Engine(model, ecfg, graphs)
    handles = [eng.submit(r) for r in reqs]
    eng.run()
    if eng.pool.num_free != eng.pool.num_total or not all(h.done for h in handles):
        raise RuntimeError("batch_invariance: a request did not end or blocks were kept")
    return {h.request_id: list(h.tokens) for h in handles}, sum(h.num_preemptions
                                                                for h in handles)


def engine_checks(cfg: InvarianceConfig, model: PagedLlama) -> list[InvarianceRow]:
    """``engine_tokens``: each request alone, then all together; ``model``'s KV pool should be
    too small for all of them at once (the batched run then preempts and recomputes)."""
    width = cfg.width
    buckets = tuple(b for b in GRAPH_BUCKETS if b < cfg.engine_requests) + (cfg.engine_requests,)
    graphs = (DecodeGraphs(model, buckets=buckets, max_blocks_per_seq=width)
              if model.device.type == "cuda" else None)
    base = EngineConfig(max_num_seqs=cfg.engine_requests, max_model_len=cfg.max_context,
                        max_num_batched_tokens=max(256, cfg.engine_requests),
                        use_graphs=graphs is not None, batch_invariant=True)
    rows = []
    for sampled in (False, True):
        reqs = _requests(cfg, model.config.vocab_size, sampled)
        alone = {}
        for r in reqs:
            alone |= _serve(model, graphs, replace(base, max_num_seqs=1,
                                                   max_num_batched_tokens=256), [r])[0]
        together, preempted = _serve(model, graphs, base, reqs)
        same = sum(alone[k] == together[k] for k in alone)
        first = [next((i for i, (a, b) in enumerate(zip(alone[k], together[k], strict=True))
                       if a != b), -1) for k in alone if alone[k] != together[k]]
        rows.append(InvarianceRow("engine_tokens", len(reqs), len(reqs), same, NAN,
                                  f"{'seeded T0.8 k50 p0.9' if sampled else 'greedy'}, "
                                  f"{cfg.engine_tokens} tokens, {preempted} preemptions "
                                  f"together; first differing token {first[:5]}"))
    return rows


def write_invariance(out_dir: Path, profile: str, cfg: InvarianceConfig | None = None
                     ) -> list[Path]:
    """Measure both tables on the GPU and write them."""
    cfg = cfg or InvarianceConfig()
    t0 = time.perf_counter()
    model = build_model(cfg, cfg.check_layers, True, cfg.check_blocks)
    checks = logit_checks(cfg, model)
    for r in checks:
        print(f"[bench] batch_invariance: {r.check} batch {r.batch}: {r.identical}/{r.compared} "
              f"identical, max diff {r.max_abs_diff:.3g} ({r.detail})", flush=True)
    del model
    torch.cuda.empty_cache()
    pool = cfg.engine_requests * 8  # blocks: about a third of what all requests need at once
    model = build_model(cfg, cfg.check_layers, True, pool)
    checks += engine_checks(cfg, model)
    print(f"[bench] batch_invariance: {checks[-2].detail}; {checks[-2].identical}/"
          f"{checks[-2].compared}; {checks[-1].detail}: {checks[-1].identical}/"
          f"{checks[-1].compared}", flush=True)
    del model
    torch.cuda.empty_cache()
    costs = step_costs(cfg)
    run = dict(model=cfg.model, dtype=cfg.dtype, bench_s=round(time.perf_counter() - t0, 1))
    return [write_table(name, stamped(rows, **run), out_dir=out_dir, config=cfg,
                        profile=profile)
            for name, rows in (("batch_invariance", checks), ("batch_invariance_cost", costs))]
