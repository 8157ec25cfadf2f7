"""The Triton varlen paged prefill attention in Triton's CPU interpreter (fp32), run by
test_prefill_attention.py in a child process with TRITON_INTERPRET=1 (set before the kernel
is defined), with triton_interp_checks' shim for scalar loop bounds.

    python tests/prefill_interp_checks.py      # prints "kernel: ok" and "model: ok"
"""

from __future__ import annotations

import random

import torch
from prefill_cases import padded, paged_case
from triton_interp_checks import _scalar_loop_bounds

RTOL = 1e-5  # fp32 on both sides (ieee dots): summation order only


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def kernel() -> None:
    """Ragged packs with starts > 0 (unmasked tiles before the chunk, several query blocks and
    causal tiles), GQA groups 1, 4 and 7 (padded to 8), block sizes 4, 16 and 5."""
    from decodelab.model.attention import paged_prefill_attention_ref
    from decodelab.model.triton.prefill_attention import paged_prefill_attention

    gen = torch.Generator().manual_seed(0)
    for hkv, group, d, bs, lens, starts in (
            (2, 4, 16, 4, [1, 70, 130, 3], [0, 65, 0, 200]),
            (1, 7, 32, 16, [33, 1, 17], [128, 300, 0]),
            (3, 1, 16, 5, [129, 2], [7, 64])):
        args = paged_case(gen, lens, starts, hkv, group, d, bs)
        want = paged_prefill_attention_ref(*args)
        got = paged_prefill_attention(*args)
        assert _rel(got, want) < RTOL, (hkv, group, lens, starts, _rel(got, want))
        # as a prefill graph runs it: rows and empty chunks past the pack change no bit
        big = paged_prefill_attention(*padded(args, len(got) + 37, len(lens) + 5))
        assert torch.equal(big[:len(got)], got), (hkv, group, lens, starts)


def model() -> None:
    """Chunked prefill of the tiny model on TritonOps (norms, rotary + cache write, the prefill
    kernel; torch matmuls at these row counts) against the torch ops: logits and cache."""
    from decodelab.model.config import named_config
    from decodelab.model.kv_cache import PagedKVCache
    from decodelab.model.llama import PagedLlama
    from decodelab.model.triton.ops import TritonOps
    from decodelab.model.weights import random_weights

    config = named_config("tiny")
    weights = random_weights(config, 1)
    ref = PagedLlama(config, weights, PagedKVCache(config, 32, 16), backend="torch")
    fast = PagedLlama(config, weights, PagedKVCache(config, 32, 16), backend="torch")
    fast.ops = TritonOps(pdl=False, linear_choice={})  # no tuned tiles: torch matmuls
    rng = random.Random(0)
    prompts = [rng.choices(range(config.vocab_size), k=n) for n in (90, 5, 40)]
    tables = [[3, 7, 1, 12, 9, 2], [0], [5, 14, 8]]
    calls = [([prompts[0][:50], prompts[1]], tables[:2], [0, 0]),
             ([prompts[0][50:], prompts[2]], [tables[0], tables[2]], [50, 0])]
    for chunks, bt, starts in calls:
        want, got = ref.prefill(chunks, bt, starts), fast.prefill(chunks, bt, starts)
        assert _rel(got, want) < RTOL, _rel(got, want)
    for a, b in ((fast.cache.k, ref.cache.k), (fast.cache.v, ref.cache.v)):
        assert _rel(a, b) < RTOL


if __name__ == "__main__":
    _scalar_loop_bounds()
    for name, check in (("kernel", kernel), ("model", model)):
        check()
        print(f"{name}: ok")
