"""Which floating-point dtype a model run uses: one policy for every phase, notebook and the CLI.

``auto`` picks by the device's compute capability (``None``: the CPU):

- ``bfloat16`` from sm_80 (A100, L4, H100, H200): the first GPUs with bf16 tensor cores;
- ``float16`` below (sm_70 and sm_75: V100, T4): fp16 tensor cores exist there for cuBLAS,
  bf16 ones do not, and bf16 runs on emulation paths at a fraction of the fp16 rate;
- ``float32`` on the CPU (the tiny model's reference precision).

Asked for by name, ``float16`` and ``float32`` run anywhere; ``bfloat16`` is refused on a GPU
below sm_80, naming its compute capability, before any work. Torch-free: names and
capabilities only, so the policy is unit-tested on any machine.
"""

from __future__ import annotations

from decodelab.core.validate import ConfigError

AUTO = "auto"
DTYPES = ("bfloat16", "float16", "float32")
CHOICES = (AUTO, *DTYPES)  # what a user may ask for
BF16_FROM = (8, 0)  # bf16 tensor cores: Ampere and later
BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}

Capability = tuple[int, int]


def sm(capability: Capability) -> str:
    """(8, 9) -> 'sm_89'."""
    return f"sm_{capability[0]}{capability[1]}"


def auto_dtype(capability: Capability | None) -> str:
    """The dtype ``auto`` picks (see the module doc); ``None`` is the CPU."""
    if capability is None:
        return "float32"
    return "bfloat16" if tuple(capability) >= BF16_FROM else "float16"


def allowed_dtypes(capability: Capability | None) -> tuple[str, ...]:
    """The dtypes a run may use on this device, ``auto``'s pick first."""
    if capability is not None and tuple(capability) < BF16_FROM:
        return ("float16", "float32")
    first = auto_dtype(capability)
    return (first, *(d for d in DTYPES if d != first))


def resolve_dtype(value: str | None, capability: Capability | None, owner: str = "dtype") -> str:
    """``None`` or ``auto`` -> :func:`auto_dtype`; a name is checked against the device.
    ConfigError names ``owner``, the value and what is allowed (and the GPU's capability)."""
    if value is None or value == AUTO:
        return auto_dtype(capability)
    if value not in DTYPES:
        raise ConfigError(f"{owner}={value!r}: must be one of {', '.join(CHOICES)}")
    if value not in allowed_dtypes(capability):
        major, minor = capability
        raise ConfigError(f"{owner}={value!r}: this GPU is {sm(capability)} (compute capability "
                          f"{major}.{minor}), without bfloat16 tensor cores (they start at "
                          f"{sm(BF16_FROM)}); use 'float16' or '{AUTO}'")
    return value
