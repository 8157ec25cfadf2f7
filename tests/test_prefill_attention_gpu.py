"""GPU checks of varlen paged prefill: the Triton kernel against the torch reference at
Llama-3.2-1B head shapes (bf16 and fp32), chunked prefill on the Triton backend, and no cold
cost for a never-seen pack shape."""

from __future__ import annotations

import random
import statistics
import time

import pytest
import torch
from prefill_cases import paged_case

from decodelab.model import compare
from decodelab.model.attention import paged_prefill_attention_ref
from decodelab.model.bench.prefill import COMPILE_LENS
from decodelab.model.config import named_config
from decodelab.model.kv_cache import PagedKVCache
from decodelab.model.llama import PagedLlama
from decodelab.model.weights import from_state_dict, random_state_dict

pytestmark = pytest.mark.gpu
HKV, GROUP, D, BS = 8, 4, 64, 16  # Llama-3.2-1B: 32 query heads over 8 KV heads, head_dim 64


def packs():
    """Packs of 1-20 chunks of 1-2000 tokens, some after cached positions."""
    rng = random.Random(0)
    yield [1], [0]
    yield [2000], [0]
    yield [513], [4096]
    yield [1, 16, 17, 64, 65, 127], [0, 0, 3, 16, 100, 0]
    for n in (3, 20):
        lens = [rng.randint(1, 2000) for _ in range(n)]
        yield lens, [rng.choice([0, 0, rng.randint(1, 3000)]) for _ in range(n)]


@pytest.mark.parametrize("dtype,bound", [(torch.bfloat16, compare.TRITON_RTOL),
                                         (torch.float16, compare.TRITON_RTOL),
                                         (torch.float32, 1e-5)])
def test_kernel_equals_reference_at_llama_1b_shapes(dtype, bound):
    from decodelab.model.triton.prefill_attention import paged_prefill_attention

    gen = torch.Generator(device="cuda").manual_seed(1)
    for lens, starts in packs():
        args = paged_case(gen, lens, starts, HKV, GROUP, D, BS, dtype)
        want = paged_prefill_attention_ref(*args)
        got = paged_prefill_attention(*args)
        assert compare.rel_err(got, want) <= bound, (lens, starts)


def build(backend="triton", name="llama-3.2-1b", num_blocks=2048, **overrides) -> PagedLlama:
    config = named_config(name, **overrides)
    sd = random_state_dict(config, seed=3, dtype=torch.bfloat16, device="cuda")
    weights = from_state_dict(config, sd, dtype=torch.bfloat16, device="cuda")
    cache = PagedKVCache(config, num_blocks, BS, dtype=torch.bfloat16, device="cuda")
    return PagedLlama(config, weights, cache, backend=backend)


def test_chunked_prefill_on_triton_equals_whole_and_torch():
    fast = build(num_layers=4)
    ref = PagedLlama(fast.config, fast.weights,
                     PagedKVCache(fast.config, 2048, BS, dtype=torch.bfloat16, device="cuda"),
                     backend="torch")
    rng = random.Random(2)
    prompt = rng.choices(range(fast.config.vocab_size), k=1500)
    table = rng.sample(range(2048), 94)
    whole = fast.prefill([prompt], [table])
    for lo, hi in ((0, 700), (700, 701), (701, 1500)):
        got = fast.prefill([prompt[lo:hi]], [table], [lo])
        want = ref.prefill([prompt[lo:hi]], [table], [lo])
        assert compare.rel_err(got, want) < 2e-2, (lo, hi)
    assert compare.rel_err(got, whole) < 2e-2


def _ms(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def test_a_never_seen_pack_shape_has_no_cold_cost():
    """After the kernels exist, the first call of a new pack shape takes at most 4x a warm call
    of a pack of about as many tokens (SDPA on cuDNN took 40-60x: a plan per length). A new
    shape may still meet a first: Triton's variant for a token count not divisible by 16,
    cuBLAS's heuristic for a new M; 513 tokens after 512 took 3.0x on the H200."""
    model = build()
    pool = model.cache.pool
    rng = random.Random(3)

    def run(lens):
        prompts = [rng.choices(range(model.config.vocab_size), k=n) for n in lens]
        tables = [pool.allocate(pool.blocks_needed(n)) for n in lens]
        try:
            return _ms(lambda: model.prefill(prompts, tables))
        finally:
            for t in tables:
                pool.free(t)

    for seen, new in (([512], [513]), ([rng.randint(400, 800) for _ in range(20)],
                                      [rng.randint(400, 800) for _ in range(20)])):
        warm = statistics.median([run(seen) for _ in range(4)][1:])
        first = run(new)
        assert first < 4 * warm * sum(new) / sum(seen), (seen, new, first, warm)


def test_new_pack_shapes_compile_no_new_triton_kernel():
    """After two prefills (with and without PDL), packs of other chunk counts, odd and even
    token counts, other block-table widths and starts compile no further variant of any Triton
    kernel prefill runs (no per-length specialization, no alignment specialization of the
    packed inputs)."""
    from decodelab.model.triton import fused, prefill_attention

    kernels = [prefill_attention._prefill_attn_kernel, fused._rope_write_kernel,
               fused._add_rms_norm_kernel, fused._silu_mul_kernel]

    def variants() -> int:
        return sum(len(cache[0]) for k in kernels for cache in k.device_caches.values())

    model = build(num_layers=2)
    pool, rng = model.cache.pool, random.Random(4)

    def prefill(lens, starts):
        seqs = [rng.choices(range(model.config.vocab_size), k=s + n)
                for n, s in zip(lens, starts, strict=True)]
        tables = [pool.allocate(pool.blocks_needed(len(s))) for s in seqs]
        try:
            for seq, bt, s in zip(seqs, tables, starts, strict=True):
                if s:
                    model.prefill([seq[:s]], [bt])
            model.prefill([seq[s:] for seq, s in zip(seqs, starts, strict=True)], tables,
                          starts)
        finally:
            for bt in tables:
                pool.free(bt)

    for n in COMPILE_LENS:  # the kernels' variants with PDL (few tokens) and without
        prefill([n], [0])
    before = variants()
    for lens, starts in (([1], [0]), ([513], [0]), ([3, 4, 5], [0, 17, 0]), ([16] * 7, [0] * 7),
                         ([256], [4096]), ([rng.randint(1, 900) for _ in range(20)], [0] * 20)):
        prefill(lens, starts)
    assert variants() == before
