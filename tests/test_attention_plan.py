"""The launch policy of paged decode attention (torch-free of kernels, so tested anywhere)."""

from __future__ import annotations

import pytest
import torch

from decodelab.model.triton import attention_plan
from decodelab.model.triton.attention_plan import (
    BUSY_PROGRAMS_PER_SM,
    MAX_CHUNK,
    MAX_SPLITS,
    MERGE_LANES,
    PROGRAMS_PER_SM,
    UNCAPPED,
    UNCAPPED_TABLE,
    grid_splits,
    launch_for,
    merge_lanes,
    num_splits,
    plan,
    row_order,
    whole_rows_table,
)


@pytest.mark.parametrize("batch", [1, 2, 3, 8, 32, 128, 1024])
@pytest.mark.parametrize("kv_heads", [1, 8])
def test_splits_fill_the_gpu_and_stay_a_power_of_two(batch, kv_heads):
    sms = 132
    splits = num_splits(batch, kv_heads, sms)
    assert splits & (splits - 1) == 0 and 1 <= splits <= MAX_SPLITS
    programs = batch * kv_heads * splits
    # Enough programs for the target unless capped; one doubling more would overshoot it.
    assert programs >= PROGRAMS_PER_SM * sms or splits == MAX_SPLITS or splits * 2 > -(
        -PROGRAMS_PER_SM * sms // (batch * kv_heads))
    if batch * kv_heads >= PROGRAMS_PER_SM * sms:
        assert splits == 1


def test_launch_narrows_when_the_gpu_is_busy():
    sms = 132
    busy, sparse = launch_for(BUSY_PROGRAMS_PER_SM * sms, sms), launch_for(sms, sms)
    assert (busy.tile, busy.warps) == (64, 2)
    assert (sparse.tile, sparse.warps) == (128, 4)


@pytest.mark.parametrize("row_bytes, shared, tile", [
    (64 * 2, 64 << 10, 128),  # T4, head_dim 64 in fp16: the wide tile fits
    (128 * 2, 64 << 10, 64),  # T4, head_dim 128: 72 KiB at 128 positions, so 64
    (64 * 4, 64 << 10, 64),  # T4, float32 cache
    (128 * 4, 99 << 10, 64),  # L4, head_dim 128 in float32
    (128 * 4, 227 << 10, 128),  # H200
    (128 * 2, None, 128),  # no limit (Triton's interpreter)
])
def test_the_tile_narrows_to_fit_shared_memory(row_bytes, shared, tile):
    sms = 40
    assert launch_for(sms, sms, row_bytes=row_bytes, shared=shared).tile == tile
    assert launch_for(BUSY_PROGRAMS_PER_SM * sms, sms, row_bytes=row_bytes,
                      shared=shared).tile == min(tile, 64)


@pytest.mark.parametrize("splits, positions, chunk, grid", [
    (32, 512, 512, 32),  # batch 1: the batch's splits
    (1, 4096, 512, 8),  # batch 128: enough 512-position chunks for a full table
    (1, 300, 512, 1),
    (4, 8192, 512, 16),
])
def test_the_grid_holds_a_full_table_in_capped_splits(splits, positions, chunk, grid):
    assert grid_splits(splits, positions, chunk) == grid


def test_a_batch_that_fills_the_gpu_takes_each_row_whole_in_a_narrow_table(monkeypatch):
    monkeypatch.setattr(attention_plan, "sm_count", lambda device: 4)  # 2 x 4 programs fill it
    cpu = torch.device("cpu")
    narrow, wide = UNCAPPED_TABLE, 545 * 16  # a graph's narrow table; the serving engine's
    splits, launch = plan(8, 1, cpu, table_positions=narrow)
    assert splits == 1 and launch.max_chunk == UNCAPPED
    assert grid_splits(splits, narrow, launch.max_chunk) == 1  # no empty split, no merge
    splits, launch = plan(8, 1, cpu, table_positions=wide)  # long rows: still cut
    assert splits == 1 and launch.max_chunk == MAX_CHUNK
    assert row_order(torch.ones(8, dtype=torch.int32), kv_heads=1) is not None  # sorted
    splits, launch = plan(7, 1, cpu, table_positions=narrow)  # split to fill the GPU
    assert splits == 2 and launch.max_chunk == MAX_CHUNK
    assert whole_rows_table(8, 1, cpu) == narrow and whole_rows_table(7, 1, cpu) == 0
    assert row_order(torch.ones(7, dtype=torch.int32), kv_heads=1) is None


def test_the_merge_width_comes_from_the_batch_alone():
    assert merge_lanes(1) == merge_lanes(8) == MERGE_LANES
    assert merge_lanes(32) == 32


def test_rows_are_taken_longest_first_once_the_batch_fills_the_gpu(monkeypatch):
    monkeypatch.setattr(attention_plan, "sm_count", lambda device: 4)  # 2 x 4 programs fill it
    lens = torch.tensor([5, 900, 1, 900, 64, 7, 8, 9], dtype=torch.int32)
    order = row_order(lens, kv_heads=1)
    assert order.dtype == torch.int32
    assert sorted(order.tolist()) == list(range(8))
    assert lens[order.long()].tolist() == [900, 900, 64, 9, 8, 7, 5, 1]
    assert row_order(lens[:7], kv_heads=1) is None  # split to fill the GPU: batch order
    assert row_order(lens[:4], kv_heads=2) is not None
