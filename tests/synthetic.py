"""Synthetic phase tables with known layer terms (µs per step), for the report's tests.

The numbers are chosen, not measured: each regime's terms are listed in :data:`KNOWN` and the
tables are built so that the definitions of :mod:`decodelab.analysis.regimes` recover exactly them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

ORIGIN = "reference/h200"
K_VALUES = (1, 2, 4, 8, 16, 32, 64)
T_STEP_INF, T_REPLAY = 15.0, 5.0  # multi-step fit: wall per step = 15 + 5 / K
BUSY = 12.0  # GPU-busy per toy step
REPLAY_FIXED, REPLAY_NODE = 4.0, 0.5  # replay_nodes graph: wall = 4 + 0.5 n
BARRIERS, BARRIER_US = 5, 0.02
# Paged model, graph mode, context 512: batch -> (wall, device span) in ms; kernels at batch 1.
MODEL = {1: (2.0, 1.99), 32: (2.5, 2.49)}
KERNELS_US = (1500.0, 450.0)
COPY_GB_S, HF_MS = 1000.0, 20.0  # copy bandwidth of the run; transformers' ms per step


def model_bytes(batch: int, context: int) -> float:
    """Bytes a model step moves: 1 GB of weights and 10 kB of K/V per token attended."""
    return 1e9 + batch * context * 1e4
# Tensor parallel (two GPUs, folder h200x2), graph mode, batch 1, context 512, in ms.
TP_ORIGIN = "reference/h200x2"
TP_WALL, TP_SPAN, TP_COMM = 1.5, 1.49, 0.4

KNOWN = {
    "eager": {"dispatch": 48.0, "compute": BUSY},
    "graph": {"replay": 5.0, "node": T_STEP_INF - BUSY, "compute": BUSY},
    "multi-step graph": {"replay": T_REPLAY / 64, "node": T_STEP_INF - BUSY, "compute": BUSY},
    "persistent kernel": {"node": BARRIERS * BARRIER_US, "compute": 0.4 - BARRIERS * BARRIER_US},
    "runtime loop": {"orchestration": 200.0, "compute": 2500.0},
    "transformer decode, eager": {"dispatch": 9000.0 - 1990.0, "compute": 1990.0},
    "transformer decode": {"replay": 10.0, "node": 1990.0 - sum(KERNELS_US),
                           "compute": sum(KERNELS_US)},
    "tensor parallel": {"replay": 10.0, "comm": 400.0, "compute": 1090.0},
}


def _dispatch_row(mode: str, wall: float, host: float, busy: float) -> dict:
    return {"mode": mode, "config": "ultra-light", "hidden": 64, "layers": 4, "batch": 1,
            "backend": "cuda", "wall_us_per_step": wall, "wall_us_q1": wall * 0.95,
            "wall_us_q3": wall * 1.05, "host_us_per_step": host, "device_us_per_step": busy}


def tables(busy_graph: float = BUSY) -> dict[str, pd.DataFrame]:
    """name -> DataFrame (with ``origin``) of every phase table."""
    multistep = [{"config": "ultra-light", "variant": v, "k_steps": k,
                  "wall_us_per_step": T_STEP_INF + T_REPLAY / k + (0 if v == "none" else 30 / k),
                  "wall_us_per_step_q1": T_STEP_INF, "wall_us_per_step_q3": T_STEP_INF + 6}
                 for v in ("none", "readout") for k in K_VALUES]
    nodes = [{"kind": kind, "n_kernels": n,
              "wall_us": (REPLAY_FIXED + REPLAY_NODE * n) if kind == "graph" else 3.0 * n,
              "host_us": 2.0 + 0.01 * n if kind == "graph" else 2.9 * n}
             for kind in ("graph", "eager") for n in (1, 2, 4, 8, 16, 32)]
    persistent = [{"variant": v, "hidden": h, "layers": 4, "batch": 1, "us_per_step": us,
                   "us_per_step_q1": us * 0.9, "us_per_step_q3": us * 1.1,
                   "steps_per_s": 1e6 / us, "barriers_per_step": BARRIERS if v != "graph_k1" else 0,
                   "barrier_us": {"block": BARRIER_US, "grid": 0.5}.get(v, math.nan)}
                  for v, h, us in (("block", 64, 0.4), ("grid", 64, 0.9), ("block", 256, 1.5),
                                   ("grid", 256, 2.5), ("graph_k1", 64, 0.01),
                                   ("block_v2", 64, math.nan), ("grid_v2", 64, 0.05))]
    for row in persistent:  # a failed variant is recorded untimed; one timed but not validated
        row["validated"] = row["variant"] not in ("block_v2", "grid_v2")
    model = [{"model": "llama-3.2-1b", "mode": m, "batch": b, "context": c, "ms_per_step": wall,
              "device_ms_per_step": span, "tokens_per_s": b / wall * 1e3,
              "bytes_per_step": model_bytes(b, c), "copy_gb_s": COPY_GB_S,
              "roofline_fraction": model_bytes(b, c) / (COPY_GB_S * 1e9) / (wall * 1e-3)}
             for m, b, c, wall, span in (("graph", 1, 512, *MODEL[1]), ("graph", 32, 512, *MODEL[32]),
                                         ("eager", 1, 512, 9.0, 8.9), ("graph", 1, 4096, 2.6, 2.5),
                                         ("hf_dynamic", 1, 512, HF_MS, math.nan))]
    kernels = [{"kernel": f"k{i}", "us_per_step": us, "batch": 1, "context": 512}
               for i, us in enumerate(KERNELS_US)]
    runtime = [{"variant": v, "batch": 32, "wall_us": us, "wall_min_us": us - 5,
                "wall_max_us": us + 5}
               for v, us in (("bare_forward", 2500.0), ("engine", 2700.0), ("no_graphs", 6000.0))]
    tp = [{"model": "llama-3.2-1b", "mode": m, "batch": 1, "context": 512, "tp": n,
           "ms_per_step": wall, "device_ms_per_step": span, "comm_ms": comm}
          for m, n, wall, span, comm in (("graph", 1, 2.0, 1.99, math.nan),
                                         ("graph", 2, TP_WALL, TP_SPAN, TP_COMM),
                                         ("eager", 2, 9.0, 8.9, 3.0))]
    frames = {
        "dispatch": pd.DataFrame([_dispatch_row("eager", 60.0, 55.0, BUSY),
                                  _dispatch_row("cuda_graph", 20.0, 2.5, busy_graph)]),
        "replay_multistep": pd.DataFrame(multistep), "replay_nodes": pd.DataFrame(nodes),
        "persistent": pd.DataFrame(persistent), "paged_model": pd.DataFrame(model),
        "paged_model_kernels": pd.DataFrame(kernels), "runtime": pd.DataFrame(runtime),
        "tp": pd.DataFrame(tp),
    }
    for name, frame in frames.items():
        frame.insert(0, "device", "h200")
        frame.insert(0, "origin", TP_ORIGIN if name == "tp" else ORIGIN)
    return frames


@dataclass(frozen=True)
class FakeInfo:
    """Enough of DeviceInfo for write_table: the synthetic rows claim an H200."""

    label: str = "h200"
    torch_version: str = "synthetic"


def write_reference_tree(root: Path, names: tuple[str, ...] | None = None) -> Path:
    """Write the synthetic tables as ``root/data/reference/h200/NAME.csv`` (+ metadata; the
    two-GPU table under ``h200x2/``)."""
    from decodelab.core.results import write_table

    out = root / "data" / "reference" / "h200"
    for name, frame in tables().items():
        if names is None or name in names:
            folder = root / "data" / frame["origin"].iloc[0]
            write_table(name, frame.drop(columns=["origin", "device"]), out_dir=folder,
                        profile="synthetic", info=FakeInfo())
    return out
