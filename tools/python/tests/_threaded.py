"""Ranks as threads of this process on torch's threaded process group, as torch's own FSDP tests run them; with
CPU tensors, zpccl's host backend (ranks as threads too) serves them."""
from __future__ import annotations

import threading
import unittest
from typing import Any, Callable, TypeVar

T = TypeVar("T")
_lock = threading.Lock()  # one threaded world at a time: the process group registry is global


def torch_with_fsdp2() -> Any:
    """torch, or SkipTest when it is missing or older than zpccl.fsdp needs, or has no threaded process group."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        raise unittest.SkipTest("torch is not installed") from None
    from zpccl import fsdp

    major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    if (major, minor) < fsdp.MIN_TORCH:
        raise unittest.SkipTest(f"torch {torch.__version__} predates FSDP2's custom collectives")
    if not dist.is_available():
        raise unittest.SkipTest("this torch has no torch.distributed")
    try:
        from torch.testing._internal.distributed import multi_threaded_pg  # noqa: F401
    except ImportError:
        raise unittest.SkipTest("this torch has no threaded process group") from None
    return torch


def run_threaded(world_size: int, fn: Callable[[int], T], timeout: float = 300.0) -> list[T]:
    """Runs ``fn(rank)`` on ``world_size`` threads, each with ``torch.distributed`` initialized on the threaded
    backend; returns the results in rank order, or re-raises the first rank's exception (with the rank noted)."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.multi_threaded_pg import (ProcessLocalGroup, _install_threaded_pg,
                                                                       _uninstall_threaded_pg)

    isolate = getattr(torch._C._distributed_c10d, "_set_thread_isolation_mode", None)
    results: list[Any] = [None] * world_size
    failures: list[tuple[int, BaseException]] = []
    with _lock:
        if isolate is not None:
            isolate(True)
        reset = getattr(ProcessLocalGroup, "reset", None)
        if reset is not None:
            reset()  # a world that failed leaves its pending collectives and its termination flag behind
        _install_threaded_pg()
        store = dist.HashStore()

        def worker(rank: int) -> None:
            dist.init_process_group("threaded", rank=rank, world_size=world_size, store=store)
            try:
                results[rank] = fn(rank)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                failures.append((rank, exc))
                ProcessLocalGroup.exception_handle(exc)  # wakes peers waiting in the threaded group
            finally:
                dist.destroy_process_group()

        threads = [threading.Thread(target=worker, args=(r,), daemon=True) for r in range(world_size)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout)
            stuck = [r for r, t in enumerate(threads) if t.is_alive()]
        finally:
            _uninstall_threaded_pg()
            if isolate is not None:
                isolate(False)
    if failures:
        # The ranks that the first failure woke up raise SystemExit: report the failure itself.
        rank, exc = next((f for f in failures if not isinstance(f[1], SystemExit)), failures[0])
        if hasattr(exc, "add_note"):
            exc.add_note(f"raised on thread-rank {rank} of {world_size}")
        raise exc
    if stuck:
        raise TimeoutError(f"run_threaded: ranks {stuck} still running after {timeout} s")
    return results
