"""The host backend with ranks as processes over torch.distributed (``Comm.from_torch_group`` on a gloo group, one
process per rank spawned as torchrun starts them): the collectives are bit-equal to thread-ranks' on the same inputs,
on node layouts from the launcher's environment and from node ids (one hop and two hops, groups in and out of rank
order, chunked plans); arguments that differ, a callback that raises or returns short data, a transport whose size is
not the communicator's, and ranks that pass different groups give a clear error on every rank and a communicator that
refuses later calls; chunk tunables (ZP_CHUNK_BYTES, ...) that differ between the processes are refused at init; a rank killed with SIGKILL in the middle of a collective, or a group destroyed under the
communicator, makes every other rank raise REMOTE_ERROR within ZP_HOST_TIMEOUT_MS, naming the rank and the call,
without hanging. Skipped without torch (gloo)."""
from __future__ import annotations

import os
import signal
import unittest
from typing import Any

import numpy as np

import zpccl

from ._procs import run_procs, torch_for_procs

WORLD = 4
# Node layouts of the battery: the launcher's (two nodes of two, LOCAL_WORLD_SIZE=2), node ids whose groups across
# nodes are not in rank order (local rank 1 is rank 3 on node 0 and rank 2 on node 1), and one node.
LAYOUTS = {"launcher": None, "crossed": [0, 1, 1, 0], "one node": [0, 0, 0, 0]}
# Chunks of 16 KiB in the processes, the threads keeping the default: the plans of the battery's larger calls differ,
# their results must not.
CHUNKED = {"ZP_CHUNK_BYTES": "16384"}


def _bytes(t: Any) -> np.ndarray:
    import torch

    return t.detach().contiguous().view(torch.uint8).numpy().copy()


def battery(rank: int, comm: zpccl.Comm) -> dict[str, np.ndarray]:
    """Every collective, in several types, bit widths, block sizes and layouts of buffers (in place, count 0), with
    inputs that depend only on the rank: its outputs, by name."""
    import torch

    n, out = 3000 + 17, {}
    g = torch.Generator().manual_seed(100 + rank)
    for dt in (torch.bfloat16, torch.float32, torch.float16):
        x = (torch.randn(n, generator=g) * 3).to(dt)
        grads = torch.randn(WORLD * n, generator=g).to(dt)
        out[f"qwz {dt}"] = _bytes(comm.quant_all_gather(x))
        out[f"qwz int4/64 {dt}"] = _bytes(comm.quant_all_gather(x, bits=4, block_size=64))
        out[f"qgz sum {dt}"] = _bytes(comm.quant_reduce_scatter(grads, op="sum"))
        out[f"qgz avg int8/128 {dt}"] = _bytes(comm.quant_reduce_scatter(grads, op="avg", bits=8, block_size=128))
        out[f"hpz int8 {dt}"] = _bytes(comm.hier_all_gather(x, bits=8))
    for dt in (torch.int32, torch.bfloat16, torch.uint8):
        shard = torch.randint(0, 120, (n,), generator=g).to(dt)
        out[f"hpz exact {dt}"] = _bytes(comm.hier_all_gather(shard))
    full = torch.zeros(WORLD * n)
    full[rank * n:(rank + 1) * n] = torch.randn(n, generator=g)
    comm.quant_all_gather(full[rank * n:(rank + 1) * n], full)
    out["qwz in place"] = _bytes(full)
    grads = torch.randn(WORLD * n, generator=g)
    comm.quant_reduce_scatter(grads, grads[rank * n:(rank + 1) * n])
    out["qgz in place"] = _bytes(grads)
    residual = torch.zeros(WORLD * n, dtype=torch.bfloat16)
    hop = torch.zeros(max(1, comm.grad_hop_residual_count(n)), dtype=torch.bfloat16)
    for step in range(2):
        grads = torch.randn(WORLD * n, generator=g)
        out[f"qgz stochastic, feedback {step}"] = _bytes(
            comm.quant_reduce_scatter(grads, rounding="stochastic", seed=5, residual=residual, hop_residual=hop))
    out["residuals"] = np.concatenate([_bytes(residual), _bytes(hop)])
    out["count 0"] = _bytes(comm.quant_all_gather(torch.zeros(0)))
    return out


