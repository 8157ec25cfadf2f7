"""Result rows of ``bench runtime``: one frozen dataclass per table, its fields in column order
(``write_table`` adds ``device`` and ``torch_version`` in front). Imports no torch.

Every table ends with the run's own columns, filled when the run ends by
:func:`decodelab.core.results.stamped` (until then they hold placeholders): ``model``, ``dtype``,
``block_size``, ``graph_tokens_agree`` (validate_engine's fraction of equal tokens) and
``bench_s`` (seconds the whole run took).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from decodelab.engine.metrics import PHASES, RequestRecord

if TYPE_CHECKING:
    from decodelab.engine.bench.step_timing import RunResult
    from decodelab.engine.metrics import StepRecord

NAN = float("nan")
TARGET_RATIO = 1.05  # engine step / bare forward step the engine aims to stay under
TARGET_SAMPLER_SHARE = 0.03  # sampler device time / engine step the sampler aims to stay under


def _us(seconds: float) -> float:
    return seconds * 1e6


@dataclass(frozen=True, slots=True)
class RuntimeRow:
    """Table ``runtime``: steady decode of one variant (the engine, one technique off, or the
    bare forward step)."""

    variant: str
    batch: int
    wall_us: float  # per step, median over chunks
    wall_min_us: float
    wall_max_us: float
    host_us: float
    orchestration_us: float  # host time outside the forward (engine's breakdown)
    sample_phase_us: float
    sync_wait_us: float
    tokens_per_s: float
    ratio_to_bare: float
    sampler_device_us: float  # the sampler alone (runtime_sampler)
    sampler_share: float
    sample_phase_share: float
    device_ops_per_step: float  # profiler; NaN where unavailable
    launches_per_step: float
    target_ratio: float = TARGET_RATIO
    target_sampler_share: float = TARGET_SAMPLER_SHARE
    model: str = ""
    dtype: str = ""
    block_size: int = 0
    graph_tokens_agree: float = NAN
    bench_s: float = NAN

    @classmethod
    def of(cls, variant: str, batch: int, res: RunResult, bare: RunResult,
           sampler_s: float) -> RuntimeRow:
        rec, wall = res.records, res.wall

        def med(phase: str) -> float:
            return _us(statistics.median(getattr(r, phase) for r in rec)) if rec else NAN

        return cls(variant, batch, wall_us=_us(wall), wall_min_us=_us(min(res.walls)),
                   wall_max_us=_us(max(res.walls)), host_us=_us(res.host),
                   orchestration_us=med("host"), sample_phase_us=med("sample"),
                   sync_wait_us=med("sync_wait"), tokens_per_s=batch / wall,
                   ratio_to_bare=wall / bare.wall, sampler_device_us=_us(sampler_s),
                   sampler_share=sampler_s / wall, sample_phase_share=med("sample") * 1e-6 / wall,
                   device_ops_per_step=res.device_ops, launches_per_step=res.launches)


@dataclass(frozen=True, slots=True)
class StepRow:
    """Table ``runtime_steps``: one engine step's breakdown (a column per metrics.PHASES, in
    µs: metrics.PHASE_COLS)."""

    variant: str
    step: int
    batch: int
    bucket: int
    schedule_us: float
    prepare_us: float
    forward_us: float
    sample_us: float
    update_us: float
    emit_us: float
    sync_wait_us: float
    wall_us: float
    host_us: float
    model: str = ""
    dtype: str = ""
    block_size: int = 0
    graph_tokens_agree: float = NAN
    bench_s: float = NAN

    @classmethod
    def of(cls, rec: StepRecord, variant: str) -> StepRow:
        return cls(variant, rec.step, rec.batch, rec.bucket,
                   *(_us(getattr(rec, p)) for p in PHASES), _us(rec.sync_wait), _us(rec.wall),
                   _us(rec.host))


@dataclass(frozen=True, slots=True)
class SamplerRow:
    """Table ``runtime_sampler``: the engine's sample step alone, one selection variant."""

    variant: str
    batch: int
    vocab: int
    k_cand: int  # candidates of partial selection; 0 = full sort
    device_us: float  # kernels back to back (graph replay); NaN if capture failed
    issued_us: float  # CUDA-event time issued op by op
    host_us: float
    partial_vs_sort_agree: float
    model: str = ""
    dtype: str = ""
    block_size: int = 0
    graph_tokens_agree: float = NAN
    bench_s: float = NAN

    @property
    def best_s(self) -> float:
        """Device seconds of this variant: ``device_us``, else the eager-issued time."""
        return (self.issued_us if self.device_us != self.device_us else self.device_us) * 1e-6


