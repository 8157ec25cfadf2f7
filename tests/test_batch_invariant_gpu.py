"""The batch-invariant switch on a GPU, bf16, Llama-3.2-1B shapes with 2 layers: a request's
logits are the same bits alone, at a random row of batches of 1 to 256 beside rows at other
contexts, in every graph bucket (padding rows included), and from prefill, chunked prefill or
a decode step; the engine serves the same tokens to requests alone and all together (greedy
and seeded sampling, chunked prefill, preemption with recompute). ``bench runtime --profile
gpu`` writes the same checks at full size into table ``batch_invariance``."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from decodelab.engine.bench import invariance

pytestmark = pytest.mark.gpu
SMALL = replace(invariance.InvarianceConfig(), engine_requests=16, engine_tokens=64,
                batches=(1, 2, 7, 8, 31, 100, 256), max_context=2048, probe_context=700,
                cost_contexts=(512,))


def _failed(rows) -> list:
    return [r for r in rows if r.identical != r.compared]


def test_logits_are_the_same_bits_alone_in_any_batch_bucket_and_from_prefill():
    width = -(-SMALL.max_context // SMALL.block_size)
    blocks = max(SMALL.batches) * width + 64
    model = invariance.build_model(SMALL, SMALL.check_layers, True, blocks)
    rows = invariance.logit_checks(SMALL, model)
    assert {r.check for r in rows} == {"prefill_vs_decode", "decode_alone_vs_batch",
                                       "graph_bucket"}
    assert not _failed(rows), _failed(rows)


def test_the_engine_serves_the_same_tokens_alone_and_together():
    model = invariance.build_model(SMALL, SMALL.check_layers, True, SMALL.engine_requests * 8)
    rows = invariance.engine_checks(SMALL, model)
    assert [r.check for r in rows] == ["engine_tokens"] * 2
    assert not _failed(rows), _failed(rows)
    assert all(" 0 preemptions" not in r.detail for r in rows), rows  # recompute was exercised


def test_the_default_kernels_do_depend_on_the_batch():
    """The check can fail: without the switch some probe row differs (cuBLAS and the matmul
    choice tile other row counts otherwise, attention splits by the batch)."""
    width = -(-SMALL.max_context // SMALL.block_size)
    blocks = max(SMALL.batches) * width + 64
    model = invariance.build_model(SMALL, SMALL.check_layers, False, blocks)
    rows = invariance.logit_checks(SMALL, model)
    assert _failed(rows), "the default kernels gave the same bits everywhere"
    torch.cuda.empty_cache()


@pytest.mark.skipif(not torch.cuda.is_available()
                    or torch.cuda.get_device_capability() < (9, 0), reason="PDL needs sm_90+")
def test_pdl_changes_nothing_on_the_invariant_kernels():
    """The invariant kernels launched with programmatic dependent launch (steps of up to 32
    rows) and serially: the same bits, eagerly and from graphs, at 1 and 8 rows (prefill too)."""
    from decodelab.model.bench import checks
    from decodelab.model.llama import PagedLlama

    model = invariance.build_model(SMALL, SMALL.check_layers, True, 512)
    assert model.ops.pdl
    serial = PagedLlama(model.config, model.weights, model.cache, pdl=False,
                        batch_invariant=True)
    assert checks.pdl_equals_serial(model, serial)


@pytest.mark.parametrize("n,k", [(3072, 2048), (2048, 2048), (2048, 8192), (16384, 2048)])
def test_a_row_is_the_same_bits_in_every_matmul_tile(n, k):
    """invariant.matmul_tile picks the tile by the row count: each row equals itself computed
    alone (the 1-row tile) under every tile the rule can pick for the weight, at several row
    counts per tile."""
    from decodelab.model.triton import attention_plan, invariant, skinny

    gen = torch.Generator(device="cuda").manual_seed(n + k)
    w = (torch.randn((n, k), generator=gen, device="cuda") / k ** 0.5).bfloat16()
    x = torch.randn((1100, k), generator=gen, device="cuda").bfloat16()
    shared = attention_plan.shared_per_block(w.device)
    alone = torch.cat([invariant.matmul(x[i:i + 1], w) for i in range(0, 1100, 37)])
    tiles = {invariant.matmul_tile(rows, n, k) for rows in (1, 65, 129, 193, 257, 1025)}
    assert len(tiles) >= 2, tiles  # the rule does change the tile with the rows
    for tile in tiles:
        stages = invariant.stages_for(*tile[:3], w.element_size(), shared)
        for rows in (65, 300, 1100):
            y = skinny.tiled(x[:rows], w, (tile.block_n, tile.block_k, tile.warps, stages),
                             tile.block_m)
            assert torch.equal(y[::37], alone[:len(y[::37])]), (tile, rows)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_invariant_kernels_are_as_close_to_the_references_as_the_default_ones(dtype):
    """Decode (16 rows per program) and prefill (64) attention on the invariant kernel against
    the torch references, and the invariant model's logits against transformers: within the
    bounds the default kernels meet (``compare``)."""
    pytest.importorskip("transformers")
    from prefill_cases import paged_case

    from decodelab.model import compare
    from decodelab.model.attention import paged_decode_attention_ref, paged_prefill_attention_ref
    from decodelab.model.bench import checks, peers
    from decodelab.model.config import named_config
    from decodelab.model.kv_cache import PagedKVCache
    from decodelab.model.llama import PagedLlama
    from decodelab.model.triton import invariant
    from decodelab.model.weights import from_state_dict, random_state_dict

    gen = torch.Generator(device="cuda").manual_seed(5)
    for lens, starts in (([2000], [0]), ([1, 17, 300, 64], [0, 40, 3000, 5])):
        args = paged_case(gen, lens, starts, 8, 4, 64, 16, dtype)
        got = invariant.prefill_attention(*args)
        assert compare.rel_err(got, paged_prefill_attention_ref(*args)) <= compare.TRITON_RTOL
        q, k, v, tables, query_starts, _, scale = args
        last = query_starts[1:] - 1  # each chunk's last token, as a decode row
        ctx = torch.tensor([s + n for s, n in zip(starts, lens, strict=True)],
                           dtype=torch.int32, device="cuda")
        want = paged_decode_attention_ref(q[last], k, v, tables, ctx, scale)
        got = invariant.decode_attention(q[last], k, v, tables, ctx, scale)
        assert compare.rel_err(got, want) <= compare.TRITON_RTOL, (lens, starts)
    config = named_config("tiny", num_layers=4)
    sd = random_state_dict(config, seed=3, dtype=dtype, device="cuda")
    cache = PagedKVCache(config, 512, 16, dtype=dtype, device="cuda")
    model = PagedLlama(config, from_state_dict(config, sd, dtype=dtype, device="cuda"), cache,
                       batch_invariant=True)
    assert checks.check_hf(model, peers.hf_model(config, sd, model.device)) <= compare.HF_BF16_RTOL
