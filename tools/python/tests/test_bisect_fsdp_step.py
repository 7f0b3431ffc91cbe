"""tools/bisect-fsdp-step.sh and its summary (tools/bisect_fsdp_step.py), without a GPU: --prepare on this tree's
history, the arguments refused, --run refused where no GPU is visible, --run --dry-run on fake prepared trees
(which flags each script gets, which library each entry uses), and the summary of old-format (rank 0's median)
and new-format (every rank's steps) fsdp_step files."""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import unittest
from typing import Any

from . import SOURCE_TREE

SCRIPT = SOURCE_TREE / "tools" / "bisect_fsdp_step.py"
SHELL = SOURCE_TREE / "tools" / "bisect-fsdp-step.sh"


def load_script() -> Any:
    if "bisect_fsdp_step" in sys.modules:
        return sys.modules["bisect_fsdp_step"]
    if not SCRIPT.exists():
        raise unittest.SkipTest(f"{SCRIPT} not found")
    spec = importlib.util.spec_from_file_location("bisect_fsdp_step", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bisect_fsdp_step"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def shell(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SHELL), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def manifest_line(label: str, script: str, zpccl: str, key: str, names: str, subject: str) -> str:
    return "\t".join([label, script, zpccl, key, names, subject])


def old_row(config: str, median: float) -> dict[str, Any]:
    return {"config": config, "median_ms": median, "min_ms": median - 1, "max_ms": median + 1, "steps": 6}


def new_row(config: str, rank0: list[float], rank1: list[float]) -> dict[str, Any]:
    steps = [max(a, b) for a, b in zip(rank0, rank1)]
    return {"config": config, "median_ms": sorted(steps)[len(steps) // 2], "step_ms": [steps],
            "step_ms_per_rank": [[rank0, rank1]], "round_median_ms": [sorted(steps)[len(steps) // 2]]}


class Summary(unittest.TestCase):
    def setUp(self) -> None:
        self.mod = load_script()
        self.tmp = pathlib.Path(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, self.tmp)
        self.manifest = self.tmp / "manifest.tsv"
        self.manifest.write_text("# header\n" + "\n".join([
            manifest_line("aaaaaaaaa", "a" * 40, "a" * 40, "k1", "0731899", "old"),
            manifest_line("bbbbbbbbb", "b" * 40, "b" * 40, "k2", "HEAD,b6e1f2a", "new"),
            manifest_line("aaaaaaaaa+bbbbbbbbb", "a" * 40, "b" * 40, "k2", "0731899+b6e1f2a", "cross"),
            manifest_line("ccccccccc", "c" * 40, "c" * 40, "k3", "cb3bab9", "never ran")]) + "\n")
        self.results = self.tmp / "results"
        self.results.mkdir()

    def write(self, name: str, rows: list[dict[str, Any]] | None) -> None:
        (self.results / f"{name}.log").write_text("log\n")
        if rows is not None:
            (self.results / f"{name}.json").write_text(json.dumps({"rows": rows}))

    def test_old_and_new_files_give_medians_of_runs_and_rank_0_where_recorded(self) -> None:
        self.write("aaaaaaaaa.r1", [old_row("nccl-noreshard", 80.0), old_row("zpccl-hpz", 46.0)])
        self.write("aaaaaaaaa.r2", [old_row("nccl-noreshard", 84.0), old_row("zpccl-hpz", 48.0)])
        self.write("aaaaaaaaa.r3", [old_row("nccl-noreshard", 82.0), old_row("zpccl-hpz", 50.0)])
        self.write("bbbbbbbbb.r1", [new_row("nccl-noreshard", [80, 81, 82], [81, 80, 83]),
                                    new_row("zpccl-hpz", [55, 57, 60], [58, 59, 61])])
        self.write("aaaaaaaaa+bbbbbbbbb.r1", None)  # a run cut before its JSON
        self.write("aaaaaaaaa+bbbbbbbbb.r2", [old_row("nccl-noreshard", 80.0)])  # zpccl's row missing
        entries = self.mod.read_manifest(self.manifest)
        self.assertEqual([e.label for e in entries], ["aaaaaaaaa", "bbbbbbbbb", "aaaaaaaaa+bbbbbbbbb", "ccccccccc"])
        self.assertEqual(entries[1].names, ["HEAD", "b6e1f2a"])
        rows = {r["label"]: r for r in self.mod.summary_rows(entries, self.mod.collect(entries, self.results))}
        old, new, cross, never = (rows[k] for k in ("aaaaaaaaa", "bbbbbbbbb", "aaaaaaaaa+bbbbbbbbb", "ccccccccc"))
        self.assertEqual((old["runs"], old["zpccl_ms"], old["nccl_ms"], old["zpccl_rank0_ms"]), (3, 48.0, 82.0, None))
        self.assertAlmostEqual(old["ratio"], 82.0 / 48.0)
        self.assertEqual(old["timing"], ["rank 0"])
        # New files: the median of each step's slowest rank (58, 59, 61), and rank 0's own (55, 57, 60).
        self.assertEqual((new["zpccl_ms"], new["zpccl_rank0_ms"], new["nccl_ms"]), (59, 57, 81))
        self.assertEqual(new["timing"], ["slowest rank"])
        self.assertEqual((new["zpccl_by_round_ms"], old["zpccl_by_round_ms"]), ([59], []))
        self.assertEqual((cross["runs"], sorted(cross["failed"])),
                         (0, ["aaaaaaaaa+bbbbbbbbb.r1.log", "aaaaaaaaa+bbbbbbbbb.r2.json"]))
        self.assertIsNone(cross["ratio"])
        self.assertEqual((never["runs"], never["failed"]), (0, []))
        table = self.mod.render(list(rows.values()))
        self.assertIn("48.0", table)
        self.assertIn("1.71x", table)
        self.assertIn("2 failed", table)
        self.assertIn("no run", table)
        self.assertIn("slowest rank, rounds 59", table)

    def test_rounds_are_medians_over_runs_round_by_round(self) -> None:
        self.assertEqual(self.mod.by_round([[50.0, 60.0, 70.0], [52.0, 58.0], [48.0, 62.0, 66.0]]), [50.0, 60.0])
        self.assertEqual(self.mod.by_round([]), [])

    def test_main_exits_1_without_a_figure_and_refuses_a_bad_manifest(self) -> None:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(self.mod.main([str(self.manifest), str(self.results)]), 1)
        self.write("ccccccccc.r1", [old_row("nccl-noreshard", 80.0), old_row("zpccl-hpz", 40.0)])
        with contextlib.redirect_stdout(out):
            self.assertEqual(self.mod.main([str(self.manifest), str(self.results), "--json",
                                            str(self.tmp / "s.json")]), 0)
        self.assertEqual(json.loads((self.tmp / "s.json").read_text())[3]["ratio"], 2.0)
        bad = self.tmp / "bad.tsv"
        bad.write_text("label\tonly two\n")
        with self.assertRaisesRegex(ValueError, "bad.tsv:1: 2 tab-separated fields, not 6"):
            self.mod.read_manifest(bad)

    def test_results_file_keeps_every_run_and_the_calls_provenance(self) -> None:
        def provenance(commit: str, when: str) -> dict[str, Any]:
            return {"commit": commit, "dirty": False, "command": "python3 perf/fsdp_step.py", "time_utc": when,
                    "regime": "net-on1gpu", "gpu": {"count": 1, "models": ["GPU " + when]}}

        rows = [new_row("nccl-noreshard", [80, 81, 82], [81, 80, 83]), new_row("zpccl-hpz", [55, 57, 60], [58, 59, 61])]
        for row in rows:
            row["steps"] = 6
            row["round_median_ms"] = [59.0, 58.0]  # two rounds of three timed steps
        self.write("aaaaaaaaa.r1", [old_row("nccl-noreshard", 80.0), old_row("zpccl-hpz", 46.0)])
        for name, when in (("bbbbbbbbb.r1", "2026-01-02T00:00:00"), ("bbbbbbbbb.r2", "2026-01-01T00:00:00")):
            (self.results / f"{name}.log").write_text("log\n")
            (self.results / f"{name}.json").write_text(json.dumps({"provenance": provenance("b" * 40, when),
                                                                   "rows": rows}))
        target = self.tmp / "bisect.json"
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), self.assertRaises(SystemExit):
            self.mod.main([str(self.manifest), str(self.results), "--results-file", str(target)])
        self.assertIn("--results-file needs --commit", out.getvalue())
        self.assertFalse(target.exists())
        with contextlib.redirect_stdout(out):
            self.assertEqual(self.mod.main([str(self.manifest), str(self.results), "--results-file", str(target),
                                            "--commit", "f" * 40, "--command", "bash tools/bisect-fsdp-step.sh"]), 0)
        doc = json.loads(target.read_text())
        # The call's provenance: the tool's tree and command over the newest run's machine facts.
        call = doc["provenance"]
        self.assertEqual((call["commit"], call["command"], call["gpu"]["models"]),
                         ("f" * 40, "bash tools/bisect-fsdp-step.sh", ["GPU 2026-01-02T00:00:00"]))
        self.assertEqual(doc["regime"], "net-on1gpu")
        self.assertEqual(sorted(doc["runs"]), ["aaaaaaaaa.r1", "bbbbbbbbb.r1", "bbbbbbbbb.r2"])
        self.assertEqual(doc["runs"]["bbbbbbbbb.r2"]["provenance"]["time_utc"], "2026-01-01T00:00:00")
        self.assertIn("2 rounds of 3 timed steps", doc["what"])
        self.assertEqual([r["label"] for r in doc["summary"]][:2], ["aaaaaaaaa", "bbbbbbbbb"])
        self.assertEqual(doc["summary"][1]["runs"], 2)
        # Runs that recorded no provenance leave the call's machine unknown: refused, not guessed.
        for name in ("bbbbbbbbb.r1", "bbbbbbbbb.r2"):
            (self.results / f"{name}.json").write_text(json.dumps({"rows": rows}))
        with self.assertRaisesRegex(ValueError, "records provenance"):
            self.mod.main([str(self.manifest), str(self.results), "--results-file", str(target),
                           "--commit", "f" * 40, "--command", "x"])


class Shell(unittest.TestCase):
    def setUp(self) -> None:
        if not SHELL.exists():
            raise unittest.SkipTest(f"{SHELL} not found")
        self.tmp = pathlib.Path(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, self.tmp)

    def test_arguments_are_refused_with_what_to_give(self) -> None:
        for args, says in ((["--bogus"], "unknown argument '--bogus'"), (["--prepare"], "--prepare needs a folder"),
                           (["--run"], "--run needs the folder --prepare made"),
                           (["--run", str(self.tmp)], "no " + str(self.tmp / "manifest.tsv")),
                           (["--summary", str(self.tmp)], "--summary takes the prepared folder and a results")):
            with self.subTest(args=args):
                run = shell(*args)
                self.assertEqual(run.returncode, 2, run.stderr)
                self.assertIn(says, run.stderr)

    def fake_prepared(self) -> pathlib.Path:
        """A prepared folder of two fake trees: an old script without --rounds (and with --loss-steps only), and
        a new one with every flag; the second and third entries share a library key."""
        prepared = self.tmp / "prep"
        prepared.mkdir()
        old_help = ("p.add_argument('--shape'); p.add_argument('--nproc'); p.add_argument('--nodes'); "
                    "p.add_argument('--configs'); p.add_argument('-J', '--json'); p.add_argument('--loss-steps'); "
                    "p.add_argument('--warmup')")
        new_help = old_help + "; p.add_argument('--rounds'); p.add_argument('--steps')"
        # Each script writes its JSON as fsdp_step.py of its age does: the old one rank 0's medians, the new one
        # every rank's steps; zpccl's step takes what ZP_FAKE_MS names for the library it was given.
        write = ("import json, os\n"
                 "ms = json.loads(os.environ['ZP_FAKE_MS'])[os.path.basename(os.path.dirname(os.path.dirname("
                 "os.environ['ZPCCL_LIBRARY'])))]\n"
                 "rows = [dict(config='nccl-noreshard', median_ms=82.0), dict(config='zpccl-hpz', median_ms=ms)]\n"
                 "if NEW:\n"
                 "    for r in rows:\n"
                 "        m = r['median_ms']\n"
                 "        r.update(step_ms=[[m, m]], step_ms_per_rank=[[[m - 1, m - 1], [m, m]]])\n"
                 "json.dump(dict(rows=rows), open(a.json, 'w'))\n"
                 "print('%15s %7s %10.1f' % ('zpccl-hpz', False, ms))\n")
        for commit, flags, new in (("1" * 40, old_help, False), ("2" * 40, new_help, True)):
            tree = self.tmp / commit[:4]
            (tree / "perf").mkdir(parents=True)
            (tree / "meson.build").write_text("project('fake')\n")
            (tree / "perf" / "fsdp_step.py").write_text(f"import argparse\np = argparse.ArgumentParser()\n{flags}\n"
                                                        f"a = p.parse_args()\nNEW = {new}\n{write}")
            with tarfile.open(prepared / f"src-{commit}.tar.gz", "w:gz") as tar:
                tar.add(tree, arcname=".")
        (prepared / "manifest.tsv").write_text("\n".join([
            "# header",
            manifest_line("111111111", "1" * 40, "1" * 40, "k1", "0731899", "old"),
            manifest_line("222222222", "2" * 40, "2" * 40, "k2", "HEAD", "new"),
            manifest_line("111111111+222222222", "1" * 40, "2" * 40, "k2", "0731899+HEAD", "cross")]) + "\n")
        (prepared / "run-default").write_text("111111111\n222222222\n111111111+222222222\n")
        return prepared

    def test_run_refuses_without_a_gpu_and_dry_run_shows_builds_and_calls(self) -> None:
        prepared = self.fake_prepared()
        env = {"ZP_BISECT_WORK": str(self.tmp / "work"), "ZP_BISECT_PYTHON": sys.executable,
               "PATH": str(self.tmp / "nobin") + os.pathsep + os.environ.get("PATH", "")}
        (self.tmp / "nobin").mkdir()
        fake_smi = self.tmp / "nobin" / "nvidia-smi"  # a machine whose nvidia-smi lists no GPU
        fake_smi.write_text("#!/bin/sh\nexit 9\n")
        fake_smi.chmod(0o755)
        run = shell("--run", str(prepared), env=env)
        self.assertEqual(run.returncode, 2, run.stdout + run.stderr)
        self.assertIn("no GPU visible", run.stderr)
        self.assertFalse((self.tmp / "work" / "results").exists())

        run = shell("--run", str(prepared), "--dry-run", env=env)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        out = run.stdout + run.stderr
        # One build a library key: the cross entry uses HEAD's.
        self.assertEqual(out.count("would build"), 2, out)
        calls = [line for line in out.splitlines() if " run 1: " in line]
        self.assertEqual(len(calls), 3, out)
        old, new, cross = calls
        self.assertIn("--shape small --nproc 2 --nodes 2 --configs nccl-noreshard,zpccl-hpz -J", old)
        self.assertNotIn("--rounds", old)  # the old script has no --rounds
        self.assertNotIn("--steps", old)  # nor --steps: its --loss-steps does not count
        self.assertIn("--warmup 3", old)
        self.assertIn("(111111111's fsdp_step.py has no --rounds: left out)", out)
        self.assertIn("--rounds 3 --steps 6 --warmup 3", new)
        self.assertIn("tree-111111111111 && ZPCCL_LIBRARY=" + str(self.tmp / "work" / "tree-222222222222"), cross)
        self.assertIn("PYTHONPATH=" + str(self.tmp / "work" / "tree-222222222222" / "tools" / "python"), cross)
        self.assertIn("NCCL_DEBUG=VERSION", cross)

        named = shell("--run", str(prepared), "--dry-run", "HEAD", env=env)
        self.assertEqual(named.returncode, 0, named.stderr)
        self.assertEqual(named.stdout.count(" run 1: "), 1)
        self.assertIn("222222222 run 1", named.stdout)
        missing = shell("--run", str(prepared), "--dry-run", "cb3bab9", env=env)
        self.assertEqual(missing.returncode, 2)
        self.assertIn("entry 'cb3bab9' is not in", missing.stderr)
        bad_knob = shell("--run", str(prepared), "--dry-run", env={**env, "ZP_BISECT_ROUNDS": "five"})
        self.assertEqual(bad_knob.returncode, 2)
        self.assertIn("knob value 'five'", bad_knob.stderr)

    def test_run_on_a_fake_gpu_machine_builds_alternates_and_summarizes(self) -> None:
        """The whole --run with stand-ins for nvidia-smi, Meson and Ninja, and the fake trees' scripts."""
        prepared = self.fake_prepared()
        bin_dir = self.tmp / "bin"
        bin_dir.mkdir()
        stand_ins = {
            "nvidia-smi": "echo 'GPU 0: NVIDIA H200 (UUID: GPU-0)'",
            "meson": 'mkdir -p "$2" && echo "$@" > "$2/setup-args" && touch "$2/build.ninja"',
            # -t targets: the library's target; a build: the named file, the call's arguments beside it.
            "ninja": 'dir=$2; shift 2; if [ "$1" = -t ]; then echo "libzpccl.so.0.2.0: cpp_LINKER"; '
                     'echo "libzpccl.so.0.2.0.p/x.symbols: SHSYM"; else echo "$@" > "$dir/ninja-args"; '
                     'touch "$dir/${3:-all}"; fi',
        }
        for name, body in stand_ins.items():
            (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
            (bin_dir / name).chmod(0o755)
        out = self.tmp / "out"
        env = {"ZP_BISECT_WORK": str(self.tmp / "work"), "ZP_BISECT_PYTHON": sys.executable,
               "PATH": str(bin_dir) + os.pathsep + os.environ.get("PATH", ""), "ZP_BISECT_MAX_PASSES": "2",
               "ZP_FAKE_MS": json.dumps({"tree-111111111111": 47.0, "tree-222222222222": 58.0}), "OUT": str(out)}
        run = shell("--run", str(prepared), env=env)
        log = run.stdout + run.stderr
        self.assertEqual(run.returncode, 0, log)
        work = self.tmp / "work"
        for tree in ("tree-111111111111", "tree-222222222222"):
            build = work / tree / "build-bisect"
            self.assertIn("-Dgpu_archs=90 --buildtype=release -Dtests=false -Dperf=false",
                          (build / "setup-args").read_text())
            self.assertIn("libzpccl.so.0.2.0", (build / "ninja-args").read_text())
        results = work / "results"
        runs = sorted(p.name for p in results.glob("*.json") if p.name != "summary.json")
        self.assertEqual(runs, ["111111111+222222222.r1.json", "111111111+222222222.r2.json", "111111111.r1.json",
                                "111111111.r2.json", "222222222.r1.json", "222222222.r2.json"])
        # Pass 2 runs the entries backward: the cross entry first.
        order = [line.split(", ")[1].split(" run")[0] for line in log.splitlines() if line.startswith("[")
                 and "] pass " in line]
        self.assertEqual(order, ["111111111", "222222222", "111111111+222222222"] * 1
                         + ["111111111+222222222", "222222222", "111111111"], log)
        summary = json.loads((results / "summary.json").read_text())
        got = {r["label"]: (r["runs"], r["zpccl_ms"], r["nccl_ms"], r["zpccl_rank0_ms"]) for r in summary}
        self.assertEqual(got, {"111111111": (2, 47.0, 82.0, None), "222222222": (2, 58.0, 82.0, 57.0),
                               "111111111+222222222": (2, 58.0, 82.0, None)})
        self.assertEqual(sorted(p.name for p in out.iterdir()), ["bisect.tar.gz", "bisect.txt"])
        self.assertIn("1.41x", (out / "bisect.txt").read_text())
        with tarfile.open(out / "bisect.tar.gz") as tar:
            self.assertIn("./111111111.r2.log", tar.getnames())

        # A second call on the warm machine builds nothing again.
        again = shell("--run", str(prepared), "0731899", env={**env, "ZP_BISECT_MAX_PASSES": "1"})
        self.assertEqual(again.returncode, 0, again.stdout + again.stderr)
        self.assertIn("library 111111111: built before", again.stdout)

    def test_prepare_archives_the_history_and_folds_equal_states(self) -> None:
        if shutil.which("git") is None or subprocess.run(["git", "-C", str(SOURCE_TREE), "cat-file", "-e",
                                                          "0731899^{commit}"], capture_output=True).returncode:
            raise unittest.SkipTest("this tree has no git history holding 0731899")
        prepared = self.tmp / "prep"
        # dc8858a^ has 4b882fb's library, package and script (only tests and results change between them), and
        # 0731899's fsdp_step is dc8858a's; 35f8470's is another.
        run = shell("--prepare", str(prepared), "4b882fb", "dc8858a^", "dc8858a", "0731899+dc8858a",
                    "35f8470+dc8858a")
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn("dc8858a^: the same library, package and script as 4b882fb62", run.stdout)
        self.assertIn("0731899+dc8858a: the same library, package and script as dc8858ad9", run.stdout)
        lines = [line.split("\t") for line in (prepared / "manifest.tsv").read_text().splitlines()
                 if not line.startswith("#")]
        self.assertEqual([line[0] for line in lines], ["4b882fb62", "dc8858ad9", "35f8470d8+dc8858ad9"])
        self.assertEqual(lines[0][4], "4b882fb,dc8858a^")
        self.assertEqual(lines[1][4], "dc8858a,0731899+dc8858a")
        self.assertEqual(lines[1][3], lines[2][3])  # one library for dc8858a and the cross entry
        self.assertNotEqual(lines[0][1], lines[2][1])
        self.assertEqual((prepared / "run-default").read_text().split(), [line[0] for line in lines])
        for commit in {line[1] for line in lines} | {line[2] for line in lines}:
            with tarfile.open(prepared / f"src-{commit}.tar.gz") as tar:
                names = tar.getnames()
            self.assertIn("perf/fsdp_step.py", names)
            self.assertIn("tools/python/zpccl/fsdp.py", names)
            self.assertFalse([n for n in names if n.startswith("perf/results/")], commit)
        again = shell("--prepare", str(self.tmp / "p2"), "0731899+a+b")
        self.assertEqual(again.returncode, 2)
        self.assertIn("SCRIPT+ZPCCL takes two commits", again.stderr)


if __name__ == "__main__":
    unittest.main()
