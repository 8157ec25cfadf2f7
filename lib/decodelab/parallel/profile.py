"""Where a tensor-parallel step's time goes, per operation, from ``torch.profiler`` on every
rank: host time of each call (e.g. ``c10d::allreduce_``, the process group's host path) and
device time of each kernel (e.g. NCCL's all-reduce kernel, which includes its wait for the
peer). Run last in a process: the profiler's CUDA hooks stay attached and would slow launches
measured after it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.distributed as dist

from decodelab.core.profiler import profile_steps
from decodelab.parallel.group import TPGroup
from decodelab.parallel.rows import OpTime, R


def profile_step(step: Callable[[], object], group: TPGroup, steps: int = 5,
                 warmup: int = 3) -> list[OpTime]:
    """Per operation name: calls, host µs and device µs per step on this rank (self times, so
    nested calls are not counted twice).

    The profiler starts on each rank at its own moment (setting it up takes long), and a
    collective kernel waits on the device until the peer's arrives: recorded from the start,
    that start-up skew would land in one rank's NCCL kernels. So ``warmup`` profiled steps are
    discarded, and the ranks meet at a barrier before the ``steps`` that count."""
    events = profile_steps(step, steps, cuda=group.device.type == "cuda", discard=warmup,
                           meet=group.barrier)
    rows = []
    for e in events.key_averages():
        host = e.self_cpu_time_total
        dev = getattr(e, "self_device_time_total", None)
        if dev is None:
            dev = getattr(e, "self_cuda_time_total", 0.0)
        if host <= 0 and dev <= 0:
            continue
        rows.append(OpTime(group.rank, e.key[:160], calls_per_step=e.count / steps,
                           host_us_per_step=host / steps, device_us_per_step=dev / steps))
    return rows


def gather_rows(group: TPGroup, rows: list[R]) -> list[R]:
    """Every rank's rows on rank 0 (other ranks get an empty list)."""
    if group.size == 1:
        return rows
    out: list = [None] * group.size if group.rank == 0 else None
    dist.gather_object(rows, out, dst=0, group=group.group)
    return [r for part in out for r in part] if group.rank == 0 else []
