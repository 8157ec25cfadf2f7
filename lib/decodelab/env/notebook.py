"""Notebook 00_environment: its parameters."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, ClassVar

from decodelab.core.params import NotebookParams as BaseParams
from decodelab.core.params import param
from decodelab.env.calibrate import CalibrationConfig

if TYPE_CHECKING:
    import pandas as pd

    from decodelab.core.device import DeviceInfo

# The fields of DeviceInfo that describe a GPU: empty or zero on a machine without one.
GPU_FIELDS = ("gpu_name", "compute_capability", "sm_count", "gpu_memory_gib", "l2_cache_mib",
              "driver", "cuda_version")


@dataclass(frozen=True, slots=True)
class NotebookParams(BaseParams):
    """Parameters of notebook 00_environment (``profile`` and ``interactive`` come from the base)."""

    NOTEBOOK: ClassVar[str] = "00_environment"

    calibrate_live: bool = param(True, "measure this machine's ceilings (False: stored results "
                                       "only)")

    @property
    def calibration(self) -> CalibrationConfig:
        return CalibrationConfig.for_profile(self.profile)


def machine_table(info: DeviceInfo) -> pd.DataFrame:
    """The machine as (field, value) rows; without a GPU its fields are one row saying so,
    not a column of blanks and zeros."""
    import pandas as pd

    fields = asdict(info)
    if not info.gpu_name:
        fields = {"gpu": "none (no CUDA device visible)",
                  **{k: v for k, v in fields.items() if k not in GPU_FIELDS}}
    return pd.DataFrame({"field": list(fields), "value": [str(v) for v in fields.values()]})
