"""What one serving run recorded (:class:`RunTrace`) and the rows of ``bench serve``'s tables,
computed from it: ``serve_offline``, ``serve_online`` and ``serve_steps``. Imports no torch.

Per run: output tokens/s and total (prompt + output) tokens/s over its duration (first
submission to the last token, the device synchronised), requests/s; TTFT and TPOT percentiles
from the engine's own records (``metrics.RequestRecord``), inter-token latency percentiles over
every gap between two tokens of one request as its callback saw them; ``busy_s``, the steps'
wall time (the duration less the time the loop sat idle waiting for arrivals); the floor, the
sum of its steps' (:mod:`.serve_floor`), and ``ratio_to_floor`` = busy_s / floor_s. The tail:
``decode_step_ms`` (the median decode-only step), ``itl_p99_x_decode`` (inter-token latency p99
over it) and ``steps_over_3x`` (steps over 3x their kind's median), each step by its own time
(``StepTrace.own_s``: its device time on a GPU); ``jit_compiles``, the Triton kernels
specialised during the run (after the warm-up a cold shape: ``core.jit_watch``), and the
engine's ``token_budget``.

Every table ends with the run's own columns, filled when the bench ends by
:func:`decodelab.core.results.stamped`: ``model``, ``dtype``, ``block_size``, ``bench_s``, and in
the run tables also the engine's size (``max_num_seqs``, ``kv_blocks``) and the measured
ceilings the floor used (``gb_s`` with ``bandwidth``: read or copy, ``tflop_s``).
"""

from __future__ import annotations

from dataclasses import dataclass

from decodelab.engine.bench.serve_floor import StepFloor, StepWork
from decodelab.engine.bench.serve_stats import TTFT_LIMIT_S, gaps, over_median, percentiles
from decodelab.engine.metrics import RequestRecord

NAN = float("nan")


@dataclass(frozen=True, slots=True)
class StepTrace:
    work: StepWork
    bucket: int  # decode rows after padding to the graph bucket (the engine's StepRecord)
    wall_s: float  # this step's start to the next one's (or to the loop going idle)
    floor: StepFloor
    gc_s: float  # garbage collection that started within the step (core.gc_pauses)
    # the engine's own split of the call (its StepRecord): host time issuing the step (plan,
    # inputs, forward, sampler, output copy), and time blocked on the device for the step
    # before's tokens. A step whose wall is mostly ``issue_s`` is bound by its host launch.
    issue_s: float = NAN
    wait_s: float = NAN
    # the device time of the step's own work (the engine's device clock; NaN on a CPU): with
    # async output a step that issues a large prefill returns at once, and its wall time lands
    # in the step after it, which waits for it; ``device_s`` charges it to its own step
    device_s: float = NAN

    @property
    def own_s(self) -> float:
        """The step's own time: its device time where measured, else its wall time."""
        return self.device_s if self.device_s == self.device_s else self.wall_s


@dataclass(frozen=True, slots=True)
class RunTrace:
    requests: tuple[RequestRecord, ...]
    token_times: tuple[tuple[float, ...], ...]  # per request: perf_counter at each token
    steps: tuple[StepTrace, ...]
    duration_s: float
    gc_pauses: int  # collections during the run, after its heap was frozen
    gc_s: float
    gc_longest_s: float
    token_budget: int = 0  # the engine's max_num_batched_tokens
    jit_compiles: int | None = None  # Triton specialisations made during the run (None: unwatched)


def _ms(values) -> tuple[float, ...]:
    return tuple(v * 1e3 for v in percentiles(values))


