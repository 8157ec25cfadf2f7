"""``python -m decodelab bench paged_model``: decode step time of the paged Llama, against the
HBM roofline and against ``transformers``' ``generate`` on the same weights.

Modes (table ``paged_model``, one row per mode x batch x context):
- ``graph``: ``DecodeGraphs.run`` (input copies into the static buffers + one graph replay),
  with programmatic dependent launch between kernels where the GPU has it (sm_90+);
- ``graph_no_pdl`` (sm_90+ only, at the batches whose step uses PDL,
  ``pdl_policy.MAX_ROWS``): the same graph with every kernel waiting for the one before to
  finish: the kernel-boundary layer that PDL removes.
- ``eager``: the same ``PagedLlama.decode`` launched op by op (Triton kernels on a GPU).
- ``compile_static`` (GPU): the peer a user gets from PyTorch alone, the same model and weights
  over a static contiguous cache, ``torch.compile(mode="max-autotune")`` with its CUDA graph
  (:mod:`decodelab.model.static_bench`); its compile time apart, in ``compile_s``.
- ``hf_dynamic`` / ``hf_static``: ``LlamaForCausalLM.generate`` (greedy), its default cache and
  its static cache (auto-compile off: compiling alone would take far longer than the whole
  bench). Step time = (time of N new tokens - time of 1) / (N - 1): one decode step of B rows.

``context`` = tokens attended by the step (the new one included). ``bytes_per_step`` = weights
read (all layers, the head, B embedding rows) + the K/V attended; ``roofline_fraction`` = time
those bytes need at the device-to-device copy bandwidth measured in this run / measured step
time. Every fast path is validated before timing: Triton attention against the reference,
graph against eager (token for token), and our logits against ``transformers``.
On a GPU more tables: ``paged_model_kernels``, per-kernel device time of one graph step
at batch 1 (from the profiler, without PDL: overlapped kernels would count their waits):
where the step's time goes; ``paged_model_linear``, each batch-1
matmul shape's candidates (cuBLAS, Triton gemv tiles) with time and weight bandwidth, and which
one the model uses; ``paged_model_gemm``, the same for each graph bucket of 2 to 64 rows
(cuBLAS against Triton ``skinny`` tiles); ``paged_attention``, our paged decode attention at the
model's attention shapes, every row at the context or a serving batch's spread of contexts,
against SDPA over a contiguous cache and FlashInfer (:mod:`decodelab.model.bench.attention`);
``paged_prefill``, prefill's first call of each never-seen pack shape against its warm calls
(:mod:`decodelab.model.bench.prefill`).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from decodelab.core.device import sized
from decodelab.core.profiles import on_bench_device
from decodelab.core.results import stamped, write_table
from decodelab.core.timing import copy_bandwidth_gb_s, median_times
from decodelab.model.bench import checks, kernels, peers
from decodelab.model.bench.attention import ATTENTION_TABLE, attention_rows
from decodelab.model.bench.config import VALIDATION_BLOCKS, PagedModelBenchConfig
from decodelab.model.bench.prefill import PREFILL_TABLE, prefill_rows
from decodelab.model.bench.rows import GemmRow, KernelRow, LinearRow, PagedModelRow
from decodelab.model.block_pool import blocks_needed
from decodelab.model.config import named_config
from decodelab.model.kv_cache import PagedKVCache, decode_inputs
from decodelab.model.llama import PagedLlama
from decodelab.model.modes import SERIAL
from decodelab.model.pdl_policy import for_rows
from decodelab.model.weights import from_state_dict, random_state_dict


def _time_ours(model: PagedLlama, graphs: dict, cfg: PagedModelBenchConfig, step_bytes,
               bw: float, checked: dict[str, float]) -> list[PagedModelRow]:
    """Eager and graph rows (one per captured set in ``graphs``, by mode) for every context x
    batch, each on its own fresh sequences."""
    rows, dev = [], model.device
    for context in cfg.contexts:
        for batch in cfg.batches:
            tables, inputs = decode_inputs(model.cache, batch, context)
            modes = {"eager": (lambda inputs=inputs: model.decode(*inputs), None)}
            for mode, g in graphs.items():
                if batch <= g.buckets[-1]:  # the serial graphs stop where PDL does
                    modes[mode] = (lambda inputs=inputs, g=g: g.run(*inputs), g)
            for mode, (fn, g) in modes.items():
                wall, host, dev_s = median_times(fn, dev.type == "cuda", cfg.timing)
                extra = dict(capture_s=g.capture_s, graph_mem_mib=g.graph_mem_mib,
                             bucket=g.bucket_for(batch)) if g is not None else {}
                rows.append(PagedModelRow.measured(mode, batch, context, wall, host, dev_s,
                                                   step_bytes(batch, context), bw,
                                                   max_rel_err=checked[mode], **extra))
                print(f"[bench] paged_model: {mode} B={batch} context {context}: "
                      f"{wall * 1e3:.3f} ms/step, {rows[-1].roofline_fraction:.0%} of roofline",
                      flush=True)
            for t in tables:
                model.cache.pool.free(t)
    return rows


def _serial_graphs(model: PagedLlama, cfg: PagedModelBenchConfig, width: int,
                   checked: dict[str, float]) -> dict:
    """The same step without programmatic dependent launch (mode ``graph_no_pdl``), at the
    batches where the model uses it: what removing the kernel boundaries' drain-and-launch gaps
    is worth. Larger steps launch serially both ways, so they are not timed twice."""
    batches = [b for b in cfg.batches if for_rows(True, b)]
    if not getattr(model.ops, "pdl", False) or not batches:
        return {}
    serial = PagedLlama(model.config, model.weights, model.cache, pdl=False,
                        linear_choice=model.ops.matmul.choice)  # same kernels, launched serially
    graphs = checks.make_graphs(serial, batches, width)
    checked[SERIAL] = checks.check_graph(serial, graphs)
    return {SERIAL: graphs}


def bench(profile: str, out_dir: Path, dtype: str = "auto") -> list[Path]:
    """``dtype``: ``core.precision``'s choice (``auto``: bf16 from sm_80, fp16 below, fp32 on
    the CPU); the sizes fit the GPU's free memory (``PagedModelBenchConfig.on_device``)."""
    cfg = PagedModelBenchConfig.for_profile(profile)
    return on_bench_device(cfg.profile,
                           lambda dev: _bench(sized(cfg, dev, dtype), dev, out_dir))


