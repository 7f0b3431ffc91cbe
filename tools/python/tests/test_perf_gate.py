"""tools/perf_gate.py, the perf gate's comparison (tools/perf-gate.sh measures on the GPU machine): the figures it
takes from a run's files, the reference it records, and what it calls regressed, improved, ok, missing or new. On
fake result files; the shell script's --compare-only path runs too."""
from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import pathlib
import subprocess
import tempfile
import unittest
from typing import Any

from . import SOURCE_TREE, load_script

SHELL = SOURCE_TREE / "tools" / "perf-gate.sh"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def provenance(dirty: bool = False, named: str | None = None) -> dict[str, Any]:
    return {"schema": "zpccl-provenance/1", "commit": COMMIT, "dirty": dirty, "regime": "net-on1gpu",
            "gpu": {"count": 1, "models": ["NVIDIA H200"], "driver": "580.159.03"},
            "env": {} if named is None else {"ZP_SOURCE_STATE": named}}


def perf_row(op: str, bits: int, size: int, speedup: float, lo: float, hi: float) -> dict[str, Any]:
    return {"op": op, "regime": "net-on1gpu", "size": size, "bits": bits, "baseline": "nccl",
            "nccl": {"time_us": 1000.0}, "oop": {"time_us": 1000.0 / speedup}, "speedup": speedup,
            "speedup_min": lo, "speedup_max": hi}


