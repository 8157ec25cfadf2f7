"""Varlen paged prefill attention and chunked prefill (CPU, fp32): the torch reference against
an independent dense causal softmax, chunked prefill against whole-prompt prefill (logits and
cache), the input checks, and the Triton kernel in Triton's CPU interpreter."""

from __future__ import annotations

import importlib.util
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fake_runtime_model import FakeModel
from prefill_cases import dense_kv, paged_case

from decodelab.model.attention import paged_prefill_attention_ref
from decodelab.model.config import named_config
from decodelab.model.kv_cache import PagedKVCache, slots_for
from decodelab.model.llama import PagedLlama
from decodelab.model.weights import random_weights

HERE = Path(__file__).parent
RTOL = 1e-5  # fp32 against fp64: summation order and rounding only


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def dense_causal(q, k_pool, v_pool, tables, lens, starts, group: int, scale: float
                 ) -> torch.Tensor:
    """fp64, one query head and one query row at a time: softmax over positions 0 .. its own,
    each sequence's K/V gathered densely from the pool first."""
    out, row = torch.zeros_like(q), 0
    for i, (n, start) in enumerate(zip(lens, starts, strict=True)):
        k, v = (dense_kv(pool, tables[i], start + n) for pool in (k_pool, v_pool))
        for j in range(n):
            for h in range(q.shape[1]):
                keys = k[h // group, :start + j + 1]  # (start + j + 1, D)
                w = torch.softmax(keys @ q[row, h] * scale, dim=0)
                out[row, h] = w @ v[h // group, :start + j + 1]
            row += 1
    return out


@pytest.mark.parametrize("hkv,group", [(1, 1), (2, 4), (3, 2), (1, 7)])
def test_reference_equals_dense_causal_softmax(hkv, group):
    gen = torch.Generator().manual_seed(10 * hkv + group)
    lens, starts = [1, 7, 13, 4, 9], [0, 5, 0, 21, 3]  # starts > 0, lengths off the block size
    args = paged_case(gen, lens, starts, hkv, group, dtype=torch.float64)
    q, k, v, tables, _, _, scale = args
    want = dense_causal(q, k, v, tables, lens, starts, group, scale)
    got = paged_prefill_attention_ref(*(x.float() if x.is_floating_point() else x
                                        for x in args[:-1]), scale)
    assert got.dtype == torch.float32 and got.shape == q.shape
    assert rel_err(got.double(), want) < RTOL


def test_reference_sequences_do_not_see_each_other():
    """Changing one sequence's cached K/V changes its rows only."""
    gen = torch.Generator().manual_seed(3)
    lens, starts = [5, 6], [3, 2]
    args = paged_case(gen, lens, starts, 2, 2)
    before = paged_prefill_attention_ref(*args)
    q, k, v, tables, bounds, st, scale = args
    k = k.clone()
    k[tables[1, 0]] += 1.0  # sequence 1's first block
    after = paged_prefill_attention_ref(q, k, v, tables, bounds, st, scale)
    assert torch.equal(after[:5], before[:5]) and not torch.equal(after[5:], before[5:])


def tiny_model(num_blocks=64, block_size=4, seed=0) -> PagedLlama:
    cfg = named_config("tiny")
    return PagedLlama(cfg, random_weights(cfg, seed), PagedKVCache(cfg, num_blocks, block_size),
                      backend="torch")


def shuffled_tables(model: PagedLlama, sizes, seed: int) -> list[list[int]]:
    blocks = list(range(model.cache.num_blocks))
    random.Random(seed).shuffle(blocks)
    out = []
    for m in sizes:
        out.append(blocks[:m])
        blocks = blocks[m:]
    return out


def cache_at(model: PagedLlama, table, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of positions 0 .. n-1 of a sequence: (layers, n, Hkv, D) each."""
    slots = torch.tensor(slots_for(table, 0, n, model.cache.block_size))
    bs = model.cache.block_size
    return tuple(c[:, slots // bs, :, slots % bs] for c in (model.cache.k, model.cache.v))


@pytest.mark.parametrize("cuts", [[17], [1, 30], [5, 6, 23], [8, 9, 10, 11]])
def test_chunked_prefill_equals_whole_prompt(cuts):
    """A prompt split into 2-4 chunks over successive calls: every chunk's logits equal the
    whole-prompt prefill of the prefix it ends, and the cache ends up the same."""
    prompt = random.Random(len(cuts)).choices(range(500), k=37)
    bounds = [0, *cuts, len(prompt)]
    whole, chunked = tiny_model(), tiny_model()
    table = shuffled_tables(whole, [10], seed=1)[0]
    want = whole.prefill([prompt], [table])
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        got = chunked.prefill([prompt[lo:hi]], [table], [lo])
        prefix = tiny_model().prefill([prompt[:hi]], [table])
        assert rel_err(got, prefix) < RTOL, (lo, hi)
    assert rel_err(got, want) < RTOL
    for a, b in zip(cache_at(chunked, table, 37), cache_at(whole, table, 37), strict=True):
        assert rel_err(a, b) < RTOL


def test_pack_of_chunks_and_whole_prompts():
    """One call packing a later chunk of one sequence with whole prompts of others equals each
    sequence prefilled alone, whole."""
    rng = random.Random(4)
    prompts = [rng.choices(range(500), k=n) for n in (29, 3, 11)]
    model = tiny_model()
    tables = shuffled_tables(model, [8, 1, 3], seed=2)
    model.prefill([prompts[0][:13]], tables[:1])
    got = model.prefill([prompts[0][13:], prompts[1], prompts[2]], tables, [13, 0, 0])
    for i, p in enumerate(prompts):
        alone = tiny_model().prefill([p], [tables[i]])
        assert rel_err(got[i:i + 1], alone) < RTOL, i


def test_chunk_after_decode_steps_sees_them():
    """Positions written by decode steps are attended by a later chunk: prefill, two decode
    steps, then a chunk equals the whole sequence prefilled at once."""
    seq = random.Random(5).choices(range(500), k=20)
    model, whole = tiny_model(), tiny_model()
    table = shuffled_tables(model, [5], seed=3)[0]
    model.prefill([seq[:9]], [table])
    bt = model.cache.block_table_tensor([table])
    for p in (9, 10):
        slot = torch.tensor(slots_for(table, p, p + 1, 4))
        model.decode(torch.tensor([seq[p]]), torch.tensor([p]), slot, bt,
                     torch.tensor([p + 1], dtype=torch.int32))
    got = model.prefill([seq[11:]], [table], [11])
    assert rel_err(got, whole.prefill([seq], [table])) < RTOL


@pytest.mark.parametrize("args,match", [
    (([[1, 2]], [[0], [1]]), "1 chunks, 2 block tables"),
    (([], []), "need the same non-zero number"),
    (([[1, 2]], [[0]], [0, 0]), "2 starts for 1 chunks"),
    (([[1, 2]], [[0]], [-1]), r"starts\[0\]=-1"),
    (([[1, 2]], [[0]], [1.0]), r"starts\[0\]=1.0"),
    (([[1], []], [[0], [1]]), "chunk 1 is empty"),
    (([[1, 2, 3]], [[0]], [2]), r"chunk 0 \(positions 2 .. 4\) needs 2 blocks of 4; its block"),
    (([[1, 2]], [[64]]), "holds block 64; allowed: 0 .. 63"),
    (([[1, 512]], [[0]]), "token id 512; allowed: 0 .. 511"),
    (([[1]], [list(range(64))], [4096]), "reaches position 4096"),
])
def test_bad_inputs_are_refused_before_any_work(args, match):
    model = tiny_model()
    before = model.cache.k.clone()
    with pytest.raises(ValueError, match=match):
        model.prefill(*args)
    assert torch.equal(model.cache.k, before)


def test_fake_model_chunked_prefill_equals_whole():
    whole, chunked = FakeModel(), FakeModel()
    prompt = list(range(3, 40))
    table = list(range(12, 2, -1))
    want = whole.prefill([prompt], [table])
    for lo, hi in ((0, 6), (6, 7), (7, 37)):
        got = chunked.prefill([prompt[lo:hi]], [table], [lo])
    assert torch.equal(got, want)
    assert torch.equal(chunked.cache.tokens, whole.cache.tokens)
    with pytest.raises(ValueError, match=r"starts\[0\]=-2"):
        chunked.prefill([prompt], [table], [-2])


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_triton_kernel_in_interpreter_equals_reference():
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(HERE.parent / "lib"), str(HERE),
                                         os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(HERE / "prefill_interp_checks.py")],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["kernel:", "ok", "model:", "ok"]


def test_prefill_flops_count_every_weight_and_attended_pair():
    from decodelab.model.bench.prefill import prefill_flops

    model = tiny_model()
    cfg, w = model.config, model.weights
    lens, starts = [5, 3], [7, 0]
    weights = sum(t.numel() for lw in w.layers for t in (lw.qkv, lw.o, lw.gate_up, lw.down))
    pairs = sum(s + j + 1 for n, s in zip(lens, starts, strict=True) for j in range(n))
    matmul, attention = prefill_flops(cfg, lens, starts)
    assert matmul == 2 * weights * sum(lens) + 2 * len(lens) * w.lm_head.numel()
    assert attention == 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * pairs


def test_prefill_bench_rows_on_the_tiny_model():
    """The bench's rows on a CPU (the bench itself runs them on a GPU only): every pack timed
    and validated, its blocks freed."""
    from decodelab.model.bench.prefill import prefill_rows

    model = tiny_model()
    rows = prefill_rows(model, packs=[("1x9", [9], [0]), ("2 after 7", [5, 3], [7, 0])])
    assert [(r.pack, r.chunks, r.tokens, r.cached) for r in rows] == [("1x9", 1, 9, 0),
                                                                      ("2 after 7", 2, 8, 7)]
    for r in rows:
        assert r.first_ms > 0 and r.warm_ms > 0 and r.max_rel_err == 0.0
        # GFLOP per ms = TFLOP/s
        assert r.tflop_s == pytest.approx((r.matmul_gflop + r.attention_gflop) / r.warm_ms)
    assert model.cache.pool.num_free == model.cache.pool.num_total


@pytest.mark.parametrize("lens", [[1], [2, 3], [5, 1, 4], [1, 1, 1, 2], [7, 2, 9, 1, 3]])
def test_pack_layout_is_right_and_16_byte_aligned(lens):
    """Every packed tensor begins on 16 bytes whatever the chunk count and token count (a Triton
    kernel compiles once per pointer alignment: an odd view would be a cold call)."""
    from decodelab.model.prefill_pack import pack_prefill

    model = tiny_model()
    starts = [3 * i for i in range(len(lens))]
    tables = shuffled_tables(model, [4] * len(lens), seed=len(lens))
    chunks = [list(range(10 + i, 10 + i + n)) for i, n in enumerate(lens)]
    pack = pack_prefill(model.cache, chunks, tables, starts, vocab_size=512, max_positions=1024)
    for x in (pack.ids, pack.positions, pack.slot_mapping, pack.query_starts, pack.starts,
              pack.block_tables):
        assert x.storage_offset() * x.element_size() % 16 == 0 and x.is_contiguous()
    assert pack.ids.tolist() == [tok for c in chunks for tok in c]
    spans = list(zip(starts, lens, tables, strict=True))
    assert pack.positions.tolist() == [s + j for s, n, _ in spans for j in range(n)]
    assert pack.slot_mapping.tolist() == [x for s, n, bt in spans
                                          for x in slots_for(bt, s, s + n, 4)]
    bounds = torch.tensor([0, *lens]).cumsum(0)
    assert pack.query_starts.tolist() == bounds.tolist() and pack.starts.tolist() == starts
    assert pack.last.tolist() == (bounds[1:] - 1).tolist()
