"""Parameter profiles: ``gpu`` (full sweeps on a CUDA device), ``cpu`` (what is meaningful on a
CPU, in minutes), ``smoke`` (the smallest sizes, for tests). ``auto`` lets the hardware decide:
it is resolved to ``gpu`` or ``cpu`` by :func:`resolve_profile` before anything runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from decodelab.core.validate import ConfigError

if TYPE_CHECKING:
    import torch

T = TypeVar("T")

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


def on_bench_device(profile: str, body: Callable[[torch.device], T]) -> T:
    """``body(device)`` on the device a profile measures: the GPU for ``gpu`` on a CUDA machine,
    else the CPU with one torch thread (see ``timing.cpu_threads``: a tiny model's small ops)."""
    import torch

    from decodelab.core.timing import cpu_threads

    if profile == "gpu" and torch.cuda.is_available():
        return body(torch.device("cuda"))
    with cpu_threads(1):
        return body(torch.device("cpu"))
