"""Parameter profiles: ``gpu`` (full sweeps on a CUDA device), ``cpu`` (what is meaningful on a
CPU, in minutes), ``smoke`` (the smallest sizes, for tests)."""

from __future__ import annotations

PROFILES = ("smoke", "cpu", "gpu")


def default_profile() -> str:
    """``gpu`` when a CUDA device is visible, else ``cpu``."""
    import torch

    return "gpu" if torch.cuda.is_available() else "cpu"
