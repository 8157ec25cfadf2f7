"""Phase 1 — dispatch: how much of a toy decode step is the host issuing kernels, and how much
of that do CUDA graphs and torch.compile remove?

- :mod:`.modes`: one switch ``make_step(weights, x0, mode)`` over the shared toy step.
- :mod:`.check`: each mode against eager over chained steps, with re-seeding.
- :mod:`.measure`: wall, host CPU, GPU-busy time and kernel counts per step.
- :mod:`.bench`: named configs x modes and the H/L/B sweep into table ``dispatch``.
- :mod:`.analysis`: crossovers and eager/graph ratios from the stored table.
- :mod:`.notebook`: notebook 01's parameters and helpers.
"""

from __future__ import annotations

from decodelab.dispatch.analysis import SEED_CPU_REDUCTION, crossovers, graph_ratios, nearest_point
from decodelab.dispatch.bench import TABLE, DispatchBenchConfig, DispatchRow, bench, run
from decodelab.dispatch.check import ModeMismatchError, check_against_eager
from decodelab.dispatch.measure import profile_counts, time_steps
from decodelab.dispatch.modes import MODES, make_step

__all__ = ["MODES", "SEED_CPU_REDUCTION", "TABLE", "DispatchBenchConfig", "DispatchRow",
           "ModeMismatchError", "bench", "check_against_eager", "crossovers",
           "graph_ratios", "make_step", "nearest_point", "profile_counts", "run",
           "time_steps"]
