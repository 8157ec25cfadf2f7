"""Table ``sampler_kernels`` (GPU): where the fused sampler's device time goes, kernel by
kernel, for each row kind of the sampler grid at a few batches, on the grid's logits.

The profiler records ``KernelsConfig.calls`` calls of ``fused_sampler.sample_step`` after
three warm-up calls, in a fresh process: the profiler (CUPTI) stays attached to the process
that used it and slows every later launch, which would skew the phases timed after it.

Columns: ``kernel`` (a Triton kernel, or a fill of the sampler's zeroed scratch),
``calls`` its launches per sampler call, ``device_us`` its device time per sampler call,
``share`` of the call's kernel time, ``call_us`` that kernel time (the kernels' own time
back to back; the grid's ``device_us`` is a graph replay, launch gaps included).
A kernel a batch's mode leaves out is not in its rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from decodelab.core.profiler import in_fresh_process, kernel_times, profile_steps
from decodelab.core.results import write_table
from decodelab.core.validate import ConfigError, check_choice, check_int, check_int_list
from decodelab.engine.bench.sampler_grid import KINDS, grid_case


@dataclass(frozen=True, slots=True)
class KernelsConfig:
    batches: tuple[int, ...] = (32, 128)
    vocab: int = 128256
    kinds: tuple[str, ...] = (*KINDS, "mix")
    calls: int = 20  # profiled calls per case
    logits_scale: float = 2.0

    def __post_init__(self) -> None:
        check_int_list("KernelsConfig", "batches", self.batches, 1, 4096)
        if not self.kinds:
            raise ConfigError(f"KernelsConfig.kinds={self.kinds!r}: must name a kind")
        for kind in self.kinds:
            check_choice("KernelsConfig", "kinds", kind, (*KINDS, "mix"))
        check_int("KernelsConfig", "vocab", self.vocab, 64)
        check_int("KernelsConfig", "calls", self.calls, 1)


@dataclass(frozen=True, slots=True)
class SamplerKernelRow:
    """Table ``sampler_kernels``: one kernel of the fused sampler on one case."""

    kind: str
    batch: int
    vocab: int
    kernel: str
    calls: float
    device_us: float
    share: float
    call_us: float


def split_rows(kind: str, batch: int, vocab: int, averages: Any, calls: int
               ) -> list[SamplerKernelRow]:
    """Rows from the profiler's averages over ``calls`` sampler calls, the slowest first."""
    times = kernel_times(averages, calls)
    total = sum(us for *_, us in times)
    return [SamplerKernelRow(kind, batch, vocab, name[:120], n, us, us / total, total)
            for name, n, us in times]


def _case(cfg: KernelsConfig, kind: str, batch: int) -> list[SamplerKernelRow]:
    """One kind at one batch: the grid's case, profiled (CUDA)."""
    from decodelab.engine import fused_sampler
    from decodelab.engine.sampler import fused

    dev = torch.device("cuda")
    logits, _, p, mode = grid_case(kind, batch, cfg.vocab, cfg.logits_scale, dev)
    last, out = (torch.zeros(batch, dtype=torch.int64, device=dev) for _ in range(2))
    events = profile_steps(
        lambda: fused_sampler.sample_step(logits, p, fused(mode), None, last, out),
        cfg.calls, cuda=True, cpu=False, warmup=3)
    return split_rows(kind, batch, cfg.vocab, events.key_averages(), cfg.calls)


def _profile(cfg: KernelsConfig) -> list[SamplerKernelRow]:
    """Child-process body of :func:`kernel_rows`."""
    rows = []
    for kind in cfg.kinds:
        for batch in cfg.batches:
            case = _case(cfg, kind, batch)
            rows += case
            slowest = f", the slowest {case[0].kernel} {case[0].device_us:.0f} us" if case else ""
            print(f"[bench] sampler_kernels: {kind} batch {batch}: "
                  f"{sum(r.device_us for r in case):.0f} us of kernels{slowest}", flush=True)
    return rows


def kernel_rows(cfg: KernelsConfig) -> list[SamplerKernelRow]:
    """:func:`_profile` in a fresh process."""
    return in_fresh_process(_profile, cfg)


def write_kernels(out_dir: Path, profile: str, cfg: KernelsConfig | None = None) -> list[Path]:
    """Profile the fused sampler (CUDA) and write table ``sampler_kernels``."""
    cfg = cfg or KernelsConfig()
    rows = kernel_rows(cfg)
    return [write_table("sampler_kernels", rows, out_dir=out_dir, config=cfg, profile=profile)]
