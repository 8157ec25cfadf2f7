"""The ceilings ``bench serve`` compares every run with, measured in the same run on the bench's
device, at phase 0's sizes for the profile (``env.calibrate.CalibrationConfig``): the copy
bandwidth (``core.timing.copy_bandwidth_gb_s``: bytes read + written), the read ceiling (the
fastest read-only stream over the same bytes: decode steps mostly read) and the matmul rate in
the model's dtype (both phase 0's own measurements, ``env.calibrate``). The floor uses the
higher bandwidth.
"""

from __future__ import annotations

import torch

from decodelab.core.timing import copy_bandwidth_gb_s
from decodelab.engine.bench.serve_floor import Ceilings
from decodelab.env.calibrate import (  # phase 0's own measurements
    CalibrationConfig,
    matmul_timing,
    read_ceiling_rate,
)


def measure(device: torch.device, profile: str, dtype: torch.dtype) -> tuple[Ceilings, dict]:
    """(the ceilings the floor uses, every measured value for the log and the config)."""
    cal = CalibrationConfig(profile)
    nbytes, t = cal.copy_mib << 20, cal.timing
    copy = copy_bandwidth_gb_s(device, nbytes, t)
    timing, nread, _ = read_ceiling_rate(nbytes, device.type, t)
    read_s = (timing.device_stats() if device.type == "cuda" else timing.wall_stats()).median
    read = nread / read_s / 1e9
    n = cal.matmul_n
    mm = matmul_timing(n, dtype, device.type, t)
    mm_s = (mm.device_stats() if device.type == "cuda" else mm.wall_stats()).median
    tflop_s = 2 * n**3 / mm_s / 1e12
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the buffers' memory back before the KV cache is sized
    best = "read" if read >= copy else "copy"
    measured = dict(copy_gb_s=copy, read_gb_s=read, matmul_tflop_s=tflop_s, matmul_n=n)
    return Ceilings(max(read, copy), tflop_s, best), measured
