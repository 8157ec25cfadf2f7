"""Notebook 03_persistent: its parameters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from decodelab.core.params import NotebookParams as BaseParams


@dataclass(frozen=True, slots=True)
class NotebookParams(BaseParams):
    """Parameters of notebook 03_persistent (``profile`` and ``interactive`` come from the base)."""

    NOTEBOOK: ClassVar[str] = "03_persistent"
