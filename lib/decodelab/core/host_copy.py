"""Host-to-device copies that do not hold the host.

PyTorch's blocking copy of a CPU tensor to a CUDA device (``tensor.to("cuda")``,
``torch.tensor(values, device="cuda")``) ends in ``cudaStreamSynchronize``: the host waits
until every kernel queued before the copy has run. In a serving step that is the step before's
work, so each such copy leaves the GPU idle while the host then launches the rest of the step.
:func:`to_device` copies from pinned memory asynchronously instead, ordered on the stream like
any kernel. The pinned block is not handed out again before its copy has landed (PyTorch's
caching host allocator records the copy on the stream), so the host may drop it at once.
"""

from __future__ import annotations

import torch


def to_device(host: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``host`` (a CPU tensor) on ``device``; to a CUDA device without waiting for it."""
    device = torch.device(device)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def copy_into(dst: torch.Tensor, host: torch.Tensor) -> None:
    """``dst.copy_(host)`` (a CPU tensor of ``dst``'s shape); to a CUDA device without waiting
    for it, as :func:`to_device`."""
    dst.copy_(host.pin_memory() if dst.is_cuda else host, non_blocking=dst.is_cuda)
