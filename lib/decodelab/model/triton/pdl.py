"""Programmatic dependent launch (PDL, Hopper and later): the kernel-boundary layer, removed
where the data allow it.

Imported lazily, with Triton (GPU only, or its interpreter).

Between two kernels of a CUDA graph the GPU normally drains the first (its last thread blocks
finish while most SMs idle), then launches the second, which starts its loads from nothing. A
kernel launched with PDL may become resident while its predecessor still runs; it calls
``gdc_wait`` before touching anything an earlier kernel writes, and ``gdc_launch_dependents``
to let its own successor in early. Reads of data no kernel writes (the weights) may come before
the wait: a matmul streams its first weight tile while the previous kernel drains.

The contract every kernel launched with :func:`launch_kw` keeps: no load of an earlier kernel's
output and no store at all before ``gdc_wait``. A kernel after it that is not launched with PDL
(cuBLAS, a torch op) waits for full completion as usual, so mixing is safe; ordering is
transitive because every PDL kernel waits before it completes. Which steps use it:
:mod:`decodelab.model.pdl_policy`.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl


@functools.cache
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


def supported(device: torch.device) -> bool:
    """PDL needs sm_90 or newer (``griddepcontrol``)."""
    return device.type == "cuda" and _capable(device.index or 0)


@triton.jit
def enter(PDL: tl.constexpr):
    """Wait for the earlier kernels' writes, then let the next kernel launch. Kernels whose
    every input comes from the kernel before call this first."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


def launch_kw(pdl: bool) -> dict[str, bool]:
    """Launch options for a Triton kernel call: PDL only while a CUDA graph is being captured,
    where it becomes a programmatic edge between graph nodes. Eager steps launch plainly: there
    the host, one launch at a time, separates the kernels, not the drain, and the kernels' own
    ``gdc_wait`` is a no-op. Empty unless ``pdl``, so the interpreter and older GPUs never see
    the option."""
    return {"launch_pdl": True} if pdl and torch.cuda.is_current_stream_capturing() else {}
