"""Notebook 02_replay: its parameters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from decodelab.core.params import NotebookParams as BaseParams
from decodelab.core.validate import check_float, check_int


@dataclass(frozen=True, slots=True)
class NotebookParams(BaseParams):
    """Parameters of notebook 02_replay (``profile`` and ``interactive`` come from the base)."""

    NOTEBOOK: ClassVar[str] = "02_replay"

    measure_live: bool = True  # measure on this machine when it has a CUDA GPU
    p_stop: float = 0.01  # stop probability per step in the trade-off figures
    sim_requests: int = 20000
    seed: int = 0

    def check(self) -> None:
        check_float(self.NOTEBOOK, "p_stop", self.p_stop, 0.0, 1.0, low_open=True)
        check_int(self.NOTEBOOK, "sim_requests", self.sim_requests, 1, 10**7)
        check_int(self.NOTEBOOK, "seed", self.seed, 0, 2**32 - 1)
