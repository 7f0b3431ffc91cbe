"""Ranks as processes spawned on this host, for the examples, the tests and the perf scripts.

    import zpccl.launch

    def train(args):                      # one rank: torch.distributed.init_process_group() reads the env:// rendezvous
        ...

    zpccl.launch.run(train, 4, args)      # here when torchrun started this process, else 4 spawned ranks

:func:`spawn` starts N processes (multiprocessing's "spawn" start method: each imports its modules afresh, as CUDA
needs) with torch.distributed's env:// rendezvous set as torchrun sets it (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` on a free port of this host), so that one function serves both
launchers. It returns each rank's return value in rank order; the first rank that raises or dies stops the others
(which may be waiting for it in a collective) and :class:`RankFailed` names it, with its traceback. It imports
neither torch nor the library.

The link regimes of one host (DESIGN.md, "Speed"), for the ranks of the examples, the tests and the perf scripts:
:func:`regime_env` gives the variables that make each (``net``: a host of its own for each process, NCCL's P2P and
shared memory off, so that processes sharing GPUs meet over sockets as emulated nodes), :func:`set_default_env` what
every regime shares (NVLink multicast off) unless the environment says otherwise, and :func:`net_label` the regime
label of rows measured over ``net``. tools/regimes.sh decides the same for the shell scripts, and
tests/test_regimes.py holds the two together.

    os.environ.update(zpccl.launch.regime_env("net", rank))   # in each rank, before NCCL's first call
"""
from __future__ import annotations

import multiprocessing
import os
import queue
import socket
import stat
import sys
import time
import traceback
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable, MutableMapping

__all__ = ["REGIMES", "RankFailed", "STOP_GRACE_S", "free_port", "host_id", "net_label", "regime_env", "run",
           "set_default_env", "sharing_suffix", "spawn"]

#: The variables of torch.distributed's env:// rendezvous that :func:`spawn` sets in each rank.
RENDEZVOUS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_HOST = "127.0.0.1"
_POLL_S = 0.05  # how often the parent looks for a rank that died without a word

#: The link regimes, as tools/regimes.sh names them: ``nvlink`` (NCCL's own links), ``nvlink-procs`` (as nvlink, a
#: process per GPU, every process naming the same host), ``shm`` (NCCL's P2P off: host shared memory), ``net`` (a host
#: of its own for each process, P2P and shared memory off: every transfer over sockets, as between nodes; processes
#: may then share a GPU) and ``2x2`` (a host of its own for each process, whose GPUs reach each other as NCCL finds
#: them: nodes of several GPUs, sockets between nodes).
REGIMES = ("nvlink", "nvlink-procs", "shm", "net", "2x2")
_SHARED_ENV = {"NCCL_NVLS_ENABLE": "0"}  # every regime: NVLink multicast off, the machines being shared
_REGIME_ENV = {"nvlink": {}, "nvlink-procs": {}, "shm": {"NCCL_P2P_DISABLE": "1"},
               "net": {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}, "2x2": {}}
_OWN_HOSTS = ("net", "2x2")  # the regimes whose processes are hosts of their own


def host_id(process: int) -> str:
    """The ``NCCL_HOSTID`` of process ``process`` of a run whose processes are hosts of their own."""
    return f"zp-node-{process}"


def regime_env(regime: str, process: int | None = None) -> dict[str, str]:
    """The variables of link regime ``regime`` (one of :data:`REGIMES`) for process ``process`` (0, 1, ...) of a run,
    to set before NCCL's first call. ``net`` and ``2x2`` name each process's host, so they need ``process``; the
    others give every process the same variables. ValueError for an unknown regime or a missing index."""
    if regime not in _REGIME_ENV:
        raise ValueError(f"zpccl.launch: unknown regime {regime!r} (known: {', '.join(REGIMES)})")
    env = dict(_SHARED_ENV, **_REGIME_ENV[regime])
    if regime in _OWN_HOSTS:
        if isinstance(process, bool) or not isinstance(process, int) or process < 0:
            raise ValueError(f"zpccl.launch: regime {regime} needs the index of the process, not {process!r}")
        env["NCCL_HOSTID"] = host_id(process)
    elif regime == "nvlink-procs":
        env["NCCL_HOSTID"] = host_id(0)
    return env


