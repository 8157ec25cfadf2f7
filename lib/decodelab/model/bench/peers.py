"""The peers of ``bench paged_model``, on the same weights:

- ``compile_static`` (GPU only): at each of the bench's ``compile_points`` (batch, context), a
  :class:`~decodelab.model.bench.static_cache.StaticCacheLlama` holding the same K/V as a set
  of paged sequences, checked against our decode step (eager and compiled) before it is timed.
  Compilation (``mode="max-autotune"``: GEMM autotuning, then CUDA-graph recording) is timed
  apart, in ``compile_s``, and never inside ``ms_per_step``.
- ``hf_dynamic`` / ``hf_static``: ``transformers``' ``generate``, default and static cache.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from decodelab.core.timing import device_sync, median_times
from decodelab.model.bench.rows import PagedModelRow
from decodelab.model.bench.static_cache import StaticCacheLlama
from decodelab.model.compare import HF_BF16_RTOL, rel_err
from decodelab.model.config import ModelConfig
from decodelab.model.kv_cache import decode_inputs
from decodelab.model.llama import PagedLlama
from decodelab.model.modes import COMPILED as MODE

# Calls that compile and record the CUDA graph (cudagraph trees record on the second call of
# a new shape and replay from the third); all of them count as compile time.
COMPILE_CALLS = 3


def _cudagraph_skips() -> int:
    """Inductor's count of graphs it ran without CUDA graphs (0 = the peer is captured)."""
    from torch._dynamo.utils import counters

    return counters["inductor"]["cudagraph_skips"]


def _one(model: PagedLlama, batch: int, context: int, cfg, row_for: Callable
         ) -> PagedModelRow:
    tables, (ids, pos, slots, bt, lens) = decode_inputs(model.cache, batch, context)
    try:
        peer = StaticCacheLlama(model.config, model.weights, model.cos, model.sin, batch,
                                context)
        peer.load_from_paged(model.cache, bt)
        want = model.decode(ids, pos, slots, bt, lens).clone()  # ours, eager
        err = rel_err(peer(ids), want)
        skips = _cudagraph_skips()
        compiled = torch.compile(peer, mode="max-autotune", fullgraph=True, dynamic=False)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(COMPILE_CALLS):
            got = compiled(ids)
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
        err = max(err, rel_err(got, want))
        if err > HF_BF16_RTOL:
            raise AssertionError(f"{MODE} at batch {batch}, context {context}: logits differ "
                                 f"from ours by {err:.3g} > {HF_BF16_RTOL}")
        if _cudagraph_skips() > skips:
            raise RuntimeError(f"{MODE} at batch {batch}, context {context}: inductor ran "
                               "without a CUDA graph, so the peer is not at its best")
        wall, host, dev_s = median_times(lambda: compiled(ids), True, cfg.timing)
        print(f"[bench] paged_model: {MODE} B={batch} context {context}: "
              f"{wall * 1e3:.3f} ms/step, compile {compile_s:.1f} s", flush=True)
        return row_for(MODE, batch, context, wall, host, dev_s, max_rel_err=err,
                       compile_s=compile_s)
    finally:
        for t in tables:
            model.cache.pool.free(t)


def compile_static_rows(model: PagedLlama, cfg, row_for: Callable) -> list[PagedModelRow]:
    """One row per (batch, context) of ``cfg.compile_points``; ``row_for(mode, batch, context,
    wall, host, device_s, **extra)`` builds it (bytes and roofline as for our own rows)."""
    import torch._dynamo

    rows = []
    with torch._dynamo.config.patch(cache_size_limit=64):
        for batch, context in cfg.compile_points:
            rows.append(_one(model, batch, context, cfg, row_for))
            torch._dynamo.reset()  # frees the shape's CUDA-graph pool and cache copy
            torch.cuda.empty_cache()
    return rows


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


def _generate_s(hf, ids, n: int, static: bool) -> float:
    kw = dict(cache_implementation="static", disable_compile=True) if static else {}
    device_sync(ids.device)
    t0 = time.perf_counter()
    hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                do_sample=False, pad_token_id=0, **kw)
    device_sync(ids.device)
    return time.perf_counter() - t0


def hf_rows(hf, config: ModelConfig, cfg, row_fn, step_bytes, bw: float, err: float
            ) -> list[PagedModelRow]:
    """transformers' generate, default and static cache: the time of one decode step of the
    batch's rows (prefill excluded)."""
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
