"""Prefill graphs on the CPU: construction refuses what cannot be captured, and the static
pack a graph reads (``StaticPack``: padding rows and empty chunks) gives the eager prefill's
logits and cache through the model, on the tiny model's torch backend."""

from __future__ import annotations

import random

import pytest
import torch

from decodelab.core.validate import ConfigError
from decodelab.model.config import named_config
from decodelab.model.kv_cache import PagedKVCache
from decodelab.model.llama import PagedLlama
from decodelab.model.prefill_graphs import PrefillGraphs, StaticPack
from decodelab.model.prefill_pack import host_pack
from decodelab.model.weights import random_weights


def _model() -> PagedLlama:
    cfg = named_config("tiny")
    return PagedLlama(cfg, random_weights(cfg, 3), PagedKVCache(cfg, 64, 8), backend="torch")


def test_prefill_graphs_refuse_a_cpu_model_naming_it():
    with pytest.raises(ConfigError, match="CUDA model on the Triton backend.*torch on cpu"):
        PrefillGraphs(_model())


@pytest.mark.parametrize("lens,starts,bucket", [([5], [0], 16), ([16], [0], 16),
                                                ([3, 9, 1], [0, 20, 4], 32)])
def test_a_padded_static_pack_gives_the_eager_prefill(lens, starts, bucket):
    eager, padded = _model(), _model()
    cfg, rng = eager.config, random.Random(1)
    seqs = [rng.choices(range(cfg.vocab_size), k=s + n) for n, s in zip(lens, starts,
                                                                          strict=True)]
    blocks = rng.sample(range(64), 64)
    tables = [[blocks.pop() for _ in range(-(-len(q) // 8))] for q in seqs]
    chunks = [q[s:] for q, s in zip(seqs, starts, strict=True)]
    for model in (eager, padded):
        for q, bt, s in zip(seqs, tables, starts, strict=True):
            if s:
                model.prefill([q[:s]], [bt])
    want = eager.prefill(chunks, tables, starts)
    static = StaticPack(32, 4, 6, torch.device("cpu"))
    static.fill(host_pack(padded.cache, chunks, tables, starts, vocab_size=cfg.vocab_size,
                          max_positions=cfg.max_position_embeddings, width=6), bucket)
    pack = static.view(bucket)
    t = sum(lens)
    assert pack.ids.shape == (bucket,) and pack.slot_mapping[t:].eq(-1).all()
    assert pack.query_starts.tolist() == [0, *torch.tensor(lens).cumsum(0).tolist()] + [t] * (
        4 - len(lens))
    got = padded.prefill_packed(pack)[:len(lens)]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    used = [b for bt in tables for b in bt]
    torch.testing.assert_close(padded.cache.k[:, used], eager.cache.k[:, used])
    torch.testing.assert_close(padded.cache.v[:, used], eager.cache.v[:, used])
