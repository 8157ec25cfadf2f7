"""How paged decode attention is launched for a shape: context splits and the tile walk.
Torch-free of kernels (no triton import), so the policy is unit-tested on any machine.

Both choices depend only on static shapes (batch, KV heads, the GPU's SM count, the block
table's width), never on the context, so an eager step and a graph replay of the same batch
and table launch alike and give identical results, and a captured graph stays valid as
contexts grow.

A row's context is cut into ``splits`` chunks, each at most ``max_chunk`` positions: in a
serving batch the contexts differ, and without the cap a batch too large to split gives each
(row, KV head) one program, so the step waits on its longest rows. With it the long rows are
shared out in pieces. The partition depends on the row's context, the batch and, for a batch
that fills the GPU, whether the table is narrow enough to take rows whole
(:data:`UNCAPPED_TABLE`: a row of 1,025 to 2,048 positions is one chunk in such a table, two
in a wider one, which rounds its sums otherwise); the grid holds enough splits for the table,
and the splits a row does not use exit at once.

The tile is narrowed where its K and V tiles would not fit the GPU's shared memory per block
(a T4 has 64 KiB: the 128-position tile of a head_dim-128 or float32 cache needs 72 KiB):
Triton would refuse the launch there (``OutOfResources``). ``tests/test_triton_aot.py`` checks
the estimate against the compiled kernels of sm_75, sm_80, sm_89 and sm_90.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

MIN_GROUP_ROWS = 16  # tensor-core tiles (sm_80+) need M >= 16: the query group is padded to this
MAX_SPLITS = 64
PROGRAMS_PER_SM = 2  # splits are added until about this many programs run per SM
# At or above this many programs per SM, each program streams alone well with 2 warps and
# 64-position tiles; below it, fewer, wider programs (128 positions, 4 warps) keep more bytes
# in flight. Measured on an H200 at Llama-3.2-1B shapes (B=8/32/128, context 4096): the best
# of tile {32, 64, 128} x stages {2, 3, 4} x warps {2, 4, 8} at each batch.
BUSY_PROGRAMS_PER_SM = 4
# Shared memory of the split kernel per tile position and byte of a K/V row (head_dim x dtype
# bytes), an upper bound of Triton 3.6's allocation (2.25-2.41 over sm_75 to sm_90, 3 stages).
SHARED_PER_TILE_BYTE = 2.5
MIN_TILE = 16
# Positions of one split at most. On an H200 at Llama-3.2-1B shapes (table paged_attention,
# contexts uniform in 1..2c): batch 128, c = 4,096, 261 µs per layer against 305 without the
# cap, 259 against 248 (a run before the cap) where every row is at 4,096, the partials'
# round trip; no change at c = 512 (no row passes the cap). A 512 cap was within 10% of it,
# ahead at some shapes, behind at others (a sweep at batches 32-256). Served (bench serve,
# median decode step per graph bucket): long prompts (contexts 2k-8.5k) 3-18% faster at 8-128
# rows; the offline workload (contexts up to 2k) 4-5% slower at 48-64 rows and within 2% at
# 96-256, where the grid holds splits for the engine's 8.7k-position tables that no row uses
# (each exits at once; the engine's narrow-table graphs, below, now take those batches).
MAX_CHUNK = 1024
# A batch that fills the GPU unsplit, over a block table of at most UNCAPPED_TABLE positions,
# takes each row whole (``max_chunk`` UNCAPPED): no empty split is launched and no merge kernel
# runs, whose launch costs more than its work where no row passes the cap. Its rows are sorted,
# and longest first the GPU balances rows this short without cutting them. Wider tables keep
# the cap, which the long rows there need. The serving engine replays a graph over a table this
# narrow when its batch's longest row fits (``DecodeGraphs``). Graph step on an H100, Llama-3.2-1B
# shapes, contexts uniform in 1..2c, narrow table against the cap in a 545-block one (µs): c =
# 512, 48-256 rows 2.6-5.4% faster (128 rows 2,226 against 2,285); c = 1,024, 48-128 rows within
# 1.4% either way, 256 rows 4.0% faster. Whole rows in the wide table at c = 4,096 were 3.6-6.6%
# slower at 48-128 rows, hence the width. Served (bench serve's chunked engine, H100): the
# offline workload's decode steps 2.91 s of device time against 3.02; long prompts unchanged.
UNCAPPED_TABLE = 2048
UNCAPPED = 1 << 30
MERGE_LANES = 8  # the merge reads at least this many splits per load
# The merge is a kernel of its own. Merging in the split kernel instead (the last split of a
# (row, KV head) to count itself in an atomic counter merges the row; same bits) was slower on
# an H200 at Llama-3.2-1B shapes: batch 1, 7.2 against 5.2 µs per layer; batch 128, mixed
# contexts around 4,096, 288 against 261 µs (the merging program's serial tail).


@dataclass(frozen=True, slots=True)
class LaunchConfig:
    """How the split kernel walks the context: positions per tile, pipeline stages, warps,
    and the most positions one split takes (a multiple of the tile)."""

    tile: int = 64
    stages: int = 3
    warps: int = 2
    max_chunk: int = MAX_CHUNK


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def sm_count(device: torch.device) -> int:
    return _sm_count(device.index or 0) if device.type == "cuda" else 8


@functools.cache
def _shared_per_block(device_index: int) -> int:
    props = torch.cuda.get_device_properties(device_index)
    return getattr(props, "shared_memory_per_block_optin", 48 << 10)


def shared_per_block(device: torch.device) -> int | None:
    """Bytes of shared memory one block may use (the opt-in limit); None off CUDA (the
    interpreter has no limit)."""
    return _shared_per_block(device.index or 0) if device.type == "cuda" else None


def num_splits(batch: int, kv_heads: int, sms: int) -> int:
    """Context splits (a power of 2, at most :data:`MAX_SPLITS`) so that about
    :data:`PROGRAMS_PER_SM` programs run per SM; splits past a short context stay empty and
    cost one early exit."""
    want = max(1, -(-PROGRAMS_PER_SM * sms // (batch * kv_heads)))
    splits = 1
    while splits * 2 <= min(want, MAX_SPLITS):
        splits *= 2
    return splits


def grid_splits(splits: int, table_positions: int, max_chunk: int) -> int:
    """Splits the grid holds per (row, KV head): the batch's ``splits``, or enough chunks of
    ``max_chunk`` for a context filling the block table, whichever is more."""
    return max(splits, -(-table_positions // max_chunk))


def merge_lanes(splits: int) -> int:
    """Splits the merge reads per load: a power of two, from the batch alone (never the grid),
    so that the merged sum is the same whatever the block table's width."""
    return max(MERGE_LANES, splits)


