"""The collectives' own cost: an all-reduce sweep over message sizes (eager and in a CUDA graph),
and the exact set of collectives one tensor-parallel decode step issues, timed alone.

Bus bandwidth follows nccl-tests' convention for all-reduce: algbw = bytes / time, busbw =
algbw x 2 (n - 1) / n, the rate each link carries, comparable across rank counts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from decodelab.core.capture import capture, warm_up
from decodelab.core.timing import TimingConfig, median_times
from decodelab.core.validate import ConfigError
from decodelab.parallel.group import TPGroup
from decodelab.parallel.rows import CollectiveRow


def bus_bandwidth_gb_s(nbytes: int, seconds: float, ranks: int) -> float:
    """All-reduce bus bandwidth in GB/s (nccl-tests' busbw)."""
    return nbytes / seconds / 1e9 * 2 * (ranks - 1) / ranks


def group_max(group: TPGroup, value: float) -> float:
    """The largest of every rank's ``value`` (so a table row is the slowest rank's figure)."""
    if group.size == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=group.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group.group)
    return float(t.item())


def check_all_reduce(group: TPGroup, numel: int, dtype: torch.dtype) -> None:
    """One all-reduce of rank-valued data must give the exact sum (small integers are exact)."""
    x = torch.full((numel,), float(group.rank + 1), dtype=dtype, device=group.device)
    group.all_reduce(x)
    want = group.size * (group.size + 1) / 2
    if not bool((x == want).all()):
        raise AssertionError(f"all-reduce of {numel} x {dtype} gave {x.float().min().item()}"
                             f"..{x.float().max().item()}, expected {want} everywhere")


@dataclass(frozen=True, slots=True)
class CollectiveTiming:
    wall_s: float  # per collective, median over samples, slowest rank
    device_s: float
    host_s: float


def time_ops(group: TPGroup, ops: Callable[[], None], refill: Callable[[], None], n_ops: int,
             mode: str, samples: int, warmup: int = 3) -> CollectiveTiming:
    """Seconds per collective of ``ops`` (which issues ``n_ops`` of them), eager or replayed from
    one CUDA graph. Before each sample, untimed, ``refill`` restores the input (repeated sums of
    the same buffer never overflow, and never time zeros) and the ranks meet at a barrier."""
    if mode not in ("eager", "graph"):
        raise ConfigError(f"collective timing mode={mode!r}: must be 'eager' or 'graph'")
    cuda = group.device.type == "cuda"
    if mode == "graph":
        if not cuda:
            raise ConfigError("collective timing mode='graph': needs CUDA devices")
        warm_up(ops, 1)
        graph, _ = capture(ops)
        run = graph.replay
    else:
        run = ops
    cfg = TimingConfig(warmup=warmup, repeats=samples, inner=1)

    def before_each() -> None:
        refill()
        group.barrier()

    wall, host, dev = median_times(run, cuda, cfg, before_each=before_each)
    return CollectiveTiming(*(group_max(group, v / n_ops) for v in (wall, dev, host)))


def all_reduce_sweep(group: TPGroup, sizes_bytes: tuple[int, ...], modes: tuple[str, ...],
                     dtype: torch.dtype, ops_per_sample: int, samples: int
                     ) -> list[CollectiveRow]:
    """One row per (message size, mode): latency per all-reduce and bus bandwidth."""
    rows = []
    esize = torch.tensor([], dtype=dtype).element_size()
    gen = torch.Generator(device=group.device).manual_seed(group.rank)
    for nbytes in sizes_bytes:
        numel = max(1, nbytes // esize)
        check_all_reduce(group, numel, dtype)
        src = (torch.randn(numel, generator=gen, device=group.device) * 1e-3).to(dtype)
        buf = src.clone()

        def ops(buf=buf):
            for _ in range(ops_per_sample):
                group.all_reduce(buf)

        for mode in modes:
            t = time_ops(group, ops, lambda buf=buf, src=src: buf.copy_(src), ops_per_sample,
                         mode, samples)
            rows.append(CollectiveRow(
                "all_reduce", mode, group.size, numel * esize, str(dtype).removeprefix("torch."),
                us_per_op=t.wall_s * 1e6, device_us_per_op=t.device_s * 1e6,
                host_us_per_op=t.host_s * 1e6, algbw_gb_s=numel * esize / t.wall_s / 1e9,
                busbw_gb_s=bus_bandwidth_gb_s(numel * esize, t.wall_s, group.size),
                ops_per_sample=ops_per_sample, samples=samples))
        del src, buf
    return rows


@dataclass(frozen=True, slots=True)
class StepMessages:
    """The collectives of one decode step of ``batch`` rows: ``all_reduces`` of (batch, hidden)
    (the embedding, then o and down per layer) and one all-gather of (batch, vocab / ranks)."""

    batch: int
    hidden: int
    vocab_shard: int
    all_reduces: int
    dtype: torch.dtype

    @property
    def all_reduce_bytes(self) -> int:
        return self.batch * self.hidden * torch.tensor([], dtype=self.dtype).element_size()

    @property
    def all_gather_bytes(self) -> int:
        """Bytes each rank contributes to the logits' all-gather."""
        return self.batch * self.vocab_shard * torch.tensor([], dtype=self.dtype).element_size()


def step_collectives(group: TPGroup, msgs: StepMessages) -> tuple[Callable[[], None],
                                                                  Callable[[], None]]:
    """(ops, refill): the step's collectives alone, in the step's order, on static buffers."""
    gen = torch.Generator(device=group.device).manual_seed(group.rank)
    src = torch.randn((msgs.batch, msgs.hidden), generator=gen, device=group.device).to(msgs.dtype)
    hidden = src.clone()
    logits = torch.randn((msgs.batch, msgs.vocab_shard), generator=gen,
                         device=group.device).to(msgs.dtype)

    def ops() -> None:
        for _ in range(msgs.all_reduces):
            group.all_reduce(hidden)
        group.all_gather_last(logits)

    return ops, lambda: hidden.copy_(src)
