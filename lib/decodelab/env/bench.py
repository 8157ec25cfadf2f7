"""``python -m decodelab bench env``: the calibration table ``environment``."""

from __future__ import annotations

from pathlib import Path

from decodelab.core.results import write_table
from decodelab.env.calibrate import CalibrationConfig, calibrate


def bench(profile: str, out_dir: Path) -> list[Path]:
    """``python -m decodelab bench env``: the calibration table ``environment``."""
    cfg = CalibrationConfig.for_profile(profile)
    return [write_table("environment", calibrate(cfg), out_dir=out_dir, config=cfg,
                        profile=profile)]