def _battery_over_gloo(rank: int) -> dict[str, dict[str, np.ndarray]]:
    results = {}
    for name, nodes in LAYOUTS.items():
        kwargs = {} if nodes is None else {"node_id": nodes[rank]}
        with zpccl.Comm.from_torch_group(**kwargs) as comm:
            assert comm.backend == zpccl.Backend.HOST and (comm.nranks, comm.rank) == (WORLD, rank)
            results[name] = battery(rank, comm)
            results[name]["layout"] = np.array([comm.node_count, comm.local_size, comm.hpz_size])
    return results


class CollectivesOverGloo(unittest.TestCase):
    def setUp(self) -> None:
        torch_for_procs()

    def test_bit_equal_to_thread_ranks(self) -> None:
        procs = run_procs(WORLD, _battery_over_gloo, local=2, env=CHUNKED)
        for p in procs:
            self.assertFalse(p.raised, p.error)
            self.assertEqual(p.exitcode, 0)
        for name, nodes in LAYOUTS.items():
            ids = [r // 2 for r in range(WORLD)] if nodes is None else nodes
            threads = zpccl.run_host_ranks(WORLD, battery, configure=lambda r, ids=ids: {"node_id": ids[r]})
            for rank in range(WORLD):
                got = procs[rank].value[name]
                self.assertEqual(set(got) - {"layout"}, set(threads[rank]), name)
                for key, want in threads[rank].items():
                    self.assertEqual(want.size == 0, key == "count 0", key)
                    self.assertTrue(np.array_equal(got[key], want), f"{name}, rank {rank}: {key}")
            self.assertEqual(procs[0].value[name]["layout"].tolist(),
                             {"launcher": [2, 2, 2], "crossed": [2, 2, 2], "one node": [1, 4, 4]}[name])


# ---- bad input ----------------------------------------------------------------------------------------------------


class _Faulty:
    """A TorchTransport whose `nth` exchange (counted from 1, init's included) raises after moving its data, or
    reports `short` bytes fewer, on this rank."""

    def __init__(self, group: Any = None, nth: int = 0, raises: bool = False, short: int = 0, extra_ranks: int = 0):
        from zpccl._torch import TorchTransport

        self.inner = TorchTransport(group)
        self.nranks, self.rank = self.inner.nranks + extra_ranks, self.inner.rank
        self.nth, self.raises, self.short, self.calls = nth, raises, short, 0

    def _after(self, got: int) -> int:
        self.calls += 1
        if self.calls == self.nth and self.raises:
            raise RuntimeError("injected by the test")
        return got - (self.short if self.calls == self.nth else 0)

    def all_gather(self, *args: Any) -> int:
        return self._after(self.inner.all_gather(*args))

    def all_to_all(self, *args: Any) -> int:
        return self._after(self.inner.all_to_all(*args))


def _error(call: Any) -> tuple[int, str]:
    """The code and message (notes included) of the ZpcclError that call() raises; (0, "") when it returns."""
    try:
        call()
    except zpccl.ZpcclError as exc:
        return int(exc.code), " ".join([str(exc), *getattr(exc, "__notes__", [])])
    return 0, ""


def _bad_input(rank: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    seen: dict[str, Any] = {}
    x = torch.ones(500) * (rank + 1)
    # Arguments that differ: every rank refuses the call, and the communicator serves the next one.
    with zpccl.Comm.from_torch_group() as comm:
        seen["mismatch"] = _error(lambda: comm.quant_all_gather(x[:500 - rank]))
        seen["after mismatch"] = _bytes(comm.quant_all_gather(x))
    # A callback that raises (rank 1, in qgZ's data exchange), then one that returns short data (rank 0).
    for key, fault in (("raises", dict(nth=4, raises=rank == 1)), ("short", dict(nth=4, short=16 * (rank == 0)))):
        comm = zpccl.Comm.from_transport(_Faulty(**fault))  # init's exchanges: its records, then its verdict
        seen[key] = _error(lambda: comm.quant_reduce_scatter(torch.ones(3 * 500)))  # arguments, data (4th), outcome
        seen[key + " later"] = _error(lambda: comm.quant_all_gather(x))
        comm.close()
    # A transport of more ranks than the group's, on every rank.
    seen["size"] = _error(lambda: zpccl.Comm.from_transport(_Faulty(extra_ranks=1)))
    # Ranks that pass different groups: rank 0 the world, the others a group of the same ranks.
    other = dist.new_group(list(range(3)))
    seen["groups"] = _error(lambda: zpccl.Comm.from_torch_group(None if rank == 0 else other))
    return seen


def _outside_a_subgroup(rank: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    group = dist.new_group([1, 2])  # collective over the world: rank 0 gets a placeholder
    seen: dict[str, Any] = {}
    if rank == 0:
        try:
            zpccl.Comm.from_torch_group(group)
        except zpccl.ZpcclError as exc:
            seen["outside"] = (type(exc).__name__, str(exc))
    else:
        with zpccl.Comm.from_torch_group(group) as comm:
            seen["inside"] = (comm.nranks, comm.rank, comm.quant_all_gather(torch.ones(4) * rank)[::4].tolist())
    # Rank 0 holds the rendezvous store: it stays until the members are done with it.
    dist.barrier()
    return seen


class BadInputOverGloo(unittest.TestCase):
    def test_clear_errors_on_every_rank(self) -> None:
        torch_for_procs()
        procs = run_procs(3, _bad_input, env={"ZP_INIT_TIMEOUT_MS": "3000", "ZP_HOST_TIMEOUT_MS": "20000"})
        for p in procs:
            self.assertFalse(p.raised, p.error)
        seen = [p.value for p in procs]
        remote, usage = int(zpccl.Result.REMOTE_ERROR), int(zpccl.Result.INVALID_USAGE)
        for rank, s in enumerate(seen):
            code, text = s["mismatch"]
            self.assertEqual(code, usage, text)
            self.assertIn("zpQuantAllGather : ranks disagree on sendcount: rank 0 passed 500, rank 1 passed 499", text)
            np.testing.assert_allclose(s["after mismatch"].view(np.float32)[::500], [1.0, 2.0, 3.0], rtol=1e-6)
            for key, what in (("raises", "allToAll of the call's data failed (returned 1: RuntimeError: injected by "
                                         "the test"),
                              ("short", "allToAll of the call's data returned ")):
                code, text = s[key]
                self.assertEqual(code, remote, f"rank {rank}: {text}")
                culprit = 1 if key == "raises" else 0
                self.assertIn(f"zpQuantReduceScatterA2A : rank {culprit}'s transport: {what}", text)
                code, text = s[key + " later"]
                self.assertEqual(code, remote, text)
                self.assertIn(f"zpQuantAllGather : the communicator failed: rank {culprit}'s transport", text)
            code, text = s["size"]
            self.assertEqual(code, remote, text)
            self.assertIn("the group has 3 ranks, but the communicator gathers 4 blocks", text)
            code, text = s["groups"]
            self.assertEqual(code, remote, text)
            self.assertIn("zpCommInitFromTransport : rank ", text)
            self.assertIn("every rank of the group must call it, with the same group", text)
        self.assertEqual(seen[0]["raises"], seen[2]["raises"])  # one message, on every rank

    def test_a_rank_outside_the_subgroup(self) -> None:
        """A rank that passes the placeholder new_group gave it (it is not a member) gets an error naming the call and
        the rank; the members' communicator is the subgroup's."""
        torch_for_procs()
        procs = run_procs(3, _outside_a_subgroup, timeout=120)
        for p in procs:
            self.assertFalse(p.raised, p.error)
        self.assertEqual(procs[0].value.get("outside"), ("ZpcclValueError", "from_torch_group: rank 0 is not a member "
                         "of the group (torch.distributed.new_group returns a placeholder to the ranks outside it): "
                         "only its members call this [zpInvalidArgument]"))
        for rank in (1, 2):
            self.assertEqual(procs[rank].value["inside"], (2, rank - 1, [1.0, 2.0]))


def _tunables_differ(rank: int, name: str, value: str) -> tuple[int, str]:
    """Rank 1 sets a tunable that cuts calls into chunks, before the library first reads it; every rank makes a
    communicator: the error, if any."""
    if rank == 1:
        os.environ[name] = value
    return _error(lambda: zpccl.Comm.from_torch_group().close())


class TunablesOverGloo(unittest.TestCase):
    def test_chunk_tunables_that_differ_are_refused_at_init(self) -> None:
        """Ranks as processes read their own environment: chunk tunables that differ would give the ranks' exchanges
        different sizes (the engine aborts or mixes data up); init refuses them on every rank, naming the variable
        and both values."""
        torch_for_procs()
        for name, value, shown in (("ZP_CHUNK_BYTES", "4096", "0, rank 1 has 4096"),
                                   ("ZP_MAX_CHUNKS", "3", "8, rank 1 has 3"),
                                   ("ZP_CHUNK_RAMP", "1", "0, rank 1 has 1")):
            procs = run_procs(2, _tunables_differ, name, value, env={"ZP_INIT_TIMEOUT_MS": "20000"})
            for p in procs:
                self.assertFalse(p.raised, p.error)
                code, text = p.value
                self.assertEqual(code, int(zpccl.Result.INVALID_USAGE), f"{name}: {text}")
                self.assertIn(f"zpCommInitFromTransport : ranks disagree on {name}: rank 0 has {shown}", text)
                self.assertIn("set them alike on every rank", text)


# ---- faults -------------------------------------------------------------------------------------------------------


class _KilledMidway:
    """A TorchTransport whose rank `victim` kills its own process with SIGKILL in the middle of its `nth` exchange
    (after the group's operation started on the other ranks)."""

    def __init__(self, victim: int, nth: int) -> None:
        from zpccl._torch import TorchTransport

        self.inner = TorchTransport()
        self.nranks, self.rank = self.inner.nranks, self.inner.rank
        self.victim, self.nth, self.calls = victim, nth, 0

    def _maybe_die(self) -> None:
        self.calls += 1
        if self.rank == self.victim and self.calls == self.nth:
            os.kill(os.getpid(), signal.SIGKILL)

    def all_gather(self, *args: Any) -> int:
        self._maybe_die()
        return self.inner.all_gather(*args)

    def all_to_all(self, *args: Any) -> int:
        self._maybe_die()
        return self.inner.all_to_all(*args)


def _killed_in_a_collective(rank: int) -> dict[str, Any]:
    import time

    import torch

    comm = zpccl.Comm.from_transport(_KilledMidway(victim=2, nth=2 + 4 * 3 + 2), ranks_per_node=2)
    grads = torch.ones(4 * 1000)
    seen: dict[str, Any] = {"done": 0}
    start = time.monotonic()
    for _ in range(5):  # each qgZ on two nodes: arguments, two hops, outcome; rank 2 dies in the 4th's first hop
        code, text = _error(lambda: comm.quant_reduce_scatter(grads))
        if code:
            seen["error"] = (code, text, time.monotonic() - start)
            break
        seen["done"] += 1
        start = time.monotonic()
    seen["later"] = _error(lambda: comm.quant_all_gather(grads[:1000]))
    comm.close()
    return seen


def _group_destroyed(rank: int) -> dict[str, Any]:
    import time

    import torch
    import torch.distributed as dist

    group = dist.new_group([0, 1, 2])
    comm = zpccl.Comm.from_torch_group(group)
    x = torch.ones(300)
    comm.quant_all_gather(x)
    if rank == 1:
        dist.destroy_process_group(group)
    start = time.monotonic()
    code, text = _error(lambda: comm.quant_all_gather(x))
    seen = {"error": (code, text, time.monotonic() - start), "later": _error(lambda: comm.quant_all_gather(x))}
    comm.close()
    return seen


class FaultsOverGloo(unittest.TestCase):
    TIMEOUT_MS = 8000

    def setUp(self) -> None:
        torch_for_procs()

    def check_survivors(self, procs: list[Any], dead: int | None, call: str) -> None:
        for p in procs:
            if p.rank == dead:
                self.assertEqual(p.exitcode, -signal.SIGKILL)
                continue
            self.assertFalse(p.raised, p.error)
            self.assertEqual(p.exitcode, 0, f"rank {p.rank}")
            code, text, seconds = p.value["error"]
            self.assertEqual(code, int(zpccl.Result.REMOTE_ERROR), text)
            self.assertRegex(text, rf"^{call} : rank \d's transport: ")
            self.assertLess(seconds, self.TIMEOUT_MS / 1000 + 5, text)
            self.assertEqual(p.value["later"][0], int(zpccl.Result.REMOTE_ERROR))
            self.assertIn("the communicator failed", p.value["later"][1])

    def test_a_rank_killed_in_a_collective(self) -> None:
        procs = run_procs(4, _killed_in_a_collective, env={"ZP_HOST_TIMEOUT_MS": str(self.TIMEOUT_MS)}, timeout=120)
        self.check_survivors(procs, 2, "zpQuantReduceScatterA2A")
        for p in procs:
            if p.rank != 2:
                self.assertEqual(p.value["done"], 3, f"rank {p.rank}")

    def test_a_group_destroyed_under_the_communicator(self) -> None:
        procs = run_procs(3, _group_destroyed, env={"ZP_HOST_TIMEOUT_MS": str(self.TIMEOUT_MS)}, timeout=120)
        self.check_survivors(procs, None, "zpQuantAllGather")


if __name__ == "__main__":
    unittest.main()
