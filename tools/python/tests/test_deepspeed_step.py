"""perf/deepspeed_step.py on DeepSpeed's CPU accelerator with tiny shapes, as a smoke test of the benchmark behind
issue 48's figures: ZeRO-3 on DeepSpeed's collectives, on zpccl's and on local ones (no-comm) timed in alternating
rounds, every rank's raw step times and phases kept, the bytes of each side counted, the JSON's provenance, the loss
runs and their gaps (its arguments: test_fsdp_step.StepProtocol); and no-comm's local collectives alone."""
from __future__ import annotations

import contextlib
import enum
import importlib.util
import io
import math
import pathlib
import statistics
import subprocess
import sys
import tempfile
import unittest
from types import SimpleNamespace
from typing import Any
from unittest import mock

from . import SOURCE_TREE, load_script
from ._step_scripts import check_timed_row, check_trace, run_step_script
from .test_deepspeed import deepspeed_or_skip

RANKS, NODES, ROUNDS, STEPS = 4, 2, 2, 2


class DeepSpeedStepScript(unittest.TestCase):
    def test_runs_on_the_cpu(self) -> None:
        deepspeed_or_skip()
        # Four ranks as two nodes of two (DeepSpeed's hpZ groups of two are zpccl's; qgZ takes two hops). d 192: the
        # matrices are over DeepSpeed's persistence threshold, so they are gathered.
        configs = ["deepspeed", "zpccl", "zpccl-exact", "no-comm"]
        with tempfile.TemporaryDirectory() as trace:
            doc, stdout = run_step_script(self, "perf/deepspeed_step.py", [
                "--cpu", "--nproc", str(RANKS), "--nodes", str(NODES), "--layers", "1", "--d-model", "192", "--heads",
                "2", "--seq", "32", "--batch", "2", "--configs", ",".join(configs), "--rounds", str(ROUNDS),
                "--steps", str(STEPS), "--warmup", "1", "--loss-steps", "3", "--loss-runs",
                "deepspeed,deepspeed-fp32,zpccl:8:4", "--trace", trace, "--trace-steps", "1"])
            check_trace(self, pathlib.Path(trace), configs, RANKS, 1, "Optimizer.step")  # in no row below
        self.assertEqual(doc["provenance"]["schema"], "zpccl-provenance/1")
        self.assertIn("deepspeed_step.py --cpu", doc["provenance"]["command"])
        self.assertEqual((doc["regime"], doc["ranks"], doc["nodes"], doc["hpz"]), ("cpu", RANKS, NODES, 2))
        self.assertRegex(doc["deepspeed"], r"^\d+\.\d+")
        rows = {r["config"]: r for r in doc["rows"]}
        self.assertEqual(list(rows), ["deepspeed", "zpccl", "zpccl-exact", "no-comm"])
        for row in rows.values():
            check_timed_row(self, row, ROUNDS, RANKS, STEPS)
            check_phases(self, row)
            self.assertEqual((row["peak_mib"], row["enable_mib"]), (0, 0))  # no device memory on a CPU
        ds, zp, exact, local = rows["deepspeed"], rows["zpccl"], rows["zpccl-exact"], rows["no-comm"]
        self.assertIsNone(ds["calls"])
        # DeepSpeed regathers each persistent parameter (those under stage3_param_persistence_threshold's 1e5
        # elements) in a call of its own after each step, beside the gathers and reduce-scatters of its fetches and
        # reduction and the gradient norm's all-reduce; zpccl gathers them in one.
        import torch

        model = load_script("perf/deepspeed_step.py").ex.build_gpt(torch, 1, 192, 2, 32)
        persistent = sum(p.numel() < 1e5 for p in model.parameters())
        self.assertGreater(persistent, 1)
        self.assertEqual(ds["calls_per_step"]["deepspeed all_gather"] - persistent,
                         exact["calls_per_step"]["deepspeed all_gather"])
        self.assertEqual(exact["calls_per_step"]["persistent_gather"], 1)
        self.assertEqual(zp["calls_per_step"]["persistent_gather"], 1)
        for row in rows.values():
            self.assertEqual(row["calls_per_step"].get("deepspeed all_reduce"), 1)  # the gradient norm's
        # zpccl-exact: DeepSpeed's gathers and reduce-scatters, its bytes but the persistent parameters' calls.
        self.assertEqual(exact["sent_mib"]["deepspeed reduce_scatter"], ds["sent_mib"]["deepspeed reduce_scatter"])
        self.assertLess(exact["sent_mib"]["deepspeed all_gather"], ds["sent_mib"]["deepspeed all_gather"])
        self.assertFalse({"qwz", "qgz", "hpz"} & set(exact["calls"]), exact["calls"])
        self.assertIsNone(exact["hpz"])
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
        # no-comm makes locally, sending nothing, the very calls zpccl serves; what zpccl leaves DeepSpeed's (the
        # gradient norm's all-reduce) it leaves too.
        self.assertEqual(local["calls"], {"local_all_gather": zp["calls"]["qwz"],
                                          "local_reduce_scatter": zp["calls"]["qgz"],
                                          "local_persistent_gather": zp["calls"]["persistent_gather"]})
        self.assertEqual({k: v for k, v in local["sent_mib"].items() if k.startswith("local")},
                         {"local_all_gather": 0, "local_reduce_scatter": 0, "local_persistent_gather": 0})
        self.assertNotIn("deepspeed reduce_scatter", local["sent_mib"])
        self.assertEqual(local["sent_mib"].get("deepspeed all_gather", 0),
                         zp["sent_mib"].get("deepspeed all_gather", 0))
        self.assertEqual(local["calls_per_step"].get("deepspeed all_gather", 0),
                         zp["calls_per_step"].get("deepspeed all_gather", 0))
        self.assertEqual([r["exchanges_data"] for r in rows.values()], [True, True, True, False])
        self.assertIsNone(local["hpz"])
        self.assertIn("no-comm: DeepSpeed's parameter gathers and gradient reduce-scatters made locally", stdout)
        self.assertIn("host: fwd", stdout)
        self.assertEqual([x["spec"] for x in doc["losses"]], ["deepspeed", "deepspeed-fp32", "zpccl:8:4"])
        for x in doc["losses"]:
            self.assertTrue(math.isfinite(x["valid"]) and x["valid"] > 0, x)
        self.assertIsNone(doc["losses"][0]["zpccl_calls"])
        self.assertIsNone(doc["losses"][1]["zpccl_calls"])
        self.assertGreater(doc["losses"][2]["zpccl_calls"]["qgz"], 0)
        gaps = {s["spec"]: s["gap_pct"] for s in doc["loss_summary"]}
        self.assertEqual({s["spec"]: s["reference"] for s in doc["loss_summary"]},
                         dict.fromkeys(gaps, "deepspeed"))
        self.assertEqual(gaps["deepspeed"]["mean"], 0.0)
        self.assertNotEqual(gaps["zpccl:8:4"]["mean"], 0.0)  # quantized: not DeepSpeed's bits
        # Gradients reduced in fp32 round otherwise than in bf16: not DeepSpeed's default bits, but close to them.
        self.assertNotEqual(gaps["deepspeed-fp32"]["mean"], 0.0)
        self.assertLess(abs(gaps["deepspeed-fp32"]["mean"]), 1.0)
        self.assertIn("vs deepspeed", stdout)
        self.assertIn("(4 ranks (2 nodes, 2 a node, CPU, gloo)", stdout.replace("# DeepSpeed ZeRO-3 step: ", "("))


