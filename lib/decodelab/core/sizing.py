"""How much of a bench fits the GPU, decided before anything is built: one policy for every phase.

A phase states its sizes as :class:`Option` s, most wanted first (the profile's own sizes,
then smaller ones: fewer batches, fewer contexts, a smaller model), each with its estimated
peak device bytes. :func:`fit` keeps the first whose need (the peak plus ``HEADROOM`` of it
plus ``WORKSPACE_BYTES`` for what an estimate leaves out: allocator rounding, cuBLAS and
Triton workspaces, activations, the CUDA context's growth) is at most the device's free
memory, and says in one line what it shrank and why. Nothing shrinks on the CPU, nor where
the first option fits (no line); where none fits it refuses with the numbers (ConfigError),
before any GPU work. Torch-free: the device's numbers come in a :class:`Device` (from
``core.device.sizing_device`` on a real GPU, made up in tests).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from decodelab.core.validate import ConfigError

GIB = 1 << 30
HEADROOM = 0.10
WORKSPACE_BYTES = 1 * GIB
T = TypeVar("T")


def need_bytes(peak: int) -> int:
    """What must be free for an estimated ``peak``: the peak, ``HEADROOM`` of it and
    ``WORKSPACE_BYTES``."""
    return int(peak * (1 + HEADROOM)) + WORKSPACE_BYTES


@dataclass(frozen=True, slots=True)
class Device:
    """What the policy reads of a GPU."""

    name: str  # "Tesla T4"
    capability: tuple[int, int]
    free: int  # bytes this process may still allocate
    total: int

    def describe(self) -> str:
        major, minor = self.capability
        return (f"{self.name} (sm_{major}{minor}), {self.free / GIB:.1f} of "
                f"{self.total / GIB:.1f} GiB free")


@dataclass(frozen=True, slots=True)
class Option(Generic[T]):
    """One set of sizes a phase may run at."""

    sizes: T  # what the phase runs with (its config at these sizes)
    peak: int  # estimated device bytes at the peak of the run
    what: str  # the sizes in words: "batches 1, 8, 32 x contexts 512, 4096"

    @property
    def need(self) -> int:
        return need_bytes(self.peak)


@dataclass(frozen=True, slots=True)
class Fitted(Generic[T]):
    sizes: T
    line: str | None  # what was shrunk and why; None: the phase runs its own sizes


def fit(phase: str, options: Sequence[Option[T]], device: Device | None) -> Fitted[T]:
    """The first of ``options`` whose need fits ``device`` (None, the CPU: the first)."""
    if not options:
        raise ValueError(f"{phase}: no sizes to choose from")
    first = options[0]
    if device is None or first.need <= device.free:
        return Fitted(first.sizes, None)
    for option in options[1:]:
        if option.need <= device.free:
            return Fitted(option.sizes, (
                f"[{phase}] sized to {device.describe()}: {first.what} needs "
                f"~{first.need / GIB:.1f} GiB, so {option.what} (~{option.need / GIB:.1f} GiB; "
                f"needs include {HEADROOM:.0%} + {WORKSPACE_BYTES / GIB:.0f} GiB headroom)"))
    smallest = min(options, key=lambda o: o.need)
    raise ConfigError(f"{phase}: even {smallest.what} needs ~{smallest.need / GIB:.1f} GiB "
                      f"(with {HEADROOM:.0%} + {WORKSPACE_BYTES / GIB:.0f} GiB headroom); "
                      f"{device.describe()}")
