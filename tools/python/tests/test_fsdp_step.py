"""perf/fsdp_step.py on the CPU: the step-time protocol it shares with perf/deepspeed_step.py (perf/step_protocol.py:
every rank timed, a step its slowest rank's, rounds kept raw; ratios of medians with the rounds' spread; the loss
runs' reference), both scripts' arguments, nccl-2comm's reduce-scatter hook, which must give FSDP2's own
reduce-scatter results bit for bit on a second process group (torch's threaded process group, ranks as threads), and
the whole script on gloo (``--cpu``) as the gate runs it on a GPU."""
from __future__ import annotations

import contextlib
import copy
import io
import math
import pathlib
import os
import tempfile
import unittest
import unittest.mock
from types import SimpleNamespace
from typing import Any

from . import SOURCE_TREE, load_script
from ._procs import torch_for_procs
from ._step_scripts import check_timed_row, check_trace, run_step_script
from ._threaded import run_threaded, torch_with_fsdp2

WORLD = 4


class StepProtocol(unittest.TestCase):
    def test_a_step_takes_its_slowest_ranks_time(self) -> None:
        sp = load_script("perf/step_protocol.py")
        # Two rounds, two ranks, three steps: rank 1 is slower in step 0 of round 0 only.
        per_rank = [[[10.0, 11.0, 12.0], [30.0, 10.0, 12.5]],
                    [[20.0, 21.0, 22.0], [19.0, 25.0, 21.0]]]
        s = sp.step_summary(per_rank)
        self.assertEqual(s["step_ms"], [[30.0, 11.0, 12.5], [20.0, 25.0, 22.0]])
        self.assertEqual(s["round_median_ms"], [12.5, 22.0])
        self.assertEqual(s["steps"], 6)
        self.assertEqual(s["median_ms"], (20.0 + 22.0) / 2)  # of 11, 12.5, 20, 22, 25, 30
        self.assertEqual((s["min_ms"], s["max_ms"]), (11.0, 30.0))
        self.assertIs(s["step_ms_per_rank"], per_rank)  # kept raw
        for ragged in ([], [[]], [[[1.0], [1.0, 2.0]]], [[[1.0]], []]):
            with self.subTest(ragged=ragged), self.assertRaises(ValueError):
                sp.step_summary(ragged)

    def test_ratios_of_medians_with_the_rounds_spread(self) -> None:
        sp = load_script("perf/step_protocol.py")
        nccl = dict(median_ms=120.0, round_median_ms=[118.0, 121.0, 124.0])
        zp = dict(median_ms=48.0, round_median_ms=[50.0, 47.0, 40.0])
        ratio, lo, hi = sp.ratio_of(nccl, zp)
        self.assertAlmostEqual(ratio, 2.5)
        self.assertAlmostEqual(lo, 118.0 / 50.0)
        self.assertAlmostEqual(hi, 124.0 / 40.0)
        self.assertEqual(sp.ratio_of(dict(median_ms=10.0), dict(median_ms=5.0)), (2.0, None, None))

    def test_arguments(self) -> None:
        fs = load_script("perf/fsdp_step.py")
        args = fs.parse_args([])
        self.assertGreaterEqual(args.rounds, 5)
        self.assertIn("nccl-2comm", args.configs.split(","))
        for bad in (["--configs", "nccl,bogus"], ["--rounds", "0"], ["--configs", "nccl,zpccl-hpz,nccl"],
                    ["--loss-runs", "nccl,zpccl:8:4,nccl"], ["--loss-steps", "-1"],
                    ["--loss-steps", "4", "--loss-stop", "5"], ["--loss-steps", "4", "--loss-stop", "-1"],
                    ["--trace", "t", "--trace-steps", "0"], ["--trace", "t", "--loss-only", "--loss-steps", "4"]):
            with self.subTest(bad=bad), contextlib.redirect_stderr(io.StringIO()), self.assertRaises(SystemExit):
                fs.parse_args(bad)
        self.assertEqual(fs.parse_args(["--configs", "zpccl-hpz, nccl"]).config_list, ["zpccl-hpz", "nccl"])
        self.assertEqual(fs.reshard_of("nccl-2comm", 2), fs.reshard_of("zpccl-hpz", 2))
        self.assertEqual(fs.reshard_of("nccl-2comm", 1), False)

    def test_rank_cpus(self) -> None:
        # One CPU list per rank in taskset's syntax, ranks separated by '/'; the scripts share the option.
        fs, ds = load_script("perf/fsdp_step.py"), load_script("perf/deepspeed_step.py")
        self.assertEqual(fs.parse_args(["--rank-cpus", "0-1/8,10"]).rank_cpu_lists, [[0, 1], [8, 10]])
        self.assertEqual(ds.parse_args(["--rank-cpus", "3/3"]).rank_cpu_lists, [[3], [3]])
        self.assertIsNone(fs.parse_args([]).rank_cpu_lists)
        with contextlib.redirect_stderr(io.StringIO()) as err, self.assertRaises(SystemExit):
            fs.parse_args(["--rank-cpus", "0-1/2-"])
        self.assertIn("--rank-cpus: CPU list '2-'", err.getvalue())
        sp = load_script("perf/step_protocol.py")
        with unittest.mock.patch.dict("os.environ", {"RANK": "1", "WORLD_SIZE": "4"}):
            with self.assertRaisesRegex(SystemExit, "gives 2 CPU lists for 4 ranks"):
                sp.pin_rank([[0], [1]])
            sp.pin_rank(None)  # without the option, nothing

    def test_deepspeed_step_arguments(self) -> None:
        ds = load_script("perf/deepspeed_step.py")
        args = ds.parse_args(["--shape", "small", "--loss-runs", "zeropp,deepspeed,zpccl:8:0", "--loss-seeds", "3,1"])
        self.assertEqual((args.layers, args.seq, args.batch), (8, 256, 8))
        self.assertEqual(args.seeds, [3, 1])
        self.assertEqual([r["spec"] for r in args.loss_specs], ["zeropp", "deepspeed", "zpccl:8:0"])
        self.assertEqual((args.loss_specs[2]["weight_bits"], args.loss_specs[2]["grad_bits"]), (8, 0))
        for bad in (["--configs", "deepspeed,nccl"], ["--loss-runs", "zpccl:8:5"], ["--loss-seeds", "1,1"],
                    ["--loss-only"]):
            with self.subTest(bad=bad), contextlib.redirect_stderr(io.StringIO()), self.assertRaises(SystemExit):
                ds.parse_args(bad)

    def test_one_grammar_of_loss_runs(self) -> None:
        """step_protocol's parse_loss_run behind both scripts: a configuration by name, ``zpccl`` (bits None: the
        script's defaults) or ``zpccl:W:G``; zpccl:0:0 refused where zpccl would serve nothing (FSDP2), a run where
        it serves hpZ alone (DeepSpeed)."""
        fs, ds = load_script("perf/fsdp_step.py"), load_script("perf/deepspeed_step.py")
        run = lambda spec, comm, config, w=None, g=None: dict(  # noqa: E731
            spec=spec, comm=comm, config=config, weight_bits=w, grad_bits=g)
        self.assertEqual(fs.parse_loss_spec(" nccl-fp32 "), run("nccl-fp32", "nccl", "nccl-fp32"))
        self.assertEqual(fs.parse_loss_spec("zpccl"), run("zpccl", "zpccl", "zpccl-hpz"))
        self.assertEqual(fs.parse_loss_spec("zpccl:0:4"), run("zpccl:0:4", "zpccl", "zpccl-hpz", 0, 4))
        self.assertEqual(ds.parse_loss_spec("zeropp"), run("zeropp", "zeropp", "zeropp"))
        self.assertEqual(ds.parse_loss_spec("zpccl"), run("zpccl", "zpccl", "zpccl"))
        self.assertEqual(ds.parse_loss_spec("zpccl:0:0"), run("zpccl:0:0", "zpccl", "zpccl", 0, 0))
        for script, bad, why in (
                (fs, "zpccl:0:0", "zpccl.fsdp would serve nothing"), (fs, "deepspeed", "not nccl, nccl-noreshard"),
                (ds, "nccl", "not deepspeed, deepspeed-fp32, zeropp, zpccl or zpccl:W:G"),
                (ds, "no-comm", "exchange no data"),
                (fs, "zpccl:8", "zpccl:W:G"), (fs, "zpccl:8:4:4", "zpccl:W:G"), (ds, "zpccl:8:x", "integers"),
                (ds, "zpccl:8:2", "0, 4 or 8"), (fs, "zpccl:16:4", "0, 4 or 8")):
            with self.subTest(bad=bad), self.assertRaises(ValueError) as caught:
                script.parse_loss_spec(bad)
            self.assertIn(why, str(caught.exception))
            self.assertIn(repr(bad), str(caught.exception))
        ddp = load_script("perf/ddp_step.py")  # names alone: no zpccl:W:G
        self.assertEqual(ddp.parse_loss_spec("zpccl"), run("zpccl", "zpccl-ddp", "zpccl"))
        with self.assertRaises(ValueError) as caught:
            ddp.parse_loss_spec("zpccl:8:4")
        self.assertIn("not nccl, bf16-compress, powersgd or zpccl", str(caught.exception))

    def test_cpu_runs_refuse_what_needs_cuda(self) -> None:
        fs, ds = load_script("perf/fsdp_step.py"), load_script("perf/deepspeed_step.py")
        self.assertTrue(fs.parse_args(["--cpu", "--configs", "nccl,zpccl-hpz"]).cpu)
        self.assertTrue(ds.parse_args(["--cpu", "--configs", "deepspeed,zpccl", "--loss-runs", "zeropp"]).cpu)
        # Without timed rounds the configurations are not run: only the loss runs count.
        self.assertTrue(fs.parse_args(["--cpu", "--loss-only", "--loss-steps", "2", "--loss-runs", "nccl"]).cpu)
        self.assertEqual(fs.parse_args(["--configs", "no-comm", "--cuda-waits", "block"]).cuda_waits, "block")
        for script, bad, why in (
                (fs, ["--cpu"], "zero3 needs CUDA"),  # the default configurations include it
                (ds, ["--cpu", "--configs", "deepspeed,zeropp"], "zeropp needs CUDA"),
                (ds, ["--cpu", "--configs", "zpccl", "--loss-steps", "2", "--loss-runs", "deepspeed,zeropp"],
                 "zeropp needs CUDA"),
                (fs, ["--nproc", "3", "--nodes", "2"], "does not divide"),
                (fs, ["--cpu", "--configs", "nccl", "--cuda-waits", "block"], "--cpu waits for no GPU")):
            with self.subTest(bad=bad), contextlib.redirect_stderr(io.StringIO()) as err, \
                    self.assertRaises(SystemExit):
                script.parse_args(bad)
            self.assertIn(why, err.getvalue())

    def test_alternating_rounds_make_the_rows(self) -> None:
        sp = load_script("perf/step_protocol.py")
        order: list[tuple[str, int]] = []

        def run(name: str, r: int) -> dict[str, Any]:  # two ranks, two steps; b twice as slow, peaks per round
            order.append((name, r))
            t = (0.010 if name == "a" else 0.020) * (r + 1)
            return dict(times=[[t, t], [t, 2 * t]], peak=(r + 1) << 20, calls={"qwz": r})

        rows: dict[str, dict[str, Any]] = {"a": {}, "b": {"sent": 1}}
        ran = sp.alternate_rounds(rows, 2, run, lambda *a, **k: None)
        self.assertEqual(order, [("a", 0), ("b", 0), ("a", 1), ("b", 1)])
        self.assertEqual(ran, [[r, n] for n, r in order])  # the order the JSON keeps
        args = SimpleNamespace(nodes=2, batch=4, seq=8, layers=1, d_model=8, weight_bits=8, grad_bits=4,
                               block_size=256, grad_block_size=None, rounds=2, warmup=1)
        a, b = (sp.timed_row(n, rows[n], args, SimpleNamespace(world=2), "net", 1, 100) for n in ("a", "b"))
        self.assertEqual(a["round_median_ms"], [15.0, 30.0])  # of the steps 10, 20 and 20, 40
        self.assertEqual(b["max_ms"], 80.0)  # the slower rank's step
        self.assertEqual((a["peak_mib"], a["calls"], a["grad_block_size"]), (2.0, {"qwz": 1}, 256))
        self.assertEqual(rows["b"]["sent"], 1)  # what the row held stays
        common = sp.timed_fields("a", rows["a"], args, SimpleNamespace(world=2), "net", 100)
        self.assertEqual({k: v for k, v in a.items() if k in common}, common)  # timed_row: these and zpccl's
        self.assertEqual(set(a) - set(common), {"ranks_per_node", "weight_bits", "grad_bits", "block_size",
                                                "grad_block_size", "calls", "enable_mib"})
        self.assertEqual(sp.vs_cell([a, b], "a", b), "0.50x (0.50-0.50)")
        self.assertEqual(sp.vs_cell([b], "a", b), "-")

    def test_each_round_prints_its_steps_and_machine(self) -> None:
        sp = load_script("perf/step_protocol.py")
        said: list[str] = []
        cpu = dict(host_busy=0.5, host_steal=0.0, rank_preempted=2, gpu_sm_mhz=None, gpu_held_back_ms=None)
        gpu = [dict(cpu, host_busy=0.25, host_steal=0.015, rank_preempted=9, rank_migrations=3, gpu_sm_mhz=1410,
                    gpu_held_back_ms={"power": 3.0, "thermal": 1.0}),
               dict(cpu, rank_migrations=5, gpu_sm_mhz=1980, gpu_held_back_ms={"power": 0.0})]

        def run(name: str, r: int) -> dict[str, Any]:  # two ranks, three steps; rank 1 slower in step 0
            machine = [cpu, cpu] if name == "a" else gpu if name == "b" else None
            return dict(times=[[0.010, 0.020, 0.030], [0.040, 0.020, 0.030]], peak=0, machine=machine)

        rows: dict[str, dict[str, Any]] = {"a": {}, "b": {}, "c": {}}
        sp.alternate_rounds(rows, 1, run, lambda text, **k: said.append(text))
        lines = said[0].splitlines()
        self.assertEqual(lines[1:], [
            "#     a 30.0 ms (host busy 50%, steal 0.0%, preempted 2)",  # steps 40, 20, 30: their median
            "#     b 30.0 ms (host busy 50%, steal 1.5%, preempted 9, migrated 5, SM 1410 MHz, held back 4 ms)"])
        self.assertEqual(rows["c"]["machine"], [None])  # a configuration that records no machine
        self.assertEqual(sp.machine_brief([None]), "no machine figures")

    def test_training_tail_and_curve(self) -> None:
        import torch

        sp = load_script("perf/step_protocol.py")
        one_rank = SimpleNamespace(ReduceOp=SimpleNamespace(AVG=None), all_reduce=lambda t, op: None)  # AVG of one
        bench = SimpleNamespace(torch=torch, dist=one_rank, where=SimpleNamespace(device="cpu"))
        got = sp.train_for_loss(bench, 25, lambda s: torch.tensor(float(s)))
        self.assertEqual(got["train_tail_steps"], sp.TRAIN_TAIL)
        self.assertAlmostEqual(got["train_tail"], sum(range(5, 25)) / 20)
        self.assertEqual(got["curve"], [(0, 0.0), (10, 10.0), (20, 20.0), (24, 24.0)])

    def test_the_loss_reference_is_the_exact_run(self) -> None:
        sp = load_script("perf/step_protocol.py")
        for exact, other in (("nccl", "zpccl"), ("deepspeed", "zeropp")):
            losses = [dict(spec=other, comm=other, seed=0, valid=2.2, grad_bits=None),
                      dict(spec=exact, comm=exact, seed=0, valid=2.0)]
            summary = sp.loss_summary(losses)
            with self.subTest(exact=exact):
                self.assertEqual([r["reference"] for r in summary], [exact, exact])
                self.assertAlmostEqual(summary[0]["gap_pct"]["mean"], 10.0)
                self.assertEqual(summary[1]["gap_pct"]["mean"], 0.0)


