"""Notebook 05_report: its parameters and the helpers it calls."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from decodelab.analysis.layers import HEADLINE_REFERENCE, Headline
from decodelab.core import paths
from decodelab.core.params import NotebookParams as BaseParams
from decodelab.core.params import param
from decodelab.toy.step import NAMED_CONFIGS


@dataclass(frozen=True, slots=True)
class NotebookParams(BaseParams):
    """Parameters of notebook 05_report (``profile`` and ``interactive`` come from the base)."""

    NOTEBOOK: ClassVar[str] = "05_report"

    reference: str = param(HEADLINE_REFERENCE, "the reference results decomposed",
                           choices=paths.reference_folders, what="a folder of data/reference/")
    toy_config: str = param("ultra-light", "toy configuration of the toy regimes",
                            choices=tuple(NAMED_CONFIGS))
    model_batch: int = param(1, "batch of the transformer-decode regimes", low=1, high=4096)
    runtime_batch: int = param(32, "batch of the runtime-loop regime", low=1, high=4096)
    context: int = param(512, "tokens of context of the transformer-decode regimes",
                         low=1, high=1 << 20)

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
