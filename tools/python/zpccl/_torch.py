"""What ``Comm.from_torch_group`` and ``Comm.from_nccl_comm`` need from torch and from the process, imported
lazily (torch is optional): on a group of CPU tensors, the host backend's transport over the group's collectives
(:class:`TorchTransport`); on an NCCL group, the group's own NCCL communicator.

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

from .errors import ZpcclValueError


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


def launcher_node_id() -> int | None:
    """This process's node as its launcher numbers it, or None when no launcher said: torchrun's ``GROUP_RANK``, else
    ``RANK // LOCAL_WORLD_SIZE`` (launchers number ranks node by node), once ``LOCAL_WORLD_SIZE`` is set; the world
    rank comes from torch.distributed where ``RANK`` is not set (a group made with an explicit rank)."""
    local = _env_int("LOCAL_WORLD_SIZE", 1)
    if local is None:
        return None
    group_rank = _env_int("GROUP_RANK", 0)
    if group_rank is not None:
        return group_rank
    rank = _env_int("RANK", 0)
    if rank is None:
        import torch.distributed as dist

        if not dist.is_initialized():
            return None
        rank = dist.get_rank()
    return rank // local


def _env_int(name: str, least: int) -> int | None:
    """The launcher's variable ``name`` as an integer of at least ``least``, None where it is unset or empty; a
    value that is not one is refused, naming it (the node layout must not rest on a guess)."""
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        value: int | None = int(text)
    except ValueError:
        value = None
    if value is None or value < least:
        raise ZpcclValueError(f"from_torch_group: the environment's {name}={text!r} is not an integer of at least "
                              f"{least}: fix it, or pass ranks_per_node or node_id", "from_torch_group")
    return value


class TorchTransport:
    """The host backend's exchanges (include/zpccl.h, "Host backend across processes") as collectives of a
    ``torch.distributed`` process group whose backend moves CPU tensors (gloo, or any that does), for
    :class:`~zpccl._lib.TransportBridge`: the library's buffers become uint8 CPU tensors without a copy
    (``torch.frombuffer``), and each exchange is one all-gather or all-to-all of the group (the group's
    ``all_gather_into_tensor`` and ``all_to_all_single``, the only all-to-all gloo runs with blocks of different
    sizes).

    Timeouts go to the group's backend as each operation's own (gloo gives up after them, closing its connections,
    so that the operation is over when it raises; without one, the group's own timeout holds); where this torch does
    not take them there, the wait is bounded instead. A closed connection (a peer that died) makes the operation
    raise at once.
    """

    def __init__(self, group: Any = None) -> None:
        import torch.distributed as dist

        self.group = group
        self.rank, self.nranks, _ = group_info(group)
        self._pg = group if group is not None else dist.distributed_c10d._get_default_group()

    @staticmethod
    def _tensor(view: memoryview) -> Any:
        import torch

        return torch.frombuffer(view, dtype=torch.uint8) if len(view) else torch.empty(0, dtype=torch.uint8)

    @staticmethod
    def _options(kind: str, timeout: float | None) -> Any:
        import datetime

        import torch

        opts = getattr(torch._C._distributed_c10d, kind)()
        if timeout is not None:
            opts.timeout = datetime.timedelta(seconds=timeout)
        return opts

    def _wait(self, work: Any, timeout: float | None, bounded: bool) -> None:
        import datetime

        if bounded and timeout is not None:
            if not work.wait(datetime.timedelta(seconds=timeout)):
                raise TimeoutError(f"the group's operation did not finish within {timeout} s")
        else:
            work.wait()

    def _check_alive(self) -> None:
        """Raises when the group was destroyed (``destroy_process_group``): gloo's operations would still run on it."""
        import torch.distributed as dist

        live = getattr(getattr(dist.distributed_c10d, "_world", None), "pg_map", None)
        if live is not None and self._pg not in live:
            raise RuntimeError("the process group was destroyed (torch.distributed.destroy_process_group)")

    def all_gather(self, send: memoryview, recv: memoryview, timeout: float | None) -> int:
        import torch.distributed as dist

        self._check_alive()
        s, r = self._tensor(send), self._tensor(recv)
        if r.numel() != s.numel() * self.nranks:
            raise ValueError(f"the group has {self.nranks} ranks, but the communicator gathers "
                             f"{r.numel() // max(1, s.numel())} blocks")
        try:
            work, bounded = self._pg._allgather_base(r, s, self._options("AllgatherOptions", timeout)), False
        except (AttributeError, TypeError):  # a torch whose group takes no options here
            work, bounded = dist.all_gather_into_tensor(r, s, group=self.group, async_op=True), True
        self._wait(work, timeout, bounded)
        return r.numel()

    def all_to_all(self, send: memoryview, send_counts: list[int], send_offsets: list[int], recv: memoryview,
                   recv_counts: list[int], recv_offsets: list[int], timeout: float | None) -> int:
        import torch
        import torch.distributed as dist

        self._check_alive()
        if len(send_counts) != self.nranks:
            raise ValueError(f"the group has {self.nranks} ranks, the communicator {len(send_counts)}")
        s, r = self._tensor(send), self._tensor(recv)
        # all_to_all_single moves each rank's block from (and into) one contiguous tensor, in rank order: the blocks
        # are used where they lie when they lie so (zpccl lays them out so, but for groups whose ranks are not in
        # rank order and for the same block sent to several ranks), else they are copied into place.
        src = _in_rank_order(s, send_counts, send_offsets)
        if src is None:
            src = torch.cat([s[o:o + c] for o, c in zip(send_offsets, send_counts)])
        dst = _in_rank_order(r, recv_counts, recv_offsets)
        out = dst if dst is not None else torch.empty(sum(recv_counts), dtype=torch.uint8)
        args = (out, src, list(recv_counts), list(send_counts))
        try:
            work, bounded = self._pg.alltoall_base(*args, self._options("AllToAllOptions", timeout)), False
        except (AttributeError, TypeError):  # a torch whose group takes no options here
            work, bounded = dist.all_to_all_single(*args, group=self.group, async_op=True), True
        self._wait(work, timeout, bounded)
        if dst is None:
            at = 0
            for o, c in zip(recv_offsets, recv_counts):
                r[o:o + c].copy_(out[at:at + c])
                at += c
        return sum(recv_counts)


def _in_rank_order(t: Any, counts: list[int], offsets: list[int]) -> Any:
    """The part of ``t`` holding every rank's block back to back in rank order, or None when they do not lie so."""
    start = at = None
    for c, o in zip(counts, offsets):
        if not c:
            continue
        if at is None:
            start = at = o
        elif o != at:
            return None
        at += c
    return t[start:at] if start is not None else t[:0]
