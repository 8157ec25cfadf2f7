"""The persistent kernels' C interface (``kernels/persistent.cu``), loaded through ctypes.

The structs mirror ``toyk::ToyArgs`` and ``toyk::LaunchInfo`` field by field; the library reports
its ABI version and both struct sizes, checked before the first call, so a drift between the two
definitions fails loudly instead of passing garbage to a kernel.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

ABI_VERSION = 3
EXCHANGES = ("block", "grid", "cluster")  # toyk::Exchange
DESIGNS = ("fixed", "wide", "narrow", "wide_fold", "narrow_fold")  # toyk::Design
PLACES = ("registers", "shared", "global", "peers")  # toyk::Placement, kPeers


class ToyArgs(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p) for name in (
        "w", "b", "w_out", "embed", "x0", "x_final", "states", "tokens", "steps", "scratch",
        "rows_done", "clock", "stages")] + [
        (name, ctypes.c_int) for name in ("H", "L", "V", "B", "N", "stop")]


class LaunchInfo(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int) for name in (
        "variant", "threads", "group", "blocks", "smem_bytes", "w_place", "wout_place", "e_place",
        "lanes_layer", "rounds_layer", "lanes_out", "rounds_out", "ok")] + [
        ("why", ctypes.c_char * 160)]


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """A launch plan as the kernels' planner decided it (``ok`` False: ``why`` says why not)."""

    ok: bool
    why: str
    group: int
    blocks: int
    threads: int
    smem_bytes: int
    w_place: str
    wout_place: str
    e_place: str
    lanes_layer: int
    rounds_layer: int
    lanes_out: int
    rounds_out: int

    @property
    def weights(self) -> str:
        return f"{self.w_place}/{self.wout_place}/{self.e_place}"


def plan_of(info: LaunchInfo) -> LaunchPlan:
    ok = bool(info.ok)
    place = (lambda p: PLACES[p]) if ok else (lambda p: "")  # noqa: E731
    return LaunchPlan(ok, info.why.decode(errors="replace"), info.group, info.blocks,
                      info.threads, info.smem_bytes, place(info.w_place), place(info.wout_place),
                      place(info.e_place), info.lanes_layer, info.rounds_layer, info.lanes_out,
                      info.rounds_out)


def bind(path: str) -> ctypes.CDLL:
    """Open the library at ``path``, declare its functions, check ABI version and struct sizes."""
    lib = ctypes.CDLL(path)
    p, i = ctypes.c_void_p, ctypes.c_int
    args_p, info_p = ctypes.POINTER(ToyArgs), ctypes.POINTER(LaunchInfo)
    lib.toyk_abi_version.restype = i
    lib.toyk_sizes.argtypes = [ctypes.POINTER(i)]
    lib.toyk_scratch_floats.argtypes = [i, i, i]
    lib.toyk_scratch_floats.restype = i
    lib.toyk_plan.argtypes = [args_p, i, i, i, i, info_p]
    lib.toyk_launch.argtypes = [args_p, i, i, i, i, p, i, info_p]
    lib.toyk_barrier.argtypes = [i, i, i, i, p, p, p, i]
    lib.toyk_barrier.restype = i
    lib.toyk_error_string.argtypes = [i]
    lib.toyk_error_string.restype = ctypes.c_char_p
    lib.toyk_device_attrs.argtypes = [i, ctypes.POINTER(i)]
    version = lib.toyk_abi_version()
    sizes = (i * 2)()
    lib.toyk_sizes(sizes)
    expected = (ctypes.sizeof(ToyArgs), ctypes.sizeof(LaunchInfo))
    if version != ABI_VERSION or tuple(sizes) != expected:
        raise RuntimeError(f"{path}: ABI {version}, struct sizes {tuple(sizes)}; this binding "
                           f"expects ABI {ABI_VERSION}, sizes {expected}: rebuild the kernels")
    return lib


def device_attrs(lib: ctypes.CDLL, device: int) -> dict:
    out = (ctypes.c_int * 4)()
    lib.toyk_device_attrs(device, out)
    return {"clock_khz": out[0], "sms": out[1], "smem_optin": out[2], "cc": out[3]}
