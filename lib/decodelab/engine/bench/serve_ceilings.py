"""The ceilings ``bench serve`` compares every run with, measured in the same run on the bench's
device, at phase 0's sizes for the profile (``env.calibrate.CalibrationConfig``): the copy
bandwidth (``core.timing.copy_bandwidth_gb_s``: bytes read + written), the read bandwidth (a
sum over the same bytes: decode steps mostly read), and the matmul rate in the model's dtype
(phase 0's own measurement, ``env.calibrate``). The floor uses the higher bandwidth.
"""

from __future__ import annotations

import torch

from decodelab.core.timing import TimingConfig, copy_bandwidth_gb_s, median_times
from decodelab.engine.bench.serve_floor import Ceilings
from decodelab.env.calibrate import CalibrationConfig
from decodelab.env.calibrate import _matmul_timing as matmul_timing  # phase 0's, not a copy


def read_bandwidth_gb_s(device: torch.device, nbytes: int, cfg: TimingConfig) -> float:
    """Bytes read per second / 1e9 by a sum over ``nbytes`` of fp32 (one scalar written)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    out = torch.empty((), dtype=torch.float32, device=device)
    device_s = median_times(lambda: torch.sum(src, dim=0, out=out), device.type == "cuda", cfg)[2]
    return src.numel() * 4 / device_s / 1e9


def measure(device: torch.device, profile: str, dtype: torch.dtype) -> tuple[Ceilings, dict]:
    """(the ceilings the floor uses, every measured value for the log and the config)."""
    cal = CalibrationConfig(profile)
    nbytes, t = cal.copy_mib << 20, cal.timing
    copy = copy_bandwidth_gb_s(device, nbytes, t)
    read = read_bandwidth_gb_s(device, nbytes, t)
    n = cal.matmul_n
    mm = matmul_timing(n, dtype, device.type, t)
    mm_s = (mm.device_stats() if device.type == "cuda" else mm.wall_stats()).median
    tflop_s = 2 * n**3 / mm_s / 1e12
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the buffers' memory back before the KV cache is sized
    best = "read" if read >= copy else "copy"
    measured = dict(copy_gb_s=copy, read_gb_s=read, matmul_tflop_s=tflop_s, matmul_n=n)
    return Ceilings(max(read, copy), tflop_s, best), measured
