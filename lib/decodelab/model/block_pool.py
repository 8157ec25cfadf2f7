"""The block allocator of the paged KV cache: a free list of fixed-size blocks. Imports no torch.

Interface (stable; the scheduler and engine build on it):

    blocks_needed(num_tokens, block_size) -> int  # ceil(num_tokens / block_size)
    pool = BlockPool(num_blocks, block_size)
    pool.blocks_needed(num_tokens) -> int       # the same, with this pool's block size
    pool.can_allocate(n) -> bool
    pool.allocate(n) -> list[int]               # BlockPoolExhausted if fewer than n are free
    pool.free(blocks)                           # ValueError on a double free or a foreign id
    pool.num_free, pool.num_total, pool.num_used

Block ids are 0 .. num_blocks - 1. Freed blocks go to the back of the free list and allocation
takes from the front, so a freed block is reused last (a stale read of a just-freed block shows
up as a wrong answer in tests rather than hiding behind an immediate reuse).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from decodelab.core.validate import check_int


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """Blocks of ``block_size`` tokens that hold ``num_tokens`` tokens (0 tokens need 0)."""
    return -(-num_tokens // block_size)


class BlockPoolExhausted(RuntimeError):
    """More blocks were asked for than are free."""


class BlockPool:
    """Owns which of ``num_blocks`` cache blocks are free; hands them out and takes them back."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        check_int("BlockPool", "num_blocks", num_blocks, 1)
        check_int("BlockPool", "block_size", block_size, 1)
        self.block_size = block_size
        self._total = num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._used: set[int] = set()

    @property
    def num_total(self) -> int:
        return self._total

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._used)

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens (0 tokens need 0 blocks)."""
        check_int("BlockPool.blocks_needed", "num_tokens", num_tokens, 0)
        return blocks_needed(num_tokens, self.block_size)

    def can_allocate(self, n: int) -> bool:
        check_int("BlockPool.can_allocate", "n", n, 0)
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` free blocks; all or nothing."""
        check_int("BlockPool.allocate", "n", n, 0)
        if n > len(self._free):
            raise BlockPoolExhausted(f"BlockPool.allocate({n}): only {len(self._free)} of "
                                     f"{self._total} blocks are free")
        blocks = [self._free.popleft() for _ in range(n)]
        self._used.update(blocks)
        return blocks

    def free(self, blocks: Iterable[int]) -> None:
        """Return blocks to the pool; all or nothing (a bad id frees none of them)."""
        blocks = list(blocks)
        seen: set[int] = set()
        for b in blocks:
            if not isinstance(b, int) or isinstance(b, bool) or not 0 <= b < self._total:
                raise ValueError(f"BlockPool.free: block {b!r} is not an id of this pool "
                                 f"(0 .. {self._total - 1})")
            if b not in self._used or b in seen:
                raise ValueError(f"BlockPool.free: block {b} is not allocated (double free?)")
            seen.add(b)
        self._used.difference_update(blocks)
        self._free.extend(blocks)

    def __repr__(self) -> str:
        return (f"BlockPool(num_blocks={self._total}, block_size={self.block_size}, "
                f"free={self.num_free})")