class SecondGroupReduceScatter(unittest.TestCase):
    def test_equals_fsdps_own_reduce_scatter(self) -> None:
        torch = torch_with_fsdp2()
        fs = load_script("perf/fsdp_step.py")
        from zpccl import fsdp as zfsdp

        from .test_fsdp import batches, build_model, next_token_loss, shard

        base = build_model(torch)  # here: torch's generator is the process's, shared by the thread-ranks

        def body(rank: int) -> Any:
            from torch.distributed.device_mesh import init_device_mesh

            dist = torch.distributed
            mesh = init_device_mesh("cpu", (WORLD,))
            second = dist.new_group(list(range(WORLD)))
            ids = batches(torch, rank, 1)[0]
            grads, hook = [], None
            for hooked in (False, True):
                model = shard(torch, copy.deepcopy(base), mesh, True)
                if hooked:
                    hook = fs.use_second_group(model, zfsdp._Fsdp.load(), second)
                next_token_loss(torch, model(ids), ids).backward()
                grads.append([p.grad.to_local().clone() for p in model.parameters()])
            return grads, hook.calls

        for rank, (grads, calls) in enumerate(run_threaded(WORLD, body)):
            plain, hooked = grads
            self.assertEqual(len(plain), len(hooked))
            for a, b in zip(plain, hooked):
                self.assertTrue(torch.equal(a, b), f"rank {rank}: a gradient differs from FSDP's own")
            # One reduce-scatter per FSDP module (two blocks and the root), all through the hook.
            self.assertEqual(calls, 3, f"rank {rank}")

    def test_refuses_a_group_of_other_ranks(self) -> None:
        torch = torch_with_fsdp2()
        fs = load_script("perf/fsdp_step.py")
        from zpccl import fsdp as zfsdp

        def body(rank: int) -> Any:
            dist = torch.distributed
            pair = dist.new_group([0, 1])
            hook = fs.second_group_reduce_scatter(zfsdp._Fsdp.load().ReduceScatter, dist, dist.group.WORLD)
            out, inp = torch.zeros(2), torch.ones(2 * WORLD)
            if rank in (0, 1):
                with self.assertRaisesRegex(ValueError, "shard group"):
                    hook(out, inp, pair, dist.ReduceOp.SUM)
            hook(out, inp, dist.group.WORLD, dist.ReduceOp.SUM)
            return out.tolist()

        for out in run_threaded(WORLD, body):
            self.assertEqual(out, [float(WORLD)] * 2)


