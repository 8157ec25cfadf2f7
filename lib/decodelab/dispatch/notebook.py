"""Notebook 01_dispatch: its parameters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from decodelab.core.params import NotebookParams as BaseParams


@dataclass(frozen=True, slots=True)
class NotebookParams(BaseParams):
    """Parameters of notebook 01_dispatch (``profile`` and ``interactive`` come from the base)."""

    NOTEBOOK: ClassVar[str] = "01_dispatch"

    measure_live: bool = True  # measure on this machine (eager on the CPU backend without CUDA)

    def check(self) -> None:
        pass
