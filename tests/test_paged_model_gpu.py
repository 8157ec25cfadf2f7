"""GPU checks of the paged model: Triton kernels vs the references, graphs vs eager, bf16 and
fp16 vs transformers (bounds stated in decodelab.model.compare). fp16 is what the dtype choice
picks below sm_80; it is checked here on whatever GPU runs the suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from decodelab.model import compare
from decodelab.model.bench import checks, peers
from decodelab.model.config import named_config
from decodelab.model.graphs import DecodeGraphs
from decodelab.model.kv_cache import PagedKVCache
from decodelab.model.llama import PagedLlama, greedy_generate
from decodelab.model.weights import from_state_dict, random_state_dict

pytestmark = pytest.mark.gpu


def build(name="tiny", backend="triton", num_blocks=512, dtype=torch.bfloat16, **overrides):
    config = named_config(name, **overrides)
    sd = random_state_dict(config, seed=3, dtype=dtype, device="cuda")
    weights = from_state_dict(config, sd, dtype=dtype, device="cuda")
    cache = PagedKVCache(config, num_blocks, 16, dtype=dtype, device="cuda")
    return PagedLlama(config, weights, cache, backend=backend), sd


@pytest.mark.parametrize("shape", [{}, dict(hidden_size=2048, num_heads=32, num_kv_heads=8,
                                             head_dim=64, num_layers=1)], ids=["tiny", "1b"])
def test_triton_attention_equals_reference(shape):
    cache = PagedKVCache(named_config("tiny", **shape), 2048, 16, dtype=torch.bfloat16,
                         device="cuda")
    assert checks.check_attention(cache, batches=(1, 3, 8, 32, 128)) <= compare.TRITON_RTOL


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("group", [1, 4, 7])
def test_paged_attention_over_any_block_table(dtype, group):
    """Shuffled, non-contiguous blocks; contexts of 1, a partial last block, exact multiples of
    the block size and long ones in one batch; every split count the plan picks (batch 1..64)
    and a batch that fills the GPU unsplit, each row whole (160); the rows taken in any order
    give the same bits, and the model's order is torch's stable sort."""
    from decodelab.model.attention import paged_decode_attention_ref
    from decodelab.model.triton.attention import paged_decode_attention
    from decodelab.model.triton.row_rank import longest_first

    gen = torch.Generator(device="cuda").manual_seed(group)
    hkv, d, bs = 2, 64, 16
    for batch in (1, 5, 64, 160):
        lens = torch.tensor([(1, 17, 32, 1000, 4095)[i % 5] for i in range(batch)],
                            dtype=torch.int32, device="cuda")
        width = -(-int(lens.max()) // bs)
        blocks = batch * width + 3
        k = torch.randn((blocks, hkv, bs, d), generator=gen, device="cuda").to(dtype)
        v = torch.randn((blocks, hkv, bs, d), generator=gen, device="cuda").to(dtype)
        bt = torch.randperm(blocks, generator=gen, device="cuda")[:batch * width]
        bt = bt.view(batch, width).int()
        q = torch.randn((batch, hkv * group, d), generator=gen, device="cuda").to(dtype)
        ref = paged_decode_attention_ref(q, k, v, bt, lens, d ** -0.5)
        got = paged_decode_attention(q, k, v, bt, lens, d ** -0.5)
        bound = 1e-5 if dtype == torch.float32 else compare.TRITON_RTOL
        assert compare.rel_err(got, ref) <= bound, (batch, dtype, group)
        model_order = longest_first(lens)
        assert torch.equal(model_order, torch.argsort(lens, descending=True, stable=True).int())
        for order in (model_order, torch.randperm(batch, generator=gen, device="cuda").int()):
            assert torch.equal(paged_decode_attention(q, k, v, bt, lens, d ** -0.5,
                                                      row_order=order), got), (batch, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_triton_ops_match_torch_ops(dtype):
    fast, _ = build(dtype=dtype)
    ref = PagedLlama(fast.config, fast.weights, fast.cache, backend="torch")
    prompts = compare.prompts(fast.config, 4)
    tokens, want = greedy_generate(ref, prompts, 16)
    _, got = greedy_generate(fast, prompts, 16, forced=tokens)
    assert compare.rel_err(got, want) < 2e-2


def test_graph_decode_equals_eager_decode_bf16():
    model, _ = build()
    graphs = DecodeGraphs(model, buckets=(1, 2, 4, 8), max_blocks_per_seq=32)
    assert graphs.capture_s > 0 and graphs.graph_mem_mib >= 0
    prompts = compare.prompts(model.config, 4)  # batch 4 == bucket 4: same kernels both ways
    eager_tokens, eager_logits = greedy_generate(model, prompts, 32)
    graph_tokens, graph_logits = greedy_generate(model, prompts, 32, step=graphs.run)
    assert graph_tokens == eager_tokens
    assert torch.equal(graph_logits, eager_logits)
    # A padded bucket (3 rows in bucket 4), teacher-forced: close, and padding wrote nothing.
    tokens, ref = greedy_generate(model, prompts[:3], 32)
    before = model.cache.k.clone()
    _, out = greedy_generate(model, prompts[:3], 32, step=graphs.run, forced=tokens)
    assert compare.rel_err(out, ref) < 2e-2
    assert torch.equal(model.cache.k[:, model.cache.scratch_block],
                       before[:, model.cache.scratch_block])


def test_narrow_table_graph_equals_the_full_table_where_rows_fit():
    """A bucket that fills the GPU unsplit also gets a graph over the narrow table, where each
    row is taken whole: it runs where the longest row fits, and gives the full table's (and
    eager decode's) bits for rows of one split (at most 1,024 positions); rows of up to 2,048
    positions, one chunk there and two in the full table, agree within bf16 rounding."""
    from decodelab.model.kv_cache import slots_at
    from decodelab.model.triton.attention_plan import (
        MAX_CHUNK,
        PROGRAMS_PER_SM,
        UNCAPPED_TABLE,
        sm_count,
    )

    bs, width = 16, 3 * UNCAPPED_TABLE // 16
    model, _ = build(num_blocks=40_000, max_position_embeddings=4 * UNCAPPED_TABLE)
    rows = -(-PROGRAMS_PER_SM * sm_count(model.device) // model.config.num_kv_heads)
    graphs = DecodeGraphs(model, buckets=(rows,), max_blocks_per_seq=width)
    assert graphs.narrow_blocks == UNCAPPED_TABLE // bs and rows in graphs.narrow
    assert graphs.fits_narrow(rows, UNCAPPED_TABLE) and not graphs.fits_narrow(rows, 2049)
    gen = torch.Generator().manual_seed(5)
    for longest in (MAX_CHUNK, UNCAPPED_TABLE):
        lens = torch.randint(1, longest + 1, (rows,), generator=gen)
        cache = model.cache
        tables = [cache.pool.allocate(cache.pool.blocks_needed(int(n))) for n in lens]
        bt = cache.block_table_tensor(tables, width)
        pos = (lens - 1).cuda()
        ids = torch.randint(0, model.config.vocab_size, (rows,), generator=gen).cuda()
        args = (ids, pos, slots_at(bt, pos, bs), bt, lens.int().cuda())
        full = graphs.run(*args).clone()  # a table wider than the narrow one: the full graph
        narrow = graphs.run(*args, longest=int(lens.max())).clone()
        if longest == MAX_CHUNK:
            assert torch.equal(narrow, full) and torch.equal(model.decode(*args), full)
        else:
            assert compare.rel_err(narrow, full) < 2e-2
        for t in tables:
            cache.pool.free(t)


def test_graph_check_runs_on_buckets_smaller_than_its_prompts():
    """The bench's graph check (8 prompts) on graphs captured for batch 1 only, as the bench's
    serial graphs are where PDL stops at small batches: it checks the largest bucket."""
    model, _ = build()
    graphs = DecodeGraphs(model, buckets=(1,), max_blocks_per_seq=32)
    assert checks.check_graph(model, graphs) < 2e-2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_logits_close_to_transformers(dtype):
    """fp16 keeps 3 more mantissa bits than bf16: the bf16 bound holds it with room."""
    pytest.importorskip("transformers")
    model, sd = build(num_layers=4, dtype=dtype)
    hf = peers.hf_model(model.config, sd, model.device)
    assert checks.check_hf(model, hf) <= compare.HF_BF16_RTOL


@pytest.mark.skipif(not torch.cuda.is_available()
                    or torch.cuda.get_device_capability() < (9, 0), reason="PDL needs sm_90+")
@pytest.mark.parametrize("name", ["tiny", "llama-3.2-1b"])
def test_pdl_graph_equals_serial_graph(name):
    """Programmatic dependent launch changes when kernels start, never what they compute: the
    same kernels launched serially give bit-identical logits, in a graph and eagerly."""
    model, _ = build(name, num_layers=2)
    assert model.ops.pdl
    serial = PagedLlama(model.config, model.weights, model.cache, pdl=False,
                        linear_choice=model.ops.matmul.choice)
    assert checks.pdl_equals_serial(model, serial)


def test_fused_norm_gemv_equals_the_unfused_ops():
    """At batch 1 the residual add and RMSNorm run in the next gemv's prologue: the same
    numbers as the add-norm kernel followed by that gemv."""
    from decodelab.model.triton.fused import rms_norm_rows
    from decodelab.model.triton.linear import TILES, add_norm_gemv, gemv

    gen = torch.Generator(device="cuda").manual_seed(0)
    for n, k in ((3072, 2048), (16384, 2048), (40, 96)):
        w = torch.randn((n, k), device="cuda", generator=gen).to(torch.bfloat16) / k ** 0.5
        h = torch.randn((1, k), device="cuda", generator=gen).to(torch.bfloat16)
        res = torch.randn((1, k), device="cuda", generator=gen).to(torch.bfloat16)
        nw = torch.rand(k, device="cuda", generator=gen).to(torch.bfloat16) + 0.5
        for tile in TILES[:4]:
            for add in (True, False):
                h_ref = h.clone()
                normed = rms_norm_rows(h_ref, res if add else None, nw, 1e-5)
                want = gemv(normed, w, tile)
                h_new, got = add_norm_gemv(h, res if add else None, nw, 1e-5, w, tile)
                assert torch.equal(h_new, h_ref), (n, k, tile, add)
                assert compare.rel_err(got, want) < 1e-2, (n, k, tile, add)


@pytest.mark.parametrize("rows", [2, 8, 32, 64])
def test_skinny_matmul_equals_cublas(rows):
    """The Triton matmul of a few rows (with SwiGLU on the fly or not) against cuBLAS, bf16,
    at the 1B model's shapes and a ragged one."""
    from triton.runtime.errors import OutOfResources

    from decodelab.model.triton.matmul_choice import cublas
    from decodelab.model.triton.skinny import TILES, skinny

    gen = torch.Generator(device="cuda").manual_seed(rows)
    for n, k, swiglu in ((3072, 2048, False), (2048, 8192, True), (100, 200, False)):
        w = torch.randn((n, k), device="cuda", generator=gen).to(torch.bfloat16) / k ** 0.5
        x = torch.randn((rows, k * (2 if swiglu else 1)), device="cuda",
                        generator=gen).to(torch.bfloat16)
        want = cublas(x, w, swiglu)
        ran = 0
        for tile in TILES:
            try:
                got = skinny(x, w, tile, swiglu=swiglu)
            except OutOfResources:  # the plan leaves such a tile out too
                continue
            ran += 1
            assert got.shape == want.shape
            assert compare.rel_err(got, want) < 1e-2, (n, k, swiglu, tile)
        assert ran, f"no skinny tile fits ({n}, {k}, swiglu={swiglu})"


def test_model_kernels_pass_memcheck():
    """compute-sanitizer memcheck over every Triton kernel of the model at small shapes
    (``sanitize_model_kernels.py``): no out-of-bounds or misaligned access, no leak."""
    from decodelab.persistent.profile import find_tool

    tool = find_tool("compute-sanitizer")
    if tool is None:
        pytest.skip("compute-sanitizer is not installed (it comes with the CUDA toolkit)")
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here.parent / "lib"),
                                                         os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([tool, "--tool", "memcheck", "--error-exitcode", "9", sys.executable,
                           str(here / "sanitize_model_kernels.py")],
                          capture_output=True, text=True, env=env, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "model kernels: ok" in out and "ERROR SUMMARY: 0 errors" in out
