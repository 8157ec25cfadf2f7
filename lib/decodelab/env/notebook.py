"""Notebook 00_environment: its parameters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from decodelab.core.params import NotebookParams as BaseParams
from decodelab.core.params import param
from decodelab.env.calibrate import CalibrationConfig


@dataclass(frozen=True, slots=True)
class NotebookParams(BaseParams):
    """Parameters of notebook 00_environment (``profile`` and ``interactive`` come from the base)."""

    NOTEBOOK: ClassVar[str] = "00_environment"

    calibrate_live: bool = param(True, "measure this machine's ceilings (False: stored results "
                                       "only)")

    @property
    def calibration(self) -> CalibrationConfig:
        return CalibrationConfig.for_profile(self.profile)
