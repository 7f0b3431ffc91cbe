"""The block format through quantize / dequantize / payload_size, against the NumPy model in _reference.py."""
from __future__ import annotations

import unittest

import numpy as np

import zpccl
from zpccl import ZpcclError

from . import _reference as ref

DTYPES = (ref.F16, ref.F32, ref.BF16)


def host_comm() -> zpccl.Comm:
    return zpccl.Comm(1, 0, zpccl.get_unique_id(), backend="host")


def zp_dtype(dtype: str) -> str | None:
    """The dtype argument a call needs: bfloat16 travels as uint16 bits here."""
    return "bfloat16" if dtype == ref.BF16 else None


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal element by element, NaN equal to NaN (the library's NaN bits are the canonical quiet NaN)."""
    if a.dtype.kind == "u":
        return bool(np.array_equal(a, b))
    return bool(np.array_equal(a, b, equal_nan=True))


class PayloadSize(unittest.TestCase):
    def test_matches_the_formula(self) -> None:
        for count in (0, 1, 2, 15, 16, 31, 32, 33, 255, 256, 257, 1000, 4096, 100003):
            for bits in (4, 8):
                for block in (32, 64, 256, 1024, 8192):
                    self.assertEqual(zpccl.payload_size(count, bits, block), ref.payload_size(count, bits, block),
                                     (count, bits, block))
        self.assertEqual(zpccl.payload_size(1000, 8, 256), 16 + 1008)  # as c_abi_test
        self.assertEqual(zpccl.payload_size(np.int64(1000), 4, 256), 16 + 512)  # NumPy ints are ints

    def test_bad_arguments(self) -> None:
        with self.assertRaisesRegex(ZpcclError, "zpQuantPayloadSize : bits 6 must be 4 or 8"):
            zpccl.payload_size(100, 6, 256)
        with self.assertRaisesRegex(ZpcclError, "zpQuantPayloadSize : blockSize 100 must be a power of two"):
            zpccl.payload_size(100, 8, 100)
        with self.assertRaisesRegex(TypeError, "payload_size: count must be an int, got float"):
            zpccl.payload_size(1.5, 8, 256)


class QuantizeDequantize(unittest.TestCase):
    def setUp(self) -> None:
        self.comm = host_comm()
        self.rng = np.random.default_rng(1234)

    def tearDown(self) -> None:
        self.comm.close()

    def check(self, x: np.ndarray, dtype: str, bits: int, block: int) -> None:
        comm = self.comm
        payload = comm.quantize(x, bits, block, dtype=zp_dtype(dtype))
        self.assertEqual(payload.dtype, np.uint8)
        self.assertEqual(payload.size, ref.payload_size(x.size, bits, block))
        self.assertEqual(payload.__array_interface__["data"][0] % 16, 0)
        self.assertTrue(np.array_equal(payload, ref.payload(x, dtype, bits, block)), "payload bytes")
        out = comm.dequantize(payload, x.size, dtype, bits, block)
        expected = ref.round_trip(x, dtype, bits, block)
        self.assertEqual(out.size, x.size)
        self.assertTrue(same_bits(out.view(expected.dtype), expected), "dequantized values")
        # Within half a scale of the input, plus the output rounding.
        x32 = ref.to_f32(x, dtype).astype(np.float64)
        err = np.abs(ref.to_f32(out.view(expected.dtype), dtype) - x32)
        eps = {ref.F16: 2.0**-11, ref.F32: 2.0**-24, ref.BF16: 2.0**-8}[dtype]
        bound = ref.block_scales_per_element(ref.to_f32(x, dtype), bits, block) / 2 * (1 + 1e-6) + np.abs(x32) * eps
        finite = np.isfinite(bound)  # blocks holding NaN or Inf come back as NaN (checked bit for bit above)
        self.assertTrue(np.all(err[finite] <= bound[finite]), f"max excess {np.max(err - bound)}")

    def test_round_trip_matches_the_model(self) -> None:
        for dtype in DTYPES:
            for bits in (4, 8):
                for block, count in ((32, 1), (32, 33), (64, 1000), (256, 1000), (256, 4096), (8192, 9000)):
                    with self.subTest(dtype=dtype, bits=bits, block=block, count=count):
                        self.check(ref.random_data(self.rng, count, dtype), dtype, bits, block)

    def test_special_blocks(self) -> None:
        x = np.zeros(128, np.float32)
        x[32:64] = 1e-3
        x[64] = np.nan  # block 2 (64..95) holds a NaN
        x[96] = np.inf  # block 3 holds an Inf
        x[100] = -5.0
        payload = self.comm.quantize(x, 8, 32)
        out = self.comm.dequantize(payload, 128, np.float32, 8, 32)
        self.assertTrue(np.all(out[:32] == 0) and not np.signbit(out[:32]).any())  # all-zero block: +0, no NaN
        self.assertTrue(np.allclose(out[32:64], 1e-3, rtol=1e-6))
        self.assertTrue(np.isnan(out[64:]).all())  # NaN and Inf blocks come back as NaN
        self.check(x, ref.F32, 8, 32)
        self.check(x.astype(np.float16), ref.F16, 4, 32)

    def test_block_maximum_is_not_clipped(self) -> None:
        x = np.array([3.0, -1.0, 0.5, 2.0] * 8, np.float32)
        for bits in (4, 8):
            out = self.comm.dequantize(self.comm.quantize(x, bits, 32), 32, "float32", bits, 32)
            self.assertEqual(out[0], np.float32(3.0))

    def test_outputs_and_payloads_given(self) -> None:
        x = ref.random_data(self.rng, 500, ref.F16)
        need = ref.payload_size(500, 8, 64)
        raw = np.zeros(need + 64, np.uint8)
        skip = -raw.__array_interface__["data"][0] % 16
        payload = raw[skip:skip + need + 16]  # 16-byte aligned, larger than needed
        self.assertIs(self.comm.quantize(x, 8, 64, payload), payload)
        out = np.empty(500, np.float16)
        self.assertIs(self.comm.dequantize(payload, 500, np.float16, 8, 64, out), out)
        self.assertTrue(same_bits(out, ref.round_trip(x, ref.F16, 8, 64)))

    def test_count_zero(self) -> None:
        payload = self.comm.quantize(np.zeros(0, np.float32), 8, 256)
        self.assertEqual(payload.size, 0)
        self.assertEqual(self.comm.dequantize(payload, 0, "float32", 8, 256).size, 0)

    def test_bfloat16_output_without_a_dtype_library(self) -> None:
        x = ref.random_data(self.rng, 100, ref.BF16)
        out = self.comm.dequantize(self.comm.quantize(x, 8, 32, dtype="bfloat16"), 100, "bfloat16", 8, 32)
        self.assertEqual(out.dtype.itemsize, 2)  # ml_dtypes.bfloat16 if installed, else uint16 bits
        self.assertTrue(same_bits(out.view(np.uint16), ref.round_trip(x, ref.BF16, 8, 32)))

    def test_ml_dtypes_bfloat16(self) -> None:
        try:
            import ml_dtypes
        except ImportError:
            self.skipTest("ml_dtypes is not installed")
        bits = ref.random_data(self.rng, 100, ref.BF16)
        x = bits.view(ml_dtypes.bfloat16)
        out = self.comm.dequantize(self.comm.quantize(x, 4, 32), 100, x.dtype, 4, 32)
        self.assertEqual(out.dtype, x.dtype)
        self.assertTrue(np.array_equal(out.view(np.uint16), ref.round_trip(bits, ref.BF16, 4, 32)))


if __name__ == "__main__":
    unittest.main()
