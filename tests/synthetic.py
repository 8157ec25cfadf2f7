"""Synthetic phase tables with known layer terms (µs per step), for the report's tests.

The numbers are chosen, not measured: each regime's terms are listed in :data:`KNOWN` and the
tables are built so that the definitions of :mod:`decodelab.regimes` recover exactly them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

ORIGIN = "reference/h200"
K_VALUES = (1, 2, 4, 8, 16, 32, 64)
T_STEP_INF, T_REPLAY = 15.0, 5.0  # multi-step fit: wall per step = 15 + 5 / K
BUSY = 12.0  # GPU-busy per toy step
REPLAY_FIXED, REPLAY_NODE = 4.0, 0.5  # replay_nodes graph: wall = 4 + 0.5 n
BARRIERS, BARRIER_US = 5, 0.02

KNOWN = {
    "eager": {"dispatch": 48.0, "compute": BUSY},
    "graph": {"replay": 5.0, "node": T_STEP_INF - BUSY, "compute": BUSY},
    "multi-step graph": {"replay": T_REPLAY / 64, "node": T_STEP_INF - BUSY, "compute": BUSY},
    "persistent kernel": {"node": BARRIERS * BARRIER_US, "compute": 0.4 - BARRIERS * BARRIER_US},
    "runtime loop": {"orchestration": 200.0, "replay": REPLAY_FIXED,
                     "compute": 2500.0 - REPLAY_FIXED},
    "transformer decode": {"replay": REPLAY_FIXED, "compute": 2000.0 - REPLAY_FIXED},
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
                   "steps_per_s": 1e6 / us, "barriers_per_step": BARRIERS}
                  for v, h, us in (("block", 64, 0.4), ("grid", 64, 0.9), ("block", 256, 1.5),
                                   ("grid", 256, 2.5))]
    barriers = [{"variant": "block", "us_per_barrier": BARRIER_US},
                {"variant": "grid", "us_per_barrier": 0.5}]
    model = [{"mode": m, "batch": b, "context": c, "us_per_token": us}
             for m, b, c, us in (("graph", 1, 512, 2000.0), ("graph", 32, 512, 2300.0),
                                 ("eager", 1, 512, 9000.0), ("graph", 1, 4096, 2600.0))]
    model[1]["us_per_token"] = 2500.0  # the bare forward at batch 32
    runtime = [{"batch": b, "step_us": us} for b, us in ((1, 2300.0), (32, 2700.0))]
    frames = {
        "dispatch": pd.DataFrame([_dispatch_row("eager", 60.0, 55.0, BUSY),
                                  _dispatch_row("cuda_graph", 20.0, 2.5, busy_graph)]),
        "replay_multistep": pd.DataFrame(multistep), "replay_nodes": pd.DataFrame(nodes),
        "persistent": pd.DataFrame(persistent), "persistent_barriers": pd.DataFrame(barriers),
        "paged_model": pd.DataFrame(model), "runtime": pd.DataFrame(runtime),
    }
    for frame in frames.values():
        frame.insert(0, "device", "h200")
        frame.insert(0, "origin", ORIGIN)
    return frames


@dataclass(frozen=True)
class FakeInfo:
    """Enough of DeviceInfo for write_table: the synthetic rows claim an H200."""

    label: str = "h200"
    torch_version: str = "synthetic"


def write_reference_tree(root: Path, names: tuple[str, ...] | None = None) -> Path:
    """Write the synthetic tables as ``root/data/reference/h200/NAME.csv`` (+ metadata)."""
    from decodelab.results import write_table

    out = root / "data" / "reference" / "h200"
    for name, frame in tables().items():
        if names is None or name in names:
            write_table(name, frame.drop(columns=["origin", "device"]), out_dir=out,
                        profile="synthetic", info=FakeInfo())
    return out