@dataclass(frozen=True, slots=True)
class BatchRow:
    """Table ``runtime_batch``: the engine against the bare forward step at one batch."""

    batch: int
    engine_wall_us: float
    bare_wall_us: float
    ratio_to_bare: float
    engine_host_us: float
    orchestration_us: float
    bare_host_us: float
    tokens_per_s: float
    model: str = ""
    dtype: str = ""
    block_size: int = 0
    graph_tokens_agree: float = NAN
    bench_s: float = NAN

    @classmethod
    def of(cls, batch: int, eng: RunResult, bare: RunResult) -> BatchRow:
        return cls(batch, _us(eng.wall), _us(bare.wall), eng.wall / bare.wall, _us(eng.host),
                   _us(statistics.median(r.host for r in eng.records)), _us(bare.host),
                   batch / eng.wall)


@dataclass(frozen=True, slots=True)
class RequestRow(RequestRecord):
    """Table ``runtime_requests``: one request of the Poisson workload: the engine's record of
    it (the fields of ``metrics.RequestRecord``, first), then these columns."""

    ttft_ms: float
    tpot_ms: float
    arrival_rate: float  # requests per second of the workload
    workload_s: float
    throughput_tok_s: float  # the whole workload's tokens per second
    model: str = ""
    dtype: str = ""
    block_size: int = 0
    graph_tokens_agree: float = NAN
    bench_s: float = NAN

    @classmethod
    def of(cls, r: RequestRecord, arrival_rate: float, workload_s: float,
           throughput: float) -> RequestRow:
        return cls(**asdict(r), ttft_ms=r.ttft_s * 1e3, tpot_ms=r.tpot_s * 1e3,
                   arrival_rate=arrival_rate, workload_s=workload_s, throughput_tok_s=throughput)


@dataclass(frozen=True, slots=True)
class ErrorRow:
    """Table ``runtime_errors``: one outcome or error class of the workload, counted."""

    kind: str  # error or outcome
    name: str
    count: int
    model: str = ""
    dtype: str = ""
    block_size: int = 0
    graph_tokens_agree: float = NAN
    bench_s: float = NAN


# Each table's column units (core.units), the numeric columns of the rows above, which
# plots.tables formats by.
UNITS: dict[str, dict[str, str]] = {
    "runtime": {"batch": "count", "wall_us": "us", "wall_min_us": "us", "wall_max_us": "us",
                "host_us": "us", "orchestration_us": "us", "sample_phase_us": "us",
                "sync_wait_us": "us", "tokens_per_s": "tokens/s", "ratio_to_bare": "ratio",
                "sampler_device_us": "us", "sampler_share": "fraction",
                "sample_phase_share": "fraction", "device_ops_per_step": "count",
                "launches_per_step": "count", "target_ratio": "ratio",
                "target_sampler_share": "fraction", "block_size": "count",
                "graph_tokens_agree": "fraction", "bench_s": "s"},
    "runtime_steps": {"step": "count", "bucket": "count", "schedule_us": "us",
                      "prepare_us": "us", "forward_us": "us", "sample_us": "us",
                      "update_us": "us", "emit_us": "us", "emit_excl_wait_us": "us"},
    "runtime_sampler": {"vocab": "count", "k_cand": "count", "device_us": "us",
                        "issued_us": "us", "partial_vs_sort_agree": "fraction"},
    "runtime_batch": {"engine_wall_us": "us", "bare_wall_us": "us", "engine_host_us": "us",
                      "bare_host_us": "us"},
    "runtime_requests": {"prompt_tokens": "count", "output_tokens": "count",
                         "preemptions": "count", "ttft_s": "s", "tpot_s": "s", "e2e_s": "s",
                         "ttft_ms": "ms", "tpot_ms": "ms", "arrival_rate": "req/s",
                         "workload_s": "s", "throughput_tok_s": "tokens/s"},
    "runtime_errors": {"count": "count"},
}
