"""Notebook 01_dispatch: its parameters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from decodelab.core.params import NotebookParams as BaseParams
from decodelab.core.params import param


@dataclass(frozen=True, slots=True)
class NotebookParams(BaseParams):
    """Parameters of notebook 01_dispatch (``profile`` and ``interactive`` come from the base)."""

    NOTEBOOK: ClassVar[str] = "01_dispatch"

    measure_live: bool = param(True, "measure this machine (without CUDA: eager on the CPU "
                                     "backend)")
