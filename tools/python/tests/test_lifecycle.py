"""Communicators on the host backend: init, queries, layouts, config fields, close/abort and errors."""
from __future__ import annotations

import ctypes
import threading
import unittest
import warnings

import zpccl
from zpccl import Backend, Result, ZpcclError, run_host_ranks
from zpccl import _lib


def one_rank(**config: object) -> zpccl.Comm:
    return zpccl.Comm(1, 0, zpccl.get_unique_id(), backend="host", **config)


class Queries(unittest.TestCase):
    def test_one_node(self) -> None:
        for nranks in (1, 2, 4, 8):
            def body(rank: int, comm: zpccl.Comm) -> tuple:
                return (comm.nranks, comm.rank, comm.cuda_device, comm.backend, comm.node_count, comm.node_rank,
                        comm.local_rank, comm.local_size, comm.hpz_rank, comm.hpz_size)

            got = run_host_ranks(nranks, body)
            self.assertEqual(got, [(nranks, r, -1, Backend.HOST, 1, 0, r, nranks, r, nranks) for r in range(nranks)])

    def test_emulated_layouts(self) -> None:
        for nranks, rpn, hpz in ((2, 1, None), (4, 2, None), (8, 4, 2), (8, 2, 1), (8, 8, 4)):
            got = run_host_ranks(nranks, lambda r, c: (c.node_count, c.node_rank, c.local_rank, c.local_size,
                                                       c.hpz_rank, c.hpz_size), ranks_per_node=rpn, hpz_size=hpz)
            h = hpz or rpn
            self.assertEqual(got, [(nranks // rpn, r // rpn, r % rpn, rpn, r % rpn % h, h) for r in range(nranks)],
                             (nranks, rpn, hpz))

    def test_node_id_per_rank(self) -> None:
        got = run_host_ranks(5, lambda r, c: (c.node_count, c.node_rank, c.local_rank, c.local_size),
                             configure=lambda r: {"node_id": 17 if r % 2 == 0 else 3})
        self.assertEqual(got, [(2, r % 2, r // 2, 3 if r % 2 == 0 else 2) for r in range(5)])

    def test_results_in_rank_order(self) -> None:
        self.assertEqual(run_host_ranks(8, lambda r, c: r * r), [r * r for r in range(8)])


class ConfigFields(unittest.TestCase):
    """Each field set to a bad value is named by the library's message: the Python layout is the C one."""

    CASES = [
        ({"backend": 9}, "config->backend"),
        ({"ranks_per_node": 3}, "config->ranksPerNode"),
        ({"node_id": -5}, "config->nodeId"),
        ({"hpz_size": 0}, "config->hpzSize"),
        ({"weight_bits": 6}, "config->weightBits"),
        ({"grad_bits": 16}, "config->gradBits"),
        ({"block_size": 100}, "config->blockSize"),
        ({"blocking": 0}, "config->blocking"),
    ]

    def test_each_field_reaches_its_c_field(self) -> None:
        for fields, mention in self.CASES:
            with self.subTest(fields=fields):
                with self.assertRaises(ZpcclError) as ctx:
                    zpccl.Comm(4, 0, zpccl.get_unique_id(), **{"backend": "host", **fields})
                self.assertIn("zpCommInitRankConfig", ctx.exception.message)
                self.assertIn(mention, ctx.exception.message)
                self.assertIn(ctx.exception.code, (Result.INVALID_ARGUMENT, Result.INVALID_USAGE))

    def test_settings_must_match_across_ranks(self) -> None:
        uid = zpccl.get_unique_id()
        errors: list = [None] * 4

        def rank(r: int) -> None:
            try:
                zpccl.Comm(4, r, uid, backend="host", hpz_size=2 if r < 2 else 4).close()
            except ZpcclError as e:
                errors[r] = e

        threads = [threading.Thread(target=rank, args=(r,)) for r in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for r, e in enumerate(errors):
            with self.subTest(rank=r):
                self.assertIsInstance(e, ZpcclError)
                self.assertEqual(e.code, Result.INVALID_USAGE)
                self.assertEqual(e.message,
                                 "zpCommInitRankConfig : ranks disagree on config->hpzSize: 2 on rank 0, 4 on rank 2")

    def test_header_fields_are_checked(self) -> None:
        L = _lib.lib()
        for field, value, mention in (("magic", 0x1234, "magic"), ("size", 8, "size")):
            config = zpccl.Config.initializer()
            config.backend = Backend.HOST
            setattr(config, field, value)
            handle = ctypes.c_void_p()
            uid = zpccl.UniqueId.from_bytes(zpccl.get_unique_id(), "t")
            res = L.zpCommInitRankConfig(ctypes.byref(handle), 1, uid, 0, ctypes.byref(config))
            self.assertEqual(res, Result.INVALID_ARGUMENT)
            self.assertIn(mention, _lib.last_error(None))
            self.assertIsNone(handle.value)

    def test_settings_take_effect(self) -> None:
        import numpy as np

        x = np.linspace(-1, 1, 64, dtype=np.float32)
        with one_rank(weight_bits=4, block_size=32) as comm:
            y = comm.quant_all_gather(x)
        with one_rank() as comm:
            self.assertTrue(np.array_equal(comm.quant_all_gather(x, bits=4, block_size=32), y))
            self.assertFalse(np.array_equal(comm.quant_all_gather(x), y))  # default: 8 bits

    def test_python_type_errors(self) -> None:
        with self.assertRaisesRegex(TypeError, "Comm: hpz_size must be an int, got str"):
            one_rank(hpz_size="2")
        with self.assertRaisesRegex(ValueError, "Comm: backend 'gpu' is not one of default, cuda, host"):
            zpccl.Comm(1, 0, zpccl.get_unique_id(), backend="gpu")
        with self.assertRaisesRegex(ValueError, "Comm: unique_id has 12 bytes, expected 128"):
            zpccl.Comm(1, 0, b"x" * 12, backend="host")
        with self.assertRaisesRegex(TypeError, "Comm: unknown config field 'bits'"):
            _lib.make_config("Comm", bits=4)

    def test_the_unset_marker_is_not_a_value(self) -> None:
        # C reads INT_MIN in a field as "unset": passed explicitly, it would silently mean the default.
        for field in ("node_id", "ranks_per_node", "hpz_size", "weight_bits", "grad_bits", "block_size", "blocking",
                      "backend"):
            with self.subTest(field=field):
                with self.assertRaises(ValueError) as ctx:
                    zpccl.Comm(1, 0, zpccl.get_unique_id(), **{"backend": "host", field: -2**31})
                self.assertEqual(ctx.exception.message, f"Comm: {field} -2147483648 is ZP_CONFIG_UNDEF_INT, which "
                                 "means unset (no field takes it as a value); pass None for the default")
        with one_rank(node_id=None, hpz_size=None) as comm:  # None is how to leave a field unset
            self.assertEqual(comm.hpz_size, 1)

    def test_rank_errors_come_from_c(self) -> None:
        with self.assertRaises(ZpcclError) as ctx:
            zpccl.Comm(4, 4, zpccl.get_unique_id(), backend="host")
        self.assertEqual(ctx.exception.code, Result.INVALID_ARGUMENT)
        self.assertIn("zpCommInitRankConfig : rank 4 is out of range [0, 4)", str(ctx.exception))
        self.assertIn("[zpInvalidArgument]", str(ctx.exception))


class Lifecycle(unittest.TestCase):
    def test_context_manager_closes(self) -> None:
        with one_rank() as comm:
            self.assertFalse(comm.closed)
            handle = comm.handle
        self.assertTrue(comm.closed)
        comm.close()  # idempotent
        comm.abort()
        # C refuses the destroyed handle too (checked without dereferencing it).
        count = ctypes.c_int(-1)
        self.assertEqual(_lib.lib().zpCommCount(handle, ctypes.byref(count)), Result.INVALID_ARGUMENT)
        self.assertEqual(count.value, -1)
        self.assertIn("not a live communicator", _lib.last_error(handle))

    def test_destroyed_handle_stays_dead_after_new_communicators(self) -> None:
        L = _lib.lib()
        for _ in range(20):
            old = one_rank()
            stale = old.handle
            old.close()
            with one_rank() as new:  # often in the memory the old one had
                self.assertNotEqual(new.handle, stale)
                self.assertEqual(L.zpCommDestroy(stale), Result.INVALID_ARGUMENT)
                self.assertIn("zpCommDestroy", _lib.last_error(None))
                self.assertEqual(new.nranks, 1)  # the second destroy did not reach it

    def test_closed_communicator_names_the_call(self) -> None:
        import numpy as np

        comm = one_rank()
        comm.close()
        calls = {
            "nranks": lambda: comm.nranks,
            "hpz_rank": lambda: comm.hpz_rank,
            "reserve": lambda: comm.reserve(1024),
            "async_error": comm.async_error,
            "quant_all_gather": lambda: comm.quant_all_gather(np.zeros(4, np.float32)),
            "hier_all_gather": lambda: comm.hier_all_gather(np.zeros(4, np.float32)),
            "hier_secondary_shard": lambda: comm.hier_secondary_shard(4),
            "quant_reduce_scatter": lambda: comm.quant_reduce_scatter(np.zeros(4, np.float32)),
            "quantize": lambda: comm.quantize(np.zeros(4, np.float32), 8, 256),
            "dequantize": lambda: comm.dequantize(np.zeros(32, np.uint8), 4, "float32", 8, 256),
            "handle": lambda: comm.handle,
        }
        for name, fn in calls.items():
            with self.subTest(call=name):
                with self.assertRaises(ZpcclError) as ctx:
                    fn()
                self.assertEqual(ctx.exception.message, f"{name}: the communicator is closed")
                self.assertEqual(ctx.exception.call, name)
        self.assertEqual(repr(comm), "<zpccl.Comm closed>")

    def test_abort_frees_and_wakes_peers(self) -> None:
        comm = one_rank()
        self.assertEqual(comm.async_error(), Result.SUCCESS)
        comm.abort()
        self.assertTrue(comm.closed)

    def test_failing_rank_aborts_and_its_error_is_reraised(self) -> None:
        import numpy as np

        def body(rank: int, comm: zpccl.Comm) -> None:
            if rank == 1:
                raise KeyError("boom on rank 1")
            comm.quant_all_gather(np.zeros(8, np.float32))  # waits for rank 1, woken by its abort

        with self.assertRaises(KeyError) as ctx:
            run_host_ranks(3, body)
        self.assertIn("boom on rank 1", str(ctx.exception))
        notes = getattr(ctx.exception, "__notes__", ["thread-rank 1"])
        self.assertTrue(any("thread-rank 1" in n for n in notes))

    def test_peer_sees_remote_error_after_abort(self) -> None:
        import numpy as np

        seen: dict[int, BaseException] = {}

        def body(rank: int, comm: zpccl.Comm) -> None:
            if rank == 0:
                comm.abort()
                return
            try:
                comm.quant_all_gather(np.zeros(8, np.float32))
            except ZpcclError as e:
                seen[rank] = e
            self.assertEqual(comm.async_error(), Result.REMOTE_ERROR)

        run_host_ranks(2, body)
        self.assertEqual(seen[1].code, Result.REMOTE_ERROR)
        self.assertIn("zpQuantAllGather", seen[1].message)

    def test_reserve_and_repr(self) -> None:
        with one_rank() as comm:
            comm.reserve(1 << 20)
            self.assertEqual(repr(comm), "<zpccl.Comm rank 0 of 1 on host>")

    def test_unclosed_warns(self) -> None:
        comm = one_rank()
        handle = comm.handle
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            del comm
        self.assertTrue(any(issubclass(w.category, ResourceWarning) for w in caught))
        self.assertEqual(_lib.lib().zpCommDestroy(handle), Result.SUCCESS)  # not destroyed by the collector

    def test_two_worlds_at_once(self) -> None:
        out: list = []
        a = threading.Thread(target=lambda: out.append(run_host_ranks(4, lambda r, c: c.nranks)))
        b = threading.Thread(target=lambda: out.append(run_host_ranks(3, lambda r, c: c.nranks)))
        a.start(), b.start(), a.join(), b.join()
        self.assertEqual(sorted(out), [[3] * 3, [4] * 4])

    def test_from_nccl_comm_null(self) -> None:
        with self.assertRaises(ZpcclError) as ctx:
            zpccl.Comm.from_nccl_comm(0, allow_several_nccl=True)  # the library's own check of NULL
        self.assertIn("zpCommInitFromNccl : ncclComm is NULL", ctx.exception.message)

    def test_unique_ids_differ(self) -> None:
        a, b = zpccl.get_unique_id(), zpccl.get_unique_id()
        self.assertEqual((len(a), len(b)), (128, 128))
        self.assertNotEqual(a, b)


if __name__ == "__main__":
    unittest.main()