def set_default_env(environ: MutableMapping[str, str] | None = None) -> None:
    """Sets what every regime shares (NVLink multicast off) in ``environ`` (this process's by default, which the
    ranks it spawns inherit) where it is not set already: a launch's default, which the user's own setting keeps."""
    environ = os.environ if environ is None else environ
    for name, value in _SHARED_ENV.items():
        environ.setdefault(name, value)


def sharing_suffix(environ: MutableMapping[str, str] | None = None) -> str:
    """``"-mps"`` when CUDA MPS serves the CUDA processes started with ``environ`` (default ``os.environ``), else
    ``""``: the suffix of the labels of rows whose processes share GPUs. A client connects to the MPS daemon whose
    pipe folder (``CUDA_MPS_PIPE_DIRECTORY``, else ``/tmp/nvidia-mps``) holds its ``control`` endpoint (a UNIX
    socket; a named pipe in older drivers). Under MPS the processes' kernels run together instead of taking turns
    in time slices, which changes what a call costs."""
    environ = os.environ if environ is None else environ
    control = os.path.join(environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps", "control")
    try:
        mode = os.stat(control).st_mode
    except OSError:
        return ""
    return "-mps" if stat.S_ISSOCK(mode) or stat.S_ISFIFO(mode) else ""


def net_label(gpus: int, environ: MutableMapping[str, str] | None = None) -> str:
    """The regime label of rows measured as emulated nodes over sockets (regime ``net``) on ``gpus`` GPUs:
    ``net-on1gpu``, or ``net-on1gpu-mps`` under CUDA MPS (:func:`sharing_suffix`)."""
    return f"net-on{gpus}gpu{sharing_suffix(environ)}"


class RankFailed(RuntimeError):
    """A spawned rank raised (``details``: its traceback) or died (its exit code); ``rank`` is the first to."""

    def __init__(self, rank: int, nprocs: int, details: str) -> None:
        self.rank, self.nprocs, self.details = rank, nprocs, details
        super().__init__(f"rank {rank} of {nprocs} failed:\n{details}")


def free_port(host: str = _HOST) -> int:
    """A TCP port of ``host`` that nothing listens on now (the rendezvous' store binds it next)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


#: Seconds that :func:`spawn` gives the ranks it stops to exit on SIGTERM before it kills them: a rank may handle
#: SIGTERM and go on (trainers that checkpoint on it), or be inside a C call (a collective waiting for the rank that
#: failed), where Python runs its handler only once the call returns.
STOP_GRACE_S = 5.0

#: How many times :func:`spawn` starts its ranks when the rendezvous port is taken under it.
RENDEZVOUS_TRIES = 3


def spawn(fn: Callable[..., Any], nprocs: int, *args: Any, env: dict[str, str] | None = None,
          timeout: float | None = None) -> list[Any]:
    """Runs ``fn(*args)`` in ``nprocs`` spawned processes, rank r with ``RANK=LOCAL_RANK=r``,
    ``WORLD_SIZE=nprocs`` and one ``MASTER_ADDR``/``MASTER_PORT``, after ``env``'s variables; returns the ranks'
    return values in rank order. ``fn``, ``args`` and the results must pickle (``fn`` a module-level function).

    The port is free when chosen, but another process may take it before rank 0's store binds it (seconds later,
    once the ranks have imported their modules); when rank 0 fails for that alone, the ranks start again on another
    port, up to :data:`RENDEZVOUS_TRIES` times in all, and stderr says so.

    Raises :class:`RankFailed` for the first rank that raises or dies, having stopped the others;
    :class:`TimeoutError` when ranks are still running after ``timeout`` seconds (None: no limit, each try)."""
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"zpccl.launch.spawn: nprocs {nprocs!r} must be an int of at least 1")
    for attempt in range(1, RENDEZVOUS_TRIES):
        port = free_port()
        try:
            return _spawn_on(port, fn, nprocs, args, env, timeout)
        except RankFailed as e:
            if not _port_was_taken(e, port):
                raise
            print(f"zpccl.launch.spawn: rendezvous port {port} was taken before rank 0 could listen on it; starting "
                  f"the {nprocs} ranks again on another port (try {attempt + 1} of {RENDEZVOUS_TRIES})",
                  file=sys.stderr, flush=True)
    return _spawn_on(free_port(), fn, nprocs, args, env, timeout)


def _port_was_taken(failure: RankFailed, port: int) -> bool:
    """Whether rank 0 failed because its store could not listen on ``port``: torch's TCPStore names the port and the
    errno, by name (``EADDRINUSE``) or by its message, as torch's versions word it."""
    taken = "EADDRINUSE" in failure.details or "Address already in use" in failure.details
    return failure.rank == 0 and taken and str(port) in failure.details