def check_phases(test: unittest.TestCase, row: dict[str, Any]) -> None:
    """Every rank's forward, backward and optimizer times of every timed step, positive, within that rank's step
    time, and their medians; on a CPU the device's phases are the host's."""
    steps = row["step_ms_per_rank"]
    for key in ("phase", "host_phase"):
        raw = row[f"{key}_ms_per_rank"]
        test.assertEqual(list(raw), ["forward", "backward", "optimizer"])
        for name, values in raw.items():
            test.assertEqual([[len(s) for s in rnd] for rnd in values], [[len(s) for s in rnd] for rnd in steps])
            test.assertTrue(all(t > 0 for rnd in values for s in rnd for t in s), (row["config"], name))
            test.assertEqual(row[f"{key}_median_ms"][name], statistics.median(t for rnd in values for s in rnd
                                                                               for t in s))
        for i, rnd in enumerate(steps):
            for rank, times in enumerate(rnd):
                for j, step in enumerate(times):
                    total = sum(raw[name][i][rank][j] for name in raw)
                    test.assertLessEqual(total, step + 1e-6, (row["config"], key, i, rank, j))
                    test.assertGreater(total, 0.5 * step, (row["config"], key, i, rank, j))  # the step's bulk
    test.assertEqual(row["phase_ms_per_rank"], row["host_phase_ms_per_rank"])


