"""Notebook 03_persistent: its parameters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from decodelab.core.params import NotebookParams as BaseParams
from decodelab.core.validate import check_int


@dataclass(frozen=True, slots=True)
class NotebookParams(BaseParams):
    """Parameters of notebook 03_persistent (``profile`` and ``interactive`` come from the base)."""

    NOTEBOOK: ClassVar[str] = "03_persistent"

    n_validate: int = 1000

    def check(self) -> None:
        check_int(self.NOTEBOOK, "n_validate", self.n_validate, 1, 100_000)