def _spawn_on(port: int, fn: Callable[..., Any], nprocs: int, args: tuple, env: dict[str, str] | None,
              timeout: float | None) -> list[Any]:
    ctx = multiprocessing.get_context("spawn")
    results: Any = ctx.Queue()
    rendezvous = dict(MASTER_ADDR=_HOST, MASTER_PORT=str(port), WORLD_SIZE=str(nprocs))
    procs = [ctx.Process(target=_rank_main, args=(fn, args, dict(env or {}, **rendezvous, RANK=str(r),
                                                                     LOCAL_RANK=str(r)), r, results))
             for r in range(nprocs)]
    for p in procs:
        p.start()
    try:
        return _collect(procs, results, timeout)
    finally:
        _stop(procs)
        results.close()


def _stop(procs: list[Any]) -> None:
    """Stops the ranks still running: SIGTERM, then SIGKILL for those still there after :data:`STOP_GRACE_S`."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join()


def run(fn: Callable[..., Any], nprocs: int, *args: Any, env: dict[str, str] | None = None) -> list[Any]:
    """``fn(*args)`` in this process when it is already one rank of a launched world (``RANK`` is set: torchrun),
    else :func:`spawn` of ``nprocs`` ranks; the return values, this rank's alone in the first case."""
    if "RANK" in os.environ:
        return [fn(*args)]
    return spawn(fn, nprocs, *args, env=env)


def _collect(procs: list[Any], results: Any, timeout: float | None) -> list[Any]:
    """The ranks' results, in rank order, as they report; the first failure, or a rank that exits without a
    report, raises."""
    nprocs, done = len(procs), {}
    deadline = None if timeout is None else time.monotonic() + timeout
    while len(done) < nprocs:
        try:
            rank, ok, value = results.get(timeout=_POLL_S)
        except queue.Empty:
            for r, p in enumerate(procs):
                # A rank's report is queued before it exits: one more look at the queue before calling it dead.
                if r not in done and p.exitcode is not None and results.empty():
                    time.sleep(_POLL_S)
                    if results.empty():
                        raise RankFailed(r, nprocs, f"exited with code {p.exitcode} before reporting") from None
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"zpccl.launch.spawn: ranks {sorted(set(range(nprocs)) - set(done))} still "
                                   f"running after {timeout} s") from None
            continue
        if not ok:
            raise RankFailed(rank, nprocs, value)
        done[rank] = value
    return [done[r] for r in range(nprocs)]


def _rank_main(fn: Callable[..., Any], args: tuple, env: dict[str, str], rank: int, results: Any) -> None:
    os.environ.update(env)
    try:
        value = fn(*args)
    except SystemExit as e:
        if e.code not in (None, 0):
            results.put((rank, False, f"SystemExit({e.code!r})\n{traceback.format_exc()}"))
            return
        value = None
    except BaseException:  # noqa: BLE001 - reported to the parent, which names the rank
        results.put((rank, False, traceback.format_exc()))
        return
    # The queue pickles in a thread of its own, whose failure reaches neither this rank nor the parent (which would see
    # a rank that exited without a word): pickled here first, as the queue pickles, a value that cannot be is this
    # rank's failure, named.
    try:
        ForkingPickler.dumps(value)
    except Exception as exc:  # noqa: BLE001 - pickling raises many kinds
        name = getattr(fn, "__qualname__", repr(fn))
        results.put((rank, False, f"{name}'s return value (a {type(value).__module__}.{type(value).__qualname__}) "
                                  f"cannot be pickled to reach the parent ({type(exc).__name__}: {exc}): return "
                                  "values that pickle (plain data, arrays, tensors)"))
        return
    results.put((rank, True, value))
