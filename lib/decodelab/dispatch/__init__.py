"""Phase 1 — dispatch: how much of a toy decode step is the host issuing kernels, and how much
of that do CUDA graphs and torch.compile remove?

- :mod:`.modes`: one switch ``make_step(weights, x0, mode)`` over the shared toy step.
- :mod:`.check`: each mode against eager over chained steps, with re-seeding.
- :mod:`.measure`: wall, host CPU, GPU-busy time and kernel counts per step.
- :mod:`.bench`: named configs x modes and the H/L/B sweep into table ``dispatch``.
- :mod:`.analysis`: crossovers and eager/graph ratios from the stored table.
"""

from __future__ import annotations

from dataclasses import dataclass

from decodelab.dispatch.analysis import SEED_CPU_REDUCTION, crossovers, graph_ratios, nearest_point
from decodelab.dispatch.bench import TABLE, BenchPlan, DispatchRow, bench, plan_for, run
from decodelab.dispatch.check import ModeMismatchError, check_against_eager
from decodelab.dispatch.measure import profile_counts, time_steps
from decodelab.dispatch.modes import MODES, make_step
from decodelab.profiles import PROFILES
from decodelab.validate import check_choice

__all__ = ["MODES", "SEED_CPU_REDUCTION", "TABLE", "BenchPlan", "DispatchRow",
           "ModeMismatchError", "NotebookParams", "bench", "check_against_eager", "crossovers",
           "graph_ratios", "make_step", "nearest_point", "plan_for", "profile_counts", "run",
           "time_steps"]


@dataclass(frozen=True, slots=True)
class NotebookParams:
    """Parameters of notebook 01_dispatch."""

    profile: str = "cpu"
    interactive: bool = True
    measure_live: bool = True  # measure on this machine (eager on the CPU backend without CUDA)

    def __post_init__(self) -> None:
        check_choice("01_dispatch", "profile", self.profile, PROFILES)
        check_choice("01_dispatch", "interactive", self.interactive, (True, False))
        check_choice("01_dispatch", "measure_live", self.measure_live, (True, False))
