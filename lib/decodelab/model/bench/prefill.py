"""Prefill time per pack shape, first call against warm calls (table ``paged_prefill``, GPU).

A serving engine meets a new pack shape (chunk count and lengths) at nearly every prefill; a
kernel that builds a plan per shape pays for it at each one (SDPA on cuDNN builds one per
sequence length). Each pack here is one this process has not run before: its first call is
timed alone (wall clock, synchronised on both sides: the cold cost, if any), then warm calls of
the same inputs (median wall time). Two small prefills before the first pack compile the
kernels (``COMPILE_LENS``), so no row pays for compilation. Packs: one prompt of 512, one of
513, 20 prompts of 500-700 tokens twice (other lengths the second time), and a 256-token chunk
after 4096 cached ones.

Each pack's first-call logits are checked afterwards (so the check warms nothing before the
first call) against the torch backend over the same cache: RoPE, cache write and the
reference attention in torch, within ``LOGITS_RTOL``.
``tflop_s`` = (matmul + attention FLOPs) / warm time; matmul: 2 x the layers' weights per new
token and the head at each chunk's last token; attention: 4 x heads x head_dim per (query,
attended position) pair, causal, the cached positions included.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from decodelab.core.timing import TimingConfig, device_sync, median_times
from decodelab.model.compare import rel_err
from decodelab.model.config import ModelConfig
from decodelab.model.llama import PagedLlama
from decodelab.model.pdl_policy import MAX_ROWS

PREFILL_TABLE = "paged_prefill"
WARM = TimingConfig(warmup=1, repeats=5, inner=1)
# Prefills that compile every kernel variant: with PDL at up to MAX_ROWS tokens and without it
# above (the PDL flag is a constexpr of the norm and RoPE kernels).
COMPILE_LENS = (MAX_ROWS, MAX_ROWS + 1)
LOGITS_RTOL = 5e-2  # bf16 Triton prefill vs torch prefill logits on the same weights


@dataclass(frozen=True, slots=True)
class PrefillRow:
    pack: str  # "<chunks>x<length>", "after <n>" where the chunk follows cached positions
    chunks: int
    tokens: int  # new tokens in the pack
    cached: int  # positions in the cache before the chunks, all chunks together
    first_ms: float  # the pack's first call: a shape this process had not run
    warm_ms: float  # median of the warm calls
    cold_ratio: float  # first_ms / warm_ms
    matmul_gflop: float
    attention_gflop: float
    tflop_s: float  # (matmul + attention) / warm time
    max_rel_err: float  # first-call logits vs the torch backend's
    backend: str
    model: str = ""  # the run's (stamped when the bench ends)
    dtype: str = ""


def prefill_flops(cfg: ModelConfig, lens, starts) -> tuple[float, float]:
    """(matmul, attention) FLOPs of one prefill of chunks ``lens`` after ``starts`` cached."""
    d, f = cfg.hidden_size, cfg.intermediate_size
    per_token = cfg.num_layers * 2 * (d * (cfg.q_size + 2 * cfg.kv_size) + cfg.q_size * d
                                      + 3 * d * f)
    matmul = per_token * sum(lens) + 2 * len(lens) * d * cfg.vocab_size
    # chunk tokens at positions s .. s + n - 1 attend s + 1 .. s + n positions
    pairs = sum(n * s + n * (n + 1) // 2 for n, s in zip(lens, starts, strict=True))
    return float(matmul), float(4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * pairs)


def default_packs(rng: random.Random) -> list[tuple[str, list[int], list[int]]]:
    """(name, chunk lengths, starts) of each pack the bench times."""
    twenty = [[rng.randint(500, 700) for _ in range(20)] for _ in range(2)]
    return [("1x512", [512], [0]), ("1x513", [513], [0]),
            ("20x500-700", twenty[0], [0] * 20), ("20x500-700 other", twenty[1], [0] * 20),
            ("1x256 after 4096", [256], [4096])]


def _first_ms(fn, device):
    device_sync(device)
    t0 = time.perf_counter()
    out = fn()
    device_sync(device)
    return (time.perf_counter() - t0) * 1e3, out


def prefill_rows(model: PagedLlama, packs=None, seed: int = 0) -> list[PrefillRow]:
    """Time every pack (``packs``: (name, chunk lengths, starts); None: :func:`default_packs`)
    on ``model``, first call then warm; validate its logits against the torch backend; free its
    blocks. Raises where the logits disagree."""
    cfg, pool, dev = model.config, model.cache.pool, model.device
    ref = PagedLlama(cfg, model.weights, model.cache, backend="torch")
    rng = random.Random(seed)
    rows = []
    for n in COMPILE_LENS:
        table = pool.allocate(pool.blocks_needed(n))
        try:
            model.prefill([rng.choices(range(cfg.vocab_size), k=n)], [table])
        finally:
            pool.free(table)
    for name, lens, starts in packs if packs is not None else default_packs(rng):
        seqs = [rng.choices(range(cfg.vocab_size), k=s + n) for n, s in zip(lens, starts,
                                                                             strict=True)]
        tables = [pool.allocate(pool.blocks_needed(len(s))) for s in seqs]
        try:
            for seq, bt, s in zip(seqs, tables, starts, strict=True):
                if s:
                    model.prefill([seq[:s]], [bt])  # the cached positions
            chunks = [seq[s:] for seq, s in zip(seqs, starts, strict=True)]

            def call(chunks=chunks, tables=tables, starts=starts):
                return model.prefill(chunks, tables, starts)

            first, logits = _first_ms(call, dev)
            warm = median_times(call, dev.type == "cuda", WARM)[0] * 1e3
            err = rel_err(logits, ref.prefill(chunks, tables, starts))
        finally:
            for bt in tables:
                pool.free(bt)
        if err > LOGITS_RTOL:
            raise AssertionError(f"prefill {name}: logits vs the torch backend {err:.3g} > "
                                 f"{LOGITS_RTOL}")
        matmul, attention = prefill_flops(cfg, lens, starts)
        rows.append(PrefillRow(name, len(lens), sum(lens), sum(starts), first, warm,
                               first / warm, matmul / 1e9, attention / 1e9,
                               (matmul + attention) / warm / 1e9, err, model.backend))
        print(f"[bench] paged_prefill: {name}: first {first:.1f} ms, warm {warm:.2f} ms, "
              f"{rows[-1].tflop_s:.0f} TFLOP/s", flush=True)
    return rows
