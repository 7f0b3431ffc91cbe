"""``Comm.from_transport`` with a transport written in Python (threads of this process meeting at a barrier, copying
between the memoryviews the library lends): outputs equal thread-ranks' (``run_host_ranks``) bit for bit, the
callbacks survive the garbage collector for the communicator's life, anything a callback raises (KeyboardInterrupt
included) becomes an error on every rank instead of unwinding through C, a close or abort from inside a callback is
refused and leaves the communicator whole, the transport is let go with the communicator (or a failed init), and
transports that are not transports are refused by name. Needs NumPy only."""
from __future__ import annotations

import gc
import threading
import unittest
import weakref
from typing import Any

import numpy as np

import zpccl


class ThreadTransport:
    """Ranks as threads, each with its own transport object sharing `posts` and a barrier."""

    def __init__(self, rank: int, nranks: int, shared: dict[str, Any], fail_on: int = 0,
                 error: type[BaseException] = RuntimeError) -> None:
        self.rank, self.nranks, self.shared = rank, nranks, shared
        self.calls, self.fail_on, self.error = 0, fail_on, error

    def _exchange(self, post: Any, take: Any) -> int:
        self.calls += 1
        self.shared["posts"][self.rank] = post
        self.shared["barrier"].wait(30)
        got = take()
        self.shared["barrier"].wait(30)
        if self.calls == self.fail_on:
            raise self.error("injected on rank %d" % self.rank)
        return got

    def all_gather(self, send: memoryview, recv: memoryview, timeout: float | None) -> int:
        n = len(send)

        def take() -> int:
            for r, peer in enumerate(self.shared["posts"]):
                recv[r * n:(r + 1) * n] = peer[0]
            return n * self.nranks

        return self._exchange((send,), take)

    def all_to_all(self, send: memoryview, send_counts: list[int], send_offsets: list[int], recv: memoryview,
                   recv_counts: list[int], recv_offsets: list[int], timeout: float | None) -> int:
        def take() -> int:
            for r, (peer, counts, offsets) in enumerate(self.shared["posts"]):
                c = counts[self.rank]
                assert c == recv_counts[r]
                recv[recv_offsets[r]:recv_offsets[r] + c] = peer[offsets[self.rank]:offsets[self.rank] + c]
            return sum(recv_counts)

        return self._exchange((send, send_counts, send_offsets), take)