class DeepSpeedsCurveAgainstFsdp2s(unittest.TestCase):
    def test_deepspeed_starts_from_the_weights_rounded_to_bf16(self) -> None:
        # DeepSpeed's bf16 mode casts the module to bf16 before its optimizer copies the weights, so its fp32 master
        # copy starts on bf16's grid; FSDP2 keeps the fp32 initialization and casts it at each forward. In the
        # warmup's first steps an update is smaller than half of bf16's spacing at the weights' scale, so which
        # weights move differs, and the two curves part from the first update: FSDP2 started from the rounded
        # weights (--start-from-bf16) follows DeepSpeed's.
        deepspeed_or_skip()
        shape = ["--cpu", "--nproc", "2", "--nodes", "2", "--layers", "1", "--d-model", "384", "--heads", "6",
                 "--seq", "64", "--batch", "4", "--loss-only", "--loss-steps", "40", "--loss-stop", "4",
                 "--loss-seeds", "0"]
        curves = {}
        for name, script, extra in (("deepspeed", "perf/deepspeed_step.py", ["--loss-runs", "deepspeed"]),
                                    ("fsdp2", "perf/fsdp_step.py", ["--loss-runs", "nccl"]),
                                    ("fsdp2-bf16", "perf/fsdp_step.py", ["--loss-runs", "nccl", "--start-from-bf16"])):
            doc, _ = run_step_script(self, script, shape + extra)
            self.assertEqual(doc["loss_stop"], 4)
            (run,) = doc["losses"]
            self.assertEqual([s for s, _ in run["curve"]], [0, 1, 2, 3])  # every step's loss
            curves[name] = [loss for _, loss in run["curve"]]
        ds, fp32, bf16 = curves["deepspeed"], curves["fsdp2"], curves["fsdp2-bf16"]
        self.assertEqual(ds[0], fp32[0])  # the same weights and batch before any update
        self.assertGreater(abs(ds[1] - fp32[1]), 4 * abs(ds[1] - bf16[1]))
        for step, (a, b) in enumerate(zip(ds, bf16)):
            self.assertLess(abs(a - b), 5e-3, f"step {step}")


class DeepSpeedNoiseFloor(unittest.TestCase):
    def test_the_fp32_run_rounds_otherwise_on_two_ranks(self) -> None:
        # On two ranks the sum of two bf16 gradients, computed wider and rounded once, is the same whether the
        # collective runs in bf16 or in fp32 and is cast back to bf16: the noise floor keeps the sum in fp32 too,
        # or it repeats the reference run to the last bit.
        deepspeed_or_skip()
        doc, _ = run_step_script(self, "perf/deepspeed_step.py", [
            "--cpu", "--nproc", "2", "--nodes", "2", "--layers", "1", "--d-model", "128", "--heads", "4", "--seq",
            "64", "--batch", "4", "--loss-only", "--loss-steps", "20", "--loss-seeds", "0", "--loss-runs",
            "deepspeed,deepspeed-fp32"])
        ds, fp32 = doc["losses"]
        self.assertEqual((ds["spec"], fp32["spec"]), ("deepspeed", "deepspeed-fp32"))
        self.assertEqual(ds["curve"][0], fp32["curve"][0])  # the same weights and batch before any update
        self.assertNotEqual(ds["valid"], fp32["valid"])
        self.assertLess(abs(ds["valid"] - fp32["valid"]), 0.01 * ds["valid"])  # both exact


