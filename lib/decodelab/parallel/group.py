"""The tensor-parallel process group: who this process is, and the two collectives decode needs.

One process per device, started by ``torchrun`` (which sets RANK, WORLD_SIZE, LOCAL_RANK and the
rendezvous address). Without those variables the process is a world of one and every collective
is the identity, so the same model code runs on a single device with no process group at all.

NVLink multicast (NVLS) stays off in every process: :data:`NO_MULTICAST_ENV` is forced into
``os.environ`` before NCCL is initialised, and inherited by anything started from here. Decode's
messages are small, where multicast brings little, and on shared hosts a fault in it can take
the GPUs out of service.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from decodelab.core.validate import ConfigError

NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                    "NVSHMEM_DISABLE_NVLS": "1"}

# torch >= 2.12 names the single-tensor all-gather ``all_gather_single``; 2.11 has only the
# older name, which 2.13 deprecates.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def disable_multicast() -> None:
    """Force the variables that keep NCCL, PyTorch and NVSHMEM off NVLink multicast."""
    os.environ.update(NO_MULTICAST_ENV)


@dataclass(frozen=True, slots=True)
class TPGroup:
    """This rank's place in a tensor-parallel group. ``group`` None: a group of one.

    ``skip_comm`` makes every collective a local stand-in of the same output shape (a measuring
    device: the step without communication; its numbers are wrong by construction)."""

    rank: int
    size: int
    device: torch.device
    group: dist.ProcessGroup | None = None
    skip_comm: bool = False

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks, in place; returns ``x``."""
        if self.size > 1 and not self.skip_comm:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """(T, n) on every rank -> (T, size * n): rank r's columns at r*n .. (r+1)*n - 1."""
        if self.size == 1:
            return x
        if self.skip_comm:
            return x.repeat(1, self.size)
        t, n = x.shape
        out = torch.empty((self.size * t, n), dtype=x.dtype, device=x.device)
        _all_gather_single(out, x.contiguous(), group=self.group)  # ranks stacked along rows
        return out.view(self.size, t, n).permute(1, 0, 2).reshape(t, self.size * n)

    def without_comm(self) -> TPGroup:
        return TPGroup(self.rank, self.size, self.device, self.group, skip_comm=True)

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier(group=self.group)


def use_loopback_for_gloo() -> None:
    """Ranks on one host talk over the loopback interface: gloo otherwise binds to whatever the
    host name resolves to, which fails on machines whose name does not resolve (sandboxes, CI).
    An interface chosen by the user (GLOO_SOCKET_IFNAME) is kept."""
    import socket

    names = {name for _, name in socket.if_nameindex()}
    for lo in ("lo", "lo0"):
        if lo in names:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", lo)
            return


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init_world(backend: str | None = None, *, init_method: str | None = None,
               rank: int | None = None, world_size: int | None = None) -> TPGroup:
    """The world group of this process. From torchrun's variables, or from ``init_method``,
    ``rank`` and ``world_size`` (tests); a world of one when neither is given. ``backend``:
    "nccl" on CUDA, "gloo" on CPU by default; one CUDA device per process (LOCAL_RANK)."""
    disable_multicast()
    if rank is None and launched_by_torchrun():
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if rank is None or world_size is None:
        rank, world_size = 0, 1
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend not in ("nccl", "gloo"):
        raise ConfigError(f"tensor-parallel backend={backend!r}: must be 'nccl' or 'gloo'")
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", rank))
        if local >= torch.cuda.device_count():
            raise ConfigError(f"LOCAL_RANK={local}: this machine has "
                              f"{torch.cuda.device_count()} CUDA devices; start at most that "
                              "many processes (torchrun --nproc-per-node)")
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world_size == 1 and init_method is None and not launched_by_torchrun():
        return TPGroup(0, 1, device)
    one_host = int(os.environ.get("LOCAL_WORLD_SIZE", world_size)) == world_size
    if backend == "gloo" and one_host:
        use_loopback_for_gloo()
    if not dist.is_initialized():
        kwargs = {"device_id": device} if backend == "nccl" else {}
        dist.init_process_group(backend, init_method=init_method, rank=rank,
                                world_size=world_size, **kwargs)
    return TPGroup(rank, world_size, device, dist.group.WORLD)


def sub_group(world: TPGroup, size: int) -> TPGroup | None:
    """The group of ranks 0 .. size-1 (every rank must call this, in the same order); None on
    ranks outside it. ``size`` 1 gives a group of one with no collectives at all."""
    if not 1 <= size <= world.size:
        raise ConfigError(f"tensor-parallel size={size}: must lie in 1 .. {world.size} (the "
                          "number of processes started)")
    if size == world.size:
        return world
    group = dist.new_group(list(range(size))) if size > 1 else None  # collective over the world
    if world.rank >= size:
        return None
    return TPGroup(world.rank, size, world.device, group)


def shutdown(world: TPGroup, *, together: bool = True) -> None:
    """Leave the group. ``together`` (every rank got here) over gloo: a barrier first, so no
    rank tears its sockets down while a peer is still inside the last collective (gloo then
    aborts that peer: "terminate called without an active exception"). After a failure a peer
    may wait in a collective that never completes, so the group is torn down at once."""
    if world.size > 1 and dist.is_initialized():
        if together and dist.get_backend() == "gloo":
            dist.barrier()
        dist.destroy_process_group()