def _bench(cfg: PagedModelBenchConfig, dev: torch.device, out_dir: Path) -> list[Path]:
    profile = cfg.profile
    dtype = getattr(torch, cfg.dtype)
    mcfg = named_config(cfg.model)
    t_start = time.perf_counter()
    bw = copy_bandwidth_gb_s(dev, (1 << 30) if dev.type == "cuda" else (64 << 20), cfg.timing)
    sd = random_state_dict(mcfg, seed=0, dtype=dtype, device=dev)
    weights = from_state_dict(mcfg, sd, dtype=dtype, device=dev)
    max_ctx = max(cfg.contexts)
    blocks_per_seq = blocks_needed(max_ctx, cfg.block_size) + 1
    cache = PagedKVCache(mcfg, max(cfg.batches) * blocks_per_seq + VALIDATION_BLOCKS,
                         cfg.block_size, dtype=dtype, device=dev)
    model = PagedLlama(mcfg, weights, cache)
    graphs = checks.make_graphs(model, cfg.batches, blocks_per_seq) if dev.type == "cuda" else None
    hf = peers.hf_model(mcfg, sd, dev)
    checked = checks.validate(model, graphs, hf)  # raises if a fast path disagrees
    cache.k.normal_()  # attended K/V: finite values at every slot the timed steps read
    cache.v.normal_()

    kv_token = mcfg.kv_bytes_per_token(cache.k.element_size())

    def step_bytes(batch: int, context: int) -> int:
        return weights.nbytes_per_step(batch) + batch * context * kv_token

    timed = {"graph": graphs} if graphs is not None else {}
    if graphs is not None:
        timed |= _serial_graphs(model, cfg, blocks_per_seq, checked)
    rows = _time_ours(model, timed, cfg, step_bytes, bw, checked)
    if dev.type == "cuda":
        def row_for(mode, batch, context, wall, host, dev_s, **extra):
            return PagedModelRow.measured(mode, batch, context, wall, host, dev_s,
                                          step_bytes(batch, context), bw, **extra)

        rows += peers.compile_static_rows(model, cfg, row_for)
    prefill = prefill_rows(model) if dev.type == "cuda" else []
    linear, gemm = _matmul_rows(model)
    choice = dict(model.ops.matmul.choice) if graphs is not None else {}  # the kernels profiled
    has_graphs = graphs is not None
    del graphs, timed, model, cache  # free the KV pool (and graph memory) before the peers run
    if hf is not None:
        rows += peers.hf_rows(hf, mcfg, cfg, PagedModelRow.measured, step_bytes, bw,
                               checked["hf"])
    del hf, sd
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    profiled = kernels.kernel_profile_isolated(cfg.model, cfg.dtype, cfg.block_size,
                                               blocks_per_seq, choice) if has_graphs else None
    bench_s = round(time.perf_counter() - t_start, 1)
    rows = stamped(rows, model=cfg.model, dtype=cfg.dtype, block_size=cfg.block_size,
                   bench_s=bench_s)
    paths = [write_table("paged_model", rows, out_dir=out_dir, config=cfg, profile=profile)]
    kernel_rows = [KernelRow(**r) for r in profiled or []]
    attention = (attention_rows(mcfg, cfg.batches, cfg.contexts, block_size=cfg.block_size,
                                dtype=dtype) if has_graphs else [])
    for name, extra in (("paged_model_kernels", kernel_rows), ("paged_model_linear", linear),
                        ("paged_model_gemm", gemm), (ATTENTION_TABLE, attention),
                        (PREFILL_TABLE, prefill)):
        if extra:
            paths.append(write_table(name, stamped(extra, model=cfg.model, dtype=cfg.dtype),
                                     out_dir=out_dir, config=cfg, profile=profile))
    return paths


def _matmul_rows(model: PagedLlama) -> tuple[list[LinearRow], list[GemmRow]]:
    """The matmul choice per weight shape, batch 1 (table ``paged_model_linear``) and per row
    count above it (``paged_model_gemm``): every candidate's time and weight bandwidth."""
    matmul = getattr(model.ops, "matmul", None)
    if matmul is None:  # the torch backend chooses nothing
        return [], []
    from decodelab.model.triton.matmul_choice import candidate_name  # Triton: GPU machines only

    esize = model.weights.embed.element_size()
    single, multi = [], []
    for (n, k, swiglu, m), times in matmul.timings.items():
        used = candidate_name(m, matmul.choice[(n, k, swiglu, m)])
        for cand, us in times.items():
            gb_s = n * k * esize / us / 1e3
            if m == 1:
                single.append(LinearRow(n, k, swiglu, cand, us, gb_s, chosen=cand == used))
            else:
                multi.append(GemmRow(n, k, swiglu, m, cand, us, gb_s, chosen=cand == used))
    return single, multi
