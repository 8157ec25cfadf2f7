"""Validation before timing in ``bench paged_model``: Triton attention against the gather
reference, Triton ops against torch ops, graph decode against eager decode, and our logits
against ``transformers`` (bounds in :mod:`decodelab.model.compare`)."""

from __future__ import annotations

import torch

from decodelab.model.attention import paged_decode_attention_ref
from decodelab.model.compare import HF_BF16_RTOL, PROMPT_LENS, TRITON_RTOL, prompts, rel_err
from decodelab.model.graphs import DecodeGraphs
from decodelab.model.kv_cache import PagedKVCache
from decodelab.model.llama import PagedLlama, greedy_generate


def check_attention(cache: PagedKVCache, batches=(1, 3, 32)) -> float:
    """Triton paged attention vs the gather reference over random layer-0-shaped K/V."""
    from decodelab.model.triton.attention import paged_decode_attention

    cfg, dev, dtype = cache.config, cache.device, cache.dtype
    scale = cfg.head_dim ** -0.5
    gen = torch.Generator(device=dev).manual_seed(0)
    worst = 0.0
    for b in batches:
        width = min(64, cache.num_blocks // b)
        perm = torch.randperm(cache.num_blocks, device=dev, generator=gen)
        bt = perm[:b * width].view(b, width).int()
        lens = torch.randint(1, width * cache.block_size + 1, (b,), device=dev,
                             generator=gen).int()
        k = torch.randn(cache.k[0].shape, device=dev, generator=gen).to(dtype)
        v = torch.randn(cache.k[0].shape, device=dev, generator=gen).to(dtype)
        q = torch.randn((b, cfg.num_heads, cfg.head_dim), device=dev,
                        generator=gen).to(dtype)
        ref = paged_decode_attention_ref(q, k, v, bt, lens, scale)
        err = rel_err(paged_decode_attention(q, k, v, bt, lens, scale), ref)
        if err > TRITON_RTOL:
            raise AssertionError(f"Triton attention vs reference at batch {b}: {err:.3g} > "
                                 f"{TRITON_RTOL}")
        worst = max(worst, err)
    return worst


def check_hf(model: PagedLlama, hf, new_tokens: int = 8) -> float:
    """Our logits vs transformers' on the same tokens (ours greedy, HF teacher-forced)."""
    batch = prompts(model.config, 3, seed=1)
    tokens, logits = greedy_generate(model, batch, new_tokens)
    worst = 0.0
    for i, p in enumerate(batch):
        seq = torch.tensor([p + tokens[i][:-1]], device=model.device)
        with torch.no_grad():
            ref = hf(seq).logits[0, len(p) - 1:]  # (new_tokens, vocab)
        err = rel_err(logits[i], ref)
        if err > HF_BF16_RTOL:
            raise AssertionError(f"logits vs transformers, prompt {i}: {err:.3g} > {HF_BF16_RTOL}")
        worst = max(worst, err)
    return worst


def check_graph(model: PagedLlama, graphs: DecodeGraphs, new_tokens: int = 16) -> float:
    """Graph decode == eager decode token for token on a full bucket; close on a padded one."""
    full = prompts(model.config, graphs.bucket_for(min(len(PROMPT_LENS), graphs.buckets[-1])))
    eager_tokens, eager_logits = greedy_generate(model, full, new_tokens)
    graph_tokens, graph_logits = greedy_generate(model, full, new_tokens, step=graphs.run)
    if graph_tokens != eager_tokens:
        raise AssertionError("graph decode tokens differ from eager decode tokens")
    worst = rel_err(graph_logits, eager_logits)
    padded = full[:3]
    tokens, ref = greedy_generate(model, padded, new_tokens)
    _, out = greedy_generate(model, padded, new_tokens, step=graphs.run, forced=tokens)
    return max(worst, rel_err(out, ref))


def pdl_equals_serial(model: PagedLlama, serial: PagedLlama, new_tokens: int = 12) -> bool:
    """Whether two models on the same weights and cache, one launching its kernels with
    programmatic dependent launch and one serially, give the same bits: greedy runs of 8
    prompts and of 1, eagerly and from graphs of buckets 1 and 8."""
    batch = prompts(model.config, 8)
    outs = []
    for m in (model, serial):
        graphs = DecodeGraphs(m, buckets=(1, 8), max_blocks_per_seq=32)
        for step in (m.decode, graphs.run):
            for rows in (batch, batch[:1]):
                outs.append(greedy_generate(m, rows, new_tokens, step=step)[1])
    half = len(outs) // 2
    return all(torch.equal(a, b) for a, b in zip(outs[:half], outs[half:], strict=True))


def validate(model: PagedLlama, graphs: DecodeGraphs | None, hf) -> dict[str, float]:
    """Every fast path against its reference; raises on a disagreement, else the errors:
    eager (Triton ops vs torch ops), graph (vs eager), hf (ours vs transformers)."""
    errs = {"eager": 0.0, "graph": float("nan"), "hf": float("nan")}
    if model.backend == "triton":
        ref = PagedLlama(model.config, model.weights,
                         PagedKVCache(model.config, 256, model.cache.block_size,
                                      dtype=model.dtype, device=model.device), backend="torch")
        fast = PagedLlama(model.config, model.weights, ref.cache, backend="triton",
                          linear_choice=model.ops.matmul.choice)
        errs["eager"] = check_attention(ref.cache)
        # 8 rows: the skinny matmuls where they were chosen (a graph bucket); 1 row: the gemvs
        for batch in (prompts(model.config, 8), prompts(model.config, 1)):
            tokens, want = greedy_generate(ref, batch, 8)
            _, got = greedy_generate(fast, batch, 8, forced=tokens)
            errs["eager"] = max(errs["eager"], rel_err(got, want))
    if graphs is not None:
        errs["graph"] = check_graph(model, graphs)
    if hf is not None:
        errs["hf"] = check_hf(model, hf)
    return errs


def make_graphs(model: PagedLlama, batches, width: int) -> DecodeGraphs:
    return DecodeGraphs(model, buckets=batches, max_blocks_per_seq=width)