def fsdp_row(config: str, rounds: list[float]) -> dict[str, Any]:
    return {"config": config, "median_ms": sorted(rounds)[len(rounds) // 2], "round_median_ms": rounds}


def write_run(folder: pathlib.Path, zpccl_rounds: list[float], dirty: bool = False, extra_row: bool = False,
              named: str | None = None, floor_rounds: list[float] | None = None) -> None:
    rows = [perf_row("qwz_all_gather", 8, 16 << 20, 1.20, 1.15, 1.25),
            perf_row("qwz_all_gather", 8, 64 << 20, 1.64, 1.60, 1.70)]
    if extra_row:
        rows.append(perf_row("qgz_reduce_scatter", 4, 64 << 20, 2.7, 2.6, 2.8))
    (folder / "net_qwz_int8.json").write_text(json.dumps({"provenance": provenance(dirty, named), "rows": rows}))
    fsdp = {"provenance": provenance(dirty, named), "rows": [
        fsdp_row("nccl", [120.0, 118.0, 124.0, 121.0, 119.0]),
        fsdp_row("nccl-noreshard", [80.0, 79.0, 82.0, 81.0, 80.0]),
        fsdp_row("nccl-2comm", [70.0, 69.0, 72.0, 71.0, 70.0]),
        fsdp_row("no-comm", floor_rounds or [40.0, 39.0, 42.0, 41.0, 40.0]),
        fsdp_row("zpccl-hpz", zpccl_rounds)], "losses": []}
    (folder / "fsdp_small.json").write_text(json.dumps(fsdp))


class PerfGate(unittest.TestCase):
    def setUp(self) -> None:
        self.gate = load_script("tools/perf_gate.py")
        self.tmp = tempfile.TemporaryDirectory()
        self.root = pathlib.Path(self.tmp.name)
        self.run_dir = self.root / "run"
        self.run_dir.mkdir()
        self.reference = self.root / "reference.json"
        write_run(self.run_dir, [48.0, 47.0, 50.0, 46.0, 49.0])

    def tearDown(self) -> None:
        self.tmp.cleanup()

    def main(self, *args: str) -> tuple[int, str]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            status = self.gate.main([str(self.run_dir), "--reference", str(self.reference), *args])
        return status, out.getvalue()

    def test_figures_of_a_run(self) -> None:
        figures, records = self.gate.collect(self.run_dir)
        f = figures["qwz_all_gather int8 net-on1gpu 16M"]
        self.assertEqual((f.value, f.lo, f.hi, f.higher_is_better), (1.20, 1.15, 1.25, True))
        step = figures["fsdp small zpccl-hpz step"]
        self.assertEqual((step.value, step.lo, step.hi, step.higher_is_better), (48.0, 46.0, 50.0, False))
        vs = figures["fsdp small zpccl-hpz vs nccl"]
        self.assertAlmostEqual(vs.value, 120.0 / 48.0)
        self.assertAlmostEqual(vs.lo, min(a / b for a, b in zip([120, 118, 124, 121, 119], [48, 47, 50, 46, 49])))
        self.assertAlmostEqual(vs.hi, max(a / b for a, b in zip([120, 118, 124, 121, 119], [48, 47, 50, 46, 49])))
        # The ablation's share: zpccl over the second-communicator step, and that step over the plain one.
        self.assertIn("fsdp small zpccl-hpz vs nccl-2comm", figures)
        self.assertAlmostEqual(figures["fsdp small nccl-2comm vs nccl-noreshard"].value, 80.0 / 70.0)
        self.assertNotIn("fsdp small nccl vs nccl-noreshard", figures)
        # The floor is gated by its step time, not by ratios to NCCL's steps.
        self.assertEqual(figures["fsdp small no-comm step"].value, 40.0)
        self.assertFalse([name for name in figures if name.startswith("fsdp small no-comm vs")])
        self.assertEqual(self.gate.machine_of(records), "1x-nvidia-h200")

    def test_no_reference_then_record_then_compare(self) -> None:
        status, text = self.main()
        self.assertEqual(status, 3, text)
        self.assertIn("no reference recorded for 1x-nvidia-h200", text)
        self.assertIn("--record", text)
        self.assertFalse(self.reference.exists())
        status, text = self.main("--record")
        self.assertEqual(status, 0, text)
        saved = json.loads(self.reference.read_text())
        self.assertEqual(saved["schema"], "zpccl-perf-gate/1")
        self.assertEqual(saved["machine"], "1x-nvidia-h200")
        self.assertEqual(saved["commits"], [COMMIT])
        status, text = self.main()
        self.assertEqual(status, 0, text)
        self.assertIn("GATE: OK", text)
        self.assertNotIn("REGRESSED", text)

    def test_a_slower_step_regresses_a_faster_one_improves(self) -> None:
        self.assertEqual(self.main("--record")[0], 0)
        write_run(self.run_dir, [56.0, 55.0, 58.0, 54.0, 57.0])  # median 56: beyond the reference's 50 * 1.03
        status, text = self.main()
        self.assertEqual(status, 1, text)
        verdicts = {line[:40].strip(): line.split()[-1] for line in text.splitlines() if line.startswith("fsdp ")}
        self.assertEqual(verdicts["fsdp small zpccl-hpz step"], "REGRESSED", text)
        self.assertEqual(verdicts["fsdp small zpccl-hpz vs nccl"], "REGRESSED", text)
        self.assertEqual(verdicts["fsdp small nccl step"], "ok", text)
        self.assertIn("GATE: FAILED: ", text)
        self.assertIn("fsdp small zpccl-hpz step", text.splitlines()[-1])
        self.assertNotIn("qwz_all_gather", text.splitlines()[-1])  # unchanged figures are not named
        write_run(self.run_dir, [49.5, 49.0, 50.0, 48.5, 49.8])  # within the reference's range, ratios too
        status, text = self.main()
        self.assertEqual(status, 0, text)
        write_run(self.run_dir, [40.0, 39.0, 41.0, 40.5, 39.5])  # well below the reference's 46
        status, text = self.main()
        self.assertEqual(status, 0, text)
        self.assertIn("improved", text)

    def test_a_slower_floor_fails_the_gate_and_names_the_machine(self) -> None:
        self.assertEqual(self.main("--record")[0], 0)
        write_run(self.run_dir, [48.0, 47.0, 50.0, 46.0, 49.0], floor_rounds=[45.0, 44.0, 47.0, 46.0, 45.5])
        status, text = self.main()
        self.assertEqual(status, 1, text)
        self.assertIn("GATE: FAILED: fsdp small no-comm step", text)
        self.assertIn("fsdp small no-comm step: the no-network floor ran slower than its reference", text)
        self.assertIn("run the gate again", text)
        # A slower zpccl step with the floor where it was names no machine.
        write_run(self.run_dir, [56.0, 55.0, 58.0, 54.0, 57.0])
        status, text = self.main()
        self.assertEqual(status, 1, text)
        self.assertNotIn("no-network floor", text)

    def test_missing_and_new_figures(self) -> None:
        self.assertEqual(self.main("--record")[0], 0)
        (self.run_dir / "fsdp_small.json").unlink()
        write_run(self.run_dir, [48.0] * 5, extra_row=True)
        (self.run_dir / "fsdp_small.json").unlink()
        status, text = self.main()
        self.assertEqual(status, 1, text)
        self.assertIn("MISSING", text)
        new = [line for line in text.splitlines() if line.endswith(" new")]
        self.assertEqual(len(new), 1, text)
        self.assertTrue(new[0].startswith("qgz_reduce_scatter int4 net-on1gpu 64M"), text)

    def test_verdicts_at_the_margin(self) -> None:
        F = self.gate.Figure
        ref_x, ref_ms = F(2.0, 1.9, 2.1, True, "x"), F(50.0, 48.0, 52.0, False, "ms")
        cases = ((1.9 * 0.97 + 1e-9, "ok"), (1.9 * 0.97 - 1e-6, "REGRESSED"), (2.1 * 1.03 + 1e-6, "improved"))
        for value, expect in cases:
            self.assertEqual(self.gate.verdict(ref_x, F(value, value, value, True, "x"), 0.03), expect, value)
        cases = ((52 * 1.03 - 1e-9, "ok"), (52 * 1.03 + 1e-6, "REGRESSED"), (48 * 0.97 - 1e-6, "improved"))
        for value, expect in cases:
            self.assertEqual(self.gate.verdict(ref_ms, F(value, value, value, False, "ms"), 0.03), expect, value)

    def test_refusals(self) -> None:
        write_run(self.run_dir, [48.0] * 5, dirty=True)
        status, text = self.main("--record")
        self.assertEqual(status, 1, text)
        self.assertIn("dirty", text)
        self.assertFalse(self.reference.exists())
        self.assertEqual(self.main("--record", "--allow-dirty")[0], 0)
        self.reference.unlink()
        # A copy sent to the GPU machine with a git folder not its own: the state its sender named is the one kept.
        measured = "fedcba9876543210fedcba9876543210fedcba98"
        write_run(self.run_dir, [48.0] * 5, dirty=True, named=measured)
        self.assertEqual(self.main("--record")[0], 0)
        self.assertEqual(json.loads(self.reference.read_text())["commits"], [measured])
        other = copy.deepcopy(json.loads((self.run_dir / "fsdp_small.json").read_text()))
        other["provenance"]["gpu"] = {"count": 2, "models": ["NVIDIA H200"]}
        (self.run_dir / "fsdp_small.json").write_text(json.dumps(other))
        status, text = self.main()
        self.assertEqual(status, 1, text)
        self.assertIn("several machines", text)
        # The kind of a file is its content's (perf_files.is_step_file); its name must agree (the shape).
        (self.run_dir / "fsdp_small.json").rename(self.run_dir / "step.json")
        status, text = self.main()
        self.assertEqual(status, 1, text)
        self.assertIn("step.json: a training step's file must be named fsdp_<shape>.json", text)
        (self.run_dir / "step.json").unlink()
        (self.run_dir / "net_qwz_int8.json").rename(self.run_dir / "fsdp_small.json")
        status, text = self.main()
        self.assertEqual(status, 1, text)
        self.assertIn("fsdp_small.json: a training step's file must be named", text)
        empty = self.root / "empty"
        empty.mkdir()
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(self.gate.main([str(empty)]), 1)
        self.assertIn("holds no gate figures", out.getvalue())

    def test_the_shell_script_compares_an_earlier_run(self) -> None:
        if not SHELL.exists():
            raise unittest.SkipTest(f"{SHELL} not found")
        self.assertEqual(self.main("--record")[0], 0)
        env = dict(os.environ, ZP_GATE_REFERENCE=str(self.reference))
        run = subprocess.run(["bash", str(SHELL), "--compare-only", str(self.run_dir)], env=env, capture_output=True,
                             text=True, timeout=120)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertIn("GATE: OK", run.stdout)
        bad = subprocess.run(["bash", str(SHELL), "--no-such-flag"], capture_output=True, text=True, timeout=60)
        self.assertEqual(bad.returncode, 2, bad.stdout + bad.stderr)
        self.assertIn("unknown argument", bad.stderr)

    def test_the_shell_script_refuses_to_measure_under_mps(self) -> None:
        """With a GPU listed and MPS's control pipe in its pipe folder, the gate stops before building: its
        references were measured in time slices, and under MPS a call costs another time."""
        if not SHELL.exists():
            raise unittest.SkipTest(f"{SHELL} not found")
        with tempfile.TemporaryDirectory() as tmp:
            bin_dir, pipes = pathlib.Path(tmp, "bin"), pathlib.Path(tmp, "mps")
            bin_dir.mkdir()
            pipes.mkdir()
            os.mkfifo(pipes / "control")
            smi = bin_dir / "nvidia-smi"
            smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: GPU-a)'\n")
            smi.chmod(0o755)
            env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
            env.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", CUDA_MPS_PIPE_DIRECTORY=str(pipes),
                       ZP_GATE_BUILD_DIR=str(pathlib.Path(tmp, "build")))
            run = subprocess.run(["bash", str(SHELL)], env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(run.returncode, 2, run.stdout + run.stderr)
        self.assertIn("CUDA MPS serves", run.stderr)
        self.assertNotIn("build", run.stdout)


if __name__ == "__main__":
    unittest.main()
