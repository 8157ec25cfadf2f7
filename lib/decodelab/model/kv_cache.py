"""The paged KV cache: one preallocated pool of fixed-size blocks per layer, written by slot.

Layout (per layer ``l``):

    k[l], v[l]: (num_blocks + 1, num_kv_heads, block_size, head_dim)

Block ``num_blocks`` (the last one) is a scratch block that no sequence owns: padding rows of a
graph-captured batch carry slot -1, and the torch write path redirects them there (the Triton
write path skips them outright), so padding never touches a real sequence's cache. One block
holds ``block_size`` consecutive positions of one sequence; ``slot = block * block_size +
position % block_size`` where ``block = block_table[position // block_size]``.

Interface (stable):

    cache = PagedKVCache(config, num_blocks, block_size, dtype=..., device=...)
    cache.pool                       # the BlockPool of these blocks (torch-free allocator)
    cache.write(layer, k, v, slot_mapping)      # k, v: (T, Hkv, D); slot -1 = write nothing
    slots_for(block_table, start, end) -> list[int]   # slots of positions start .. end-1
    slots_at(block_tables, positions, block_size)     # the same on tensors or arrays, one per row
    decode_inputs(cache, batch, context, gen, width=) -> (tables, decode args)  # B fresh rows
    cache.block_table_tensor(tables, width) -> (B, width) int32, padded with the scratch block
    cache.capacity_tokens, cache.nbytes, PagedKVCache.blocks_for_memory(config, ...)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from decodelab.core.host_copy import to_device
from decodelab.core.validate import ConfigError, check_int
from decodelab.model.block_pool import BlockPool
from decodelab.model.config import ModelConfig


def slots_for(block_table: Sequence[int], start: int, end: int, block_size: int) -> list[int]:
    """Cache slots of positions ``start .. end-1`` of a sequence with this block table."""
    if end > len(block_table) * block_size:
        raise ValueError(f"positions up to {end - 1} need {-(-end // block_size)} blocks; the "
                         f"block table has {len(block_table)}")
    return [block_table[p // block_size] * block_size + p % block_size for p in range(start, end)]


def slots_at(block_tables, positions, block_size: int):
    """(B,) int64 cache slots of ``positions[b]`` in row ``b`` of ``block_tables`` (B, width):
    torch tensors (on their device) or numpy arrays (the engine's pinned host mirror)."""
    if isinstance(block_tables, np.ndarray):
        blocks = block_tables[np.arange(len(block_tables)), positions // block_size]
        blocks = blocks.astype(np.int64)
    else:
        rows = torch.arange(block_tables.shape[0], device=block_tables.device)
        blocks = block_tables[rows, positions // block_size].long()
    return blocks * block_size + positions % block_size


class PagedKVCache:
    """K and V block pools of every layer, plus the allocator that hands their blocks out."""

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int = 16, *,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> None:
        check_int("PagedKVCache", "num_blocks", num_blocks, 1)
        check_int("PagedKVCache", "block_size", block_size, 1, 1024)
        self.config = config
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (config.num_layers, num_blocks + 1, config.num_kv_heads, block_size,
                 config.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=self.device)
        self.v = torch.zeros(shape, dtype=dtype, device=self.device)
        self.pool = BlockPool(num_blocks, block_size)

    @property
    def scratch_block(self) -> int:
        """The block padding rows point at; never handed out by ``pool``."""
        return self.num_blocks

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    @staticmethod
    def blocks_for_memory(config: ModelConfig, block_size: int, dtype: torch.dtype,
                          nbytes: int) -> int:
        """How many blocks (plus the scratch block) fit in ``nbytes`` of K and V."""
        per_block = config.kv_bytes_per_token(torch.tensor([], dtype=dtype).element_size())
        blocks = nbytes // (per_block * block_size) - 1
        if blocks < 1:
            raise ConfigError(f"KV cache memory {nbytes} bytes: must hold at least 2 blocks of "
                              f"{per_block * block_size} bytes")
        return blocks

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor,
              slot_mapping: torch.Tensor) -> None:
        """Store ``k, v`` (T, Hkv, D) at ``slot_mapping`` (T,); slot -1 goes to scratch.

        Graph-safe: shapes are static, the redirect is a ``where`` on device.
        """
        scratch = torch.full_like(slot_mapping, self.scratch_block * self.block_size)
        slots = torch.where(slot_mapping < 0, scratch, slot_mapping)
        blocks, offsets = slots // self.block_size, slots % self.block_size
        # Advanced indices split by a slice put the token dim first: (T, Hkv, D).
        self.k[layer][blocks, :, offsets] = k
        self.v[layer][blocks, :, offsets] = v

    def block_table_tensor(self, tables: Sequence[Sequence[int]], width: int | None = None
                           ) -> torch.Tensor:
        """(B, width) int32 on the cache's device; short rows padded with the scratch block."""
        width = width if width is not None else max((len(t) for t in tables), default=1)
        out = torch.full((len(tables), max(width, 1)), self.scratch_block, dtype=torch.int32)
        for i, t in enumerate(tables):
            if len(t) > width:
                raise ValueError(f"block table {i} has {len(t)} blocks; width is {width}")
            out[i, :len(t)] = torch.tensor(list(t), dtype=torch.int32)
        return to_device(out, self.device)

    def __repr__(self) -> str:
        return (f"PagedKVCache(blocks={self.num_blocks}, block_size={self.block_size}, "
                f"dtype={self.dtype}, {self.nbytes / 2**20:.1f} MiB)")


def decode_inputs(cache: PagedKVCache, batch: int, context: int,
                  gen: torch.Generator | None = None, *, width: int | None = None):
    """B sequences with ``context`` tokens each (the last one new this step): static tensors.
    Returns (block tables to free, decode arguments). ``gen``, a seeded CPU generator, draws the
    token ids (processes that must feed the same ids pass equally seeded generators); ``width``
    pads the block tables to that many blocks (default: the blocks ``context`` needs)."""
    tables = [cache.pool.allocate(cache.pool.blocks_needed(context)) for _ in range(batch)]
    bt = cache.block_table_tensor(tables, width)
    pos = torch.full((batch,), context - 1, dtype=torch.int64, device=cache.device)
    slots = slots_at(bt, pos, cache.block_size)
    if gen is None:
        ids = torch.randint(0, cache.config.vocab_size, (batch,), device=cache.device)
    else:
        ids = torch.randint(0, cache.config.vocab_size, (batch,), generator=gen).to(cache.device)
    return tables, (ids, pos, slots, bt, (pos + 1).int())
