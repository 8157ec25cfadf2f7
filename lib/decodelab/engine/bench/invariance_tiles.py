"""``python -m decodelab bench tiles`` (CUDA only): table ``batch_invariance_tiles``, the
evidence for ``invariant.matmul_tile``. Every candidate tile of the batch-invariant matmul
(rows x columns x K chunk, warps) on each of the model's weights, in the run's dtype:

- ``same_bits``: a sample of rows of a large batch through the tile, each the same bits as
  that row computed alone (the rule's one-row tile). The rule may pick any tile only because
  this holds for every one;
- ``tile_us`` at each row count, device time per call in a CUDA graph, beside cuBLAS on the
  same operands (``x_cublas``: tile / cuBLAS); ``picked``: the tile the rule picks there.

Tiles too small for a row count (more than MAX_ROW_TILES row tiles) or too large for it
(BLOCK_M above twice the rows, past 64) are not timed there; tiles whose operands do not fit
the GPU's shared memory in one stage, or that Triton cannot launch there, are left out. The
LM head is timed up to LOGIT_ROWS rows only: it sees a decode batch's rows or a prefill
pack's last positions, never a whole pack.
A point takes at most about ``point_s`` of replays (a slow GPU times fewer calls).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from decodelab.core.capture import capture, warm_up
from decodelab.core.device import require_cuda, run_dtype
from decodelab.core.profiles import measured_device
from decodelab.core.results import stamped, write_table
from decodelab.core.timing import time_graph_replays
from decodelab.engine.bench.invariance_config import NAN
from decodelab.model.config import ModelConfig, named_config

MAX_ROW_TILES = 64  # row tiles per call above which a tile is not timed
MAX_TILE = 256 * 128  # rows x columns per program: past it the accumulator spills
LOGIT_ROWS = 256  # the most rows the LM head is timed at (the engine's largest batch)


@dataclass(frozen=True, slots=True)
class TileSweepConfig:
    model: str = "llama-3.2-1b"
    rows: tuple[int, ...] = (32, 64, 128, 192, 256, 1024, 4096)
    block_m: tuple[int, ...] = (16, 32, 64, 128, 256)
    block_n: tuple[int, ...] = (16, 32, 64, 128, 256)
    block_k: tuple[int, ...] = (64, 128, 256)
    checked_rows: int = 9  # rows compared with themselves alone, spread over the largest batch
    calls: int = 10  # matmuls per graph replay
    replays: int = 20
    point_s: float = 0.05  # replay time per (tile, rows) at most, about


@dataclass(frozen=True, slots=True)
class TileRow:
    weight: str
    n: int
    k: int
    rows: int
    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int
    same_bits: bool
    tile_us: float
    cublas_us: float
    x_cublas: float
    picked: bool  # invariant.matmul_tile's tile at these rows
    model: str = ""
    dtype: str = ""
    bench_s: float = NAN


def weight_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """(n, k) of each matmul weight of a layer, and of the LM head."""
    d, f = config.hidden_size, config.intermediate_size
    return {"qkv": (config.q_size + 2 * config.kv_size, d), "o": (d, config.q_size),
            "gate_up": (2 * f, d), "down": (d, f), "lm_head": (config.vocab_size, d)}


def candidates(n: int, k: int, cfg: TileSweepConfig):
    """The tiles tried on a weight (n, k): the grid (wide weights in tiles of at least 64
    columns; 8 warps from 128 rows), and every tile the rule picks at the sweep's rows."""
    from decodelab.model.triton import invariant

    tiles = {invariant.matmul_tile(rows, n, k) for rows in cfg.rows}
    for bm, bn, bk in itertools.product(cfg.block_m, cfg.block_n, cfg.block_k):
        if bm * bn > MAX_TILE or (n > invariant.WIDE_N and bn < 64):
            continue
        for warps in (4, 8) if bm >= 128 else (4,):
            tiles.add(invariant.MatmulTile(bm, bn, bk, warps))
    return sorted(tiles)


