"""qgZ's gradient rounding through the bindings on the host backend: stochastic rounding and error feedback equal,
bit for bit, a NumPy model written from include/zpccl.h's "Gradient rounding" (Philox counter layout, rounding
rule, residual layouts), on one-hop and two-hop layouts over several calls; the config's rounding and seed; bad
residuals refused by name with the communicator still usable."""
from __future__ import annotations

import unittest
from typing import Any

import numpy as np

import zpccl
from zpccl import run_host_ranks

from . import _reference as ref
from .test_quant import same_bits, zp_dtype

#: Random123's kat_vectors, "philox4x32 10": counter, key, output.
KATS = [
    ([0, 0, 0, 0], (0, 0), [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    ([0xFFFFFFFF] * 4, (0xFFFFFFFF, 0xFFFFFFFF), [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
    ([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], (0xA4093822, 0x299F31D0),
     [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]),
]


class Model(unittest.TestCase):
    def test_philox_known_answers(self) -> None:
        for ctr, key, out in KATS:
            self.assertEqual([int(w) for w in ref.philox4x32_10(ctr, key)], out)


class GradRounding(unittest.TestCase):
    def run_layout(self, nranks: int, ranks_per_node: int, dtype: str, bits: int, block: int, n: int,
                   stochastic: bool, feedback: bool, calls: int = 3, op: str = "sum") -> None:
        rng = np.random.default_rng(nranks * 100 + bits + n)
        inputs = [[ref.random_data(rng, n * nranks, dtype) for _ in range(nranks)] for _ in range(calls)]
        node_of = [r // ranks_per_node for r in range(nranks)]
        nodes = len(set(node_of))
        two_hop = 1 < nodes and ranks_per_node > 1
        seed = 31337

        def start_res() -> list[np.ndarray]:
            return [ref.from_f32((rng.standard_normal(n * nranks) * 0.01).astype(np.float32), ref.BF16)
                    for _ in range(nranks)]

        res0 = start_res() if feedback else None
        model_res = [r.copy() for r in res0] if feedback else None
        model_hop = [np.zeros(n * nodes if two_hop else 0, np.uint16) for _ in range(nranks)] if feedback else None
        expected = []
        for call in range(calls):
            expected.append(ref.quant_reduce_scatter_grad(inputs[call], dtype, op, bits, block, node_of, stochastic,
                                                          seed, call, model_res, model_hop))

        def body(rank: int, comm: zpccl.Comm) -> tuple[list[np.ndarray], np.ndarray | None, np.ndarray | None]:
            hop_count = comm.grad_hop_residual_count(n)
            self.assertEqual(hop_count, n * nodes if two_hop else 0)
            res = res0[rank].copy() if feedback else None
            hop = np.zeros(hop_count, np.uint16) if feedback else None
            outs = []
            for call in range(calls):
                recv = np.full(n, 0xA5A5, np.uint16) if dtype == ref.BF16 else np.full(n, np.nan, dtype)
                outs.append(comm.quant_reduce_scatter(
                    inputs[call][rank], recv, op, dtype=zp_dtype(dtype),
                    rounding="stochastic" if stochastic else "nearest", residual=res,
                    hop_residual=hop if feedback and two_hop else None))
            return outs, res, hop

        got = run_host_ranks(nranks, body, ranks_per_node=ranks_per_node, grad_bits=bits, block_size=block,
                             grad_seed=seed)
        for rank, (outs, res, hop) in enumerate(got):
            for call in range(calls):
                self.assertTrue(same_bits(outs[call], expected[call][rank]), f"rank {rank} call {call}")
            if feedback:
                self.assertTrue(np.array_equal(res, model_res[rank]), f"residual of rank {rank}")
                self.assertTrue(np.array_equal(hop, model_hop[rank]), f"hop residual of rank {rank}")

    def test_equal_to_the_model_one_hop_and_two_hops(self) -> None:
        for nranks, rpn in ((4, 4), (4, 2), (6, 3), (6, 2)):
            for dtype, bits, block, n in ((ref.BF16, 4, 256, 600), (ref.F32, 8, 64, 130), (ref.F16, 4, 32, 77)):
                for stochastic, feedback in ((True, True), (True, False), (False, True)):
                    with self.subTest(nranks=nranks, rpn=rpn, dtype=dtype, sr=stochastic, ef=feedback):
                        self.run_layout(nranks, rpn, dtype, bits, block, n, stochastic, feedback)

    def test_config_rounding_and_seed_serve_the_plain_call(self) -> None:
        rng = np.random.default_rng(7)
        sends = [ref.random_data(rng, 400 * 4, ref.F32) for _ in range(4)]

        def plain(rank: int, comm: zpccl.Comm) -> np.ndarray:
            return comm.quant_reduce_scatter(sends[rank])

        def explicit(rank: int, comm: zpccl.Comm) -> np.ndarray:
            return comm.quant_reduce_scatter(sends[rank], rounding=zpccl.Rounding.STOCHASTIC, seed=9)

        a = run_host_ranks(4, plain, ranks_per_node=2, grad_rounding="stochastic", grad_seed=9)
        b = run_host_ranks(4, explicit, ranks_per_node=2)
        c = run_host_ranks(4, plain, ranks_per_node=2)
        want = ref.quant_reduce_scatter_grad(sends, ref.F32, "sum", 4, 256, [0, 0, 1, 1], True, 9, 0, None, None)
        for r in range(4):
            self.assertTrue(same_bits(a[r], b[r]))
            self.assertTrue(same_bits(a[r], want[r]))
            self.assertFalse(same_bits(a[r], c[r]), "stochastic rounding gave the nearest rounding's bits")

    def test_bad_residuals_are_refused_by_name(self) -> None:
        n = 64

        def body(rank: int, comm: zpccl.Comm) -> list[str]:
            send = np.ones(n * 2, np.float32)
            messages = []
            for bad, what in ((np.zeros(n * 2, np.float32), "residualType float"),
                              (np.zeros(n * 2 - 1, np.uint16), "residualCount"),
                              (np.zeros(n, np.uint16), "residualCount")):
                with self.assertRaises(zpccl.ZpcclError) as cm:
                    comm.quant_reduce_scatter(send, residual=bad)
                self.assertEqual(cm.exception.code, zpccl.Result.INVALID_ARGUMENT)
                self.assertIn("zpQuantReduceScatterA2AEx2", str(cm.exception))
                self.assertIn(what, str(cm.exception))
                messages.append(str(cm.exception))
            with self.assertRaises(zpccl.ZpcclValueError):
                comm.quant_reduce_scatter(send, rounding="upward")
            with self.assertRaises(zpccl.ZpcclError) as cm:
                comm.quant_reduce_scatter(send, rounding=5)
            self.assertIn("options->rounding 5", str(cm.exception))
            # Still usable: a good call with a residual.
            res = np.zeros(n * 2, np.uint16)
            out = comm.quant_reduce_scatter(send, residual=res, rounding="stochastic")
            self.assertTrue(np.allclose(out, 2.0))
            return messages

        run_host_ranks(2, body)


if __name__ == "__main__":
    unittest.main()



class GradRoundingEdges(unittest.TestCase):
    """What the random-data comparisons above leave out: ranks that round and draw differently, the all-reduce's
    rounding against the model over several calls, the residuals of blocks that held NaN or Inf or whose partial sum
    overflowed, and which calls take a sequence number."""

    def test_all_reduce_with_per_rank_rounding_and_seeds_equals_the_model(self) -> None:
        # include/zpccl.h: gradRounding and gradSeed "may differ between ranks"; every quantizing rank (sender, and
        # the intermediate of two hops) rounds and draws by its own. Three calls with error feedback: the sequence
        # advances per all-reduce, both residuals carry over, and every rank's output stays bit-identical.
        rng = np.random.default_rng(41)
        for nranks, rpn in ((4, 4), (4, 2), (6, 2), (3, 1)):
            node_of = [r // rpn for r in range(nranks)]
            two_hop = nranks // rpn > 1 and rpn > 1
            seeds = [3 + 5 * r for r in range(nranks)]
            stochastic = [r % 3 != 1 for r in range(nranks)]
            for dtype, bits, block, count in ((ref.BF16, 4, 32, 1001), (ref.F16, 8, 64, 700), (ref.F32, 4, 8192, 9000)):
                calls = 3
                inputs = [[ref.random_data(rng, count, dtype) for _ in range(nranks)] for _ in range(calls)]
                shard = ref.all_reduce_shard(count, nranks, block)
                res0 = [ref.from_f32((rng.standard_normal(count) * 0.01).astype(np.float32), ref.BF16)
                        for _ in range(nranks)]
                model_res = [r.copy() for r in res0]
                model_hop = [np.zeros(shard * (nranks // rpn) if two_hop else 0, np.uint16) for _ in range(nranks)]
                expected = [ref.quant_all_reduce_grad(inputs[c], dtype, "avg", bits, block, node_of, stochastic, seeds,
                                                      c, model_res, model_hop) for c in range(calls)]

                def body(rank: int, comm: zpccl.Comm) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
                    res = res0[rank].copy()
                    hop = np.zeros(comm.grad_hop_residual_count(comm.all_reduce_shard_count(count, block)), np.uint16)
                    outs = [comm.quant_all_reduce(inputs[c][rank], op="avg", bits=bits, block_size=block,
                                                  dtype=zp_dtype(dtype), residual=res, hop_residual=hop)
                            for c in range(calls)]
                    return outs, res, hop

                got = run_host_ranks(nranks, body, ranks_per_node=rpn, configure=lambda r: {
                    "grad_seed": seeds[r], "grad_rounding": "stochastic" if stochastic[r] else "nearest"})
                for rank, (outs, res, hop) in enumerate(got):
                    with self.subTest(nranks=nranks, rpn=rpn, dtype=dtype, bits=bits, block=block, rank=rank):
                        for c in range(calls):
                            self.assertTrue(same_bits(outs[c], got[0][0][c]), f"call {c}: ranks differ")
                            self.assertTrue(same_bits(outs[c], expected[c]), f"call {c} differs from the model")
                        self.assertTrue(np.array_equal(res, model_res[rank]), "residual")
                        self.assertTrue(np.array_equal(hop, model_hop[rank]), "hop residual")

    def test_residuals_of_blocks_with_nan_inf_or_an_overflowing_partial(self) -> None:
        # A sender's block holding NaN or +-Inf keeps a zero residual (its other blocks keep theirs); a two-hop
        # partial sum that overflows fp32 keeps a zero hop residual; the destination's block is all NaN.
        rng = np.random.default_rng(43)
        n, block, bits = 96, 32, 4
        for nranks, rpn in ((4, 4), (4, 2), (6, 2)):
            node_of = [r // rpn for r in range(nranks)]
            nodes = nranks // rpn
            two_hop = nodes > 1 and rpn > 1
            for special in (np.nan, np.inf, -np.inf, "overflow"):
                sends = [ref.random_data(rng, n * nranks, ref.F32) for _ in range(nranks)]
                hot = n + 40  # destination 1, its second block
                if special == "overflow":
                    for s in sends:
                        s[hot] = np.float32(3e38)
                else:
                    sends[2][hot] = special
                res0 = [ref.from_f32((rng.standard_normal(n * nranks) * 0.01).astype(np.float32), ref.BF16)
                        for _ in range(nranks)]
                model_res = [r.copy() for r in res0]
                model_hop = [np.zeros(n * nodes if two_hop else 0, np.uint16) for _ in range(nranks)]
                with np.errstate(all="ignore"):
                    expected = ref.quant_reduce_scatter_grad(sends, ref.F32, "sum", bits, block, node_of, True, 4, 0,
                                                             model_res, model_hop)

                def body(rank: int, comm: zpccl.Comm) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
                    res = res0[rank].copy()
                    hop = np.zeros(comm.grad_hop_residual_count(n), np.uint16)
                    out = comm.quant_reduce_scatter(sends[rank], rounding="stochastic", seed=4, bits=bits,
                                                    block_size=block, residual=res,
                                                    hop_residual=hop if two_hop else None)
                    return out, res, hop

                got = run_host_ranks(nranks, body, ranks_per_node=rpn)
                for rank, (out, res, hop) in enumerate(got):
                    with self.subTest(nranks=nranks, rpn=rpn, special=special, rank=rank):
                        # The model sums an overflowing block to +-Inf elements; qgZ's block rule makes it NaN.
                        outside = np.r_[0:32, 64:n] if rank == 1 else np.arange(n)
                        self.assertTrue(same_bits(out[outside], expected[rank][outside]), "differs from the model")
                        if rank == 1:
                            self.assertTrue(np.all(np.isnan(out[32:64])), "the block of the special is not all NaN")
                            self.assertTrue(np.all(np.isfinite(np.r_[out[:32], out[64:]])), "another block is not")
                        self.assertTrue(np.array_equal(res, model_res[rank]), "residual")
                        if special != "overflow" and rank == 2:
                            self.assertTrue(np.all(res[n + 32:n + 64] == 0), "a NaN or Inf block kept a residual")
                            self.assertTrue(np.any(res[n:n + 32] != 0), "a finite block lost its residual")
                        if two_hop:
                            self.assertTrue(np.array_equal(hop, model_hop[rank]), "hop residual")
                if special == "overflow" and two_hop:
                    # Destination 1 is local rank 1 of node 0; each node's local rank 1 requantizes node 0's partial.
                    for a in range(nodes):
                        hop = got[a * rpn + 1][2]
                        self.assertTrue(np.all(hop[32:64] == 0), "an overflowed partial kept a hop residual")
                        self.assertTrue(np.any(hop[:32] != 0), "a finite partial lost its hop residual")

    def test_the_sequence_counts_every_gradient_call_and_no_other(self) -> None:
        # include/zpccl.h: the sequence is the call's number among the communicator's qgZ and all-reduce calls,
        # every rounding, count 0 included; qwZ, hpZ and zpQuantize take none. The stochastic all-reduce after each
        # prelude draws as the one with the sequence number the prelude leaves.
        rng = np.random.default_rng(47)
        sends = [ref.random_data(rng, 512, ref.F32) for _ in range(2)]
        empty = np.zeros(0, np.float32)
        preludes: list[tuple[str, Any, int]] = [
            ("none", lambda r, c: None, 0),
            ("qgZ of count 0", lambda r, c: c.quant_reduce_scatter(empty), 1),
            ("all-reduce of count 0", lambda r, c: c.quant_all_reduce(empty), 1),
            ("stochastic all-reduce of count 0", lambda r, c: c.quant_all_reduce(empty, rounding="stochastic"), 1),
            ("qwZ, hpZ, quantize", lambda r, c: (c.quant_all_gather(sends[r]), c.hier_all_gather(sends[r]),
                                                 c.quant_all_gather(empty), c.quantize(sends[r], 4, 256)), 0),
            ("two nearest qgZ", lambda r, c: (c.quant_reduce_scatter(sends[r]),
                                              c.quant_reduce_scatter(sends[r], bits=8)), 2),
            ("qgZ with its own sequence", lambda r, c: c.quant_reduce_scatter(sends[r], sequence=40,
                                                                                rounding="stochastic"), 1),
        ]

        def draw(rank: int, comm: zpccl.Comm, sequence: int | None = None) -> np.ndarray:
            return comm.quant_all_reduce(sends[rank], rounding="stochastic", seed=1, sequence=sequence)

        named = {seq: run_host_ranks(2, lambda r, c: draw(r, c, seq))[0] for seq in (0, 1, 2)}
        self.assertFalse(same_bits(named[0], named[1]) or same_bits(named[1], named[2]), "sequences draw alike")
        for name, prelude, seq in preludes:
            got = run_host_ranks(2, lambda r, c: (prelude(r, c), draw(r, c))[1])
            with self.subTest(prelude=name):
                self.assertTrue(same_bits(got[0], named[seq]) and same_bits(got[1], named[seq]),
                                f"did not draw as sequence {seq}")

class GradNumericsScript(unittest.TestCase):
    """perf/experiments/grad_numerics.py's plumbing on the CPU (ranks as threads, the host backend), a few steps: every
    configuration runs, the JSON holds its runs, gaps and the residuals' memory."""

    def test_runs_on_the_cpu(self) -> None:
        import json
        import os
        import subprocess
        import sys
        import tempfile

        from . import SOURCE_TREE
        from ._threaded import torch_with_fsdp2

        torch_with_fsdp2()
        script = SOURCE_TREE / "perf" / "experiments" / "grad_numerics.py"
        if not script.exists():
            raise unittest.SkipTest(f"{script} not found")
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "g.json")
            env = dict(os.environ, ZP_DEBUG="NONE")
            env.setdefault("ZPCCL_LIBRARY", str(zpccl.library_path()))
            run = subprocess.run([sys.executable, str(script), "--cpu", "--steps", "2", "--seeds", "0,1",
                                  "--configs", "exact,int4,int4-sr-ef", "-J", out], env=env, capture_output=True,
                                 text=True, timeout=600)
            self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
            data = json.load(open(out))
        self.assertEqual([(r["config"], r["seed"]) for r in data["runs"]],
                         [(c, s) for s in (0, 1) for c in ("exact", "int4", "int4-sr-ef")])
        for r in data["runs"]:
            self.assertEqual(len(r["losses"]), 2)
            self.assertTrue(all(np.isfinite(r["losses"])) and np.isfinite(r["valid"]))
        ef = [r for r in data["runs"] if r["config"] == "int4-sr-ef"][0]["summary"]["grad_residuals"]
        self.assertGreater(ef["residual_bytes"], 0)
        self.assertGreater(ef["hop_residual_bytes"], 0)  # two nodes of two: the intermediate hop's too
        # Gaps to exact in percent, seed by seed (tools/loss_stats.py's paired_gaps of the runs' validation losses).
        self.assertNotIn("gaps", data)  # a fraction, in the script's files of perf/results/: another unit's key
        gaps = data["gap_pct"]
        self.assertEqual(set(gaps), {"exact", "int4", "int4-sr-ef"})
        self.assertEqual(gaps["exact"], dict(mean=0.0, per_seed={"0": 0.0, "1": 0.0}))
        valid = {(r["config"], r["seed"]): r["valid"] for r in data["runs"]}
        for seed in (0, 1):
            want = 100 * (valid["int4", seed] - valid["exact", seed]) / valid["exact", seed]
            self.assertAlmostEqual(gaps["int4"]["per_seed"][str(seed)], want, places=12)
        self.assertAlmostEqual(gaps["int4"]["mean"], sum(gaps["int4"]["per_seed"].values()) / 2, places=12)
        record = data["provenance"]  # perf/provenance.py's record, not an ad-hoc commit
        self.assertEqual((record["schema"], record["regime"]), ("zpccl-provenance/1", "cpu-threads"))
        self.assertIn("--cpu --steps 2", record["command"])
        self.assertNotIn("commit", data)