class _Status(enum.Enum):
    """ZeRO-3's parameter states, as far as no-comm reads them."""

    NOT_AVAILABLE = 1
    AVAILABLE = 2


class NoCommCollectives(unittest.TestCase):
    def test_local_collectives_write_what_a_rank_has(self) -> None:
        deepspeed_or_skip()
        import torch
        from deepspeed.runtime.zero import partition_parameters, stage3

        ds_step = load_script("perf/deepspeed_step.py")
        theirs = (partition_parameters._dist_allgather_fn, stage3.reduce_scatter_coalesced)
        # Two parameters as ZeRO-3 leaves them after a step: a persistent one (its partition of 2 of 5 elements on
        # each of 3 ranks) and another, each with its own all_gather (DeepSpeed's, standing in: it records calls).
        status = _Status
        deepspeeds: list[Any] = []
        params = [SimpleNamespace(ds_id=i, ds_persist=i == 0, ds_status=status.NOT_AVAILABLE, ds_numel=5,
                                  ds_shape=(5,), ds_tensor=torch.tensor([7.0, 8.0]), ds_process_group="dp",
                                  data=None) for i in range(2)]
        for p in params:
            p.all_gather = lambda param_list=None, async_op=False, *a: deepspeeds.append((param_list, async_op))
        local = ds_step.LocalCollectives(SimpleNamespace(module=SimpleNamespace(parameters=lambda: params)))
        try:
            # Through zpccl.deepspeed's seams: the functions ZeRO-3 looks up at call time are no-comm's.
            self.assertEqual((partition_parameters._dist_allgather_fn, stage3.reduce_scatter_coalesced),
                             (local.all_gather, local.reduce_scatter))
            local.dist = SimpleNamespace(get_world_size=lambda group: 3, get_rank=lambda group: 1)
            # A gather in place (DeepSpeed's input is its own slot of the output) and from elsewhere: the rank's
            # partition in every slot.
            out = torch.full((12,), float("nan"))
            out.view(3, 4)[1].copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
            self.assertTrue(local.all_gather(out.view(3, 4)[1], out, "dp").wait())
            self.assertEqual(out.tolist(), [1.0, 2.0, 3.0, 4.0] * 3)
            out = torch.full((6,), float("nan"))
            local.all_gather(torch.tensor([5.0, 6.0]), out, "dp")
            self.assertEqual(out.tolist(), [5.0, 6.0] * 3)
            # Rank 1's chunk of ceil(numel / 3) elements of each gradient: a whole one, a short one, an empty one;
            # copies, as DeepSpeed's buckets are reused after the call.
            grads = [torch.arange(7.0), torch.arange(4.0) + 10, torch.tensor([20.0])]
            got = local.reduce_scatter(grads, "dp")
            for g in grads:
                g.fill_(float("nan"))
            self.assertEqual([g.tolist() for g in got], [[3.0, 4.0, 5.0], [12.0, 13.0], []])
            # The persistent parameters' regather after a step: local, the rank's partition in every slot, cut to
            # the parameter; any other gather (not all persistent, asynchronous, a parameter alone) DeepSpeed's.
            self.assertIsNone(params[1].all_gather([params[0]]))
            self.assertEqual((params[0].data.tolist(), params[0].ds_status),
                             ([7.0, 8.0, 7.0, 8.0, 7.0], status.AVAILABLE))
            params[0].ds_status = status.NOT_AVAILABLE
            params[0].all_gather(params)
            params[0].all_gather([params[0]], True)
            params[0].all_gather()
            self.assertEqual(deepspeeds, [(params, False), ([params[0]], True), (None, False)])
            self.assertEqual(local.summary(), {"local_all_gather": dict(calls=2, wire_bytes=0),
                                               "local_reduce_scatter": dict(calls=1, wire_bytes=0),
                                               "local_persistent_gather": dict(calls=1, wire_bytes=0)})
            local.reset_stats()
            self.assertEqual({k: v["calls"] for k, v in local.summary().items()},
                             {"local_all_gather": 0, "local_reduce_scatter": 0, "local_persistent_gather": 0})
        finally:
            local.disable()
        self.assertEqual((partition_parameters._dist_allgather_fn, stage3.reduce_scatter_coalesced), theirs)
        params[1].all_gather([params[0]])  # DeepSpeed's own again
        self.assertEqual(deepspeeds[-1], ([params[0]], False))

    def test_the_noise_floor_is_a_loss_run_of_deepspeeds_collectives(self) -> None:
        ds_step = load_script("perf/deepspeed_step.py")
        self.assertEqual(ds_step.parse_loss_spec("deepspeed-fp32"),
                         dict(spec="deepspeed-fp32", comm="deepspeed", config="deepspeed-fp32", weight_bits=None,
                              grad_bits=None))
        with contextlib.redirect_stderr(io.StringIO()) as err, self.assertRaises(SystemExit):
            ds_step.parse_args(["--configs", "deepspeed,deepspeed-fp32"])  # not timed: a loss run alone
        self.assertIn("unknown deepspeed-fp32", err.getvalue())

    def test_no_comm_is_no_loss_run(self) -> None:
        ds_step = load_script("perf/deepspeed_step.py")
        with self.assertRaisesRegex(ValueError, "no-comm.*exchange no data"):
            ds_step.parse_loss_spec("no-comm")
        self.assertIn("no-comm", ds_step.parse_args([]).configs.split(","))  # timed by default
        with contextlib.redirect_stderr(io.StringIO()) as err, self.assertRaises(SystemExit):
            ds_step.parse_args(["--loss-steps", "2", "--loss-runs", "deepspeed,no-comm"])
        self.assertIn("loss run 'no-comm'", err.getvalue())


