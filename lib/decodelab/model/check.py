"""The paged-model benchmark's checks and peers: validation before timing, graph capture,
the per-kernel profile of one step, and ``transformers``' ``generate`` as the peer.

Stated bounds (also used by the GPU tests):
- ``HF_BF16_RTOL``: our bf16 logits vs transformers' bf16 logits on the same weights and the
  same (teacher-forced) tokens: max |diff| / max |reference| per step.
- ``TRITON_RTOL``: Triton paged attention vs the gather reference, both on bf16 inputs.
"""

from __future__ import annotations

import statistics
import time

import torch

from decodelab.model.attention import paged_decode_attention_ref
from decodelab.model.config import ModelConfig
from decodelab.model.graphs import DecodeGraphs
from decodelab.model.kv_cache import PagedKVCache
from decodelab.model.llama import PagedLlama, greedy_generate
from decodelab.model.rows import PagedModelRow

HF_BF16_RTOL = 0.05
TRITON_RTOL = 1e-2
PROMPT_LENS = (37, 5, 120, 64, 1, 17, 250, 9)  # 8 prompts: one full graph bucket


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def prompts(config: ModelConfig, n: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, config.vocab_size, (PROMPT_LENS[i % len(PROMPT_LENS)],),
                          generator=gen).tolist() for i in range(n)]


def hf_model(config: ModelConfig, sd: dict[str, torch.Tensor], device: torch.device):
    """transformers' LlamaForCausalLM holding the same weights (None without transformers)."""
    try:
        import transformers
    except ImportError:
        return None

    hf_config = transformers.LlamaConfig(**config.to_hf_dict())
    with torch.device(device):
        hf = transformers.LlamaForCausalLM(hf_config).to(next(iter(sd.values())).dtype)
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise RuntimeError(f"HF load: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return hf.eval()


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


def validate(model: PagedLlama, graphs: DecodeGraphs | None, hf) -> dict[str, float]:
    """Every fast path against its reference; raises on a disagreement, else the errors:
    eager (Triton ops vs torch ops), graph (vs eager), hf (ours vs transformers)."""
    errs = {"eager": 0.0, "graph": float("nan"), "hf": float("nan")}
    if model.backend == "triton":
        ref = PagedLlama(model.config, model.weights,
                         PagedKVCache(model.config, 256, model.cache.block_size,
                                      dtype=model.dtype, device=model.device), backend="torch")
        fast = PagedLlama(model.config, model.weights, ref.cache, backend="triton",
                          linear_choice=model.ops.plan.choice)
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


def kernel_profile(graphs: DecodeGraphs, cache: PagedKVCache, context: int = 512,
                   steps: int = 5) -> list[dict]:
    """Device time per kernel of one graph step at batch 1 (profiler, averaged over steps)."""
    from torch.profiler import ProfilerActivity, profile

    tables = [cache.pool.allocate(cache.pool.blocks_needed(context))]
    bt = cache.block_table_tensor(tables)
    pos = torch.tensor([context - 1], device=cache.device)
    slot = bt[0, (context - 1) // cache.block_size].long() * cache.block_size + pos % cache.block_size
    args = (torch.tensor([1], device=cache.device), pos, slot, bt, (pos + 1).int())
    for _ in range(3):
        graphs.run(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            graphs.run(*args)
        torch.cuda.synchronize()
    cache.pool.free(tables[0])
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if us > 0:
            rows.append(dict(kernel=e.key[:120], calls_per_step=e.count / steps,
                             us_per_step=us / steps, batch=1, context=context))
    total = sum(r["us_per_step"] for r in rows) or 1.0
    for r in rows:
        r["share"] = r["us_per_step"] / total
    return sorted(rows, key=lambda r: -r["us_per_step"])


def _profiled_step(model_name: str, dtype: str, block_size: int, width: int,
                   context: int, linear_choice: dict) -> list[dict]:
    """Child-process body of :func:`kernel_profile_isolated`: a batch-1 graph, profiled. Without
    programmatic dependent launch: overlapped kernels would count their waits as their time."""
    from decodelab.model.config import named_config
    from decodelab.model.weights import random_weights

    config = named_config(model_name)
    weights = random_weights(config, 0, dtype=getattr(torch, dtype), device="cuda")
    cache = PagedKVCache(config, width + 8, block_size, dtype=getattr(torch, dtype),
                         device="cuda")
    model = PagedLlama(config, weights, cache, pdl=False, linear_choice=linear_choice)
    graphs = DecodeGraphs(model, buckets=(1,), max_blocks_per_seq=width)
    return kernel_profile(graphs, cache, context)


def kernel_profile_isolated(model_name: str, dtype: str, block_size: int, width: int,
                            linear_choice: dict, context: int = 512) -> list[dict]:
    """:func:`kernel_profile` in a fresh process, with the matmul kernels ``linear_choice``
    names (the timed model's, so the profile shows its kernels). A fresh process because the
    profiler (CUPTI) stays attached to the process that used it and slows every later launch,
    which would skew the timings of the phases that run after this one."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_profiled_step, (model_name, dtype, block_size, width, context,
                                           linear_choice))


def _generate_s(hf, ids, n: int, static: bool) -> float:
    kw = dict(cache_implementation="static", disable_compile=True) if static else {}
    sync = torch.cuda.synchronize if ids.is_cuda else (lambda: None)
    sync()
    t0 = time.perf_counter()
    hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                do_sample=False, pad_token_id=0, **kw)
    sync()
    return time.perf_counter() - t0


def hf_rows(hf, config: ModelConfig, cfg, row_fn, step_bytes, bw: float, err: float
            ) -> list[PagedModelRow]:
    """transformers' generate, default and static cache: decode-only time per token."""
    context, n, reps, rows = cfg.contexts[0], cfg.hf_new_tokens, max(3, cfg.repeats // 2), []
    for batch in cfg.hf_batches:
        ids = torch.randint(0, config.vocab_size, (batch, context - 1), device=hf.device)
        for static in (False, True):
            _generate_s(hf, ids, 2, static)  # warm-up
            # Medians of each length first, then the difference: robust to one slow call.
            t_n = statistics.median(_generate_s(hf, ids, n, static) for _ in range(reps))
            t_1 = statistics.median(_generate_s(hf, ids, 1, static) for _ in range(reps))
            rows.append(row_fn("hf_static" if static else "hf_dynamic", batch, context,
                               (t_n - t_1) / (n - 1), float("nan"), float("nan"),
                               step_bytes(batch, context), bw, max_rel_err=err))
    return rows
