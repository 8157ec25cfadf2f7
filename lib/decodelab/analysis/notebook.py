"""Notebook 05_report: its parameters and the helpers it calls."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from decodelab.analysis.layers import HEADLINE_REFERENCE, Headline
from decodelab.core.params import NotebookParams as BaseParams
from decodelab.core.validate import ConfigError, check_choice, check_int
from decodelab.toy.step import NAMED_CONFIGS


@dataclass(frozen=True, slots=True)
class NotebookParams(BaseParams):
    """Parameters of notebook 05_report (``profile`` and ``interactive`` come from the base)."""

    NOTEBOOK: ClassVar[str] = "05_report"

    reference: str = HEADLINE_REFERENCE  # data/reference/<reference>/: what is decomposed
    toy_config: str = "ultra-light"
    model_batch: int = 1
    runtime_batch: int = 32
    context: int = 512

    def check(self) -> None:
        if not (isinstance(self.reference, str) and re.fullmatch(r"[a-z0-9][a-z0-9_.-]*",
                                                                  self.reference)):
            raise ConfigError(f"{self.NOTEBOOK}.reference={self.reference!r}: must name a folder of "
                              "data/reference/ (lower-case letters, digits, '_', '-', '.')")
        check_choice(self.NOTEBOOK, "toy_config", self.toy_config, tuple(NAMED_CONFIGS))
        check_int(self.NOTEBOOK, "model_batch", self.model_batch, 1, 4096)
        check_int(self.NOTEBOOK, "runtime_batch", self.runtime_batch, 1, 4096)
        check_int(self.NOTEBOOK, "context", self.context, 1, 1 << 20)

    @property
    def headline(self) -> Headline:
        return Headline(self.toy_config, self.model_batch, self.runtime_batch, self.context)

    @property
    def origin(self) -> str:
        return f"reference/{self.reference}"

    @property
    def is_headline(self) -> bool:
        """The README's configuration: only this run may rewrite ``figures/headline_*``."""
        return self.reference == HEADLINE_REFERENCE and self.headline == Headline()
