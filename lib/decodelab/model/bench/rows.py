"""Result rows of ``bench paged_model``: one frozen dataclass per table, its fields in column
order (``write_table`` adds ``device`` and ``torch_version`` in front). Imports no torch."""

from __future__ import annotations

from dataclasses import dataclass

NAN = float("nan")


@dataclass(frozen=True, slots=True)
class PagedModelRow:
    """Table ``paged_model``: one mode x batch x context. Graph-only columns are NaN in the
    other modes, so every run has one schema; the run's columns (model .. bench_s) are filled
    when the run ends (``dataclasses.replace``)."""

    mode: str  # graph, graph_no_pdl, eager, compile_static, hf_dynamic, hf_static
    batch: int
    context: int  # tokens attended by the step, the new one included
    # Wall time of one decode step of ``batch`` rows (B new tokens; per token is this / B).
    # hf_dynamic/hf_static: (generate's time for N new tokens - for 1) / (N - 1), i.e. one
    # decode step of generate over the same B rows, prefill excluded.
    ms_per_step: float
    device_ms_per_step: float
    host_ms_per_step: float
    tokens_per_s: float
    bytes_per_step: int  # weights read + the K/V attended
    achieved_gb_s: float
    copy_gb_s: float  # device-to-device copy bandwidth measured in the same run
    roofline_fraction: float  # time the bytes need at copy_gb_s / measured step time
    capture_s: float = NAN  # graph only
    graph_mem_mib: float = NAN  # graph only
    bucket: int | float = NAN  # graph only: the captured batch size the step pads to
    compile_s: float = NAN  # compile_static only: torch.compile + CUDA-graph recording
    max_rel_err: float = NAN  # the mode's validation against its reference
    model: str = ""
    dtype: str = ""
    block_size: int = 0
    bench_s: float = NAN

    @classmethod
    def measured(cls, mode: str, batch: int, context: int, wall: float, host: float,
                 device_s: float, nbytes: int, bw: float, **extra) -> PagedModelRow:
        """The row of one timing: seconds per step (wall, host, device) and bytes per step
        against the copy bandwidth ``bw`` (GB/s)."""
        return cls(mode, batch, context, ms_per_step=wall * 1e3,
                   device_ms_per_step=device_s * 1e3, host_ms_per_step=host * 1e3,
                   tokens_per_s=batch / wall, bytes_per_step=nbytes,
                   achieved_gb_s=nbytes / wall / 1e9, copy_gb_s=bw,
                   roofline_fraction=nbytes / (bw * 1e9) / wall, **extra)


@dataclass(frozen=True, slots=True)
class KernelRow:
    """Table ``paged_model_kernels``: one kernel of a batch-1 graph step (profiler), launched
    without programmatic dependent launch, so kernels never overlap."""

    kernel: str
    calls_per_step: float
    us_per_step: float
    batch: int
    context: int
    share: float  # of the step's summed kernel time
    model: str = ""  # the run's (stamped when the bench ends)
    dtype: str = ""


@dataclass(frozen=True, slots=True)
class GemmRow:
    """Table ``paged_model_gemm``: one candidate for one matmul shape at ``rows`` > 1 tokens."""

    n: int
    k: int
    swiglu: bool
    rows: int
    candidate: str  # cublas or skinny_<BLOCK_N>x<BLOCK_K>w<warps>s<stages>
    us: float
    weight_gb_s: float
    chosen: bool  # the candidate the model uses for this shape and row count
    model: str = ""  # the run's (stamped when the bench ends)
    dtype: str = ""


@dataclass(frozen=True, slots=True)
class LinearRow:
    """Table ``paged_model_linear``: one candidate for one batch-1 matmul shape."""

    n: int
    k: int
    swiglu: bool
    candidate: str  # cublas or gemv_<rows>x<cols>w<warps>
    us: float
    weight_gb_s: float
    chosen: bool  # the candidate the model uses for this shape
    model: str = ""  # the run's (stamped when the bench ends)
    dtype: str = ""


# Each table's column units (core.units), the numeric columns of the rows above, which
# plots.tables formats by.
UNITS: dict[str, dict[str, str]] = {
    "paged_model": {"batch": "count", "context": "count", "ms_per_step": "ms",
                    "device_ms_per_step": "ms", "host_ms_per_step": "ms",
                    "tokens_per_s": "tokens/s", "bytes_per_step": "bytes",
                    "achieved_gb_s": "GB/s", "copy_gb_s": "GB/s", "roofline_fraction": "fraction",
                    "capture_s": "s", "graph_mem_mib": "MiB", "bucket": "count",
                    "compile_s": "s", "max_rel_err": "number", "block_size": "count",
                    "bench_s": "s"},
    "paged_model_kernels": {"calls_per_step": "count", "us_per_step": "us", "share": "fraction"},
    "paged_model_gemm": {"n": "count", "k": "count", "rows": "count", "us": "us",
                         "weight_gb_s": "GB/s"},
    "paged_model_linear": {"n": "count", "k": "count", "us": "us", "weight_gb_s": "GB/s"},
}