class WithoutDeepSpeed(unittest.TestCase):
    def test_the_scripts_stop_before_any_rank_saying_what_to_install(self) -> None:
        ds_step = load_script("perf/deepspeed_step.py")
        real = importlib.util.find_spec
        if real("deepspeed") is not None:
            self.assertIsNone(ds_step.dt.require_deepspeed())  # importable: nothing to say
        hidden = mock.patch("importlib.util.find_spec",
                            lambda name, *a: None if name == "deepspeed" else real(name, *a))
        with hidden, self.assertRaises(SystemExit) as stop:
            ds_step.dt.require_deepspeed()
        message = str(stop.exception.code)
        self.assertIn("DeepSpeed is not importable: pip install 'deepspeed>=0.19'", message)
        self.assertIn("tools/gpu-python-deps.sh", message)  # the way on a machine without network
        # Each script, run as a program without DeepSpeed, says so before it starts a rank (a rank's failure would
        # name zpccl.launch.RankFailed).
        for script in ("perf/deepspeed_step.py", "tools/python/examples/deepspeed_train.py"):
            code = ("import importlib.util, runpy, sys; real = importlib.util.find_spec; importlib.util.find_spec = "
                    "lambda name, *a: None if name == 'deepspeed' else real(name, *a); sys.argv = [sys.argv[1], "
                    "'--nproc', '2']; runpy.run_path(sys.argv[0], run_name='__main__')")
            run = subprocess.run([sys.executable, "-c", code, str(SOURCE_TREE / script)], capture_output=True,
                                 text=True, timeout=120)
            self.assertEqual(run.returncode, 1, run.stderr)
            self.assertIn(f"{pathlib.Path(script).name}: DeepSpeed is not importable", run.stderr)
            self.assertNotIn("RankFailed", run.stderr)


if __name__ == "__main__":
    unittest.main()