class FsdpStepOnCpu(unittest.TestCase):
    """perf/fsdp_step.py as the gate and the bisect run it, on gloo with zpccl's host backend and tiny shapes: four
    ranks as two nodes of two, every configuration but zero3 in alternating rounds, FSDP's bytes counted, zpccl's
    paths counted (hpZ inside a node), the ablation's hook taking every reduce-scatter, the floor's local
    collectives taking every call, the loss runs."""

    RANKS, ROUNDS, STEPS = 4, 2, 2
    CONFIGS = ["nccl", "nccl-noreshard", "nccl-2comm", "no-comm", "zpccl-hpz", "zpccl-reshard"]

    def rank_cpus(self) -> list[int]:
        """A CPU for each rank, round robin over the first two this process may use."""
        allowed = sorted(os.sched_getaffinity(0))[:2]
        return [allowed[r % len(allowed)] for r in range(self.RANKS)]

    def test_runs_on_the_cpu(self) -> None:
        torch_for_procs()
        doc, stdout = run_step_script(self, "perf/fsdp_step.py", [
            "--cpu", "--nproc", str(self.RANKS), "--nodes", "2", "--configs", ",".join(self.CONFIGS), "--rounds",
            str(self.ROUNDS), "--steps", str(self.STEPS), "--warmup", "1", "--layers", "1", "--d-model", "64",
            "--heads", "2", "--seq", "32", "--batch", "2", "--block-size", "32", "--loss-steps", "3", "--loss-runs",
            "nccl,zpccl:8:4", "--rank-cpus", "/".join(str(c) for c in self.rank_cpus())])
        self.assertIn("fsdp_step.py --cpu", doc["provenance"]["command"])
        # Each rank ran on its CPU, and the file says so, with the host's CPUs.
        self.assertEqual(doc["rank_cpus"], [[c] for c in self.rank_cpus()])
        self.assertEqual(doc["host_cpus"]["count"], os.cpu_count())
        for row in doc["rows"]:
            for rnd in row["machine"]:
                self.assertEqual([m["rank_cpu"] for m in rnd], self.rank_cpus(), row["config"])
                self.assertEqual([m["rank_migrations"] for m in rnd], [0] * self.RANKS, row["config"])
        self.assertEqual((doc["regime"], doc["ranks"], doc["nodes"], doc["ranks_per_node"]), ("cpu", 4, 2, 2))
        rows = {r["config"]: r for r in doc["rows"]}
        self.assertEqual(list(rows), self.CONFIGS)
        for row in rows.values():
            check_timed_row(self, row, self.ROUNDS, self.RANKS, self.STEPS)
        self.assertEqual([rows[n]["reshard"] for n in self.CONFIGS], ["True", "False", "2", "False", "2", "True"])
        # FSDP's bytes: resharding after forward gathers every weight twice; the ablation (groups of two after
        # forward) in between.
        plain, kept, two = (rows[n]["sent_mib"] for n in ("nccl", "nccl-noreshard", "nccl-2comm"))
        self.assertGreater(kept["all_gather"], 0)
        self.assertEqual(plain["all_gather"], 2 * kept["all_gather"])
        self.assertTrue(kept["all_gather"] < two["all_gather"] < plain["all_gather"], two)
        self.assertEqual(plain["reduce_scatter"], kept["reduce_scatter"])
        # zpccl: a forward gather (qwZ), a backward gather inside the node (hpZ) and a reduce-scatter (qgZ) per FSDP
        # module and step; resharded to the whole group, the backward gathers are qwZ too. The ablation's hook runs
        # every reduce-scatter.
        hpz, reshard = rows["zpccl-hpz"]["calls"], rows["zpccl-reshard"]["calls"]
        modules = hpz["qgz"]
        self.assertEqual(hpz, {"qwz": modules, "hpz": modules, "qgz": modules})
        self.assertEqual(reshard, {"qwz": 2 * modules, "qgz": modules})
        self.assertEqual(rows["nccl-2comm"]["calls"], {"reduce_scatter_second_group": modules})
        # The floor: every gather (forward only, as nccl-noreshard) and reduce-scatter made locally, nothing sent.
        self.assertEqual(rows["no-comm"]["calls"], {"local": 2 * modules})
        self.assertEqual(rows["no-comm"]["sent_mib"], {})
        sent = rows["zpccl-hpz"]["sent_mib"]
        self.assertLess(sent["qwz"], kept["all_gather"])  # int8 blocks against bf16
        self.assertLess(sent["qgz"], kept["reduce_scatter"])  # int4 blocks against bf16
        self.assertEqual([x["spec"] for x in doc["losses"]], ["nccl", "zpccl:8:4"])
        for x in doc["losses"]:
            self.assertTrue(math.isfinite(x["valid"]) and x["valid"] > 0, x)
        self.assertGreater(doc["losses"][1]["zpccl_calls"]["qgz"], 0)
        gaps = {r["spec"]: r["gap_pct"]["mean"] for r in doc["loss_summary"]}
        self.assertEqual(gaps["nccl"], 0.0)
        self.assertNotEqual(gaps["zpccl:8:4"], 0.0)
        self.assertIn("vs 2comm", stdout)

    def test_trace_round(self) -> None:
        # --trace: after the timed rounds, one more of each configuration under torch's profiler, in no row.
        torch_for_procs()
        with tempfile.TemporaryDirectory() as tmp:
            folder = pathlib.Path(tmp)
            doc, stdout = run_step_script(self, "perf/fsdp_step.py", [
                "--cpu", "--nproc", "2", "--nodes", "2", "--configs", "nccl,zpccl-hpz", "--rounds", "1", "--steps",
                "2", "--warmup", "1", "--layers", "1", "--d-model", "64", "--heads", "2", "--seq", "32", "--batch",
                "2", "--block-size", "32", "--trace", str(folder), "--trace-steps", "1"])
            for row in doc["rows"]:
                check_timed_row(self, row, 1, 2, 2)  # the traced round is in no row
            check_trace(self, folder, ["nccl", "zpccl-hpz"], 2, 1, "FSDP::")
        self.assertIn("comm exposed", stdout)


