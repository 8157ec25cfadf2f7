"""Result rows of ``bench tp``: one frozen dataclass per table, its fields in column order
(``write_table`` adds ``device`` and ``torch_version`` in front). Imports no torch.

Every table ends with ``bench_s`` and ``world_size``, filled by
:func:`decodelab.core.results.stamped` when rank 0 writes the rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

NAN = float("nan")
R = TypeVar("R")  # any row type


@dataclass(frozen=True, slots=True)
class TPChecks:
    """The verdicts of validation before timing, the same on every rank of a group."""

    graph_equals_eager: bool | float = NAN  # free-running greedy tokens; NaN without graphs
    max_rel_err_vs_tp1: float = 0.0  # teacher-forced logits against TP=1's
    tokens_equal_tp1: bool = True  # free-running greedy tokens against TP=1's


@dataclass(frozen=True, slots=True)
class TPRow:
    """Table ``tp``: one model x tp x mode x batch decode step, the slowest rank's times."""

    model: str
    tp: int
    mode: str  # eager or graph
    batch: int
    bucket: int | float  # graph only: the captured batch size the step pads to
    context: int
    dtype: str
    ms_per_step: float  # wall time of one decode step of ``batch`` rows, the slowest rank
    device_ms_per_step: float
    host_ms_per_step: float
    tokens_per_s: float
    ms_no_comm: float  # every collective replaced by a local stand-in (NaN at tp=1)
    comm_ms: float  # ms_per_step - ms_no_comm
    ms_comm_alone: float  # the step's collectives alone
    all_reduces_per_step: int
    all_reduce_bytes: int
    all_gather_bytes: int
    bytes_per_rank: int  # weights + K/V each rank reads per step
    copy_gb_s: float
    roofline_fraction: float
    capture_s: float  # graph only
    graph_mem_mib: float  # graph only
    graph_equals_eager: bool | float
    max_rel_err_vs_tp1: float
    tokens_equal_tp1: bool
    bench_s: float = NAN
    world_size: int = 0


@dataclass(frozen=True, slots=True)
class CollectiveRow:
    """Table ``tp_collectives``: all-reduce latency and bandwidth at one message size."""

    op: str
    mode: str  # eager or graph
    ranks: int
    nbytes: int
    dtype: str
    us_per_op: float
    device_us_per_op: float
    host_us_per_op: float
    algbw_gb_s: float
    busbw_gb_s: float  # nccl-tests' bus bandwidth
    ops_per_sample: int
    samples: int
    bench_s: float = NAN
    world_size: int = 0


@dataclass(frozen=True, slots=True)
class OpTime:
    """One operation of a profiled step on one rank (self times, per step)."""

    rank: int
    op: str
    calls_per_step: float
    host_us_per_step: float
    device_us_per_step: float


@dataclass(frozen=True, slots=True)
class ProfileRow:
    """Table ``tp_profile``: one operation of one TP step on one rank."""

    model: str
    tp: int
    mode: str
    batch: int
    context: int
    rank: int
    op: str
    calls_per_step: float
    host_us_per_step: float
    device_us_per_step: float
    bench_s: float = NAN
    world_size: int = 0

    @classmethod
    def of(cls, model: str, tp: int, mode: str, batch: int, context: int,
           op: OpTime) -> ProfileRow:
        return cls(model, tp, mode, batch, context, op.rank, op.op, op.calls_per_step,
                   op.host_us_per_step, op.device_us_per_step)


@dataclass(frozen=True, slots=True)
class SkipRow:
    """Table ``tp_skipped``: a model x tp configuration left out, and why (``parallel.memory``)."""

    model: str
    tp: int
    need_gib: float  # estimated device memory one rank needs, headroom included
    free_gib: float  # free on the tightest rank when it was decided
    reason: str
    bench_s: float = NAN
    world_size: int = 0



# Each table's column units (core.units), the numeric columns of the rows above, which
# plots.tables formats by.
UNITS: dict[str, dict[str, str]] = {
    "tp": {"tp": "count", "batch": "count", "bucket": "count", "context": "count",
           "ms_per_step": "ms", "device_ms_per_step": "ms", "host_ms_per_step": "ms",
           "tokens_per_s": "tokens/s", "ms_no_comm": "ms", "comm_ms": "ms",
           "ms_comm_alone": "ms", "all_reduces_per_step": "count", "all_reduce_bytes": "bytes",
           "all_gather_bytes": "bytes", "bytes_per_rank": "bytes", "copy_gb_s": "GB/s",
           "roofline_fraction": "fraction", "capture_s": "s", "graph_mem_mib": "MiB",
           "max_rel_err_vs_tp1": "number", "graph_equals_eager": "text", "bench_s": "s",
           "world_size": "count"},
    "tp_collectives": {"ranks": "count", "nbytes": "bytes", "us_per_op": "us",
                       "device_us_per_op": "us", "host_us_per_op": "us", "algbw_gb_s": "GB/s",
                       "busbw_gb_s": "GB/s", "ops_per_sample": "count", "samples": "count"},
    "tp_profile": {"rank": "number", "calls_per_step": "count", "host_us_per_step": "us",
                   "device_us_per_step": "us"},
    "tp_skipped": {"need_gib": "GiB", "free_gib": "GiB"},
}
