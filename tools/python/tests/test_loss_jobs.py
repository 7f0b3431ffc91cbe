"""tools/loss_jobs.py: a step script's loss runs, one job a seed, side by side, with timeouts and a deadline."""
from __future__ import annotations

import contextlib
import io
import json
import os
import pathlib
import tarfile
import tempfile
import textwrap
import time
import unittest

from . import SOURCE_TREE, load_script
from ._procs import torch_for_procs

# A stand-in for a step script: for its seed it writes one loss run to -J, then, as asked, starts a child (a rank)
# that records its pid, writes a second run, sleeps, or fails.
FAKE = textwrap.dedent("""
    import argparse, json, os, subprocess, sys, time
    p = argparse.ArgumentParser()
    p.add_argument("--loss-seeds", type=int, required=True)
    p.add_argument("-J", required=True)
    p.add_argument("--sleep", type=float, default=0)
    p.add_argument("--fail-seed", type=int, default=-1)
    p.add_argument("--child-pids", default="")
    p.add_argument("--specs", default="exact,zpccl")
    a = p.parse_args()
    ref, run = a.specs.split(",")
    exact = 2.0 + a.loss_seeds / 100
    valid = {ref: exact, run: exact * (1 + (a.loss_seeds + 1) / 1000)}  # a gap of 0.1 * (seed + 1) percent
    def write(specs):
        with open(a.J, "w") as f:
            json.dump({"losses": [{"spec": s, "seed": a.loss_seeds, "valid": valid[s]} for s in specs]}, f)
    write([ref])
    if a.child_pids:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        with open(f"{a.child_pids}.{a.loss_seeds}", "w") as f:
            f.write(str(child.pid))
    time.sleep(a.sleep)
    if a.loss_seeds == a.fail_seed:
        sys.exit(3)
    write([ref, run])
""")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A child killed but not yet reaped by its (killed) parent's reaper is a zombie: gone for our purpose.
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


