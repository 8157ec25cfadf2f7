"""Notebook 02_replay: its parameters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from decodelab.core.params import NotebookParams as BaseParams
from decodelab.core.params import param


@dataclass(frozen=True, slots=True)
class NotebookParams(BaseParams):
    """Parameters of notebook 02_replay (``profile`` and ``interactive`` come from the base)."""

    NOTEBOOK: ClassVar[str] = "02_replay"

    measure_live: bool = param(True, "measure this machine's sweeps (needs a CUDA GPU)")
    p_stop: float = param(0.01, "stop probability per step in the trade-off figures",
                          low=0.0, high=1.0, low_open=True)
    sim_requests: int = param(20000, "requests drawn in the trade-off simulation",
                              low=1, high=10**7)
    seed: int = param(0, "seed of the trade-off simulation", low=0, high=2**32 - 1)
