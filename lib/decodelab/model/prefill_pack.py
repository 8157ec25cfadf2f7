"""The host side of one prefill call: check the chunks, lay them out as packed device tensors.

A prefill call carries n chunks; chunk i is ``token_ids[i]``, the new tokens of sequence i at
positions ``starts[i] .. starts[i] + len - 1`` (positions before ``starts[i]`` are already in
the cache). Packed without padding, chunk after chunk, into T = sum of lengths rows:

    ids, positions, slot_mapping  (T,) int64   token, its position, its cache slot
    block_tables                  (n, M) int32 padded with the scratch block (never read:
                                               only positions < start + len are attended)
    query_starts                  (n+1,) int32 chunk i is rows query_starts[i] .. [i+1]-1
    starts                        (n,) int32   positions cached before each chunk
    last                          (n,) int64   the row of each chunk's last token

Every check runs on the host lists before anything reaches the device, and names the chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, chain
from numbers import Integral

import numpy as np
import torch

from decodelab.core.host_copy import to_device
from decodelab.model.kv_cache import PagedKVCache, slots_at


@dataclass(frozen=True, slots=True)
class PrefillPack:
    ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    query_starts: torch.Tensor
    starts: torch.Tensor
    last: torch.Tensor
    max_query_len: int  # the longest chunk: the Triton kernel sizes its grid with it


def check_chunks(token_ids: Sequence[Sequence[int]], block_tables: Sequence[Sequence[int]],
                 starts: Sequence[int] | None, *, block_size: int, num_blocks: int,
                 vocab_size: int, max_positions: int) -> list[int]:
    """Raise ValueError naming the first bad input; return the starts (zeros for None)."""
    n = len(token_ids)
    if n == 0 or len(block_tables) != n:
        raise ValueError(f"prefill: {n} chunks, {len(block_tables)} block tables; need the same "
                         "non-zero number")
    starts = [0] * n if starts is None else list(starts)
    if len(starts) != n:
        raise ValueError(f"prefill: {len(starts)} starts for {n} chunks; need one per chunk")
    for i, (chunk, table, start) in enumerate(zip(token_ids, block_tables, starts, strict=True)):
        if not isinstance(start, Integral) or isinstance(start, bool) or start < 0:
            raise ValueError(f"prefill: starts[{i}]={start!r}: must be an integer >= 0 (the "
                             "positions already cached)")
        if len(chunk) < 1:
            raise ValueError(f"prefill: chunk {i} is empty; every chunk needs at least one token")
        end = start + len(chunk)
        if end > max_positions:
            raise ValueError(f"prefill: chunk {i} reaches position {end - 1}; the model has "
                             f"positions 0 .. {max_positions - 1}")
        need = -(-end // block_size)
        if len(table) < need:
            raise ValueError(f"prefill: chunk {i} (positions {start} .. {end - 1}) needs "
                             f"{need} blocks of {block_size}; its block table has {len(table)}")
        bad = [b for b in table[:need] if not 0 <= b < num_blocks]
        if bad:
            raise ValueError(f"prefill: block table {i} holds block {bad[0]}; allowed: 0 .. "
                             f"{num_blocks - 1}")
        low, high = min(chunk), max(chunk)
        if low < 0 or high >= vocab_size:
            raise ValueError(f"prefill: chunk {i} holds token id {low if low < 0 else high}; "
                             f"allowed: 0 .. {vocab_size - 1}")
    return starts


def _slots(table: Sequence[int], start: int, n: int, block_size: int) -> np.ndarray:
    """(n,) cache slots of positions start .. start + n - 1 (``slots_at`` on one row per
    position: a broadcast view of the table, no copy)."""
    rows = np.broadcast_to(np.asarray(table, dtype=np.int64), (n, len(table)))
    return slots_at(rows, np.arange(start, start + n), block_size)


def pack_prefill(cache: PagedKVCache, token_ids: Sequence[Sequence[int]],
                 block_tables: Sequence[Sequence[int]], starts: Sequence[int] | None = None,
                 *, vocab_size: int, max_positions: int) -> PrefillPack:
    """Check the chunks (:func:`check_chunks`), then build their packed tensors on the cache's
    device (numpy on the host, no Python loop per token)."""
    bs, dev = cache.block_size, cache.device
    starts = check_chunks(token_ids, block_tables, starts, block_size=bs,
                          num_blocks=cache.num_blocks, vocab_size=vocab_size,
                          max_positions=max_positions)
    lens = [len(c) for c in token_ids]
    spans = list(zip(starts, lens, block_tables, strict=True))
    bounds = [0, *accumulate(lens)]
    n, t = len(lens), bounds[-1]
    # One copy to the device each for (3, T) int64 ids, positions, slots and for the int32
    # chunk offsets and starts. Every tensor starts at a multiple of 16 bytes: Triton compiles
    # a kernel once per pointer alignment, so an unaligned view would compile again.
    host = np.zeros((3, _aligned(t, 2)), dtype=np.int64)
    host[0, :t] = np.fromiter(chain.from_iterable(token_ids), np.int64, count=t)
    host[1, :t] = np.concatenate([np.arange(s, s + m) for s, m, _ in spans])
    host[2, :t] = np.concatenate([_slots(bt, s, m, bs) for s, m, bt in spans])
    ids, positions, slots = to_device(torch.from_numpy(host), dev)[:, :t]
    at = _aligned(n + 1, 4)  # where starts begin
    small = np.zeros(at + n, dtype=np.int32)
    small[:n + 1], small[at:] = bounds, starts
    small = to_device(torch.from_numpy(small), dev)
    return PrefillPack(ids=ids, positions=positions, slot_mapping=slots,
                       block_tables=cache.block_table_tensor(block_tables),
                       query_starts=small[:n + 1], starts=small[at:],
                       last=small[1:n + 1].long() - 1, max_query_len=max(lens))


def _aligned(count: int, per_16_bytes: int) -> int:
    """``count`` elements rounded up to whole 16-byte units of ``per_16_bytes`` elements."""
    return -(-count // per_16_bytes) * per_16_bytes
