"""Parameter profiles: ``gpu`` (full sweeps on a CUDA device), ``cpu`` (what is meaningful on a
CPU, in minutes), ``smoke`` (the smallest sizes, for tests). ``auto`` lets the hardware decide:
it is resolved to ``gpu`` or ``cpu`` by :func:`resolve_profile` before anything runs.

Which device a profile measures is one policy, :func:`measured_device`, for every phase and
notebook: ``gpu`` measures the CUDA device and is refused (ConfigError, exit code 2 on the command
line) where none is visible, never measured at other sizes instead; ``cpu`` and ``smoke``
measure the CPU. Phases that exist only on CUDA (replay's graphs, the persistent kernels) run
every profile on the GPU, the profile picking their sizes, and refuse a machine without one
(``core.device.require_cuda``).
"""

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


def _cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()


def default_profile() -> str:
    """``gpu`` when a CUDA device is visible, else ``cpu``."""
    return "gpu" if _cuda_visible() else "cpu"


def resolve_profile(value: str | None, owner: str = "profile") -> str:
    """``None`` or ``auto`` -> :func:`default_profile`; a named profile stays; else ConfigError."""
    if value is None or value == AUTO:
        return default_profile()
    if value not in PROFILES:
        raise ConfigError(f"unknown {owner} {value!r}; allowed: {', '.join(CHOICES)}")
    return value


def measured_device(profile: str, owner: str = "profile") -> str:
    """``"cuda"`` for ``gpu``, ``"cpu"`` for ``cpu`` and ``smoke`` (``auto`` resolved first).
    ``gpu`` without a visible CUDA device is refused: ConfigError naming ``owner`` and what is
    allowed."""
    profile = resolve_profile(profile, owner)
    if profile != "gpu":
        return "cpu"
    if not _cuda_visible():
        raise ConfigError(f"{owner} 'gpu' needs a CUDA GPU and none is visible; use 'cpu', "
                          f"'smoke' or '{AUTO}'")
    return "cuda"


def on_bench_device(profile: str, body: Callable[[torch.device], T]) -> T:
    """``body(device)`` on :func:`measured_device`'s device: the GPU, or the CPU with one torch
    thread (see ``timing.cpu_threads``: a tiny model's small ops)."""
    import torch

    from decodelab.core.timing import cpu_threads

    if measured_device(profile) == "cuda":
        return body(torch.device("cuda"))
    with cpu_threads(1):
        return body(torch.device("cpu"))
