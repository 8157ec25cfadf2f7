"""GPU checks of prefill through CUDA graphs per token bucket (``model.prefill_graphs``): every
pack a bucket holds gives the eager call's logits and cache contents, packs past the buckets or
``max_chunks`` run eagerly, and a replay returns while the device still works (no host wait)."""

from __future__ import annotations

import random

import pytest
import torch

from decodelab.model import compare
from decodelab.model.config import named_config
from decodelab.model.kv_cache import PagedKVCache
from decodelab.model.llama import PagedLlama
from decodelab.model.prefill_graphs import PrefillGraphs
from decodelab.model.weights import random_weights

pytestmark = pytest.mark.gpu
BS = 16


def _models(layers: int = 2, batch_invariant: bool = False):
    """Two models on the same weights over their own caches (graphs, eager)."""
    cfg = named_config("llama-3.2-1b", num_layers=layers)
    w = random_weights(cfg, 7, dtype=torch.bfloat16, device="cuda")
    return [PagedLlama(cfg, w, PagedKVCache(cfg, 1024, BS, dtype=torch.bfloat16, device="cuda"),
                       batch_invariant=batch_invariant) for _ in range(2)]


def _calls(rng: random.Random, vocab: int):
    """(chunks, tables, starts) of packs inside and past buckets (16, 64, 256) and 4 chunks:
    one token, bucket edges, ragged chunks after cached positions, 5 chunks (eager), 300
    tokens (eager). Tables are taken from one shuffled pool, so each sequence owns its blocks."""
    blocks = list(range(1024))
    rng.shuffle(blocks)

    def table(n):
        return [blocks.pop() for _ in range(-(-n // BS))]

    for lens, starts in (([1], [0]), ([16], [0]), ([17], [0]), ([64], [0]),
                         ([3, 40, 1, 100], [0, 30, 7, 0]), ([250], [500]),
                         ([10] * 5, [0] * 5), ([300], [0])):
        seqs = [rng.choices(range(vocab), k=s + n) for n, s in zip(lens, starts, strict=True)]
        yield ([q[s:] for q, s in zip(seqs, starts, strict=True)], [table(len(q)) for q in seqs],
               starts, [q[:s] for q, s in zip(seqs, starts, strict=True)])


@pytest.mark.parametrize("batch_invariant", [False, True])
def test_a_replayed_pack_equals_the_eager_prefill(batch_invariant):
    graphed, eager = _models(batch_invariant=batch_invariant)
    graphs = PrefillGraphs(graphed, buckets=(16, 64, 256), max_chunks=4, max_blocks_per_seq=64)
    assert graphs.bucket_for(17, 4) == 64 and graphs.bucket_for(257, 1) is None
    assert graphs.bucket_for(10, 5) is None
    rng = random.Random(0)
    for chunks, tables, starts, cached in _calls(rng, graphed.config.vocab_size):
        for model in (graphed, eager):
            for bt, c in zip(tables, cached, strict=True):
                if c:
                    model.prefill([c], [bt])  # the positions before the chunk (eager)
        got = graphs.prefill(chunks, tables, starts).clone()
        want = eager.prefill(chunks, tables, starts)
        lens = [len(c) for c in chunks]
        if batch_invariant:  # padding changes no bit of a row (the switch's promise)
            assert torch.equal(got, want), lens
        else:  # other row counts: other matmul tiles
            assert compare.rel_err(got, want) <= compare.TRITON_RTOL, lens
        for a, b in ((graphed.cache.k, eager.cache.k), (graphed.cache.v, eager.cache.v)):
            used = [blk for bt in tables for blk in bt]
            assert compare.rel_err(a[:, used], b[:, used]) <= compare.TRITON_RTOL, lens
    # the scratch block stays untouched by padding rows (slot -1 writes nothing)
    assert not graphed.cache.k[:, graphed.cache.scratch_block].any()


def test_a_replay_does_not_wait_for_the_device():
    """The pack's copies are pinned and asynchronous: a replay issued behind a long kernel
    returns before that kernel ends."""
    graphed, _ = _models()
    graphs = PrefillGraphs(graphed, buckets=(64,), max_chunks=2, max_blocks_per_seq=8)
    chunk = list(range(50))
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # a long kernel ahead of the replay (~0.1 s)
    done = torch.cuda.Event()
    graphs.prefill([chunk], [[1, 2, 3, 4]])
    done.record()
    assert not done.query(), "the replay waited for the work queued before it"
    torch.cuda.synchronize()


def test_an_engine_with_prefill_graphs_gives_the_same_tokens_on_the_invariant_model():
    """Chunked prefill mixed with decode, 24 requests of 20-300-token prompts, greedy and
    seeded: through prefill graphs and eagerly the batch-invariant model gives the same
    tokens (padding changes no bit), and every block comes back."""
    from decodelab.engine.config import EngineConfig
    from decodelab.engine.engine import Engine
    from decodelab.engine.requests import Request, SamplingParams
    from decodelab.model.graphs import DecodeGraphs

    model, _ = _models(batch_invariant=True)
    decode = DecodeGraphs(model, buckets=(1, 8, 16), max_blocks_per_seq=32)
    prefill = PrefillGraphs(model, buckets=(16, 64, 256), max_chunks=4, max_blocks_per_seq=32)
    rng = random.Random(5)
    prompts = [rng.choices(range(model.config.vocab_size), k=rng.randint(20, 300))
               for _ in range(24)]
    ecfg = EngineConfig(max_num_seqs=16, max_model_len=512, max_num_batched_tokens=256,
                        batch_invariant=True)
    outs = []
    for graphs in (prefill, None):
        eng = Engine(model, ecfg, decode, graphs)
        handles = [eng.submit(Request(f"r{i}", p, SamplingParams(
            temperature=0.0 if i % 2 else 0.8, seed=i, max_new_tokens=24)))
            for i, p in enumerate(prompts)]
        eng.run()
        outs.append([h.tokens for h in handles])
        assert eng.pool.num_free == eng.pool.num_total
    assert outs[0] == outs[1]
