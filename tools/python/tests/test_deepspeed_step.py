"""perf/deepspeed_step.py on DeepSpeed's CPU accelerator with tiny shapes, as a smoke test of the benchmark behind
issue 48's figures: ZeRO-3 on DeepSpeed's collectives and on zpccl's timed in alternating rounds, every rank's raw
step times kept, the bytes of each side counted, the JSON's provenance, the loss runs and their gaps (its arguments:
test_fsdp_step.StepProtocol)."""
from __future__ import annotations

import math
import unittest

from ._step_scripts import check_timed_row, run_step_script
from .test_deepspeed import deepspeed_or_skip

RANKS, NODES, ROUNDS, STEPS = 4, 2, 2, 2


class DeepSpeedStepScript(unittest.TestCase):
    def test_runs_on_the_cpu(self) -> None:
        deepspeed_or_skip()
        # Four ranks as two nodes of two (DeepSpeed's hpZ groups of two are zpccl's; qgZ takes two hops). d 192: the
        # matrices are over DeepSpeed's persistence threshold, so they are gathered.
        doc, stdout = run_step_script(self, "perf/deepspeed_step.py", [
            "--cpu", "--nproc", str(RANKS), "--nodes", str(NODES), "--layers", "1", "--d-model", "192", "--heads", "2",
            "--seq", "32", "--batch", "2", "--configs", "deepspeed,zpccl", "--rounds", str(ROUNDS), "--steps",
            str(STEPS), "--warmup", "1", "--loss-steps", "3", "--loss-runs", "deepspeed,zpccl:8:4"])
        self.assertEqual(doc["provenance"]["schema"], "zpccl-provenance/1")
        self.assertIn("deepspeed_step.py --cpu", doc["provenance"]["command"])
        self.assertEqual((doc["regime"], doc["ranks"], doc["nodes"], doc["hpz"]), ("cpu", RANKS, NODES, 2))
        self.assertRegex(doc["deepspeed"], r"^\d+\.\d+")
        rows = {r["config"]: r for r in doc["rows"]}
        self.assertEqual(list(rows), ["deepspeed", "zpccl"])
        for row in rows.values():
            check_timed_row(self, row, ROUNDS, RANKS, STEPS)
            self.assertEqual((row["peak_mib"], row["enable_mib"]), (0, 0))  # no device memory on a CPU
        ds, zp = rows["deepspeed"], rows["zpccl"]
        self.assertIsNone(ds["calls"])
        self.assertGreater(ds["sent_mib"]["deepspeed all_gather"], 0)
        self.assertGreater(ds["sent_mib"]["deepspeed reduce_scatter"], 0)
        # qwZ and two-hop qgZ in each timed step. No backward gather (so no hpZ call) under the benchmark's config:
        # DeepSpeed keeps a parameter gathered until its backward when it is reused within
        # stage3_max_reuse_distance elements (DeepSpeed's default, 1e9: the whole model here and at 57M).
        for path in ("qwz", "qgz"):
            self.assertGreater(zp["calls"].get(path, 0), 0, zp["calls"])
        self.assertEqual(zp["hpz"], 2)
        # zpccl's gradients left DeepSpeed's reduce-scatter: what DeepSpeed still sends is less than ZeRO-3's.
        self.assertLess(zp["sent_mib"].get("deepspeed reduce_scatter", 0), ds["sent_mib"]["deepspeed reduce_scatter"])
        self.assertEqual([x["spec"] for x in doc["losses"]], ["deepspeed", "zpccl:8:4"])
        for x in doc["losses"]:
            self.assertTrue(math.isfinite(x["valid"]) and x["valid"] > 0, x)
        self.assertIsNone(doc["losses"][0]["zpccl_calls"])
        self.assertGreater(doc["losses"][1]["zpccl_calls"]["qgz"], 0)
        gaps = {s["spec"]: s["gap_pct"] for s in doc["loss_summary"]}
        self.assertEqual(gaps["deepspeed"]["mean"], 0.0)
        self.assertNotEqual(gaps["zpccl:8:4"]["mean"], 0.0)  # quantized: not DeepSpeed's bits
        self.assertIn("vs deepspeed", stdout)
        self.assertIn("(4 ranks (2 nodes, 2 a node, CPU, gloo)", stdout.replace("# DeepSpeed ZeRO-3 step: ", "("))


if __name__ == "__main__":
    unittest.main()
