"""Host backend helper: run a function on N thread-ranks of one communicator, as the C tests' runHostRanks does."""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, TypeVar

from .comm import Comm, get_unique_id
from .enums import Backend

T = TypeVar("T")


def run_host_ranks(nranks: int, fn: Callable[[int, Comm], T], *,
                   configure: Callable[[int], dict[str, Any]] | None = None, timeout: float | None = None,
                   **config: Any) -> list[T]:
    """Runs ``fn(rank, comm)`` on ``nranks`` threads, each with its rank of one host-backend communicator.

    Creates a unique id, starts one thread per rank, creates the rank's :class:`Comm` (``backend="host"``,
    ``config`` as keyword arguments of :class:`Comm`, updated per rank by ``configure(rank)`` when given, e.g.
    ``lambda r: {"node_id": r % 2}``), calls ``fn``, destroys the communicator, and returns ``fn``'s results in
    rank order. ctypes releases the GIL inside each C call, so ranks really do meet inside the collectives.

    A rank whose ``fn`` raises aborts its communicator, which wakes peers waiting for it in a collective (they
    fail with ``REMOTE_ERROR``); the first exception raised, in time, is re-raised here, with the rank in a note.
    ``timeout`` (seconds) bounds the wait for the threads (``TimeoutError``; they are daemons and keep running
    until the library's own ``ZP_HOST_TIMEOUT_MS`` frees them).
    """
    if not isinstance(nranks, int) or nranks <= 0:
        raise ValueError(f"run_host_ranks: nranks {nranks!r} must be a positive int")
    uid = get_unique_id()
    results: list[Any] = [None] * nranks
    failures: list[tuple[int, BaseException]] = []
    lock = threading.Lock()

    def record(rank: int, exc: BaseException) -> None:
        with lock:
            failures.append((rank, exc))

    def body(rank: int) -> None:
        kwargs = dict(config)
        if configure is not None:
            kwargs.update(configure(rank) or {})
        kwargs["backend"] = Backend.HOST
        try:
            comm = Comm(nranks, rank, uid, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            record(rank, exc)
            return
        try:
            results[rank] = fn(rank, comm)
        except BaseException as exc:  # noqa: BLE001
            record(rank, exc)
            try:
                comm.abort()
            except BaseException:  # noqa: BLE001 - the first failure is the one worth reporting
                pass
            return
        try:
            comm.close()
        except BaseException as exc:  # noqa: BLE001
            record(rank, exc)

    threads = [threading.Thread(target=body, args=(r,), name=f"zpccl-rank-{r}", daemon=True) for r in range(nranks)]
    for t in threads:
        t.start()
    deadline = None if timeout is None else time.monotonic() + timeout
    for t in threads:
        t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    stuck = [r for r, t in enumerate(threads) if t.is_alive()]
    if stuck:
        raise TimeoutError(f"run_host_ranks: ranks {stuck} still running after {timeout} s")
    if failures:
        rank, exc = failures[0]
        if hasattr(exc, "add_note"):
            exc.add_note(f"raised on thread-rank {rank} of {nranks} (run_host_ranks)")
        raise exc
    return results
