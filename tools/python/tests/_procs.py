"""Ranks as processes, as torchrun starts them: ``run_procs`` spawns one process per rank with torchrun's environment
(``MASTER_ADDR``/``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``),
each initializes ``torch.distributed`` on gloo through the ``env://`` rendezvous and runs a function of this package,
and the parent collects what each returned or raised, and how each process ended (a rank killed with SIGKILL ends
with -9). Unlike :func:`zpccl.launch.spawn`, which stops every rank at the first failure, it waits for every rank:
the fault tests kill one and look at what the others did. The functions the tests run in the processes live in the
test modules (importable by the spawned interpreter); what they share lives here."""
from __future__ import annotations

import dataclasses
import multiprocessing
import os
import queue
import time
import traceback
import unittest
from typing import Any, Callable

from zpccl.launch import free_port


@dataclasses.dataclass
class Outcome:
    """What one rank's process did: returned ``value``, or raised (``error``: type name, message, zpccl code)."""

    rank: int
    value: Any = None
    error: tuple[str, str, Any] | None = None
    exitcode: int | None = None
    seconds: float = 0.0  # from the start of the function to its return or raise

    @property
    def raised(self) -> bool:
        return self.error is not None


def torch_for_procs() -> Any:
    """torch with gloo and FSDP2's hooks, or SkipTest."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        raise unittest.SkipTest("torch is not installed") from None
    if not dist.is_available() or not dist.is_gloo_available():
        raise unittest.SkipTest("this torch has no gloo process group")
    return torch


def _child(rank: int, nprocs: int, local: int, port: int, fn: Callable[..., Any], args: tuple, env: dict[str, str],
           results: Any) -> None:
    os.environ.update(env)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(nprocs),
                      LOCAL_RANK=str(rank % local), LOCAL_WORLD_SIZE=str(local), GROUP_RANK=str(rank // local),
                      OMP_NUM_THREADS="1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    start = time.monotonic()
    try:
        dist.init_process_group("gloo", init_method="env://")
        start = time.monotonic()
        value = fn(rank, *args)
        results.put(Outcome(rank, value=value, seconds=time.monotonic() - start))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        code = getattr(exc, "code", None)
        notes = " ".join(getattr(exc, "__notes__", []))
        text = f"{exc} {notes}".strip() if notes else str(exc)
        results.put(Outcome(rank, error=(type(exc).__name__, text + "\n" + traceback.format_exc(limit=3),
                                         int(code) if code is not None else None),
                            seconds=time.monotonic() - start))
    results.close()
    results.join_thread()
    # Not through the interpreter's exit: a process group whose peer died may wait in its destructor.
    os._exit(0)


def run_procs(nprocs: int, fn: Callable[..., Any], *args: Any, local: int | None = None,
              env: dict[str, str] | None = None, timeout: float = 240.0) -> list[Outcome]:
    """Runs ``fn(rank, *args)`` in ``nprocs`` spawned processes (``local`` ranks a node as the launcher says, default
    all), ``env`` added to each one's environment; returns every rank's :class:`Outcome`, in rank order. A process
    that neither reports nor exits within ``timeout`` seconds is killed and fails the test's assertions (no value,
    no error)."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_child, args=(r, nprocs, local or nprocs, port, fn, args, dict(env or {}), results),
                         daemon=True) for r in range(nprocs)]
    for p in procs:
        p.start()
    outcomes = {r: Outcome(r) for r in range(nprocs)}
    deadline = time.monotonic() + timeout
    pending = set(range(nprocs))
    while pending and time.monotonic() < deadline:
        try:
            got = results.get(timeout=0.2)
            outcomes[got.rank] = got
            pending.discard(got.rank)
        except queue.Empty:
            pass
        pending = {r for r in pending if procs[r].is_alive() or procs[r].exitcode == 0}
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()) if p.is_alive() else 0)
        if p.is_alive():
            p.kill()
            p.join()
    for r, p in enumerate(procs):
        outcomes[r].exitcode = p.exitcode
    return [outcomes[r] for r in range(nprocs)]
