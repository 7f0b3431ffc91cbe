"""What ``Comm.from_torch_group`` and ``Comm.from_nccl_comm`` need from torch and from the process, imported
lazily (torch is optional).

Why ``from_torch_group`` creates its own NCCL communicators instead of wrapping the process group's:

* The ``ncclComm_t`` of a ``ProcessGroupNCCL`` belongs to the NCCL that torch loaded (the ``nvidia-nccl`` wheel's
  ``libnccl.so.2``, preloaded with ``RTLD_GLOBAL``, or one linked into libtorch). ``libzpccl.so`` needs
  ``libnccl.so.2`` too, and which file it gets depends on what the process loaded first: the dynamic linker
  reuses an already loaded ``libnccl.so.2`` by soname, but torch loads its copy by path, so importing zpccl
  before torch can leave two NCCLs in one process. An ``ncclComm`` is a private struct of one NCCL build, with
  its own global state (proxy threads, bootstrap, registrations); handing it to another copy or version is
  undefined behaviour (crashes, hangs, or silent corruption).
* torch creates its communicators lazily (at the first collective on a device, unless
  ``init_process_group(device_id=...)``), and exposes them only through a private, version-dependent call
  (``group._get_backend(torch.device("cuda"))._comm_ptr()``). Its watchdog may also abort the communicator
  under zpccl's feet, and zpccl's ``ncclCommSplit`` calls are collectives on it.

Broadcasting a zpccl unique id through the group costs one small broadcast and a second set of NCCL resources,
and is safe whatever NCCL torch carries. Callers who know that the process has one NCCL can still wrap theirs
with ``Comm.from_nccl_comm(ptr)``, which checks :func:`loaded_nccl_libraries` first.
"""
from __future__ import annotations

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
