"""Every Triton kernel of the paged model at small shapes, for compute-sanitizer memcheck
(``test_paged_model_gpu.test_model_kernels_pass_memcheck`` runs this file under it): the
gemv tiles and the gemv with the residual add and RMSNorm in its prologue, the norm alone,
the skinny matmul with and without SwiGLU, paged attention over shuffled block tables and
random context lengths (``check.check_attention``), and whole decode steps eager and from
CUDA graphs (PDL edges on sm_90+), full and padded buckets. Exits non-zero if a result is
wrong."""

from __future__ import annotations

import torch

from decodelab.model import compare
from decodelab.model.bench import checks
from decodelab.model.config import named_config
from decodelab.model.graphs import DecodeGraphs
from decodelab.model.kv_cache import PagedKVCache
from decodelab.model.llama import PagedLlama, greedy_generate
from decodelab.model.triton.fused import rms_norm_rows
from decodelab.model.triton.linear import TILES, add_norm_gemv, gemv
from decodelab.model.triton.skinny import TILES as SKINNY_TILES
from decodelab.model.triton.skinny import skinny
from decodelab.model.weights import from_state_dict, random_state_dict

BF = torch.bfloat16


def matmuls(gen: torch.Generator) -> None:
    for n, k in ((40, 96), (300, 256)):
        w = torch.randn((n, k), device="cuda", generator=gen).to(BF)
        h = torch.randn((1, k), device="cuda", generator=gen).to(BF)
        res = torch.randn((1, k), device="cuda", generator=gen).to(BF)
        nw = torch.rand(k, device="cuda", generator=gen).to(BF)
        for tile in TILES[:2]:
            gemv(h, w, tile)
            add_norm_gemv(h, res, nw, 1e-5, w, tile)
        rms_norm_rows(h.clone(), res, nw, 1e-5)
        for rows in (3, 8):
            for swiglu in (False, True):
                x = torch.randn((rows, k * (2 if swiglu else 1)), device="cuda",
                                generator=gen).to(BF)
                skinny(x, w, SKINNY_TILES[0], swiglu=swiglu)


def attention_and_decode_steps() -> None:
    config = named_config("tiny", num_layers=2)
    sd = random_state_dict(config, seed=3, dtype=BF, device="cuda")
    weights = from_state_dict(config, sd, dtype=BF, device="cuda")
    cache = PagedKVCache(config, 128, 16, dtype=BF, device="cuda")
    checks.check_attention(cache, batches=(1, 5))  # raises if attention is wrong
    model = PagedLlama(config, weights, cache)
    graphs = DecodeGraphs(model, buckets=(1, 4), max_blocks_per_seq=16)
    prompts = compare.prompts(config, 4)
    for batch in (prompts, prompts[:1], prompts[:3]):  # full buckets 4 and 1, padded 3 -> 4
        eager = greedy_generate(model, batch, 6)[0]
        assert greedy_generate(model, batch, 6, step=graphs.run)[0] == eager, len(batch)


if __name__ == "__main__":
    generator = torch.Generator(device="cuda").manual_seed(0)
    matmuls(generator)
    attention_and_decode_steps()
    print("model kernels: ok")
