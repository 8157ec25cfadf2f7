"""The GPU's read ceiling: the fastest of a few read-only streams over the same bytes.

``torch.sum`` reads every byte once, but it is tuned to reduce, not to stream: on an H200 it
reads about 4.28 TB/s while the project's own batch-1 gemv over the LM head reads 4.54 TB/s, so
a floor at the reduction's rate is beaten on its own page. A read ceiling must be the fastest
read this GPU is seen to do. :func:`best_read_rate` therefore times the reduction and a plain
Triton stream (each program sums a strided set of full blocks, loads marked evict-first, one
fp32 partial per program) at a few block sizes, warp counts and programs per SM, and returns
the fastest with the name of what gave it; the project's own batch-1 gemv over a weight of
the same size is a candidate too (a decode step's floor must not sit below its own kernels).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from decodelab.core.timing import Timing, TimingConfig, time_cuda

# (elements per block, warps, programs per SM): wide enough loads to keep every SM's memory
# pipeline full, few enough programs that the partials stay negligible
STREAM_CONFIGS = tuple((block, warps, per_sm) for block in (2048, 8192) for warps in (4, 8)
                       for per_sm in (2, 4, 8))


@triton.jit
def _read_stream_kernel(src, partial, n_blocks, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for b in range(pid, n_blocks, tl.num_programs(0)):
        offs = b.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(src + offs, eviction_policy="evict_first")
    tl.store(partial + pid, tl.sum(acc, axis=0))


def stream_sum(src: torch.Tensor, block: int, warps: int, programs: int,
               partial: torch.Tensor) -> torch.Tensor:
    """The sum of ``src`` (fp32, contiguous, a multiple of ``block`` elements) as ``programs``
    partials in ``partial``; a read of every byte once."""
    if src.numel() % block:
        raise ValueError(f"stream_sum: {src.numel()} elements is not a multiple of the block "
                         f"{block}")
    _read_stream_kernel[(programs,)](src, partial, src.numel() // block, BLOCK=block,
                                     num_warps=warps)
    return partial


def best_read_rate(n_bytes: int, cfg: TimingConfig) -> tuple[Timing, int, str]:
    """The fastest read-only stream over ``n_bytes`` in device memory: its timing, the bytes it
    reads and what it was (``torch.sum``, the stream's configuration or the gemv). Each is
    checked against torch before it is timed."""
    timing, nbytes, how = _fastest_sum(n_bytes, cfg)
    return _faster_gemv(nbytes, cfg, (timing, how))


def _fastest_sum(n_bytes: int, cfg: TimingConfig) -> tuple[Timing, int, str]:
    """``torch.sum`` or the Triton stream, whichever reads ``n_bytes`` of fp32 faster."""
    block_max = max(b for b, _, _ in STREAM_CONFIGS)
    n = n_bytes // 4 // block_max * block_max
    src = torch.rand(n, device="cuda")
    out = torch.empty((), device="cuda")
    best = (time_cuda(lambda: torch.sum(src, dim=0, out=out), cfg), "torch.sum")
    sms = torch.cuda.get_device_properties(src.device).multi_processor_count
    partial = torch.empty(sms * max(p for _, _, p in STREAM_CONFIGS), device="cuda")
    for block, warps, per_sm in STREAM_CONFIGS:
        programs = sms * per_sm
        got = stream_sum(src, block, warps, programs, partial)[:programs].sum()
        if not torch.allclose(got, out, rtol=1e-4):
            raise RuntimeError(f"read stream (block {block}, {warps} warps, {programs} "
                               f"programs) summed {got.item()}, torch.sum {out.item()}")
        t = time_cuda(lambda b=block, w=warps, p=programs: stream_sum(src, b, w, p, partial),
                      cfg)
        if t.device_stats().median < best[0].device_stats().median:
            best = (t, f"Triton stream, block {block}, {warps} warps, {programs} programs")
    return best[0], n * 4, best[1]


def _faster_gemv(n_bytes: int, cfg: TimingConfig, best: tuple[Timing, str]
                 ) -> tuple[Timing, int, str]:
    """``best``, or the project's batch-1 gemv (``model.triton.linear``) over a bf16 weight of
    ``n_bytes`` (K = 2048, the LM head's width) at its fastest tile where that reads faster:
    the decode step's own read-only kernel is a read stream too, and the ceiling must not be
    below it. The gemv is checked against ``torch.matmul`` before it is timed."""
    from decodelab.model.triton.linear import TILES, gemv

    k = 2048
    w = torch.randn(n_bytes // 2 // k, k, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    ref = x.float() @ w[:4096].float().T  # a slice: the whole weight in fp32 is 2x its size
    (timing, how), nbytes = best, n_bytes
    for tile in TILES:
        got = gemv(x, w, tile)[:, :4096].float()
        if not torch.allclose(got, ref, rtol=2e-2, atol=2e-2):
            raise RuntimeError(f"gemv tile {tile} disagrees with torch.matmul")
        t = time_cuda(lambda tile=tile: gemv(x, w, tile), cfg)
        if (t.device_stats().median / (w.numel() * 2)  # seconds per byte
                < timing.device_stats().median / nbytes):
            timing, how = t, f"the model's batch-1 gemv, {w.shape[0]}x{k} bf16, tile {tile}"
            nbytes = w.numel() * 2
    return timing, nbytes, how
