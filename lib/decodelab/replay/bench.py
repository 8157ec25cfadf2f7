"""``python -m decodelab bench replay``: tables ``replay_nodes`` and ``replay_multistep``."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd

from decodelab.core.device import require_cuda
from decodelab.core.profiles import measured_device
from decodelab.core.results import write_table
from decodelab.replay.fit import fit_multistep, fit_nodes
from decodelab.replay.measure import ReplayBenchConfig, measure_multistep, measure_nodes


def bench(profile: str, out_dir: Path) -> list[Path]:
    """``python -m decodelab bench replay``: tables ``replay_nodes`` and ``replay_multistep``."""
    cfg = ReplayBenchConfig.for_profile(profile)
    measured_device(profile)  # gpu without CUDA: refused as in every phase
    require_cuda("the replay bench (CUDA graphs)")
    t0 = time.perf_counter()
    nodes = measure_nodes(cfg)
    multi = [row for name in cfg.configs for row in measure_multistep(cfg, name)]
    print(f"[replay] measured in {time.perf_counter() - t0:.1f} s", flush=True)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        cols = ["kind", "metric", "intercept", "slope", "slope_ci_low", "slope_ci_high", "r2"]
        print(fit_nodes(pd.DataFrame(nodes))[cols].to_string(index=False), flush=True)
        cols = ["config", "variant", "t_step_us", "t_replay_us", "r2", "k_2pct", "k_max_rel_dev"]
        print(fit_multistep(pd.DataFrame(multi))[cols].to_string(index=False), flush=True)
    return [write_table("replay_nodes", nodes, out_dir=out_dir, config=cfg, profile=profile),
            write_table("replay_multistep", multi, out_dir=out_dir, config=cfg, profile=profile)]