class FsdpMemoryArguments(unittest.TestCase):
    """perf/fsdp_memory.py runs on a GPU alone, through fsdp_step's Bench: its arguments must carry every field of
    ``args`` that the Bench methods it calls read, or it fails on the GPU machine at its first line of work."""

    @staticmethod
    def _fields_read(function: Any) -> set[str]:
        """The names read as ``args.X`` or ``self.args.X`` in ``function``'s body."""
        import ast

        return {node.attr for node in ast.walk(function) if isinstance(node, ast.Attribute)
                and ((isinstance(node.value, ast.Name) and node.value.id == "args")
                     or (isinstance(node.value, ast.Attribute) and node.value.attr == "args"))}

    def test_every_field_the_bench_reads_is_parsed(self) -> None:
        import ast

        bench = next(node for node in ast.parse((SOURCE_TREE / "perf/fsdp_step.py").read_text()).body
                     if isinstance(node, ast.ClassDef) and node.name == "Bench")
        methods = {f.name: f for f in bench.body if isinstance(f, ast.FunctionDef)}
        memory = ast.parse((SOURCE_TREE / "perf/fsdp_memory.py").read_text())
        called = {node.func.attr for node in ast.walk(memory) if isinstance(node, ast.Call)
                  and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
                  and node.func.value.id == "bench"}
        self.assertTrue(called, "fsdp_memory.py calls no Bench method by the name `bench`: update this test")
        used = {"__init__", *(called & methods.keys())}
        needed = set().union(*(self._fields_read(methods[m]) for m in used))
        self.assertIn("cpu", needed)
        args = vars(load_script("perf/fsdp_memory.py").parse_args([]))
        self.assertEqual(sorted(needed - args.keys()), [], f"Bench methods {sorted(used)}")
        self.assertIs(args["cpu"], False)


if __name__ == "__main__":
    unittest.main()
