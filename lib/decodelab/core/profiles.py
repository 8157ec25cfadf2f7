"""Parameter profiles: ``gpu`` (full sweeps on a CUDA device), ``cpu`` (what is meaningful on a
CPU, in minutes), ``smoke`` (the smallest sizes, for tests). ``auto`` lets the hardware decide:
it is resolved to ``gpu`` or ``cpu`` by :func:`resolve_profile` before anything runs."""

from __future__ import annotations

from decodelab.core.validate import ConfigError

PROFILES = ("smoke", "cpu", "gpu")  # what benches run
AUTO = "auto"
CHOICES = (AUTO, *PROFILES)  # what a user may ask for


def default_profile() -> str:
    """``gpu`` when a CUDA device is visible, else ``cpu``."""
    import torch

    return "gpu" if torch.cuda.is_available() else "cpu"


def resolve_profile(value: str | None, owner: str = "profile") -> str:
    """``None`` or ``auto`` -> :func:`default_profile`; a named profile stays; else ConfigError."""
    if value is None or value == AUTO:
        return default_profile()
    if value not in PROFILES:
        raise ConfigError(f"unknown {owner} {value!r}; allowed: {', '.join(CHOICES)}")
    return value