@dataclass(frozen=True, slots=True)
class ServeRunRow:
    """The columns every run has (module docstring); latencies in ms."""

    variant: str  # the engine's configuration (ServeBenchConfig.variants)
    run: str
    workload: str
    requests: int
    finished: int
    preemptions: int
    prompt_tokens: int
    output_tokens: int
    duration_s: float
    busy_s: float
    steps: int
    output_tok_s: float
    total_tok_s: float
    request_rate: float  # requests completed per second of the duration
    ttft_p50_ms: float
    ttft_p90_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p90_ms: float
    tpot_p99_ms: float
    itl_p50_ms: float
    itl_p90_ms: float
    itl_p99_ms: float
    floor_s: float
    ratio_to_floor: float
    floor_output_tok_s: float  # output tokens / floor_s: the throughput at the floor
    gc_pauses: int  # garbage collections during the run (its heap frozen before it)
    gc_ms: float  # their total
    gc_longest_ms: float
    decode_step_ms: float  # the median own time (StepTrace.own_s) of the decode-only steps
    itl_p99_x_decode: float  # itl_p99_ms / decode_step_ms: the tail against a bare step
    steps_over_3x: int  # steps over 3x the median own time of their kind (StepWork.kind)
    jit_compiles: float  # Triton specialisations during the run (NaN: not watched)
    token_budget: int  # the engine's max_num_batched_tokens

    @staticmethod
    def columns(variant: str, run: str, workload: str, trace: RunTrace) -> dict:
        reqs, dur = trace.requests, trace.duration_s
        out = sum(r.output_tokens for r in reqs)
        busy = sum(s.wall_s for s in trace.steps)
        floor = sum(s.floor.s for s in trace.steps)
        itl = [g for times in trace.token_times for g in gaps(times)]
        itl_ms = _ms(itl)
        medians, over = over_median([s.work.kind for s in trace.steps],
                                    [s.own_s for s in trace.steps])
        decode_ms = medians.get("decode", NAN) * 1e3
        return dict(
            variant=variant, run=run, workload=workload, requests=len(reqs),
            finished=sum(r.status == "finished" for r in reqs),
            preemptions=sum(r.preemptions for r in reqs),
            prompt_tokens=sum(r.prompt_tokens for r in reqs), output_tokens=out,
            duration_s=dur, busy_s=busy, steps=len(trace.steps), output_tok_s=out / dur,
            total_tok_s=(out + sum(r.prompt_tokens for r in reqs)) / dur,
            request_rate=len(reqs) / dur,
            **dict(zip(("ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms"),
                       _ms(r.ttft_s for r in reqs), strict=True)),
            **dict(zip(("tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms"),
                       _ms(r.tpot_s for r in reqs), strict=True)),
            **dict(zip(("itl_p50_ms", "itl_p90_ms", "itl_p99_ms"), itl_ms, strict=True)),
            floor_s=floor, ratio_to_floor=busy / floor if floor > 0 else NAN,
            floor_output_tok_s=out / floor if floor > 0 else NAN,
            gc_pauses=trace.gc_pauses, gc_ms=trace.gc_s * 1e3,
            gc_longest_ms=trace.gc_longest_s * 1e3, decode_step_ms=decode_ms,
            itl_p99_x_decode=itl_ms[-1] / decode_ms if decode_ms > 0 else NAN,
            steps_over_3x=over,
            jit_compiles=NAN if trace.jit_compiles is None else trace.jit_compiles,
            token_budget=trace.token_budget)


@dataclass(frozen=True, slots=True)
class OfflineRow(ServeRunRow):
    """Table ``serve_offline``: one workload submitted at once (nano-vllm's, long prompts).
    ``capture_s``/``graph_mem_mib``: the decode and prefill graphs' capture (NaN without);
    ``prefill_buckets``: the token buckets prefill replays graphs of (0: every prefill eager);
    ``warmup_s``: the variant's warm-up run (its step graphs captured on first use)."""

    capture_s: float = NAN
    graph_mem_mib: float = NAN
    prefill_buckets: int = 0
    warmup_s: float = NAN
    model: str = ""
    dtype: str = ""
    block_size: int = 0
    max_num_seqs: int = 0
    kv_blocks: int = 0
    gb_s: float = NAN
    bandwidth: str = ""
    tflop_s: float = NAN
    bench_s: float = NAN

    @classmethod
    def of(cls, variant: str, workload: str, trace: RunTrace, *, capture_s: float,
           graph_mem_mib: float, prefill_buckets: int, warmup_s: float) -> OfflineRow:
        return cls(**ServeRunRow.columns(variant, workload, workload, trace),
                   capture_s=capture_s, graph_mem_mib=graph_mem_mib,
                   prefill_buckets=prefill_buckets, warmup_s=warmup_s)