def run_over(nranks: int, body: Any, fail_rank: int = -1, **transport_kwargs: Any) -> list[Any]:
    shared = {"posts": [None] * nranks, "barrier": threading.Barrier(nranks)}
    results: list[Any] = [None] * nranks

    def rank_main(rank: int) -> None:
        try:
            kwargs = transport_kwargs if rank == fail_rank else {}
            comm = zpccl.Comm.from_transport(ThreadTransport(rank, nranks, shared, **kwargs), node_id=rank // 2)
            gc.collect()  # the callbacks live on in the communicator
            try:
                results[rank] = body(rank, comm)
            finally:
                bridge = comm._transport
                comm.close()
                results[rank] = (results[rank], bridge.finalized, comm._transport)
        except BaseException as exc:  # noqa: BLE001
            results[rank] = exc

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(nranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def collectives(rank: int, comm: zpccl.Comm) -> list[np.ndarray]:
    rng = np.random.default_rng(rank)
    x = rng.standard_normal(777).astype(np.float32)
    grads = rng.standard_normal(4 * 777).astype(np.float32)
    return [comm.quant_all_gather(x), comm.hier_all_gather(x), comm.quant_reduce_scatter(grads, op="avg")]


class PythonTransport(unittest.TestCase):
    def test_outputs_equal_thread_ranks(self) -> None:
        over = run_over(4, collectives)
        threads = zpccl.run_host_ranks(4, collectives, configure=lambda r: {"node_id": r // 2})
        for rank in range(4):
            self.assertNotIsInstance(over[rank], BaseException, over[rank])
            outputs, finalized, left = over[rank]
            self.assertTrue(finalized)
            self.assertIsNone(left)
            for got, want in zip(outputs, threads[rank]):
                self.assertTrue(np.array_equal(got.view(np.uint32), want.view(np.uint32)))

    def test_what_a_callback_raises_is_an_error_on_every_rank(self) -> None:
        for error in (ValueError, KeyboardInterrupt):
            with self.subTest(error=error.__name__):
                def body(rank: int, comm: zpccl.Comm) -> Any:
                    try:
                        comm.quant_all_gather(np.ones(100, np.float32))  # arguments (3rd), data (4th), outcome
                    except zpccl.ZpcclError as exc:
                        return exc.code, str(exc)
                    return None

                over = run_over(4, body, fail_rank=2, fail_on=4, error=error)
                for rank in range(4):
                    self.assertNotIsInstance(over[rank], BaseException, over[rank])
                    (code, text), _, _ = over[rank]
                    self.assertEqual(code, zpccl.Result.REMOTE_ERROR)
                    self.assertRegex(text, r"^zpQuantAllGather : rank 2's transport: allGather of the call's data "
                                           rf"failed \(returned 1: {error.__name__}: injected on rank 2; ")

    def test_close_or_abort_inside_a_callback_is_refused_and_the_communicator_lives(self) -> None:
        for how in ("close", "abort"):
            with self.subTest(how=how):
                class Reentrant(ThreadTransport):
                    comm: zpccl.Comm | None = None
                    refused: BaseException | None = None

                    def all_gather(self, send: memoryview, recv: memoryview, timeout: float | None) -> int:
                        got = super().all_gather(send, recv, timeout)
                        if self.comm is not None:
                            comm, self.comm = self.comm, None
                            try:
                                getattr(comm, how)()
                            except zpccl.ZpcclError as exc:
                                self.refused = exc
                            gc.collect()  # the callbacks must still be alive for the rest of the call
                        return got

                transport = Reentrant(0, 1, {"posts": [None], "barrier": threading.Barrier(1)})
                comm = zpccl.Comm.from_transport(transport)
                bridge = comm._transport
                x = np.linspace(-3.0, 5.0, 300).astype(np.float32)
                want = comm.quant_all_gather(x)
                transport.comm = comm
                got = comm.quant_all_gather(x)
                self.assertIsInstance(transport.refused, zpccl.ZpcclError)
                self.assertEqual(transport.refused.code, zpccl.Result.INVALID_USAGE)
                c_call = "zpCommDestroy" if how == "close" else "zpCommAbort"
                self.assertRegex(str(transport.refused), rf"^{c_call} : called from inside zpQuantAllGather")
                self.assertFalse(comm.closed)
                self.assertIs(comm._transport, bridge)
                self.assertTrue(np.array_equal(got.view(np.uint32), want.view(np.uint32)))
                self.assertTrue(np.array_equal(comm.quant_all_gather(x).view(np.uint32), want.view(np.uint32)))
                getattr(comm, how)()
                self.assertTrue(comm.closed)
                self.assertTrue(bridge.finalized)

    def test_the_transport_is_let_go_when_the_communicator_goes_or_never_comes(self) -> None:
        # A transport over torch.distributed holds its process group: kept alive past destroy_process_group() until
        # the interpreter exits, gloo's group aborts the process there (torch's "terminate called without an active
        # exception"), which fails a torchrun job that closed everything. Reference counting alone must free it.
        gc.disable()
        try:
            for how in ("close", "abort", "failed init"):
                with self.subTest(how=how):
                    shared = {"posts": [None], "barrier": threading.Barrier(1)}
                    transport = ThreadTransport(0, 1, shared, fail_on=1 if how == "failed init" else 0)
                    alive = weakref.ref(transport)
                    if how == "failed init":
                        try:
                            zpccl.Comm.from_transport(transport)
                        except zpccl.ZpcclError as exc:
                            self.assertEqual(exc.code, zpccl.Result.REMOTE_ERROR)
                            exc = None  # noqa: F841 - its traceback holds the call's frames
                        else:
                            self.fail("init over a failing transport succeeded")
                    else:
                        comm = zpccl.Comm.from_transport(transport)
                        comm.quant_all_gather(np.ones(64, np.float32))
                        getattr(comm, how)()
                    del transport
                    self.assertIsNone(alive(), "the transport outlives its communicator")
        finally:
            gc.enable()

    def test_not_a_transport(self) -> None:
        class NoMethods:
            nranks, rank = 1, 0

        with self.assertRaisesRegex(TypeError, r"from_transport: transport has no method all_gather\(\)"):
            zpccl.Comm.from_transport(NoMethods())
        with self.assertRaisesRegex(TypeError, "from_transport: transport.nranks must be an int, got str"):
            zpccl.Comm.from_transport(type("T", (), {"nranks": "2", "rank": 0})())
        # ctypes would keep the low 32 bits: 2**32 + 1 ranks would reach C as 1, rank 2**32 as 0.
        for name, value in (("nranks", 2**32 + 1), ("rank", -2**31 - 1), ("rank", 2**32)):
            transport = ThreadTransport(0, 1, {"posts": [None], "barrier": threading.Barrier(1)})
            setattr(transport, name, value)
            with self.assertRaisesRegex(ValueError, rf"from_transport: transport\.{name} {value} does not fit in a "
                                                    "C int"):
                zpccl.Comm.from_transport(transport)
        with self.assertRaisesRegex(ValueError, "from_transport: a transport serves the host backend only"):
            zpccl.Comm.from_transport(ThreadTransport(0, 1, {}), backend="cuda")


if __name__ == "__main__":
    unittest.main()
