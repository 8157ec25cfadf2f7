"""The block allocator: exhaustive property tests (no block owned twice, every block returned)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from decodelab.core.validate import ConfigError
from decodelab.model.block_pool import BlockPool, BlockPoolExhausted

# An operation: ("alloc", n) asks for n blocks for a new owner; ("free", i) frees owner i % owners.
ops = st.lists(st.one_of(st.tuples(st.just("alloc"), st.integers(0, 12)),
                         st.tuples(st.just("free"), st.integers(0, 1000))), max_size=60)


@settings(max_examples=300, deadline=None)
@given(num_blocks=st.integers(1, 40), block_size=st.integers(1, 8), ops=ops)
def test_no_block_owned_twice_and_every_block_returned(num_blocks, block_size, ops):
    pool = BlockPool(num_blocks, block_size)
    owners: list[list[int]] = []
    for kind, n in ops:
        if kind == "alloc":
            if pool.can_allocate(n):
                owners.append(pool.allocate(n))
            else:
                before = pool.num_free
                with pytest.raises(BlockPoolExhausted):
                    pool.allocate(n)
                assert pool.num_free == before  # all or nothing
        elif owners:
            pool.free(owners.pop(n % len(owners)))
        owned = [b for o in owners for b in o]
        assert len(owned) == len(set(owned)), "a block is owned twice"
        assert all(0 <= b < num_blocks for b in owned)
        assert pool.num_free + len(owned) == pool.num_total
        assert pool.num_used == len(owned)
    for o in owners:
        pool.free(o)
    assert pool.num_free == num_blocks
    assert sorted(pool.allocate(num_blocks)) == list(range(num_blocks))


@given(st.integers(1, 64), st.integers(0, 1000))
def test_blocks_needed_is_ceiling(block_size, tokens):
    pool = BlockPool(1, block_size)
    need = pool.blocks_needed(tokens)
    assert need * block_size >= tokens and (need - 1) * block_size < max(tokens, 1)


def test_double_free_and_foreign_ids_are_rejected_without_side_effects():
    pool = BlockPool(4, 16)
    a = pool.allocate(2)
    pool.free(a[:1])
    with pytest.raises(ValueError, match="not allocated"):
        pool.free(a)  # a[0] is already free: nothing of this call is freed
    assert pool.num_free == 3
    with pytest.raises(ValueError, match="not an id"):
        pool.free([4])
    with pytest.raises(ValueError, match="not an id"):
        pool.free([-1])
    with pytest.raises(ValueError, match="not allocated"):
        pool.free([a[1], a[1]])
    pool.free([a[1]])
    assert pool.num_free == 4


def test_freed_blocks_are_reused_last():
    pool = BlockPool(4, 1)
    first = pool.allocate(1)
    pool.free(first)
    assert pool.allocate(3) == [1, 2, 3]


def test_bad_sizes_are_config_errors():
    with pytest.raises(ConfigError, match="num_blocks"):
        BlockPool(0, 16)
    with pytest.raises(ConfigError, match="block_size"):
        BlockPool(8, 0)
    with pytest.raises(ConfigError, match="n="):
        BlockPool(8, 1).allocate(-1)


def test_block_pool_imports_no_torch():
    code = ("import sys; import decodelab.model.block_pool; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


@given(st.integers(1, 64), st.integers(0, 1000))
def test_one_blocks_needed_for_pool_and_scheduler(block_size, tokens):
    from decodelab.engine.scheduler import SchedulerConfig
    from decodelab.model.block_pool import blocks_needed

    sched = SchedulerConfig(block_size, max_num_seqs=1, max_model_len=2)
    assert (BlockPool(1, block_size).blocks_needed(tokens) == sched.blocks_needed(tokens)
            == blocks_needed(tokens, block_size))