@dataclass(frozen=True, slots=True)
class OnlineRow(ServeRunRow):
    """Table ``serve_online``: Poisson arrivals at ``offered_rate`` = ``rate_fraction`` x the
    offline request rate (requests/s); ``request_rate`` is the rate achieved.
    ``rate_ttft_p99_over_limit``: the lowest offered rate of this variant's sweep whose TTFT
    p99 exceeds ``ttft_limit_s`` (NaN: none did), the same in each of its rows."""

    rate_fraction: float = NAN
    offered_rate: float = NAN
    arrival_span_s: float = NAN
    ttft_limit_s: float = TTFT_LIMIT_S
    rate_ttft_p99_over_limit: float = NAN
    model: str = ""
    dtype: str = ""
    block_size: int = 0
    max_num_seqs: int = 0
    kv_blocks: int = 0
    gb_s: float = NAN
    bandwidth: str = ""
    tflop_s: float = NAN
    bench_s: float = NAN

    @classmethod
    def of(cls, variant: str, workload: str, trace: RunTrace, *, rate_fraction: float,
           offered_rate: float, arrival_span_s: float) -> OnlineRow:
        return cls(**ServeRunRow.columns(variant, run_name(workload, rate_fraction), workload,
                                         trace),
                   rate_fraction=rate_fraction, offered_rate=offered_rate,
                   arrival_span_s=arrival_span_s)


def run_name(workload: str, rate_fraction: float | None = None) -> str:
    """``offline``, or ``online@0.5x`` for an online run at half the offline request rate."""
    return workload if rate_fraction is None else f"{workload}@{rate_fraction:g}x"


@dataclass(frozen=True, slots=True)
class ServeStepRow:
    """Table ``serve_steps``: one engine step of a run: what it computed, its wall time and
    its floor (``bound``: bytes or flops, whichever sets the larger part of it)."""

    variant: str
    run: str
    step: int  # within the run
    kind: str  # decode, prefill, mixed, emit (StepWork.kind)
    decode_rows: int
    bucket: int
    prefill_rows: int
    prefill_tokens: int
    context_tokens: int  # tokens the decode rows attended, summed
    wall_ms: float
    floor_ms: float
    bound: str
    gc_ms: float  # garbage collection within the step's wall time
    issue_ms: float  # host time issuing the step (StepTrace.issue_s)
    wait_ms: float  # blocked on the device for the step before's tokens (StepTrace.wait_s)
    device_ms: float  # the device time of the step's own work (StepTrace.device_s)
    model: str = ""
    dtype: str = ""
    block_size: int = 0
    bench_s: float = NAN

    @classmethod
    def of(cls, variant: str, run: str, step: int, s: StepTrace) -> ServeStepRow:
        w = s.work
        # to 0.1 µs: tens of thousands of steps per GPU run, and no clock resolves finer
        return cls(variant, run, step, w.kind, w.decode_rows, s.bucket, w.prefill_rows,
                   w.prefill_tokens, w.decode_context, round(s.wall_s * 1e3, 4),
                   round(s.floor.s * 1e3, 4), s.floor.bound, round(s.gc_s * 1e3, 4),
                   round(s.issue_s * 1e3, 4), round(s.wait_s * 1e3, 4),
                   round(s.device_s * 1e3, 4))
