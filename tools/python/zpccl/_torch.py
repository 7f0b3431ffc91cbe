"""What ``Comm.from_torch_group`` and ``Comm.from_nccl_comm`` need from torch and from the process, imported
lazily (torch is optional).

An ``ncclComm_t`` is a private struct of one NCCL build, with its own global state (proxy threads, bootstrap,
registrations): it may be handed only to the very NCCL library that made it. ``libzpccl.so`` needs
``libnccl.so.2``; torch's ``ProcessGroupNCCL`` uses the NCCL of the ``nvidia-nccl`` wheel (loaded by path), or
one linked into libtorch. The installed zpccl package links the wheel's NCCL through an ``$ORIGIN``-relative
RPATH, so that the dynamic linker gives both the same file, whichever is imported first; a zpccl built
elsewhere may still end up with a second NCCL in the process.

:func:`same_nccl_as_torch` tells which case holds by comparing the address of ``ncclGetVersion`` as seen
from libtorch_cuda and from libzpccl: one function, one library. When it holds, ``from_torch_group`` wraps the
group's own communicator (``zpCommInitFromNccl``: no second bootstrap, zpccl's sub-communicators split from
torch's); otherwise it broadcasts a zpccl unique id through the group and zpccl builds its own communicators.

torch creates a group's communicator lazily (at the first collective on a device, unless
``init_process_group(device_id=...)``), and exposes it only through a private, version-dependent call
(``group._get_backend(device)._comm_ptr()``): :func:`nccl_comm_pointer` makes sure it exists first.
"""
from __future__ import annotations

import ctypes
import os
from typing import Any


def loaded_nccl_libraries() -> list[str]:
    """The distinct NCCL library files mapped into this process (from ``/proc/self/maps``; [] elsewhere)."""
    found = set()
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.split(maxsplit=5)[-1].strip() if line.count(" ") >= 5 else ""
                base = os.path.basename(path)
                if base.startswith("libnccl") and ".so" in base:
                    found.add(os.path.realpath(path))
    except OSError:
        return []
    return sorted(found)


def group_info(group: Any) -> tuple[int, int, int]:
    """(rank in group, group size, global rank of the group's rank 0)."""
    import torch.distributed as dist

    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if group is None or group is dist.GroupMember.WORLD:
        return rank, size, 0
    get_global = getattr(dist, "get_global_rank", None) or dist.distributed_c10d._get_global_rank
    return rank, size, int(get_global(group, 0))


def broadcast_bytes(data: bytes, nbytes: int, group: Any, device: Any) -> bytes:
    """Rank 0 of ``group`` sends ``data`` (``nbytes`` long) to every rank, as a uint8 tensor.

    The tensor lives on ``device`` when the group's backend is NCCL (which moves CUDA tensors only), else on
    the CPU (gloo).
    """
    import torch
    import torch.distributed as dist

    rank, _, src = group_info(group)
    on_cuda = "nccl" in str(dist.get_backend(group)).lower()
    tensor = torch.zeros(nbytes, dtype=torch.uint8, device=device if on_cuda else "cpu")
    if rank == 0:
        tensor.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    dist.broadcast(tensor, src=src, group=group)
    return bytes(tensor.cpu().tolist())


def _torch_cuda_library() -> str | None:
    """The libtorch_cuda file this process mapped (where ProcessGroupNCCL lives), or None."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.split(maxsplit=5)[-1].strip() if line.count(" ") >= 5 else ""
                if os.path.basename(path).startswith("libtorch_cuda.so"):
                    return path
    except OSError:
        pass
    return None


def _function_address(library: Any, name: str) -> int | None:
    """The address ``dlsym`` finds for ``name`` from ``library`` (the library and what it depends on), or None."""
    try:
        return ctypes.cast(getattr(library, name), ctypes.c_void_p).value
    except AttributeError:
        return None


def same_nccl_as_torch(zpccl_library: Any) -> bool:
    """Whether torch's ProcessGroupNCCL and ``zpccl_library`` (a loaded ``ctypes.CDLL``) call the same NCCL.

    ``dlsym`` through a library's handle searches the library and its dependencies, so two handles that give
    ``ncclGetVersion`` the same address reach one NCCL. An NCCL linked into libtorch with hidden symbols is not
    found from libtorch's handle, which correctly reads as "not the same".
    """
    path = _torch_cuda_library()
    if path is None:
        return False
    try:
        torch_library = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return False
    ours = _function_address(zpccl_library, "ncclGetVersion")
    return ours is not None and ours == _function_address(torch_library, "ncclGetVersion")


def nccl_comm_pointer(group: Any, device: Any) -> int | None:
    """The ``ncclComm_t`` of ``group`` on ``device`` as an int, created first if torch has not yet; None when
    this torch does not expose it (private API) or the group's backend is not NCCL."""
    import torch
    import torch.distributed as dist

    if "nccl" not in str(dist.get_backend(group)).lower():
        return None
    try:
        backend = (group or dist.group.WORLD)._get_backend(device)
        get = getattr(backend, "_comm_ptr", None) or getattr(backend, "comm_ptr", None)
        if get is None:
            return None
        ptr = int(get())
        if not ptr:
            # The communicator is made at the group's first collective on this device.
            dist.all_reduce(torch.zeros(1, device=device), group=group)
            torch.cuda.current_stream(device).synchronize()
            ptr = int(get())
    except (AttributeError, RuntimeError, TypeError):
        return None
    return ptr or None
