"""The collectives on the host backend with NumPy arrays, 2, 4 and 8 thread-ranks, several node layouts: the three of
ZeRO++ and the quantized all-reduce."""
from __future__ import annotations

import unittest
from typing import Any

import numpy as np

import zpccl
from zpccl import run_host_ranks

from . import _reference as ref
from .test_quant import DTYPES, same_bits, zp_dtype

RANKS = (2, 4, 8)
#: (nranks, config): one node; emulated nodes of consecutive ranks (two-hop qgZ); interleaved nodes by node_id.
LAYOUTS: list[tuple[int, dict[str, Any]]] = [
    (2, {}), (4, {}), (8, {}),
    (2, {"ranks_per_node": 1}), (4, {"ranks_per_node": 2}), (8, {"ranks_per_node": 4}), (8, {"ranks_per_node": 2}),
    (8, {"ranks_per_node": 4, "hpz_size": 2}), (8, {"ranks_per_node": 8, "hpz_size": 4}),
]


def node_of_rank(nranks: int, config: dict[str, Any], node_ids: list[int] | None = None) -> list[int]:
    if node_ids is not None:
        return node_ids
    rpn = config.get("ranks_per_node", nranks)
    return [r // rpn for r in range(nranks)]


class QuantAllGather(unittest.TestCase):
    def test_identical_everywhere_and_equal_to_the_model(self) -> None:
        rng = np.random.default_rng(7)
        for nranks in RANKS:
            for dtype in DTYPES:
                for bits, block, count in ((8, 256, 1000), (4, 32, 77), (8, 64, 1)):
                    shards = [ref.random_data(rng, count, dtype) for _ in range(nranks)]
                    cfg = {"weight_bits": bits, "block_size": block}
                    outs = run_host_ranks(nranks, lambda r, c: c.quant_all_gather(shards[r], dtype=zp_dtype(dtype)),
                                          **cfg)
                    with self.subTest(nranks=nranks, dtype=dtype, bits=bits, block=block, count=count):
                        expected = np.concatenate([ref.round_trip(s, dtype, bits, block) for s in shards])
                        for out in outs:
                            self.assertEqual(out.shape, (nranks * count,))
                            self.assertEqual(out.dtype, shards[0].dtype)
                            self.assertTrue(same_bits(out, outs[0]), "ranks differ")
                        self.assertTrue(same_bits(outs[0], expected), "differs from the model")
                        # Per block, within scale/2 of the input plus the output rounding.
                        eps = {ref.F16: 2.0**-11, ref.F32: 2.0**-24, ref.BF16: 2.0**-8}[dtype]
                        for r, s in enumerate(shards):
                            x = ref.to_f32(s, dtype).astype(np.float64)
                            got = ref.to_f32(outs[0][r * count:(r + 1) * count], dtype)
                            bound = ref.block_scales_per_element(ref.to_f32(s, dtype), bits, block) / 2 * (1 + 1e-6)
                            self.assertTrue(np.all(np.abs(got - x) <= bound + np.abs(x) * eps))

    def test_per_call_override_in_place_and_given_recv(self) -> None:
        rng = np.random.default_rng(8)
        n = 300
        shards = [ref.random_data(rng, n, ref.F32) for _ in range(4)]

        def body(rank: int, comm: zpccl.Comm) -> tuple[np.ndarray, np.ndarray]:
            recv = np.empty(4 * n, np.float32)
            recv[rank * n:(rank + 1) * n] = shards[rank]
            out = comm.quant_all_gather(recv[rank * n:(rank + 1) * n], recv, bits=4, block_size=64)  # in place
            assert out is recv
            return recv, comm.quant_all_gather(shards[rank], bits=4, block_size=64)

        for in_place, out_of_place in run_host_ranks(4, body):
            expected = np.concatenate([ref.round_trip(s, ref.F32, 4, 64) for s in shards])
            self.assertTrue(same_bits(in_place, expected))
            self.assertTrue(same_bits(out_of_place, expected))

    def test_shapes_are_free_sizes_are_not(self) -> None:
        shards = [np.full((3, 5), r, np.float16) for r in range(2)]
        outs = run_host_ranks(2, lambda r, c: c.quant_all_gather(shards[r], np.empty((2, 3, 5), np.float16)))
        self.assertEqual(outs[0].shape, (2, 3, 5))
        self.assertTrue(np.array_equal(outs[0][1], np.ones((3, 5), np.float16)))


class HierAllGather(unittest.TestCase):
    def test_exact_in_hpz_group_order(self) -> None:
        for nranks, config in LAYOUTS:
            n = 37

            def body(rank: int, comm: zpccl.Comm) -> dict[str, Any]:
                send = (np.arange(n) + 1000 * rank).astype(np.int64)
                out = comm.hier_all_gather(send)
                return {"out": out, "node": comm.node_rank, "hpz_rank": comm.hpz_rank, "hpz_size": comm.hpz_size}

            got = run_host_ranks(nranks, body, **config)
            with self.subTest(nranks=nranks, config=config):
                for rank, g in enumerate(got):
                    h = g["hpz_size"]
                    self.assertEqual(h, config.get("hpz_size", config.get("ranks_per_node", nranks)))
                    blocks = g["out"].reshape(h, n)
                    sources = [int(b[0]) // 1000 for b in blocks]
                    for i, (src, b) in enumerate(zip(sources, blocks)):
                        self.assertTrue(np.array_equal(b, np.arange(n) + 1000 * src))  # exact, whole shards
                        self.assertEqual(got[src]["node"], g["node"])  # intra-node only
                        self.assertEqual(got[src]["hpz_rank"], i)  # in hpZ-rank order
                        self.assertTrue(np.array_equal(got[src]["out"], g["out"]))  # the group agrees
                    self.assertEqual(sources[g["hpz_rank"]], rank)

    def test_every_type_and_in_place(self) -> None:
        for dtype in (np.int8, np.int16, np.uint16, np.float64, np.complex64, np.bool_):
            def body(rank: int, comm: zpccl.Comm) -> tuple[np.ndarray, np.ndarray]:
                send = (np.arange(10) * (rank + 1)).astype(dtype)
                recv = np.zeros(40, dtype)
                recv[rank * 10:(rank + 1) * 10] = send
                comm.hier_all_gather(recv[rank * 10:(rank + 1) * 10], recv)
                return comm.hier_all_gather(send), recv

            with self.subTest(dtype=dtype):
                expected = np.concatenate([(np.arange(10) * (r + 1)).astype(dtype) for r in range(4)])
                for out, in_place in run_host_ranks(4, body):
                    self.assertEqual(out.dtype, np.dtype(dtype))
                    self.assertTrue(np.array_equal(out, expected))
                    self.assertTrue(np.array_equal(in_place, expected))

    def test_secondary_shard_rebuilds_the_forward_gather(self) -> None:
        rng = np.random.default_rng(9)
        for nranks, config in LAYOUTS:
            n = 256
            shards = [ref.random_data(rng, n, ref.BF16) for _ in range(nranks)]

            def body(rank: int, comm: zpccl.Comm) -> tuple:
                full = comm.quant_all_gather(shards[rank], dtype="bfloat16")
                offset, count = comm.hier_secondary_shard(full.size)
                secondary = full[offset:offset + count].copy()  # kept between forward and backward
                rebuilt = comm.hier_all_gather(secondary, dtype="bfloat16")
                return full, rebuilt, (offset, count), comm.hpz_rank, comm.hpz_size

            with self.subTest(nranks=nranks, config=config):
                for full, rebuilt, (offset, count), hpz_rank, hpz_size in run_host_ranks(nranks, body, **config):
                    self.assertEqual(count, nranks * n // hpz_size)
                    self.assertEqual(offset, count * hpz_rank)
                    self.assertTrue(np.array_equal(rebuilt, full))  # hpZ is exact

    def test_secondary_shard_needs_a_multiple(self) -> None:
        def body(rank: int, comm: zpccl.Comm) -> None:
            self.assertEqual(comm.hier_secondary_shard(0), (0, 0))
            with self.assertRaisesRegex(zpccl.ZpcclError, "zpHierSecondaryShard : fullCount 10 is not a multiple of "
                                                          "hpzSize 4"):
                comm.hier_secondary_shard(10)

        run_host_ranks(4, body)


class QuantReduceScatter(unittest.TestCase):
    def run_case(self, nranks: int, config: dict[str, Any], dtype: str, op: str, bits: int, block: int, n: int,
                 seed: int, node_ids: list[int] | None = None) -> None:
        rng = np.random.default_rng(seed)
        sends = [ref.random_data(rng, n * nranks, dtype) for _ in range(nranks)]
        cfg = dict(config, grad_bits=bits, block_size=block)
        configure = (lambda r: {"node_id": node_ids[r]}) if node_ids else None

        def body(rank: int, comm: zpccl.Comm) -> tuple[np.ndarray, np.ndarray, bool]:
            first = comm.quant_reduce_scatter(sends[rank], op=op, dtype=zp_dtype(dtype))
            again = comm.quant_reduce_scatter(sends[rank], op=op, dtype=zp_dtype(dtype))
            two_hop = comm.node_count > 1 and comm.local_size > 1
            return first, again, two_hop

        got = run_host_ranks(nranks, body, configure=configure, **cfg)
        layout = node_of_rank(nranks, config, node_ids)
        expected = ref.quant_reduce_scatter(sends, dtype, op, bits, block, layout)
        two_hop = got[0][2]
        bounds = ref.reduce_scatter_bound(sends, dtype, bits, block, two_hop)
        eps = {ref.F16: 2.0**-11, ref.F32: 2.0**-24, ref.BF16: 2.0**-8}[dtype]
        for rank, (first, again, _) in enumerate(got):
            self.assertEqual(first.size, n)
            self.assertTrue(same_bits(first, again), "not deterministic")
            self.assertTrue(same_bits(first, expected[rank]), f"rank {rank} differs from the model")
            exact = sum(ref.to_f32(s[rank * n:(rank + 1) * n], dtype).astype(np.float64) for s in sends)
            bound = bounds[rank]
            if op == "avg":
                exact, bound = exact / nranks, bound / nranks
            err = np.abs(ref.to_f32(first, dtype) - exact)
            limit = bound + (np.abs(exact) + bound) * eps
            self.assertTrue(np.all(err <= limit), f"rank {rank}: max excess {np.max(err - limit)}")
            # The loose, scale-only bound of the brief: nranks * (largest block scale) per element.
            max_scale = max(ref.block_scales_per_element(ref.to_f32(s, dtype), bits, block).max() for s in sends)
            loose = nranks * max_scale / (nranks if op == "avg" else 1)
            self.assertLess(float(np.max(err)), loose + float(np.max(np.abs(exact))) * eps)

    def test_one_hop(self) -> None:
        seed = 0
        for nranks in RANKS:
            for dtype in DTYPES:
                for op, bits, block, n in (("sum", 4, 256, 300), ("avg", 8, 32, 100), ("avg", 4, 64, 1)):
                    seed += 1
                    with self.subTest(nranks=nranks, dtype=dtype, op=op, bits=bits, block=block, n=n):
                        self.run_case(nranks, {}, dtype, op, bits, block, n, seed)

    def test_two_hops(self) -> None:
        seed = 100
        for nranks, config in ((4, {"ranks_per_node": 2}), (8, {"ranks_per_node": 4}), (8, {"ranks_per_node": 2})):
            for dtype in DTYPES:
                for op, bits in (("sum", 4), ("avg", 8)):
                    seed += 1
                    with self.subTest(nranks=nranks, config=config, dtype=dtype, op=op, bits=bits):
                        self.run_case(nranks, config, dtype, op, bits, 64, 200, seed)

    def test_interleaved_and_uneven_nodes(self) -> None:
        # Ranks 0,2,4,6 on one node and 1,3,5,7 on the other: two hops with non-consecutive node members.
        self.run_case(8, {}, ref.F32, "sum", 4, 32, 96, 200, node_ids=[r % 2 for r in range(8)])
        # Nodes of 3 and 2 ranks: uneven, so one hop.
        self.run_case(5, {}, ref.F16, "avg", 8, 32, 50, 201, node_ids=[0, 0, 0, 1, 1])

    def test_in_place_and_given_recv(self) -> None:
        rng = np.random.default_rng(11)
        n = 64
        sends = [ref.random_data(rng, 2 * n, ref.F32) for _ in range(2)]

        def body(rank: int, comm: zpccl.Comm) -> tuple[np.ndarray, np.ndarray]:
            buf = sends[rank].copy()
            comm.quant_reduce_scatter(buf, buf[rank * n:(rank + 1) * n], op=zpccl.RedOp.AVG)  # in place
            out = np.empty(n, np.float32)
            self.assertIs(comm.quant_reduce_scatter(sends[rank], out, "avg", bits=8, block_size=32), out)
            return buf[rank * n:(rank + 1) * n], out

        got = run_host_ranks(2, body)
        exp4 = ref.quant_reduce_scatter(sends, ref.F32, "avg", 4, 256, [0, 0])
        exp8 = ref.quant_reduce_scatter(sends, ref.F32, "avg", 8, 32, [0, 0])
        for rank, (in_place, out) in enumerate(got):
            self.assertTrue(same_bits(in_place, exp4[rank]))  # default grad_bits 4, block 256
            self.assertTrue(same_bits(out, exp8[rank]))


    def test_a_finite_sum_beyond_bfloat16_is_inf_in_its_element_alone(self) -> None:
        # include/zpccl.h: "a finite sum beyond the output type's range (fp16, bf16) is +-Inf" (host tests cover
        # fp16's). Blocks whose maximum is 127 * 2^119 have the scale 2^119 exactly, so the codes sum exactly:
        # 4 * 127 + 3 = 511 steps is 2^128 - 2^119, finite in fp32, the midpoint above bf16's largest value, which
        # rounds to even: Inf. The element of rank 4's own maximum sums to 127 steps, finite.
        nranks, block = 5, 32
        sends = []
        for r in range(nranks):
            x = np.zeros(block * nranks, np.float32)
            x[5] = np.float32(127 * 2.0**119) if r < 4 else np.float32(3 * 2.0**119)
            if r == 4:
                x[0] = np.float32(127 * 2.0**119)
            x[block * 2 + 7] = -x[5]  # destination 2's slice: the same sums, negative
            x[block * 2] = -x[0]
            sends.append(ref.from_f32(x, ref.BF16))
        for s in sends:
            self.assertTrue(np.isfinite(ref.to_f32(s, ref.BF16)).all())
        got = run_host_ranks(nranks, lambda r, c: c.quant_reduce_scatter(sends[r], bits=8, block_size=block,
                                                                         dtype=zpccl.DataType.BFLOAT16))
        for dest, where, sign in ((0, 5, 1.0), (2, 7, -1.0)):
            out = ref.to_f32(got[dest], ref.BF16)
            self.assertEqual(out[where], sign * np.inf, f"destination {dest}")
            rest = np.delete(out, where)
            self.assertTrue(np.isfinite(rest).all(), f"destination {dest}: another element is not finite")
            self.assertEqual(out[0], sign * np.float32(127 * 2.0**119))
        # The all-reduce of the same inputs: that block NaN on every rank (the gather quantizes an Inf), the rest
        # finite.
        got = run_host_ranks(nranks, lambda r, c: c.quant_all_reduce(sends[r], bits=8, block_size=block,
                                                                     dtype=zpccl.DataType.BFLOAT16))
        for out in got:
            self.assertTrue(same_bits(out, got[0]), "ranks differ")
            o = ref.to_f32(out, ref.BF16)
            for b in (0, 2):
                self.assertTrue(np.isnan(o[b * block:(b + 1) * block]).all(), f"block {b} is not all NaN")
            self.assertTrue(np.isfinite(np.r_[o[block:2 * block], o[3 * block:]]).all())

class QuantAllReduce(unittest.TestCase):
    """``Comm.quant_all_reduce`` against the NumPy model (tests/_reference.py, from include/zpccl.h): bit-equal on
    one-hop, two-hop, interleaved and uneven layouts, counts whose last shards are partial or empty, every rank's
    output bit-identical; in place; the per-call options through ``zpQuantAllReduceEx``; refusals by name."""

    def run_case(self, nranks: int, config: dict[str, Any], dtype: str, op: str, bits: int, block: int,
                 count: int, seed: int, node_ids: list[int] | None = None) -> None:
        rng = np.random.default_rng(seed)
        sends = [ref.random_data(rng, count, dtype) for _ in range(nranks)]
        configure = (lambda r: {"node_id": node_ids[r]}) if node_ids else None

        def body(rank: int, comm: zpccl.Comm) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
            plain = comm.quant_all_reduce(sends[rank], op=op, dtype=zp_dtype(dtype))
            buf = sends[rank].copy()
            inplace = comm.quant_all_reduce(buf, buf, op=op, dtype=zp_dtype(dtype))
            assert inplace is buf
            # Ex: the same codes given per call, rounding to nearest given explicitly.
            ex = comm.quant_all_reduce(sends[rank], op=op, bits=bits, block_size=block, dtype=zp_dtype(dtype),
                                       rounding="nearest")
            return plain, buf, ex, comm.all_reduce_shard_count(count)

        got = run_host_ranks(nranks, body, configure=configure, **dict(config, grad_bits=bits, block_size=block))
        expected = ref.quant_all_reduce(sends, dtype, op, bits, block, node_of_rank(nranks, config, node_ids))
        for rank, (plain, inplace, ex, shard) in enumerate(got):
            self.assertEqual(plain.shape, (count,))
            self.assertEqual(shard, ref.all_reduce_shard(count, nranks, block))
            self.assertTrue(same_bits(plain, expected), f"rank {rank} differs from the model")
            self.assertTrue(same_bits(inplace, expected), f"rank {rank}: in place differs")
            self.assertTrue(same_bits(ex, expected), f"rank {rank}: zpQuantAllReduceEx differs")
        # Not the exact sum (the codes are lossy), but near it.
        exact = sum(ref.to_f32(s, dtype).astype(np.float64) for s in sends) / (nranks if op == "avg" else 1)
        err = np.abs(ref.to_f32(got[0][0], dtype) - exact)
        self.assertGreater(float(err.max()), 0.0)
        self.assertLess(float(err.max()), float(np.abs(exact).max()) * (0.5 if bits == 4 else 0.05) + 1e-30)

    def test_one_hop_two_hops_interleaved_and_uneven(self) -> None:
        seed = 300
        cases: list[tuple[int, dict[str, Any], list[int] | None]] = [
            (1, {}, None), (4, {}, None), (2, {"ranks_per_node": 1}, None), (4, {"ranks_per_node": 2}, None),
            (6, {"ranks_per_node": 2}, None), (4, {"ranks_per_node": 1}, None), (6, {}, [r % 2 for r in range(6)]),
            (5, {}, [0, 0, 0, 1, 1])]
        for nranks, config, node_ids in cases:
            for dtype in DTYPES:
                for op, bits, block, count in (("sum", 4, 64, 1001), ("avg", 8, 32, 3), ("avg", 4, 256, 64 * 7)):
                    seed += 1
                    with self.subTest(nranks=nranks, config=config, nodes=node_ids, dtype=dtype, op=op, bits=bits,
                                      block=block, count=count):
                        self.run_case(nranks, config, dtype, op, bits, block, count, seed, node_ids)

    def test_gradient_rounding_is_deterministic_and_seeded(self) -> None:
        rng = np.random.default_rng(12)
        sends = [ref.random_data(rng, 777, ref.F32) for _ in range(4)]

        def body(rank: int, comm: zpccl.Comm) -> list[np.ndarray]:
            def sr(seed: int) -> np.ndarray:
                return comm.quant_all_reduce(sends[rank], rounding="stochastic", seed=seed, sequence=5)

            residual = np.zeros(777, np.uint16)  # bf16 bits
            hop = np.zeros(comm.grad_hop_residual_count(comm.all_reduce_shard_count(777)), np.uint16)
            fed = comm.quant_all_reduce(sends[rank], residual=residual, hop_residual=hop)
            return [sr(1), sr(1), sr(2), fed, residual]

        got = run_host_ranks(4, body, ranks_per_node=2)
        nearest = ref.quant_all_reduce(sends, ref.F32, "sum", 4, 256, [0, 0, 1, 1])
        for rank, (a, b, c, fed, residual) in enumerate(got):
            self.assertTrue(same_bits(a, got[0][0]) and same_bits(fed, got[0][3]), f"rank {rank} differs")
            self.assertTrue(same_bits(a, b), "the same seed and sequence draw the same")
            self.assertFalse(same_bits(a, c), "another seed draws otherwise")
            self.assertFalse(same_bits(a, nearest), "stochastic rounding rounds otherwise than to nearest")
            self.assertTrue(same_bits(fed, nearest), "a zero residual quantizes as to nearest")
            self.assertTrue(np.any(residual != 0), "error feedback keeps what the codes lost")

    def test_adversarial_blocks_stay_within_the_header_bound(self) -> None:
        # include/zpccl.h's error bound (tests/_reference.py's all_reduce_bound) on blocks chosen to stress it,
        # with the nearest rounding (also bit-equal to the model) and the stochastic one (E doubled): one large
        # value among tiny ones, every rank's input identical, ranks cancelling, sums near the type's largest
        # value, values near the smallest normal, sparse blocks, fp16 subnormals (where the roundings to the output
        # type cost their subnormal spacing) and zero blocks (exact zeros out).
        rng = np.random.default_rng(57)
        largest = {ref.F32: 3.4e38, ref.F16: 65504.0, ref.BF16: 3.38e38}
        smallest = {ref.F32: 1.2e-38, ref.F16: 6.2e-5, ref.BF16: 1.2e-38}

        def families(count: int, dtype: str, n: int) -> list[tuple[str, list[np.ndarray]]]:
            def typed(v: np.ndarray) -> np.ndarray:
                return ref.from_f32(v.astype(np.float32), dtype)

            def one_large(r: int) -> np.ndarray:
                v = rng.standard_normal(count) * 1e-3
                v[::17] = largest[dtype] / (4 * n) * (1 if r % 2 else -1)
                return typed(v)

            def sparse() -> np.ndarray:
                v = np.zeros(count)
                v[rng.integers(0, count, 3)] = rng.standard_normal(3)
                return typed(v)

            same = ref.random_data(rng, count, dtype)
            base = ref.random_data(rng, count, dtype)
            negated = base ^ np.uint16(0x8000) if dtype == ref.BF16 else -base
            return [
                ("one large among tiny", [one_large(r) for r in range(n)]),
                ("identical", [same.copy() for _ in range(n)]),
                ("cancelling", [base.copy() if r % 2 == 0 else negated.copy() for r in range(n)]),
                ("near the largest", [typed(rng.uniform(-1, 1, count) * largest[dtype] / n * 0.99) for _ in range(n)]),
                ("near the smallest normal", [typed(smallest[dtype] * rng.uniform(1, 4, count)
                                                    * np.sign(rng.standard_normal(count))) for _ in range(n)]),
                ("sparse", [sparse() for _ in range(n)]),
                *([("fp16 subnormals", [typed(2.0**-24 * rng.integers(-20, 21, count)) for _ in range(n)])]
                  if dtype == ref.F16 else []),
                ("zero", [typed(np.zeros(count)) for _ in range(n)]),
            ]

        k = 0
        for nranks, rpn in ((3, 3), (4, 2), (2, 1)):
            node_of = [r // rpn for r in range(nranks)]
            two_hop = nranks // rpn > 1 and rpn > 1
            for dtype in DTYPES:
                for bits, block, count in ((4, 32, 1000), (8, 32, 999), (4, 8192, 20000), (8, 8192, 16385)):
                    for name, sends in families(count, dtype, nranks):
                        k += 1
                        op, stochastic = ("sum", "avg")[k % 2], k % 3 == 0

                        def body(rank: int, comm: zpccl.Comm) -> np.ndarray:
                            return comm.quant_all_reduce(sends[rank], op=op, bits=bits, block_size=block,
                                                         dtype=zp_dtype(dtype), seed=k,
                                                         rounding="stochastic" if stochastic else "nearest")

                        got = run_host_ranks(nranks, body, ranks_per_node=rpn)
                        with self.subTest(nranks=nranks, rpn=rpn, dtype=dtype, bits=bits, block=block, inputs=name,
                                          op=op, stochastic=stochastic):
                            for out in got:
                                self.assertTrue(same_bits(out, got[0]), "ranks differ")
                            if not stochastic:
                                expected = ref.quant_all_reduce(sends, dtype, op, bits, block, node_of)
                                self.assertTrue(same_bits(got[0], expected), "differs from the model")
                            out = ref.to_f32(got[0], dtype).astype(np.float64)
                            exact, bound = ref.all_reduce_bound(sends, dtype, op, bits, block, two_hop, stochastic)
                            self.assertTrue(np.isfinite(out).all(), "a finite input gave a non-finite output")
                            err = np.abs(out - exact)
                            self.assertTrue(np.all(err <= bound), f"largest excess {np.max(err - bound)}")
                            if name == "zero":
                                self.assertTrue(np.all(got[0].view(np.uint8) == 0), "zeros are not +0")

    def test_refusals_name_the_argument(self) -> None:
        from .test_errors import on_ranks

        x = np.zeros(100, np.float32)
        for fn, message, kind in (
                (lambda r, c: c.quant_all_reduce(x, np.zeros(99, np.float32)),
                 "quant_all_reduce: recv has 99 elements, expected 100", ValueError),
                (lambda r, c: c.quant_all_reduce(x, op="max"), "zpQuantAllReduce : op max is not supported", None),
                (lambda r, c: c.quant_all_reduce(x, bits=6), "zpQuantAllReduceEx : options->bits 6 must be 4 or 8",
                 None),
                (lambda r, c: c.quant_all_reduce(x, bits=0), "quant_all_reduce: bits 0 must be 4 or 8", ValueError),
                (lambda r, c: c.quant_all_reduce(x, np.zeros(100, np.float16)),
                 "quant_all_reduce: recv dtype float16 differs from send dtype float32", ValueError),
                (lambda r, c: c.quant_all_reduce(x, residual=np.zeros(99, np.uint16)),
                 "zpQuantAllReduceEx : options->residualCount 99 must be 100 for count 100 on 2 ranks", None),
                (lambda r, c: c.all_reduce_shard_count(10, block_size=48),
                 "zpQuantAllReduceShardCount : blockSize 48 must be a power of two", None)):
            with self.subTest(message=message):
                for e in on_ranks(2, fn):
                    self.assertIsInstance(e, zpccl.ZpcclError)
                    if kind is not None:
                        self.assertIsInstance(e, kind)
                    self.assertIn(message, str(e))

        def usable_after(rank: int, comm: zpccl.Comm) -> np.ndarray:
            try:
                comm.quant_all_reduce(x, op="max")
            except zpccl.ZpcclError:
                pass
            return comm.quant_all_reduce(np.full(100, rank + 1.0, np.float32))

        for out in run_host_ranks(2, usable_after):
            self.assertTrue(np.all(out == 3.0), out[:4])  # 1 + 2, exact: one value a block quantizes exactly


if __name__ == "__main__":
    unittest.main()
