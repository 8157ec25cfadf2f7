"""The ceilings every figure is compared to (phase 0).

``calibrate()`` measures: on a GPU, host launch latency of a tiny kernel, device-to-device copy
bandwidth (bytes read + written), the read ceiling (the fastest read-only stream over the same
bytes, :mod:`decodelab.env.read_stream`: bytes read per second, what a read-dominated kernel
such as a decode step's weight and K/V reads can reach), host<->device bandwidth, bf16 and fp32 matmul rate; on a CPU, per-op dispatch overhead,
memory copy bandwidth, memory read bandwidth and fp32 matmul rate.

A copy moves every byte twice (a read and a write) over the same memory, so a read-only stream
can beat the copy rate: floors of read-dominated work use the read ceiling
(:mod:`decodelab.env.ceilings` picks it, and says so where only the copy rate was measured).

On a shared machine the CPU figures move with the load of other processes (a few-fold on a
busy 2-core host): :func:`spread_warning` flags a calibration whose quartiles lie far apart.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from decodelab.core.device import has_cuda
from decodelab.core.profiles import measured_device
from decodelab.core.timing import Timing, TimingConfig, device_sync, summarize, time_cuda, time_host
from decodelab.core.validate import check_choice


@dataclass(frozen=True, slots=True)
class CalibrationConfig:
    """Sizes of the calibration measurements. ``profile`` picks defaults: smoke, cpu or gpu."""

    profile: str = "cpu"

    def __post_init__(self) -> None:
        check_choice("CalibrationConfig", "profile", self.profile, ("smoke", "cpu", "gpu"))

    @classmethod
    def for_profile(cls, profile: str) -> CalibrationConfig:
        """The sizes a run of ``profile`` calibrates at: ``smoke``'s smallest, else those of
        the device :func:`calibrate` measures (the GPU wherever one is visible: the ceilings
        are the machine's, whatever the profile). ``gpu`` without CUDA is refused
        (:func:`~decodelab.core.profiles.measured_device`)."""
        measured_device(profile)
        if profile == "smoke":
            return cls("smoke")
        return cls("gpu" if has_cuda() else "cpu")

    @property
    def copy_mib(self) -> int:
        return {"smoke": 16, "cpu": 256, "gpu": 2048}[self.profile]

    @property
    def matmul_n(self) -> int:
        return {"smoke": 256, "cpu": 1024, "gpu": 8192}[self.profile]

    @property
    def timing(self) -> TimingConfig:
        return {"smoke": TimingConfig(warmup=1, repeats=3, inner=2),
                "cpu": TimingConfig(warmup=2, repeats=7, inner=3),
                "gpu": TimingConfig(warmup=3, repeats=15, inner=5)}[self.profile]


@dataclass(frozen=True, slots=True)
class Calibration:
    """One ceiling: ``value`` is the median; the other columns summarise the repeats."""

    quantity: str
    unit: str
    value: float
    q1: float
    q3: float
    ci_low: float
    ci_high: float
    n: int
    backend: str
    detail: str


def _row(quantity: str, unit: str, samples: tuple[float, ...], convert, backend: str,
         detail: str) -> Calibration:
    values = [convert(s) for s in samples]
    st = summarize(values)
    return Calibration(quantity, unit, st.median, st.q1, st.q3, st.ci_low, st.ci_high, st.n,
                       backend, detail)


def _tiny_op_timing(device: str, cfg: TimingConfig) -> Timing:
    x = torch.ones(1, device=device)
    inner = TimingConfig(cfg.warmup * 100, cfg.repeats, 1000)
    if device == "cuda":
        return time_host(lambda: x.add_(1.0), inner, sync=device_sync)
    return time_host(lambda: x.add_(1.0), inner)


def _copy_rate(n_bytes: int, device: str, cfg: TimingConfig) -> tuple[Timing, int]:
    n = n_bytes // 4
    src = torch.rand(n, device=device)
    dst = torch.empty_like(src)
    fn = lambda: dst.copy_(src)  # noqa: E731
    t = time_cuda(fn, cfg) if device == "cuda" else time_host(fn, cfg)
    return t, 2 * n * 4  # bytes read + bytes written


def read_rate(n_bytes: int, device: str, cfg: TimingConfig) -> tuple[Timing, int]:
    """A reduction over ``n_bytes`` of fp32: it reads every byte once and writes one number."""
    src = torch.rand(n_bytes // 4, device=device)
    out = torch.empty((), device=device)
    fn = lambda: torch.sum(src, dim=0, out=out)  # noqa: E731
    t = time_cuda(fn, cfg) if device == "cuda" else time_host(fn, cfg)
    return t, src.numel() * 4


def read_ceiling_rate(n_bytes: int, device: str, cfg: TimingConfig
                      ) -> tuple[Timing, int, str]:
    """The read ceiling's measurement: on a GPU the fastest read-only stream
    (:func:`decodelab.env.read_stream.best_read_rate`), on a CPU the sum of :func:`read_rate`;
    its timing, the bytes read and what gave it."""
    if device != "cuda":
        return (*read_rate(n_bytes, device, cfg), "torch.sum")
    from decodelab.env.read_stream import best_read_rate  # Triton: imported on a GPU only

    return best_read_rate(n_bytes, cfg)


def matmul_timing(n: int, dtype: torch.dtype, device: str, cfg: TimingConfig) -> Timing:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    fn = lambda: torch.matmul(a, b, out=out)  # noqa: E731
    return time_cuda(fn, cfg) if device == "cuda" else time_host(fn, cfg)


def calibrate(cfg: CalibrationConfig = CalibrationConfig()) -> list[Calibration]:
    """Measure this machine's ceilings (GPU ones when CUDA is present, else CPU ones)."""
    rows: list[Calibration] = []
    t = cfg.timing
    if not has_cuda():
        tiny = _tiny_op_timing("cpu", t)
        rows.append(_row("op_dispatch_overhead", "us", tiny.host, lambda s: s * 1e6, "cpu",
                         "host CPU time per tiny torch op (x.add_ on 1 element)"))
        copy, nbytes = _copy_rate(cfg.copy_mib << 20, "cpu", t)
        rows.append(_row("memory_copy_bandwidth", "GB/s", copy.wall, lambda s: nbytes / s / 1e9,
                         "cpu", f"fp32 copy of {cfg.copy_mib} MiB, bytes read + written"))
        read, nread = read_rate(cfg.copy_mib << 20, "cpu", t)
        rows.append(_row("memory_read_bandwidth", "GB/s", read.wall, lambda s: nread / s / 1e9,
                         "cpu", f"sum over {cfg.copy_mib} MiB of fp32, bytes read"))
        n = cfg.matmul_n
        mm = matmul_timing(n, torch.float32, "cpu", t)
        rows.append(_row("matmul_fp32", "TFLOP/s", mm.wall, lambda s: 2 * n**3 / s / 1e12, "cpu",
                         f"{n}x{n}x{n} fp32, {torch.get_num_threads()} threads"))
        return rows

    tiny = _tiny_op_timing("cuda", t)
    rows.append(_row("launch_host", "us", tiny.host, lambda s: s * 1e6, "cuda",
                     "host CPU time to issue one tiny kernel (x.add_ on 1 element)"))
    rows.append(_row("launch_wall", "us", tiny.wall, lambda s: s * 1e6, "cuda",
                     "wall time per tiny kernel, back to back, one sync per 1000"))
    copy, nbytes = _copy_rate(cfg.copy_mib << 20, "cuda", t)
    rows.append(_row("d2d_copy_bandwidth", "GB/s", copy.device, lambda s: nbytes / s / 1e9,
                     "cuda", f"device copy of {cfg.copy_mib} MiB, bytes read + written"))
    read, nread, how = read_ceiling_rate(cfg.copy_mib << 20, "cuda", t)
    rows.append(_row("read_bandwidth", "GB/s", read.device, lambda s: nread / s / 1e9, "cuda",
                     f"fastest read of {nread >> 20} MiB in device memory ({how}), "
                     "bytes read"))
    for direction in ("h2d", "d2h"):
        rows.append(_host_copy_row(direction, cfg))
    n = cfg.matmul_n
    for dtype, name in ((torch.bfloat16, "matmul_bf16"), (torch.float32, "matmul_fp32")):
        prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False  # plain fp32, not the tf32 tensor-core path
        try:
            mm = matmul_timing(n, dtype, "cuda", t)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = prev
        rows.append(_row(name, "TFLOP/s", mm.device, lambda s, n=n: 2 * n**3 / s / 1e12, "cuda",
                         f"{n}x{n}x{n} {str(dtype).removeprefix('torch.')}, random inputs"))
    return rows


def _host_copy_row(direction: str, cfg: CalibrationConfig) -> Calibration:
    n = (cfg.copy_mib << 20) // 4 // 4
    host = torch.rand(n).pin_memory()
    dev = torch.empty(n, device="cuda")
    if direction == "h2d":
        fn = lambda: dev.copy_(host, non_blocking=True)  # noqa: E731
    else:
        fn = lambda: host.copy_(dev, non_blocking=True)  # noqa: E731
    timing = time_cuda(fn, cfg.timing)
    return _row(f"{direction}_bandwidth", "GB/s", timing.device, lambda s: n * 4 / s / 1e9, "cuda",
                f"pinned {direction} copy of {n * 4 >> 20} MiB")


def ceiling(rows, quantity: str) -> float:
    """The median value of one calibration (rows from :func:`calibrate` or a loaded table)."""
    import pandas as pd

    from decodelab.core.results import to_frame

    frame = rows if isinstance(rows, pd.DataFrame) else to_frame(rows)
    match = frame[frame["quantity"] == quantity]
    if match.empty:
        raise KeyError(f"no calibration {quantity!r}; have {sorted(frame['quantity'].unique())}")
    return float(match["value"].iloc[-1])


SPREAD_LIMIT = 1.5  # third / first quartile beyond which a calibration is flagged


def spread_warning(rows) -> list[str]:
    """One line per calibration whose third quartile is more than :data:`SPREAD_LIMIT` times its
    first (rows from :func:`calibrate` or a loaded table): the machine's load moved it."""
    import pandas as pd

    from decodelab.core.results import to_frame

    frame = rows if isinstance(rows, pd.DataFrame) else to_frame(rows)
    wide = frame[(frame["q1"] > 0) & (frame["q3"] > SPREAD_LIMIT * frame["q1"])]
    return [f"{r.quantity}: its quartiles span {r.q3 / r.q1:.1f}x ({r.q1:.3g} to {r.q3:.3g} "
            f"{r.unit})" for r in wide.itertuples()]
