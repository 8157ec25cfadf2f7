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
