"""perf/ddp_step.py on the CPU with tiny shapes, as a smoke test of its protocol: every configuration (DDP's own
all-reduce, bf16_compress_hook, PowerSGD, zpccl's hook) timed in alternating rounds, every rank's raw step times
kept, the JSON's provenance, the loss runs and their gaps; and its arguments' refusals."""
from __future__ import annotations

import contextlib
import io
import math
import pathlib
import tempfile
import unittest

from . import load_script
from ._procs import torch_for_procs
from ._step_scripts import check_timed_row, check_trace, run_step_script

RANKS, ROUNDS, STEPS = 2, 2, 2


class DdpStepScript(unittest.TestCase):
    def test_arguments(self) -> None:
        ds = load_script("perf/ddp_step.py")
        args = ds.parse_args([])
        self.assertGreaterEqual(args.rounds, 5)
        self.assertEqual(args.config_list, list(ds.CONFIGS))
        self.assertEqual([r["spec"] for r in args.loss_specs], args.config_list)  # the loss runs: --configs'
        self.assertEqual([r["comm"] for r in args.loss_specs], ["nccl", "bf16-compress", "powersgd", "zpccl-ddp"])
        for bad in (["--configs", "nccl,bogus"], ["--configs", "nccl,nccl"], ["--rounds", "0"],
                    ["--warmup", "1"], ["--powersgd-start", "1"], ["--nproc", "3", "--nodes", "2"],
                    ["--loss-only"], ["--loss-runs", "zpccl,fp8"], ["--loss-runs", "zpccl:8:4"],
                    ["--loss-runs", "nccl,zpccl,nccl"], ["--loss-steps", "-1"]):
            with self.subTest(bad=bad), contextlib.redirect_stderr(io.StringIO()), self.assertRaises(SystemExit):
                ds.parse_args(bad)
        one = ds.parse_args(["--configs", "zpccl", "--warmup", "0"])
        self.assertEqual((one.config_list, [r["spec"] for r in one.loss_specs]), (["zpccl"], ["zpccl"]))
        self.assertEqual([r["spec"] for r in ds.parse_args(["--loss-runs", "zpccl,nccl"]).loss_specs],
                         ["zpccl", "nccl"])

    def test_runs_on_the_cpu(self) -> None:
        torch_for_procs()
        with tempfile.TemporaryDirectory() as trace:
            doc, stdout = run_step_script(self, "perf/ddp_step.py", [
                "--cpu", "--nproc", str(RANKS), "--layers", "1", "--d-model", "32", "--heads", "2", "--seq", "16",
                "--batch", "2", "--rounds", str(ROUNDS), "--steps", str(STEPS), "--warmup", "2", "--loss-steps", "3",
                "--block-size", "32", "--trace", trace, "--trace-steps", "1"])
            # The traced round is in no row and not in "order" below; DDP annotates its forward.
            check_trace(self, pathlib.Path(trace), ["nccl", "bf16-compress", "powersgd", "zpccl"], RANKS, 1,
                        "DistributedDataParallel.forward")
        # The keys of the files in perf/results/ that tools/render_results.py renders.
        self.assertEqual(set(doc), {"provenance", "rows", "order", "losses", "loss_summary", "loss_seeds",
                                    "loss_runs", "regime", "ranks", "nodes", "params", "grad_bits", "block_size",
                                    "grad_block_size", "lr", "loss_stop", "host_cpus", "rank_cpus"})
        self.assertIsNone(doc["loss_stop"])  # every step of --loss-steps trained
        self.assertIsNone(doc["rank_cpus"])  # no --rank-cpus: where the kernel put them
        for row in doc["rows"]:
            self.assertEqual(set(row), {
                "config", "regime", "ranks", "nodes", "params", "layers", "d_model", "seq", "batch", "grad_bits",
                "rounds", "warmup", "steps", "median_ms", "min_ms", "max_ms", "round_median_ms", "step_ms",
                "step_ms_per_rank", "tokens_per_s", "peak_mib", "machine", "zpccl_calls", "zpccl_sent_mib",
                "staging_mib", "grad_mib"})
        for x in doc["losses"]:
            self.assertEqual(set(x), {"spec", "comm", "seed", "steps", "valid", "train_tail", "train_tail_steps",
                                      "zpccl_calls", "curve"})
        self.assertEqual(doc["loss_runs"], ["nccl", "bf16-compress", "powersgd", "zpccl"])
        self.assertEqual(doc["provenance"]["schema"], "zpccl-provenance/1")
        self.assertIn("ddp_step.py --cpu", doc["provenance"]["command"])
        self.assertEqual(doc["regime"], "cpu")
        configs = ["nccl", "bf16-compress", "powersgd", "zpccl"]
        self.assertEqual([r["config"] for r in doc["rows"]], configs)
        self.assertEqual(doc["order"], [[r, c] for r in range(ROUNDS) for c in configs], "rounds alternate")
        for row in doc["rows"]:
            check_timed_row(self, row, ROUNDS, RANKS, STEPS)
        zp = doc["rows"][-1]
        self.assertEqual(zp["zpccl_calls"], 1)  # the tiny model is one bucket a step
        self.assertGreater(zp["zpccl_sent_mib"], 0)
        self.assertIsNone(doc["rows"][0]["zpccl_calls"])
        self.assertEqual([x["spec"] for x in doc["losses"]], configs)
        for x in doc["losses"]:
            self.assertTrue(math.isfinite(x["valid"]) and x["valid"] > 0, x)
        self.assertEqual(doc["losses"][-1]["zpccl_calls"], 3)
        gaps = {s["spec"]: s["gap_pct"] for s in doc["loss_summary"]}
        self.assertEqual(gaps["nccl"]["mean"], 0.0)
        self.assertNotEqual(gaps["zpccl"]["mean"], 0.0)  # quantized gradients: not DDP's bits
        self.assertIn("vs bf16-compress", stdout)


if __name__ == "__main__":
    unittest.main()
