"""The compile_static peer's model (eager, CPU, fp32) equals our paged decode on the same K/V."""

from __future__ import annotations

import pytest
import torch

from decodelab.model.bench.static_cache import StaticCacheLlama
from decodelab.model.config import named_config
from decodelab.model.kv_cache import PagedKVCache, decode_inputs
from decodelab.model.llama import PagedLlama
from decodelab.model.weights import from_state_dict, random_state_dict


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("batch,context", [(1, 1), (3, 37), (4, 64)])
def test_static_cache_step_equals_paged_decode(tied, batch, context):
    config = named_config("tiny", tie_word_embeddings=tied)
    weights = from_state_dict(config, random_state_dict(config, seed=3))
    cache = PagedKVCache(config, 80, block_size=16)
    cache.k.normal_(generator=torch.Generator().manual_seed(0))
    cache.v.normal_(generator=torch.Generator().manual_seed(1))
    model = PagedLlama(config, weights, cache, backend="torch")
    # tables that do not start at block 0: the peer must follow each row's table
    cache.pool.allocate(5)
    _, (ids, pos, slots, bt, lens) = decode_inputs(cache, batch, context,
                                                   torch.Generator().manual_seed(2))
    peer = StaticCacheLlama(config, weights, model.cos, model.sin, batch, context)
    peer.load_from_paged(cache, bt)
    want = model.decode(ids, pos, slots, bt, lens)
    got = peer(ids)
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert float((got - want).abs().max() / want.abs().max()) < 1e-5
    # the step wrote its own K/V where ours did
    last = context - 1
    block, off = bt[0, last // 16].long(), last % 16
    torch.testing.assert_close(peer.l0_k[0, :, last], cache.k[0][block, :, off])
