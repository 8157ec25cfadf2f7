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


@dataclass(frozen=True, slots=True)
class HostPack:
    """A checked prefill call laid out on the host (numpy), before any copy to the device."""

    tokens: np.ndarray  # (3, T) int64: ids, positions, slots
    bounds: np.ndarray  # (n+1,) int32: the query starts
    starts: np.ndarray  # (n,) int32
    tables: np.ndarray  # (n, width) int32, padded with the scratch block


def host_pack(cache: PagedKVCache, token_ids: Sequence[Sequence[int]],
              block_tables: Sequence[Sequence[int]], starts: Sequence[int] | None = None, *,
              vocab_size: int, max_positions: int, width: int | None = None) -> HostPack:
    """Check the chunks (:func:`check_chunks`), then lay them out (numpy, no Python loop per
    token); ``width``: the tables' (default: the longest table's)."""
    bs = cache.block_size
    starts = check_chunks(token_ids, block_tables, starts, block_size=bs,
                          num_blocks=cache.num_blocks, vocab_size=vocab_size,
                          max_positions=max_positions)
    lens = [len(c) for c in token_ids]
    spans = list(zip(starts, lens, block_tables, strict=True))
    t = sum(lens)
    tokens = np.empty((3, t), dtype=np.int64)
    tokens[0] = np.fromiter(chain.from_iterable(token_ids), np.int64, count=t)
    tokens[1] = np.concatenate([np.arange(s, s + m) for s, m, _ in spans])
    tokens[2] = np.concatenate([_slots(bt, s, m, bs) for s, m, bt in spans])
    width = width if width is not None else max(len(bt) for bt in block_tables)
    tables = np.full((len(lens), width), cache.scratch_block, dtype=np.int32)
    for row, bt in zip(tables, block_tables, strict=True):
        row[:len(bt)] = bt
    return HostPack(tokens, np.array([0, *accumulate(lens)], dtype=np.int32),
                    np.array(starts, dtype=np.int32), tables)


def pack_prefill(cache: PagedKVCache, token_ids: Sequence[Sequence[int]],
                 block_tables: Sequence[Sequence[int]], starts: Sequence[int] | None = None,
                 *, vocab_size: int, max_positions: int) -> PrefillPack:
    """:func:`host_pack`, then its packed tensors on the cache's device."""
    host = host_pack(cache, token_ids, block_tables, starts, vocab_size=vocab_size,
                     max_positions=max_positions)
    dev = cache.device
    n, t = host.starts.shape[0], host.tokens.shape[1]
    # One copy to the device each for (3, T) int64 ids, positions, slots and for the int32
    # chunk offsets, starts and tables. Every tensor starts at a multiple of 16 bytes: Triton
    # compiles a kernel once per pointer alignment, so an unaligned view would compile again.
    tokens = np.zeros((3, _aligned(t, 2)), dtype=np.int64)
    tokens[:, :t] = host.tokens
    ids, positions, slots = to_device(torch.from_numpy(tokens), dev)[:, :t]
    at, tables_at = _aligned(n + 1, 4), _aligned(n + 1, 4) + _aligned(n, 4)
    small = np.zeros(tables_at + host.tables.size, dtype=np.int32)
    small[:n + 1], small[at:at + n], small[tables_at:] = (host.bounds, host.starts,
                                                         host.tables.ravel())
    small = to_device(torch.from_numpy(small), dev)
    return PrefillPack(ids=ids, positions=positions, slot_mapping=slots,
                       block_tables=small[tables_at:].view(n, host.tables.shape[1]),
                       query_starts=small[:n + 1], starts=small[at:at + n],
                       last=small[1:n + 1].long() - 1)


def _aligned(count: int, per_16_bytes: int) -> int:
    """``count`` elements rounded up to whole 16-byte units of ``per_16_bytes`` elements."""
    return -(-count // per_16_bytes) * per_16_bytes
