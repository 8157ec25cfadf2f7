"""How paged decode attention is launched for a shape: context splits and the tile walk.
Torch-free of kernels (no triton import), so the policy is unit-tested on any machine.

Both choices depend only on static shapes (batch, KV heads, the GPU's SM count), never on the
block table's width or the context, so an eager step and a graph replay of the same batch
launch alike and give identical results, and a captured graph stays valid as contexts grow.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

MIN_GROUP_ROWS = 16  # tensor-core tiles need M >= 16: the query group is padded to this
MAX_SPLITS = 64
PROGRAMS_PER_SM = 2  # splits are added until about this many programs run per SM
# At or above this many programs per SM, each program streams alone well with 2 warps and
# 64-position tiles; below it, fewer, wider programs (128 positions, 4 warps) keep more bytes
# in flight. Measured on an H200 at Llama-3.2-1B shapes (B=8/32/128, context 4096): the best
# of tile {32, 64, 128} x stages {2, 3, 4} x warps {2, 4, 8} at each batch.
BUSY_PROGRAMS_PER_SM = 4


@dataclass(frozen=True, slots=True)
class LaunchConfig:
    """How the split kernel walks the context: positions per tile, pipeline stages, warps."""

    tile: int = 64
    stages: int = 3
    warps: int = 2


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def sm_count(device: torch.device) -> int:
    return _sm_count(device.index or 0) if device.type == "cuda" else 8


def num_splits(batch: int, kv_heads: int, sms: int) -> int:
    """Context splits (a power of 2, at most :data:`MAX_SPLITS`) so that about
    :data:`PROGRAMS_PER_SM` programs run per SM; splits past a short context stay empty and
    cost one early exit."""
    want = max(1, -(-PROGRAMS_PER_SM * sms // (batch * kv_heads)))
    splits = 1
    while splits * 2 <= min(want, MAX_SPLITS):
        splits *= 2
    return splits


def launch_for(programs: int, sms: int) -> LaunchConfig:
    if programs >= BUSY_PROGRAMS_PER_SM * sms:
        return LaunchConfig(tile=64, stages=3, warps=2)
    return LaunchConfig(tile=128, stages=3, warps=4)


def plan(batch: int, kv_heads: int, device: torch.device) -> tuple[int, LaunchConfig]:
    """(splits, launch) for one decode attention call."""
    sms = sm_count(device)
    splits = num_splits(batch, kv_heads, sms)
    return splits, launch_for(batch * kv_heads * splits, sms)
