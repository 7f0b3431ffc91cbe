"""Bad input: every error is a ZpcclError (ValueError / TypeError where Python found it) naming the call.

Collective errors are made on every rank alike, as a real bad call would be, so no rank is left waiting.
"""
from __future__ import annotations

import unittest
from typing import Any, Callable

import numpy as np

import zpccl
from zpccl import Result, ZpcclError, _lib, run_host_ranks


def on_ranks(nranks: int, fn: Callable[[int, zpccl.Comm], Any]) -> list[Any]:
    """Runs ``fn`` expecting it to raise on every rank; returns the exceptions in rank order."""
    def body(rank: int, comm: zpccl.Comm) -> BaseException | None:
        try:
            fn(rank, comm)
        except ZpcclError as e:
            return e
        return None

    return run_host_ranks(nranks, body)


class BadInput(unittest.TestCase):
    def expect(self, fn: Callable[[int, zpccl.Comm], Any], message: str, kind: type = ZpcclError,
               nranks: int = 2, code: Result = Result.INVALID_ARGUMENT) -> ZpcclError:
        errors = on_ranks(nranks, fn)
        for e in errors:
            self.assertIsInstance(e, kind, message)
            self.assertIn(message, str(e))
            self.assertEqual(e.code, code)
        return errors[0]

    def test_wrong_dtype(self) -> None:
        x = np.zeros(8, np.int64)
        e = self.expect(lambda r, c: c.quant_all_gather(x),
                        "quant_all_gather: send dtype int64 is not supported (float16, bfloat16 and float32 are)",
                        ValueError)
        self.assertEqual(e.call, "quant_all_gather")
        self.expect(lambda r, c: c.quant_reduce_scatter(np.zeros(8, np.uint16)),
                    "for bfloat16 bits held in uint16 pass dtype='bfloat16'", ValueError)
        self.expect(lambda r, c: c.quantize(np.zeros(8, np.float64), 8, 256),
                    "quantize: x dtype float64 is not supported", ValueError, nranks=1)
        self.expect(lambda r, c: c.dequantize(np.zeros(64, np.uint8), 8, np.int32, 8, 256),
                    "dequantize: out dtype int32 is not supported", ValueError, nranks=1)
        self.expect(lambda r, c: c.quant_all_gather(np.zeros(8, np.float16), dtype="bfloat16"),
                    "quant_all_gather: dtype bfloat16 does not match send's element type float16", ValueError)
        self.expect(lambda r, c: c.quant_all_gather(np.zeros(8, np.float32), np.zeros(16, np.float16)),
                    "quant_all_gather: recv dtype float16 differs from send dtype float32", ValueError)
        self.expect(lambda r, c: c.hier_all_gather(np.zeros(8, np.int8), dtype="float16"),
                    "hier_all_gather: dtype float16 does not match send's element type int8", ValueError)

    def test_arrays_of_python_objects_are_refused(self) -> None:
        objects = np.array([object(), "text", 3, None], dtype=object)
        holding = np.zeros(4, dtype=[("weight", np.float32), ("tag", object)])  # a structured dtype with objects
        for send, label in ((objects, "object"), (holding, str(holding.dtype))):
            with self.subTest(dtype=label):
                recv = np.empty(2 * send.size, dtype=send.dtype)
                self.expect(lambda r, c: c.hier_all_gather(send, recv),
                            f"hier_all_gather: send has dtype {label}, which holds Python objects", TypeError)
                # As an output too, and in every method that takes arrays.
                self.expect(lambda r, c: c.hier_all_gather(np.zeros(4, np.float64), recv),
                            "hier_all_gather: recv has dtype", TypeError)
                self.expect(lambda r, c: c.quant_all_gather(send), "quant_all_gather: send has dtype", TypeError)
                self.expect(lambda r, c: c.quant_reduce_scatter(send), "quant_reduce_scatter: send has dtype",
                            TypeError)
                self.expect(lambda r, c: c.quantize(send, 8, 256), "quantize: x has dtype", TypeError, nranks=1)
                self.expect(lambda r, c: c.dequantize(send, 4, "float32", 8, 256), "dequantize: payload has dtype",
                            TypeError, nranks=1)
        # The objects are untouched and still counted: the interpreter can use and free them.
        self.assertEqual(objects[1], "text")
        self.assertEqual(sum(1 for o in objects if o is None), 1)

    def test_c_checks_the_type_too(self) -> None:
        # The same call straight through ctypes, past the Python check: the library refuses it as well.
        x, y = np.zeros(8, np.int64), np.zeros(16, np.int64)

        def raw_call(rank: int, comm: zpccl.Comm) -> None:
            ptr = lambda a: a.__array_interface__["data"][0]  # noqa: E731
            res = _lib.lib().zpQuantAllGather(ptr(x), ptr(y), 8, int(zpccl.DataType.INT64), comm.handle, None)
            _lib.check(res, "zpQuantAllGather", comm.handle)

        self.expect(raw_call, "zpQuantAllGather : type int64 is not supported (float16, bfloat16 and float32 are)")

    def test_not_an_array(self) -> None:
        self.expect(lambda r, c: c.quant_all_gather([1.0, 2.0]),
                    "quant_all_gather: send must be a numpy.ndarray or a torch.Tensor, got builtins.list", TypeError)
        self.expect(lambda r, c: c.hier_secondary_shard(10.0), "hier_secondary_shard: full_count must be an int",
                    TypeError)

    def test_non_contiguous(self) -> None:
        x = np.zeros(16, np.float32)[::2]
        self.expect(lambda r, c: c.quant_all_gather(x),
                    "quant_all_gather: send is not contiguous (shape (8,), strides (8,)); pass "
                    "numpy.ascontiguousarray(send)", ValueError)
        recv = np.zeros((4, 8), np.float32).T
        self.expect(lambda r, c: c.hier_all_gather(np.zeros(8, np.float32), recv),
                    "hier_all_gather: recv is not contiguous", ValueError)

    def test_wrong_sizes(self) -> None:
        self.expect(lambda r, c: c.quant_all_gather(np.zeros(6, np.float32), np.zeros(10, np.float32)),
                    "quant_all_gather: recv has 10 elements, expected 12", ValueError)
        self.expect(lambda r, c: c.hier_all_gather(np.zeros(6, np.float32), np.zeros(13, np.float32)),
                    "hier_all_gather: recv has 13 elements, expected 12", ValueError)
        self.expect(lambda r, c: c.quant_reduce_scatter(np.zeros(10, np.float32)),
                    "quant_reduce_scatter: send has 10 elements, not a multiple of nranks 4", ValueError, nranks=4)
        self.expect(lambda r, c: c.quant_reduce_scatter(np.zeros(12, np.float32), np.zeros(4, np.float32)),
                    "quant_reduce_scatter: recv has 4 elements, expected 6", ValueError)
        self.expect(lambda r, c: c.quantize(np.zeros(100, np.float32), 8, 32, np.zeros(16, np.uint8)),
                    "quantize: payload has 16 bytes, expected at least 128", ValueError, nranks=1)
        self.expect(lambda r, c: c.dequantize(np.zeros(16, np.uint8), 100, "float32", 8, 32),
                    "dequantize: payload has 16 bytes, expected at least 128 for 100 elements", ValueError, nranks=1)
        self.expect(lambda r, c: c.dequantize(np.zeros(128, np.uint8), 100, "float32", 8, 32,
                                              np.zeros(99, np.float32)),
                    "dequantize: out has 99 elements, expected 100", ValueError, nranks=1)

    def test_read_only_output(self) -> None:
        recv = np.zeros(16, np.float32)
        recv.flags.writeable = False
        self.expect(lambda r, c: c.quant_all_gather(np.zeros(8, np.float32), recv),
                    "quant_all_gather: recv is read-only", ValueError)

    def test_bad_bits_and_block_size(self) -> None:
        x = np.zeros(64, np.float32)
        self.expect(lambda r, c: c.quant_all_gather(x, bits=6), "zpQuantAllGatherEx : options->bits 6 must be 4 or 8")
        self.expect(lambda r, c: c.quant_reduce_scatter(np.zeros(128, np.float32), bits=6),
                    "zpQuantReduceScatterA2AEx : options->bits 6 must be 4 or 8")
        self.expect(lambda r, c: c.quant_all_gather(x, block_size=48),
                    "zpQuantAllGatherEx : options->blockSize 48 must be a power of two in [32, 8192]")
        self.expect(lambda r, c: c.quant_all_gather(x, bits=0),
                    "quant_all_gather: bits 0 must be 4 or 8 (None keeps the communicator's)", ValueError)
        self.expect(lambda r, c: c.quantize(x, 6, 256), "quantize: bits 6 must be 4 or 8", ValueError, nranks=1)
        self.expect(lambda r, c: c.dequantize(np.zeros(64, np.uint8), 4, "float32", 8, 16),
                    "dequantize: block_size 16 must be a power of two in [32, 8192]", ValueError, nranks=1)

    def test_bad_op(self) -> None:
        x = np.zeros(64, np.float32)
        self.expect(lambda r, c: c.quant_reduce_scatter(x, op="max"),
                    "zpQuantReduceScatterA2A : op max is not supported (sum and avg are)")
        self.expect(lambda r, c: c.quant_reduce_scatter(x, op=zpccl.RedOp.PROD),
                    "zpQuantReduceScatterA2A : op prod is not supported (sum and avg are)")
        self.expect(lambda r, c: c.quant_reduce_scatter(x, op=17), "zpQuantReduceScatterA2A : invalid op 17")
        self.expect(lambda r, c: c.quant_reduce_scatter(x, op="mean"),
                    "quant_reduce_scatter: op 'mean' is not one of sum, prod, max, min, avg", ValueError)

    def test_ints_that_do_not_fit_their_c_type(self) -> None:
        # ctypes keeps an int's low bits: without the Python check, 2**64 + 5 would reach C as 5 and -1 as SIZE_MAX.
        for count, why in ((2**64 + 5, "does not fit in a C size_t"), (2**64, "does not fit in a C size_t"),
                           (-1, "is negative"), (np.int64(-5), "is negative")):
            with self.subTest(count=count), self.assertRaises(ValueError) as cm:
                zpccl.payload_size(count, 8, 256)
            self.assertIsInstance(cm.exception, ZpcclError)
            self.assertIn(f"payload_size: count {count} {why}", str(cm.exception))
        with self.assertRaises(ZpcclError) as cm:  # SIZE_MAX fits: it reaches C unchanged, which refuses it
            zpccl.payload_size(2**64 - 1, 8, 256)
        self.assertIn("zpQuantPayloadSize : count 18446744073709551615 overflows", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            zpccl.payload_size(100, 2**32 + 8, 256)
        self.assertIn("payload_size: bits 4294967304 does not fit in a C int", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            zpccl.payload_size(100, 8, -2**31 - 1)
        self.assertIn("payload_size: block_size -2147483649 does not fit in a C int", str(cm.exception))

        huge, x = 2**64 + 4, np.zeros(64, np.float32)
        self.expect(lambda r, c: c.hier_secondary_shard(huge),
                    f"hier_secondary_shard: full_count {huge} does not fit in a C size_t", ValueError)
        self.expect(lambda r, c: c.hier_secondary_shard(-2), "hier_secondary_shard: full_count -2 is negative",
                    ValueError)
        self.expect(lambda r, c: c.reserve(2**64), "reserve: max_bytes 18446744073709551616 does not fit", ValueError,
                    nranks=1)
        self.expect(lambda r, c: c.reserve(-1), "reserve: max_bytes -1 is negative", ValueError, nranks=1)
        self.expect(lambda r, c: c.dequantize(np.zeros(64, np.uint8), 2**64 + 8, "float32", 8, 32),
                    "dequantize: count 18446744073709551624 does not fit in a C size_t", ValueError, nranks=1)
        self.expect(lambda r, c: c.dequantize(np.zeros(64, np.uint8), -8, "float32", 8, 32),
                    "dequantize: count -8 is negative", ValueError, nranks=1)
        # 2**32 would be op 0, sum; 2**32 + 8 would be bits 8 and 2**32 + 256 block size 256.
        self.expect(lambda r, c: c.quant_reduce_scatter(x, op=2**32),
                    "quant_reduce_scatter: op 4294967296 does not fit in a C int", ValueError)
        self.expect(lambda r, c: c.quant_all_gather(x, bits=2**32 + 8),
                    "quant_all_gather: bits 4294967304 does not fit in a C int", ValueError)
        self.expect(lambda r, c: c.quant_all_gather(x, block_size=2**32 + 256),
                    "quant_all_gather: block_size 4294967552 does not fit in a C int", ValueError)

    def test_init_ints_that_do_not_fit_their_c_type(self) -> None:
        uid = zpccl.get_unique_id()
        for nranks, rank, name in ((2**32 + 1, 0, "nranks"), (1, 2**32, "rank"), (1, -2**31 - 1, "rank")):
            with self.subTest(nranks=nranks, rank=rank), self.assertRaises(ValueError) as cm:
                zpccl.Comm(nranks, rank, uid, backend="host")
            self.assertIn(f"Comm: {name} ", str(cm.exception))
            self.assertIn("does not fit in a C int", str(cm.exception))
        for ptr in (2**64 + 5, -1):
            # backend="host" has the library refuse the config before it reads the pointer, were it to get there.
            with self.subTest(ptr=ptr), self.assertRaises(ValueError) as cm:
                zpccl.Comm.from_nccl_comm(ptr, backend="host")
            self.assertIn("from_nccl_comm: nccl_comm", str(cm.exception))
            self.assertIn("is not an address", str(cm.exception))

    def test_stream_on_the_host_backend(self) -> None:
        self.expect(lambda r, c: c.quant_all_gather(np.zeros(8, np.float32), stream=1234),
                    "quant_all_gather: stream must be None on the host backend", ValueError)

    def test_overlap_outside_the_in_place_layout(self) -> None:
        buf = [np.zeros(32, np.float32) for _ in range(2)]
        self.expect(lambda r, c: c.quant_all_gather(buf[r][1:9], buf[r][:16]),
                    "zpQuantAllGather : sendbuff", code=Result.INVALID_ARGUMENT)

    def test_misaligned_payload_is_refused_by_c(self) -> None:
        raw = np.zeros(256, np.uint8)
        skip = -raw.__array_interface__["data"][0] % 16 + 4  # 4 bytes past a 16-byte boundary
        self.expect(lambda r, c: c.quantize(np.zeros(32, np.float32), 8, 32, raw[skip:skip + 64]),
                    "zpQuantize : payload", nranks=1)

    def test_error_keeps_the_communicator_usable(self) -> None:
        def body(rank: int, comm: zpccl.Comm) -> np.ndarray:
            with self.assertRaises(ZpcclError):
                comm.quant_all_gather(np.zeros(8, np.float32), bits=6)
            return comm.quant_all_gather(np.ones(8, np.float32))

        for out in run_host_ranks(2, body):
            self.assertTrue(np.array_equal(out, np.ones(16, np.float32)))


if __name__ == "__main__":
    unittest.main()