def launch_for(programs: int, sms: int, *, row_bytes: int = 0, shared: int | None = None
               ) -> LaunchConfig:
    """``row_bytes``: bytes of one K/V row (head_dim x dtype bytes); ``shared``: the GPU's
    shared memory per block (None: no limit)."""
    if programs >= BUSY_PROGRAMS_PER_SM * sms:
        tile, warps = 64, 2
    else:
        tile, warps = 128, 4
    return fitted(LaunchConfig(tile=tile, stages=3, warps=warps, max_chunk=MAX_CHUNK), row_bytes,
                  shared)


def fitted(launch: LaunchConfig, row_bytes: int, shared: int | None) -> LaunchConfig:
    """``launch`` with its tile halved until its K and V tiles fit ``shared`` bytes."""
    tile = launch.tile
    while (tile > MIN_TILE and shared is not None
           and SHARED_PER_TILE_BYTE * tile * row_bytes > shared):
        tile //= 2
    return replace(launch, tile=tile)


def row_order(context_lens: torch.Tensor, kv_heads: int,
              sort: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor | None:
    """The split kernel's ``row_order``: (B,) int32, the rows by context length, longest first
    (ties in batch order), from one sort per decode step shared by every layer; None (batch
    order) where the batch is split to fill the GPU, with no queue of programs to order.
    ``sort`` makes that order (the model's: ``row_rank.longest_first``, one launch); by
    default ``torch.argsort``, stable.

    Measured on an H100 at Llama-3.2-1B shapes, tables 545 blocks wide as the serving engine's,
    sorted against batch order (µs per layer, graph replays, L2-cold K/V). A serving
    batch's contexts (each row's from 1 to 2c): 128 rows, c = 512, 56.1 against 59.0; c =
    1,024, 105.9 against 113.1; 256 rows 108.9 against 128.3 and 185.8 against 198.4; 64 rows
    even at c = 512, 7.9% faster at 1,024. Every row at 512: 256 rows 11% faster, 128 rows 8%
    slower (the ordered grid's unused splits, launched between the rows). The graph step over
    such a serving batch: 0.9-3.3% faster from 128 rows, 1.9% at 64 rows and c = 1,024, 1.1%
    slower at c = 512 (there the sort, argsort and its cast, cost about 20 µs a step and the
    kernel saved 3 µs; the model now sorts with ``row_rank``, 5-8 µs); at 8-32 rows, sorted,
    it was 0.4-1.4% slower, hence batch order there."""
    if num_splits(context_lens.shape[0], kv_heads, sm_count(context_lens.device)) > 1:
        return None
    if sort is not None:
        return sort(context_lens)
    return torch.argsort(context_lens, descending=True, stable=True).to(torch.int32)


def plan(batch: int, kv_heads: int, device: torch.device, row_bytes: int = 0, *,
         table_positions: int) -> tuple[int, LaunchConfig]:
    """(splits, launch) for one decode attention call over K/V rows of ``row_bytes`` and
    block tables of ``table_positions``. A batch that fills the GPU unsplit over a table of at
    most :data:`UNCAPPED_TABLE` positions takes each row whole, in one program per (row, KV
    head), so the grid holds no empty split and no merge runs."""
    sms = sm_count(device)
    splits = num_splits(batch, kv_heads, sms)
    launch = launch_for(batch * kv_heads * splits, sms, row_bytes=row_bytes,
                        shared=shared_per_block(device))
    whole = table_positions <= whole_rows_table(batch, kv_heads, device)
    return splits, replace(launch, max_chunk=UNCAPPED) if whole else launch


def whole_rows_table(batch: int, kv_heads: int, device: torch.device) -> int:
    """Positions of the widest block table in which a batch takes each row whole (no split,
    no merge): :data:`UNCAPPED_TABLE` where the batch fills the GPU unsplit, else 0."""
    return UNCAPPED_TABLE if num_splits(batch, kv_heads, sm_count(device)) == 1 else 0
