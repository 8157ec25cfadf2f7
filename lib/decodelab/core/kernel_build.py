"""Run-time build of the CUDA kernels in ``kernels/`` for the GPU at hand, cached.

``load_persistent()`` compiles the persistent-kernel sources with plain ``nvcc`` into a shared
library for the detected architecture (``sm_90`` on H200, ``sm_75`` on a T4, ...), one object per
source in parallel, and returns its path; :mod:`decodelab.persistent.library` loads it through
ctypes (no torch headers, so the same build serves every torch version). The library's name
carries a hash of the sources and headers, the architecture, the flags and the nvcc version:
re-running a notebook reuses it, a changed source never loads a stale one. ``build_check()``
builds the standalone check (``kernels/persistent_check.cu``) the same way, for
compute-sanitizer and Nsight Compute. Build time is reported apart from any measurement.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from decodelab.core import paths
from decodelab.core.validate import ConfigError

PERSISTENT_SOURCES = ("persistent.cu", "persistent_block.cu", "persistent_grid.cu",
                      "persistent_cluster.cu")
PERSISTENT_HEADERS = ("persistent.cuh", "persistent_device.cuh", "persistent_policies.cuh",
                      "persistent_body.cuh", "persistent_kernels.cuh")
CHECK_SOURCE = "persistent_check.cu"
CUDA_FLAGS = ("-O3", "-std=c++17", "-lineinfo", "-Xcompiler", "-fPIC")


@dataclass(frozen=True, slots=True)
class Built:
    path: Path  # the shared library (or executable)
    arch: str  # e.g. "sm_90"
    build_s: float  # seconds spent here (compile, or just the cache lookup)
    cached: bool  # True when a build for this key already existed


def kernels_dir() -> Path:
    return paths.repo_root() / "kernels"


def cache_dir() -> Path:
    """Build cache root: ``DECODELAB_KERNEL_CACHE`` or ``~/.cache/decodelab/kernels``."""
    env = os.environ.get("DECODELAB_KERNEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "decodelab" / "kernels"


def find_nvcc() -> str:
    """``NVCC``, else ``nvcc`` on the PATH, else ``$CUDA_HOME/bin/nvcc``."""
    candidates = [os.environ.get("NVCC"), shutil.which("nvcc")]
    candidates += [str(Path(home) / "bin" / "nvcc") for home in
                   (os.environ.get("CUDA_HOME"), "/usr/local/cuda") if home]
    for nvcc in candidates:
        if nvcc and Path(nvcc).exists():
            return nvcc
    raise ConfigError("building the persistent kernels needs nvcc (CUDA toolkit): none found on "
                      "the PATH, in NVCC or under CUDA_HOME")


def detect_arch() -> str:
    """'sm_90' for compute capability 9.0 and so on."""
    import torch

    from decodelab.core.device import require_cuda

    require_cuda("building the persistent kernels")
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def gencode_flags(arch: str) -> list[str]:
    number = arch.removeprefix("sm_")
    if not number.isdigit():
        raise ConfigError(f"arch={arch!r}: must look like 'sm_90'")
    return [f"-gencode=arch=compute_{number},code={arch}"]


def cache_key(files: list[Path], arch: str, flags: list[str], extra: str = "") -> str:
    """Hash of the files' names and bytes, the architecture, the flags and ``extra``."""
    h = hashlib.sha256()
    for path in files:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    h.update(arch.encode())
    h.update("\0".join(flags).encode())
    h.update(extra.encode())
    return h.hexdigest()[:16]


def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    return out.strip().splitlines()[-1]


def _compile(nvcc: str, flags: list[str], source: Path, obj: Path) -> None:
    cmd = [nvcc, *flags, "-I", str(source.parent), "-c", str(source), "-o", str(obj)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"nvcc failed on {source.name}:\n{' '.join(cmd)}\n{done.stderr[-4000:]}")


def build(arch: str, *, check: bool = False) -> Built:
    """Build (or find in the cache) the kernels library, or with ``check`` the standalone check
    executable, for ``arch``. Objects compile in parallel; the result lands atomically."""
    folder = kernels_dir()
    sources = [folder / s for s in PERSISTENT_SOURCES] + ([folder / CHECK_SOURCE] if check else [])
    nvcc = find_nvcc()
    flags = [*CUDA_FLAGS, *gencode_flags(arch)]
    key = cache_key(sources + [folder / h for h in PERSISTENT_HEADERS], arch, flags,
                    nvcc_version(nvcc))
    target = cache_dir() / (f"persistent_check_{key}" if check else f"libtoyk_{key}.so")
    t0 = time.perf_counter()
    if target.exists():
        return Built(target, arch, time.perf_counter() - t0, True)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        objects = [Path(tmp) / f"{s.stem}.o" for s in sources]
        with ThreadPoolExecutor(max_workers=len(sources)) as pool:
            list(pool.map(lambda so: _compile(nvcc, flags, *so), zip(sources, objects, strict=True)))
        out = Path(tmp) / target.name
        link = [nvcc, *gencode_flags(arch), *(["-shared"] if not check else []), "-o", str(out),
                *map(str, objects)]
        done = subprocess.run(link, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"nvcc link failed:\n{' '.join(link)}\n{done.stderr[-4000:]}")
        os.replace(out, target)
    return Built(target, arch, time.perf_counter() - t0, False)


_BUILT: dict[tuple[str, bool], Built] = {}


def load_persistent(check: bool = False) -> Built:
    """The kernels library (or the check executable) for this GPU; the first call in a process
    hashes the sources, later calls return at once."""
    arch = detect_arch()
    if (arch, check) not in _BUILT:
        _BUILT[(arch, check)] = build(arch, check=check)
    return _BUILT[(arch, check)]
