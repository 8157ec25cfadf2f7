"""What we run on: ``collect_info()`` describes the machine (GPU, driver, CUDA, torch, CPU, git
commit); every result table's metadata carries it."""

from __future__ import annotations

import functools
import platform
import re
import subprocess
from dataclasses import dataclass

import torch

from decodelab.core import paths


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    label: str  # short device name used for folders and the ``device`` column: "h200", "cpu"
    backend: str  # "cuda" or "cpu"
    gpu_name: str
    compute_capability: str
    sm_count: int
    gpu_memory_gib: float
    l2_cache_mib: float
    driver: str
    cuda_version: str
    torch_version: str
    python_version: str
    cpu_model: str
    cpu_count: int
    git_commit: str


def device_label(gpu_name: str | None) -> str:
    """'NVIDIA H200' -> 'h200', 'Tesla T4' -> 't4', None -> 'cpu'."""
    if not gpu_name:
        return "cpu"
    name = re.sub(r"^(nvidia|tesla)\s+", "", gpu_name.strip(), flags=re.I).lower()
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "gpu"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> str:
    """The checkout's commit (+dirty); ``DECODELAB_GIT_COMMIT`` names it where .git is absent
    (e.g. a copied working tree on a lent GPU machine)."""
    import os

    if os.environ.get("DECODELAB_GIT_COMMIT"):
        return os.environ["DECODELAB_GIT_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=paths.repo_root(),
                             capture_output=True, text=True, timeout=5)
        commit = out.stdout.strip() if out.returncode == 0 else ""
        if commit:
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                   cwd=paths.repo_root(), capture_output=True, text=True, timeout=5)
            return commit + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def _driver_version() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


@functools.cache
def collect_info() -> DeviceInfo:
    """Describe this machine; cached (it does not change within a process)."""
    import os

    common = dict(torch_version=torch.__version__, python_version=platform.python_version(),
                  cpu_model=_cpu_model(), cpu_count=os.cpu_count() or 1, git_commit=_git_commit())
    if not torch.cuda.is_available():
        return DeviceInfo(label="cpu", backend="cpu", gpu_name="", compute_capability="",
                          sm_count=0, gpu_memory_gib=0.0, l2_cache_mib=0.0, driver="",
                          cuda_version="", **common)
    props = torch.cuda.get_device_properties(0)
    return DeviceInfo(
        label=device_label(props.name), backend="cuda", gpu_name=props.name,
        compute_capability=f"{props.major}.{props.minor}", sm_count=props.multi_processor_count,
        gpu_memory_gib=round(props.total_memory / 2**30, 2),
        l2_cache_mib=round(getattr(props, "L2_cache_size", 0) / 2**20, 2),
        driver=_driver_version(), cuda_version=torch.version.cuda or "", **common)


def has_cuda() -> bool:
    return torch.cuda.is_available()


def require_cuda(what: str) -> None:
    """Raise ConfigError naming ``what`` unless torch sees a CUDA GPU (before any GPU work)."""
    from decodelab.core.validate import ConfigError

    if not has_cuda():
        raise ConfigError(f"{what} needs a CUDA GPU (torch sees none); the notebooks show the "
                          "shipped reference results instead")


def compute_capability() -> tuple[int, int] | None:
    """(major, minor) of the visible CUDA device, None without one (the CPU). A device query:
    it creates no CUDA context, so the command line may ask before any phase starts."""
    return tuple(torch.cuda.get_device_capability(0)) if has_cuda() else None


def run_dtype(value: str | None, backend: str, owner: str = "dtype") -> str:
    """The dtype a run on ``backend`` ("cuda" or "cpu") uses for ``value`` (``auto``: the
    policy of ``core.precision``; bfloat16 below sm_80 is refused there, naming the GPU)."""
    from decodelab.core.precision import resolve_dtype

    return resolve_dtype(value, compute_capability() if backend == "cuda" else None, owner)


MEMORY_LIMIT_ENV = "DECODELAB_GPU_MEMORY_GIB"


def memory_limit_gib() -> float | None:
    """``DECODELAB_GPU_MEMORY_GIB`` (a number > 0): this process uses at most that much GPU
    memory, as on a smaller GPU (e.g. 15 on an H200 to run a T4's sizes); None when unset.
    A bad value is refused (ConfigError naming the variable)."""
    import os

    from decodelab.core.validate import ConfigError

    raw = os.environ.get(MEMORY_LIMIT_ENV, "").strip()
    if not raw:
        return None
    try:
        gib = float(raw)
    except ValueError:
        gib = float("nan")
    if not gib > 0 or gib == float("inf"):
        raise ConfigError(f"{MEMORY_LIMIT_ENV}={raw!r}: must be a number of GiB > 0")
    return gib


@functools.cache
def _apply_memory_limit(index: int, gib: float) -> None:
    total = torch.cuda.get_device_properties(index).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, gib * 2**30 / total), index)


def gpu_memory(device: torch.device | str = "cuda") -> tuple[int, int] | None:
    """(free, total) bytes this process may use on ``device``; None off CUDA. Free counts what
    PyTorch's caching allocator holds unused. With ``DECODELAB_GPU_MEMORY_GIB`` the limit is
    applied to the allocator here (``torch.cuda.set_per_process_memory_fraction``, once per
    process) and both numbers are capped by it: the sizing sees the smaller GPU."""
    device = torch.device(device)
    if device.type != "cuda" or not has_cuda():
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    free, total = torch.cuda.mem_get_info(index)
    free += torch.cuda.memory_reserved(index) - torch.cuda.memory_allocated(index)
    gib = memory_limit_gib()
    if gib is not None:
        _apply_memory_limit(index, gib)
        total = min(total, int(gib * 2**30))
        free = min(free, total - torch.cuda.memory_allocated(index))
    return max(0, free), total


def sizing_device(device: torch.device | str = "cuda"):
    """``core.sizing.Device`` of ``device`` (its free memory as :func:`gpu_memory` counts it);
    None off CUDA, where nothing is sized."""
    from decodelab.core.sizing import Device

    memory = gpu_memory(device)
    if memory is None:
        return None
    device = torch.device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    return Device(torch.cuda.get_device_name(index), (major, minor), *memory)


def sized(config, device: torch.device, dtype: str | None):
    """``config.on_device(dtype, ...)`` on ``device`` (``core.sizing`` off the CPU), its one
    line printed when it shrank something; returns the config to run."""
    fitted = config.on_device(dtype, sizing_device(device))
    if fitted.line:
        print(fitted.line, flush=True)
    return fitted.sizes
