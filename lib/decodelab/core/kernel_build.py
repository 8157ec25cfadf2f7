"""Run-time build of the CUDA kernels in ``kernels/`` for the GPU at hand, cached.

``load_persistent()`` compiles ``kernels/persistent.cu`` with its torch binding through
``torch.utils.cpp_extension.load`` for the detected architecture (``sm_90`` on H200, ``sm_75``
on a T4, ...). The build folder and module name carry a hash of the sources, the architecture,
the flags and the torch version, so re-running a notebook reuses the compiled module and a
changed source never loads a stale one. Build time is reported apart from any measurement.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from decodelab.core import paths
from decodelab.core.device import require_cuda
from decodelab.core.validate import ConfigError

PERSISTENT_SOURCES = ("persistent.cu", "persistent_binding.cpp")
PERSISTENT_HEADERS = ("persistent.cuh", "persistent_device.cuh", "persistent_v2.cuh")
CUDA_FLAGS = ("-O3", "-std=c++17", "-lineinfo")


@dataclass(frozen=True, slots=True)
class BuiltModule:
    module: ModuleType
    name: str  # module name, includes the cache key
    arch: str  # e.g. "sm_90"
    build_s: float  # seconds spent in load() (compile, or just import when cached)
    cached: bool  # True when a compiled module for this key already existed


def kernels_dir() -> Path:
    return paths.repo_root() / "kernels"


def cache_dir() -> Path:
    """Build cache root: ``DECODELAB_KERNEL_CACHE`` or ``~/.cache/decodelab/kernels``."""
    env = os.environ.get("DECODELAB_KERNEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "decodelab" / "kernels"


def detect_arch() -> str:
    """'sm_90' for compute capability 9.0 and so on."""
    import torch

    require_cuda("building the persistent kernels")
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def gencode_flags(arch: str) -> list[str]:
    number = arch.removeprefix("sm_")
    if not number.isdigit():
        raise ConfigError(f"arch={arch!r}: must look like 'sm_90'")
    return [f"-gencode=arch=compute_{number},code={arch}"]


def cache_key(sources: list[Path], arch: str, flags: list[str], extra: str = "") -> str:
    """Hash of the sources' bytes, the architecture, the flags and ``extra`` (torch version)."""
    h = hashlib.sha256()
    for path in sources:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    h.update(arch.encode())
    h.update("\0".join(flags).encode())
    h.update(extra.encode())
    return h.hexdigest()[:16]


_LOADED: dict[str, BuiltModule] = {}


def load_persistent(verbose: bool = False) -> BuiltModule:
    """Build (or load from the cache) the persistent-kernel extension for this GPU.

    The first call in a process hashes the sources; later calls return the loaded module at
    once (the run loop calls this per launch, and host time per launch is measured)."""
    if "persistent" in _LOADED:
        return _LOADED["persistent"]
    import torch
    from torch.utils import cpp_extension

    arch = detect_arch()
    folder = kernels_dir()
    sources = [folder / s for s in PERSISTENT_SOURCES]
    flags = [*CUDA_FLAGS, *gencode_flags(arch)]
    key = cache_key(sources + [folder / h for h in PERSISTENT_HEADERS], arch, flags,
                    torch.__version__)
    name = f"decodelab_persistent_{key}"
    build_dir = cache_dir() / name
    build_dir.mkdir(parents=True, exist_ok=True)
    cached = (build_dir / f"{name}.so").exists()
    t0 = time.perf_counter()
    module = cpp_extension.load(name=name, sources=[str(s) for s in sources],
                                extra_cuda_cflags=flags, extra_cflags=["-O3", "-std=c++17"],
                                extra_include_paths=[str(folder)], build_directory=str(build_dir),
                                verbose=verbose)
    built = BuiltModule(module, name, arch, time.perf_counter() - t0, cached)
    _LOADED["persistent"] = built
    return built
