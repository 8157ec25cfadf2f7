"""Whether a tensor-parallel configuration fits the GPUs, decided before anything is built.

``bench tp`` builds each model's full weights on every rank (the same random weights
everywhere), then each TP size's shard, KV pool and graphs. On a small GPU the larger shapes do
not fit (Llama-3.1-8B's bf16 weights alone are 16 GB, a T4's whole memory): such a
configuration is skipped with its reason, instead of failing the run with an out-of-memory
error. The estimate, per rank, is the larger of

- building the full weights: their state dict, the fused q/k/v and gate/up copies made from
  it, and the largest tensor drawn in float32 before its cast;
- the timed configuration: the full weights (kept for the next TP size), this rank's shard
  (none at tp=1: the full weights serve), its KV pool, and the graphs' logits outputs
  (twice at tp > 1, where a twin without collectives is captured too);

plus the headroom every phase's sizing adds (``core.sizing.need_bytes``: ``HEADROOM`` of it and
``WORKSPACE_BYTES`` for what the estimate leaves out). The pieces' bytes are
``model.memory``'s, as in the other phases.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from decodelab.core.sizing import GIB, HEADROOM, WORKSPACE_BYTES, need_bytes
from decodelab.model import memory
from decodelab.model.config import ModelConfig
from decodelab.parallel.shard import local_config


@dataclass(frozen=True, slots=True)
class RankMemory:
    """Estimated device bytes of one rank for one TP size (see the module doc)."""

    full_weights: int
    build_extra: int  # fused copies + the largest float32 draw, while building the weights
    shard: int
    kv_pool: int
    logits: int

    @property
    def peak(self) -> int:
        return max(self.full_weights + self.build_extra,
                   self.full_weights + self.shard + self.kv_pool + self.logits)

    @property
    def need(self) -> int:
        """``peak`` with the stated headroom: what must be free."""
        return need_bytes(self.peak)


def rank_memory(config: ModelConfig, tp: int, dtype_bytes: int, num_blocks: int,
                block_size: int, graph_buckets: Iterable[int] = ()) -> RankMemory:
    """The estimate for ``config`` split ``tp`` ways, with a KV pool of ``num_blocks`` blocks
    (plus the scratch block) and decode graphs captured for ``graph_buckets``."""
    full = memory.weight_bytes(config, dtype_bytes)
    kv = memory.kv_pool_bytes(local_config(config, tp), num_blocks, block_size, dtype_bytes)
    logits = memory.logits_bytes(config, graph_buckets) * (2 if tp > 1 else 1)
    return RankMemory(full_weights=full, build_extra=memory.build_extra_bytes(config, dtype_bytes),
                      shard=0 if tp == 1 else -(-full // tp), kv_pool=kv, logits=logits)


@dataclass(frozen=True, slots=True)
class Fit:
    """The decision for one TP size: it runs (``reason`` None) or it is skipped, and why."""

    tp: int
    need: int  # bytes per rank, headroom included
    free: int | None  # bytes free on the tightest rank; None: not a GPU, nothing to check
    reason: str | None = None

    @property
    def runs(self) -> bool:
        return self.reason is None


def decide(needs: dict[int, int], free: int | None) -> list[Fit]:
    """Which TP sizes run, by size: each must need no more than ``free``, and a size above 1
    also needs TP=1 to run (TP=1's tokens and logits are what its validation compares with)."""
    fits = []
    for tp in sorted(needs):
        need, reason = needs[tp], None
        if free is not None and need > free:
            reason = (f"needs ~{need / GIB:.1f} GiB per rank (estimate with "
                      f"{HEADROOM:.0%} + {WORKSPACE_BYTES / GIB:.0f} GiB headroom), "
                      f"{free / GIB:.1f} GiB free")
        elif tp > 1 and 1 in needs and not fits[0].runs:
            reason = "its validation compares with tp=1, which does not fit"
        fits.append(Fit(tp, need, free, reason))
    return fits


def free_bytes(device) -> int | None:
    """Device memory this process can still use (``core.device.gpu_memory``: with
    ``DECODELAB_GPU_MEMORY_GIB``'s limit). None on a CPU."""
    from decodelab.core.device import gpu_memory

    memory = gpu_memory(device)
    return None if memory is None else memory[0]