def timed_at(block_m: int, rows: int) -> bool:
    """Whether a tile of ``block_m`` rows is timed at ``rows`` rows (see the module doc)."""
    return -(-rows // block_m) <= MAX_ROW_TILES and (block_m <= 64 or block_m <= 2 * rows)


def graph_us(fn: Callable[[], object], cfg: TileSweepConfig) -> float:
    """Device µs per call of ``fn``: calls captured in one CUDA graph, replayed back to back;
    ``cfg.calls`` x ``cfg.replays`` of them, fewer where that would take over ``point_s``."""
    warm_up(fn, 2)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    budget = max(3, min(cfg.calls * cfg.replays,
                        int(cfg.point_s / max(start.elapsed_time(end) * 1e-3, 1e-9))))
    calls = min(cfg.calls, budget)

    def captured() -> None:
        for _ in range(calls):
            fn()  # each output is dropped: the graph's pool reuses its memory

    graph, _ = capture(captured)
    us = time_graph_replays(graph, max(1, budget // calls)) * 1e6 / calls
    del graph
    return us


def sweep_weight(name: str, w: torch.Tensor, cfg: TileSweepConfig,
                 time_us: Callable[[Callable[[], object]], float]) -> list[TileRow]:
    """Every candidate tile on weight ``w``: bits against rows alone, and ``time_us`` of a
    call at each row count where it is timed, beside cuBLAS (``x @ w.T``)."""
    from triton.runtime.errors import OutOfResources

    from decodelab.model.triton import attention_plan, invariant, skinny

    n, k = w.shape
    counts = [r for r in cfg.rows if name != "lm_head" or r <= LOGIT_ROWS] or [min(cfg.rows)]
    gen = torch.Generator(device=w.device).manual_seed(n * 31 + k)
    x = torch.randn((max(counts), k), generator=gen, device=w.device).to(w.dtype)
    sample = torch.linspace(0, x.shape[0] - 1, cfg.checked_rows).long().tolist()
    alone = torch.cat([invariant.matmul(x[i:i + 1], w) for i in sample])
    cublas = {rows: time_us(lambda rows=rows: x[:rows] @ w.T) for rows in counts}
    shared = attention_plan.shared_per_block(w.device)
    out = []
    for tile in candidates(n, k, cfg):
        one_stage = (tile.block_m + tile.block_n) * tile.block_k * w.element_size()
        if shared is not None and one_stage > shared:
            continue  # its x and w tiles do not fit this GPU's shared memory
        stages = invariant.stages_for(tile.block_m, tile.block_n, tile.block_k,
                                      w.element_size(), shared)
        launch = (tile.block_n, tile.block_k, tile.warps, stages)
        try:
            same = torch.equal(skinny.tiled(x, w, launch, tile.block_m)[sample], alone)
        except OutOfResources as err:  # the compiled pipeline needs more than the GPU has
            print(f"[bench] batch_invariance_tiles: {name}: {tile} left out ({err})", flush=True)
            continue
        for rows in counts:
            if not timed_at(tile.block_m, rows):
                continue
            us = time_us(lambda rows=rows, launch=launch, bm=tile.block_m:
                         skinny.tiled(x[:rows], w, launch, bm))
            out.append(TileRow(name, n, k, rows, *tile, stages, same, us, cublas[rows],
                               us / cublas[rows], tile == invariant.matmul_tile(rows, n, k)))
    return out


def tile_rows(config: ModelConfig, dtype: torch.dtype, device: torch.device,
              cfg: TileSweepConfig = TileSweepConfig(),
              time_us: Callable[[Callable[[], object]], float] | None = None) -> list[TileRow]:
    """The table's rows for every weight shape of ``config`` (random weights, scaled as a
    linear layer's); ``time_us`` defaults to :func:`graph_us`."""
    time_us = time_us or (lambda fn: graph_us(fn, cfg))
    out = []
    for name, (n, k) in weight_shapes(config).items():
        gen = torch.Generator(device=device).manual_seed(n + k)
        w = (torch.randn((n, k), generator=gen, device=device) / k ** 0.5).to(dtype)
        rows = sweep_weight(name, w, cfg, time_us)
        same = {(r.block_m, r.block_n, r.block_k, r.warps): r.same_bits for r in rows}
        print(f"[bench] batch_invariance_tiles: {name} ({n} x {k}): {sum(same.values())} of "
              f"{len(same)} tiles the same bits as rows alone", flush=True)
        out += rows
        del w
    return out


def bench(profile: str, out_dir: Path, dtype: str = "auto") -> list[Path]:
    """``python -m decodelab bench tiles``: the sweep on the CUDA GPU at every profile's sizes
    (a few minutes on an H200, mostly Triton compiling about a hundred tiles)."""
    measured_device(profile)  # gpu without CUDA: refused as in every phase
    require_cuda("the invariant matmul's tile sweep (Triton on CUDA)")
    cfg = TileSweepConfig()
    run = run_dtype(dtype, "cuda", "tiles.dtype")
    t0 = time.perf_counter()
    rows = tile_rows(named_config(cfg.model), getattr(torch, run), torch.device("cuda"), cfg)
    return [write_table("batch_invariance_tiles", stamped(
        rows, model=cfg.model, dtype=run, bench_s=round(time.perf_counter() - t0, 1)),
        out_dir=out_dir, config=cfg, profile=profile)]