class LossJobs(unittest.TestCase):
    def setUp(self) -> None:
        self.lj = load_script("tools/loss_jobs.py")
        self.tmp = tempfile.TemporaryDirectory()
        self.root = pathlib.Path(self.tmp.name)
        self.fake = self.root / "fake_step.py"
        self.fake.write_text(FAKE)
        self.out = self.root / "out"

    def tearDown(self) -> None:
        self.tmp.cleanup()

    def main(self, *argv: str) -> tuple[int, list[str]]:
        """The exit status, and the report's lines: one a seed and the count of seeds done (the gap table's lines
        are in self.table)."""
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            rc = self.lj.main(["--out", str(self.out), "--name", "t", "--stagger", "0", *argv])
        lines = text.getvalue().splitlines()
        self.table = [line for line in lines if line.startswith("|")]
        self.gaps_said = next((line for line in lines if line.startswith("no ")), "")
        self.said = [line for line in lines if line.startswith("loss_jobs: seed") and " not started: " in line]
        return rc, [line for line in lines if line.startswith("seed ") or line.endswith(" seeds done")]

    def row(self, config: str) -> list[str]:
        """The gap table's cells of the row labelled ``config``."""
        line = next(line for line in self.table if line.startswith(f"| {config} "))
        return [c.strip() for c in line.split("|")[1:-1]]

    def test_seeds_and_arguments(self) -> None:
        self.assertEqual(self.lj.parse_seeds("0,2,5-7"), [0, 2, 5, 6, 7])
        self.assertEqual(self.lj.parse_seeds("3-3"), [3])
        for bad in ("1,1", "2-1", "a", "1-", "", "0,3-5,4"):
            with self.subTest(bad=bad), self.assertRaises(ValueError):
                self.lj.parse_seeds(bad)
        base = ["--seeds", "0", "--out", "o", "--name", "n"]
        for bad in ([], ["--", "s.py", "--loss-seeds", "1"], ["--", "s.py", "-J", "x.json"], ["--jobs", "0", "--", "s"],
                    ["--timeout", "-1", "--", "s"], ["--timeout", "9", "--deadline", "8", "--", "s"]):
            with self.subTest(bad=bad), contextlib.redirect_stderr(io.StringIO()), self.assertRaises(SystemExit):
                self.lj.parse_args(base + bad)
        with contextlib.redirect_stderr(io.StringIO()), self.assertRaises(SystemExit):
            self.lj.parse_args(["--seeds", "0", "--out", "o", "--name", "a/b", "--", "s"])
        args = self.lj.parse_args(base + ["--", "s.py", "--nproc", "2"])
        self.assertEqual((args.command, args.seed_list), (["s.py", "--nproc", "2"], [0]))
        # A folder holding a file of one of these jobs (an earlier call's) is refused: its runs would be counted.
        self.out.mkdir()
        (self.out / "t-seed3.json").write_text("{}")
        args = ["--seeds", "2-4", "--out", str(self.out), "--name", "t", "--", "s"]
        err = io.StringIO()
        with contextlib.redirect_stderr(err), self.assertRaises(SystemExit):
            self.lj.parse_args(args)
        self.assertIn("already holds t-seed3.json", err.getvalue())
        self.lj.parse_args(args[:-3] + ["u", "--", "s"])  # another name

    def test_every_seed_a_job_of_its_own(self) -> None:
        rc, lines = self.main("--seeds", "0-2", "--jobs", "2", "--pack", str(self.root / "r.tgz"), "--",
                              str(self.fake), "--fail-seed", "1")
        self.assertEqual(rc, 1)  # one seed failed
        self.assertEqual(lines, [
            f"seed 0: done, {lines[0].split(', ')[1]}, exact@0, zpccl@0",
            f"seed 1: failed (exit status 3), {lines[1].split(', ')[1]}, exact@1",  # the runs it finished stay
            f"seed 2: done, {lines[2].split(', ')[1]}, exact@2, zpccl@2",
            "2 of 3 seeds done"])
        # Paired to the first run of each file, over the seeds that have both: 0.1% and 0.3%.
        seeds, mean, _, _, per_seed, _ = self.row("zpccl")[1:]
        self.assertEqual((seeds, mean, per_seed), ("0,2", "+0.20%", "+0.10 / +0.30"))
        for s in range(3):
            doc = json.loads((self.out / f"t-seed{s}.json").read_text())
            self.assertEqual({r["seed"] for r in doc["losses"]}, {s})
            self.assertTrue((self.out / f"t-seed{s}.log").exists())
        with tarfile.open(self.root / "r.tgz") as tar:
            names = sorted(f"t-seed{s}.{e}" for s in range(3) for e in ("json", "log"))
            self.assertEqual(sorted(tar.getnames()), names)

    def test_timeout_stops_the_job_and_its_ranks(self) -> None:
        pids = self.root / "pids"
        t0 = time.monotonic()
        rc, lines = self.main("--seeds", "4", "--timeout", "2", "--", str(self.fake), "--sleep", "60",
                              "--child-pids", str(pids))
        self.assertLess(time.monotonic() - t0, 30)
        self.assertEqual(rc, 1)
        self.assertTrue(lines[0].startswith("seed 4: timed out after 2 s, "), lines)
        self.assertTrue(lines[0].endswith(", exact@4"), lines)
        self.assertEqual(self.table, [])
        self.assertEqual(self.gaps_said, "no run shares a seed with 'exact': no gaps")
        child = int((self.root / "pids.4").read_text())
        for _ in range(50):  # the group was killed; its reaping may lag a moment
            if not alive(child):
                break
            time.sleep(0.1)
        self.assertFalse(alive(child), "the job's child process outlived it")

    def test_deadline_stops_what_runs_and_starts_nothing_more(self) -> None:
        rc, lines = self.main("--seeds", "0-2", "--jobs", "1", "--deadline", "2", "--", str(self.fake), "--sleep",
                              "60")
        self.assertEqual(rc, 1)
        self.assertTrue(lines[0].startswith("seed 0: stopped at the deadline, "), lines)
        self.assertEqual(lines[1:], ["seed 1: not started, -, no loss run in t-seed1.json",
                                     "seed 2: not started, -, no loss run in t-seed2.json", "0 of 3 seeds done"])
        self.assertEqual(self.said, ["loss_jobs: seeds 1, 2 not started: the --deadline (2 s) came first"])

    def test_a_job_starts_only_where_its_timeout_ends_before_the_deadline(self) -> None:
        rc, lines = self.main("--seeds", "0-1", "--jobs", "1", "--timeout", "3", "--deadline", "5", "--",
                              str(self.fake), "--sleep", "60")
        self.assertEqual(rc, 1)
        self.assertTrue(lines[0].startswith("seed 0: timed out after 3 s, "), lines)
        self.assertEqual(lines[1:], ["seed 1: not started, -, no loss run in t-seed1.json", "0 of 2 seeds done"])

    def test_the_first_wave_starts_whatever_its_stagger(self) -> None:
        """A timeout as long as the deadline allows still starts every job of the first wave: its stagger keeps the
        ranks' starts apart, it does not cost a seed (the third job's 2 s + 4 s ends past the 5 s deadline)."""
        rc, lines = self.main("--seeds", "0-3", "--jobs", "3", "--stagger", "1", "--timeout", "4", "--deadline", "5",
                              "--", str(self.fake), "--sleep", "2.5")
        self.assertEqual([line.split(",")[0] for line in lines[:3]], [f"seed {s}: done" for s in range(3)], lines)
        self.assertEqual(lines[3:], ["seed 3: not started, -, no loss run in t-seed3.json", "3 of 4 seeds done"])
        self.assertEqual(rc, 1)
        self.assertEqual(len(self.said), 1, lines)
        self.assertRegex(self.said[0], r"^loss_jobs: seed 3 not started: a job's --timeout \(4 s\) no longer fits in "
                                       r"the [23] s left before --deadline$")

    def test_gaps_pooled_with_a_campaigns_files(self) -> None:
        # The campaign's six seeds from perf/results and two new ones, against its reference (nccl), with its label
        # and tolerance.
        ls = self.lj.ls
        campaign = ls.campaign("ddp-small-cpu-int8")
        (before,) = ls.campaign_rows(campaign)
        rc, lines = self.main("--seeds", "100-101", "--jobs", "2", "--campaign", campaign.name, "--",
                              str(self.fake), "--specs", "nccl,zpccl")
        self.assertEqual((rc, lines[-1]), (0, "2 of 2 seeds done"))
        label, tolerance = campaign.configs["zpccl"]
        cells = self.row(label)
        self.assertEqual(cells[1], ",".join(str(s) for s in before.stats.seeds + [100, 101]))
        gaps = {**before.stats.gaps, 100: 10.1, 101: 10.2}
        self.assertEqual(cells[2], f"{ls.gap_stats(gaps).mean:+.2f}%")
        self.assertEqual(cells[-1], ls.verdict(ls.gap_stats(gaps), tolerance))
        with contextlib.redirect_stderr(io.StringIO()), self.assertRaises(SystemExit):
            self.lj.parse_args(["--seeds", "0", "--out", "o", "--name", "n", "--campaign", "nope", "--", "s"])

    def test_a_real_step_script(self) -> None:
        # What the tool appends (--loss-seeds S -J FILE) is what the step scripts take: two seeds of DDP's step on
        # the CPU, side by side, each file holding its own seed's runs.
        torch_for_procs()
        rc, lines = self.main("--seeds", "5,6", "--jobs", "2", "--timeout", "300", "--",
                              str(SOURCE_TREE / "perf/ddp_step.py"), "--cpu", "--nproc", "2", "--layers", "1",
                              "--d-model", "32", "--heads", "2", "--seq", "16", "--batch", "2", "--loss-only",
                              "--loss-steps", "3", "--loss-runs", "nccl,zpccl", "--block-size", "32")
        self.assertEqual(rc, 0, (lines, [(self.out / f"t-seed{s}.log").read_text()[-2000:] for s in (5, 6)]))
        for s in (5, 6):
            doc = json.loads((self.out / f"t-seed{s}.json").read_text())
            self.assertEqual(doc["loss_seeds"], [s])
            self.assertEqual([(r["spec"], r["seed"]) for r in doc["losses"]], [("nccl", s), ("zpccl", s)])
            self.assertTrue(all(r["valid"] > 0 for r in doc["losses"]))
        self.assertEqual(lines[-1], "2 of 2 seeds done")
        self.assertEqual(self.row("zpccl")[1], "5,6")  # paired to nccl, the first run


if __name__ == "__main__":
    unittest.main()
