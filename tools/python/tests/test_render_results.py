"""tools/render_results.py: perf/RESULTS.md's tables rendered from result files, each row naming its file and
commit, the prose left alone, and --check failing (with a diff) when a document differs from what the files give.
Runs on fake result folders written here, and checks that the project's own documents are up to date."""
from __future__ import annotations

import contextlib
import io
import json
import pathlib
import tempfile
import unittest
from typing import Any

from . import SOURCE_TREE, load_script

COMMIT = "0123456789abcdef0123456789abcdef01234567"
LEGACY = "fedcba9876543210fedcba9876543210fedcba98"


def perf_row(op: str, bits: int, regime: str, size: int, speedup: float, nccl_us: float) -> dict[str, Any]:
    return {"op": op, "regime": regime, "size": size, "bits": bits, "block": 256, "nodes": 2,
            "oop": {"time_us": nccl_us / speedup, "wrong": 0}, "baseline": "nccl", "nccl": {"time_us": nccl_us},
            "speedup": speedup}


class Folder:
    """A results folder: a file with provenance, a bare array named by the legacy manifest, loss runs."""

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        rows = [perf_row("qwz_all_gather", 8, "shm", 64 << 20, 2.05, 1350.0),
                perf_row("qwz_all_gather", 8, "shm", 256 << 20, 1.85, 5350.0),
                perf_row("qwz_all_gather", 4, "shm", 64 << 20, 3.60, 1350.0),
                perf_row("qwz_all_gather", 4, "shm", 256 << 20, 3.40, 5350.0)]
        self.write("new.json", {"provenance": {"schema": "zpccl-provenance/1", "commit": COMMIT, "dirty": False},
                                "rows": rows})
        self.write("old.json", [perf_row("qwz_all_gather", 8, "shm", 1 << 20, 1.08, 41.8),
                                perf_row("qwz_all_gather", 4, "shm", 1 << 20, 1.60, 41.8)])
        self.write("legacy.json", {"note": "recorded after the fact", "files": {"old.json": {"commit": LEGACY}}})
        self.write("loss-a.json", {"commit": "aaaaaaa", "runs": [
            {"config": "exact", "seed": 0, "valid": 2.0}, {"config": "int4", "seed": 0, "valid": 2.01},
            {"config": "exact", "seed": 1, "valid": 1.9}, {"config": "int4", "seed": 1, "valid": 1.919}]})
        self.write("loss-b.json", {"commit": "bbbbbbb", "runs": [
            {"config": "exact", "seed": 2, "valid": 2.1}, {"config": "int4", "seed": 2, "valid": 2.1042},
            {"config": "int4-b64", "seed": 2, "valid": 2.1042 / 1.002}]})

    def write(self, name: str, data: Any) -> None:
        (self.root / name).write_text(json.dumps(data))


class RenderResults(unittest.TestCase):
    def setUp(self) -> None:
        self.rr = load_script("tools/render_results.py")
        self.tmp = tempfile.TemporaryDirectory()
        self.root = pathlib.Path(self.tmp.name)
        (self.root / "results").mkdir()
        self.folder = Folder(self.root / "results")
        self.store = self.rr.Store(self.root / "results")
        rr = self.rr
        self.tables = {
            "shm": lambda s: rr.collective_table(s, "shm", "qwz_all_gather", ["1M", "64M", "256M"],
                                                 [("new.json", ("64M", "256M")), ("old.json", ("1M",))], ["shm"],
                                                 (8, 4), {8: (1.9, "64M"), 4: (3.5, "64M")}),
            "loss": lambda s: rr.loss_table(s, "loss", self.campaign, [
                rr.LossLine("int4", "int4, nearest", rr.fmt_blocks(4, 256)),
                rr.LossLine("int4-b64", "int4, nearest, against blocks of 256", rr.fmt_blocks(4, 64), "int4")],
                rr.GRAD_COLUMNS, "gradients"),
        }
        self.campaign = rr.ls.Campaign("test", "test", ("loss-a.json", "loss-b.json"), "exact",
                                       {"int4": ("int4", 0.1), "int4-b64": ("int4, 64", 0.1)}, (("int4-b64", "int4"),))

    def tearDown(self) -> None:
        self.tmp.cleanup()

    def render(self, text: str) -> str:
        return self.rr.render(text, self.store, self.tables, "doc")

    def test_cells_marks_and_sources(self) -> None:
        doc = "Prose *stays*.\n<!-- table: shm -->\nstale\n<!-- end table -->\nMore prose.\n"
        out = self.render(doc)
        self.assertTrue(out.startswith("Prose *stays*.\n<!-- table: shm -->\n| "), out)
        self.assertTrue(out.endswith("<!-- end table -->\nMore prose.\n"), out)
        self.assertNotIn("stale", out)
        lines = out.splitlines()
        int8 = next(line for line in lines if line.startswith("| int8 "))
        # 64M: at the target and above int8's wire-bytes limit (1.97x): bold and marked; 256M: below the target.
        self.assertEqual([c.strip() for c in int8.split("|")[1:-1]], ["int8", "1.08", "**2.05†**", "1.85", "a, b"])
        # Letters in the order the table first uses the files: the 1M cell is the older file's.
        int4 = next(line for line in lines if line.startswith("| int4 "))
        self.assertEqual([c.strip() for c in int4.split("|")[1:-1]], ["int4", "1.60", "**3.60**", "3.40", "a, b"])
        nccl = next(line for line in lines if line.startswith("| NCCL bf16, us "))
        self.assertIn("| 41.8 | 1350.0 | 5350.0 |", nccl)
        sources = next(line for line in lines if line.startswith("Sources: "))
        self.assertEqual(sources, f"Sources: a: `old.json`, {LEGACY[:7]} (legacy manifest); b: `new.json`, "
                                  f"{COMMIT[:7]}.")
        self.assertEqual(self.render(out), out)  # rendering is idempotent

    def test_a_commit_main_does_not_hold_names_the_commit_that_holds_its_code(self) -> None:
        new = json.loads((self.root / "results" / "new.json").read_text())
        new["provenance"]["code_commit"] = "abcdef1" + "0" * 33
        self.folder.write("new.json", new)
        out = self.rr.render("<!-- table: shm -->\n<!-- end table -->\n", self.rr.Store(self.root / "results"),
                             self.tables)
        sources = next(line for line in out.splitlines() if line.startswith("Sources: "))
        self.assertEqual(sources, f"Sources: a: `old.json`, {LEGACY[:7]} (legacy manifest); b: `new.json`, "
                                  f"{COMMIT[:7]} (not on main; its code is abcdef1's).")

    def test_loss_gaps_paired_by_seed_across_files(self) -> None:
        out = self.render("<!-- table: loss -->\n<!-- end table -->\n")
        lines = out.splitlines()
        self.assertEqual(lines[1], "| gradients | blocks | bytes vs bf16 | seeds | gap: mean | standard error | "
                                   "95% interval | per seed, % | the interval supports | src |")
        row = next(line for line in lines if line.startswith("| int4, nearest | "))
        cells = [c.strip() for c in row.split("|")[1:-1]]
        # gaps +0.50, +1.00, +0.20 %: mean +0.567, standard error 0.233, t(2) = 4.303.
        self.assertEqual(cells[:5], ["int4, nearest", "256", "3.88x", "0,1,2", "+0.57%"])
        self.assertEqual(cells[5], "0.23")
        self.assertEqual(cells[6], "-0.44 .. +1.57%")
        self.assertEqual(cells[7], "+0.50 / +1.00 / +0.20")
        self.assertEqual(cells[8:], ["cannot tell at 0.1%", "a, b"])
        # The contrast: int4-b64 against int4 of the seed both ran (loss-b.json: int4-b64 0.2% below int4).
        contrast = next(line for line in lines if line.startswith("| int4, nearest, against blocks of 256 | "))
        self.assertEqual([c.strip() for c in contrast.split("|")[1:-1]][1:], [
            "64", "3.56x", "2", "-0.20%", "-", "-", "-0.20", "one seed: no interval", "b"])
        self.assertIn("aaaaaaa (recorded in the file)", out)
        # An exact run that differs between two files breaks the pairing: refused, naming both.
        self.folder.write("loss-b.json", {"commit": "bbbbbbb", "runs": [
            {"config": "exact", "seed": 0, "valid": 2.5}, {"config": "int4", "seed": 2, "valid": 2.1},
            {"config": "int4-b64", "seed": 2, "valid": 2.0958}]})
        with self.assertRaisesRegex(self.rr.RenderError, "table loss: exact seed 0: .* in loss-a.json but .* in "
                                                         "loss-b.json"):
            self.rr.render("<!-- table: loss -->\n<!-- end table -->\n", self.rr.Store(self.root / "results"),
                           self.tables)
        # A run whose seed has no exact run to pair with is refused, not left out.
        self.folder.write("loss-b.json", {"commit": "bbbbbbb", "runs": [
            {"config": "int4", "seed": 2, "valid": 2.1}, {"config": "int4-b64", "seed": 2, "valid": 2.0958}]})
        with self.assertRaisesRegex(self.rr.RenderError, r"table loss: int4 seeds \[2\] have no exact run"):
            self.rr.render("<!-- table: loss -->\n<!-- end table -->\n", self.rr.Store(self.root / "results"),
                           self.tables)

    def test_step_rows_with_their_calls(self) -> None:
        def row(config: str, ms: float, calls: dict[str, int] | None) -> dict[str, Any]:
            r = {"config": config, "median_ms": ms, "min_ms": ms - 1, "max_ms": ms + 1, "tokens_per_s": 1e6 / ms,
                 "peak_mib": 100.0, "sent_mib": {"deepspeed all_gather": 54.6}}
            if calls is not None:
                r["calls_per_step"] = calls
            return r

        self.folder.write("step.json", {"provenance": {"schema": "zpccl-provenance/1", "commit": COMMIT,
                                                       "dirty": False}, "rows": [
            row("deepspeed", 300.0, {"deepspeed all_gather": 70, "deepspeed all_reduce": 1}),
            row("no-comm", 100.0, {"deepspeed all_reduce": 1, "local_all_gather": 3, "local_persistent_gather": 1}),
            row("bare", 200.0, None)]})
        self.tables["step"] = lambda s: self.rr.step_table(s, "step", "step.json", [
            ("deepspeed", "ZeRO-3"), ("no-comm", "floor")], ["deepspeed"], calls=True)
        lines = self.render("<!-- table: step -->\n<!-- end table -->\n").splitlines()
        self.assertIn("| configuration | step ms (median, range) | tokens/s | peak MiB / rank | sent MiB / step / rank "
                      "| calls / step | vs deepspeed | src |", lines)
        cells = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]] for line in lines
                 if line.startswith("| ZeRO-3") or line.startswith("| floor")}
        self.assertEqual(cells["ZeRO-3"][5], "71")
        self.assertEqual(cells["floor"][5], "1")  # local calls exchange nothing
        self.assertEqual(cells["floor"][6], "3.00x")
        self.tables["bare"] = lambda s: self.rr.step_table(s, "bare", "step.json", [("bare", "bare")], [], calls=True)
        with self.assertRaisesRegex(self.rr.RenderError, "'bare' has no calls_per_step"):
            self.render("<!-- table: bare -->\n<!-- end table -->\n")

    def test_a_traces_summary_per_configuration_and_rank(self) -> None:
        def rank(compute: float, nccl: float, exposed: float) -> dict[str, Any]:
            return {"kernel_ms": {"compute": compute, "nccl": nccl, "zpccl": 0.25, "memory": 0.04},
                    "kernels": {"compute": 120.0, "nccl": 6.0, "zpccl": 12.0, "memory": 3.0},
                    "busy_ms": compute + nccl, "comm_exposed_ms": exposed, "traced_step_ms": 61.26}

        self.folder.write("trace.json", {"provenance": {"schema": "zpccl-provenance/1", "commit": COMMIT,
                                                        "dirty": False},
                                         "configs": {"zpccl": [rank(5.04, 40.0, 38.16), rank(5.5, 35.1, 33.0)]}})
        self.tables["trace"] = lambda s: self.rr.trace_table(s, "trace", "trace.json", [("zpccl", "FSDP2 + zpccl")])
        lines = [line for line in self.render("<!-- table: trace -->\n<!-- end table -->\n").splitlines()
                 if line.startswith("| FSDP2 + zpccl")]
        cells = " | 120 / 6 / 12 | 61.3 | a |"
        self.assertEqual(lines, ["| FSDP2 + zpccl | 0 | 5.0 | 40.0 | 0.2 | 0.0 | 45.0 | 38.2" + cells,
                                 "| FSDP2 + zpccl | 1 | 5.5 | 35.1 | 0.2 | 0.0 | 40.6 | 33.0" + cells])
        self.tables["none"] = lambda s: self.rr.trace_table(s, "none", "trace.json", [("nccl", "FSDP2 + NCCL")])
        with self.assertRaisesRegex(self.rr.RenderError, "trace.json has no trace of nccl"):
            self.render("<!-- table: none -->\n<!-- end table -->\n")

    def test_cpu_share_per_rank_and_round_from_the_machine_records(self) -> None:
        def rank(cpu_s: float, wall_s: float) -> dict[str, Any]:
            return {"wall_s": wall_s, "rank_cpu_s": cpu_s, "host_busy": 0.2, "gpu_sm_mhz": 1980}

        def row(config: str, machine: list | None) -> dict[str, Any]:
            return {"config": config, "median_ms": 40.0, "min_ms": 30.25, "max_ms": 50.0, "machine": machine}

        self.folder.write("waits.json", {"provenance": {"schema": "zpccl-provenance/1", "commit": COMMIT,
                                                        "dirty": False}, "rows": [
            row("no-comm", [[rank(0.5, 0.5), rank(0.45, 0.5)], [rank(0.4, 0.5), rank(0.5, 0.5)]]),
            row("zpccl-hpz", [[rank(1.9, 1.0), rank(2.15, 1.0)]]),
            row("bare", None)]})
        self.tables["waits"] = lambda s: self.rr.cpu_share_table(s, "waits", [("waits.json", "asleep")], [
            ("nccl", "NCCL"), ("no-comm", "floor"), ("zpccl-hpz", "zpccl")])
        lines = self.render("<!-- table: waits -->\n<!-- end table -->\n").splitlines()
        # A configuration the run lacks is left out; the share is over every round and rank.
        self.assertEqual([line for line in lines if line.startswith("| asleep")],
                         ["| asleep | floor | 40.0 (30.2-50.0) | 80 - 100% | a |",
                          "| asleep | zpccl | 40.0 (30.2-50.0) | 190 - 215% | a |"])
        self.tables["bare"] = lambda s: self.rr.cpu_share_table(s, "bare", [("waits.json", "x")], [("bare", "b")])
        with self.assertRaisesRegex(self.rr.RenderError, "waits.json's bare row has no machine records"):
            self.render("<!-- table: bare -->\n<!-- end table -->\n")
        # Where the ranks ran: the CPUs each rank's main thread ended its rounds on, and its migrations a round.
        def placed(cpu: int, moved: int) -> dict[str, Any]:
            return dict(rank(0.5, 0.5), rank_cpu=cpu, rank_migrations=moved)

        self.folder.write("placed.json", {"provenance": {"schema": "zpccl-provenance/1", "commit": COMMIT,
                                                         "dirty": False}, "rows": [
            row("no-comm", [[placed(3, 0), placed(9, 2)], [placed(1, 5), placed(9, 0)]]),
            row("zpccl-hpz", [[rank(1.0, 1.0), rank(1.0, 1.0)]])]})
        self.tables["placed"] = lambda s: self.rr.cpu_share_table(s, "placed", [("placed.json", "pinned")], [
            ("no-comm", "floor")], where=True)
        lines = self.render("<!-- table: placed -->\n<!-- end table -->\n").splitlines()
        self.assertIn("| run | configuration | step ms (median, range) | a rank's CPU time / wall | CPUs at rounds' "
                      "ends, per rank | migrations a round | src |", lines)
        self.assertIn("| pinned | floor | 40.0 (30.2-50.0) | 100 - 100% | 1,3 / 9 | 0 - 5 | a |", lines)
        self.tables["unplaced"] = lambda s: self.rr.cpu_share_table(s, "unplaced", [("placed.json", "x")], [
            ("zpccl-hpz", "z")], where=True)
        with self.assertRaisesRegex(self.rr.RenderError, "zpccl-hpz row does not say where its ranks ran"):
            self.render("<!-- table: unplaced -->\n<!-- end table -->\n")

    def test_sources_past_z_take_two_letters(self) -> None:
        self.assertEqual([self.rr.source_letter(i) for i in (0, 25, 26, 27, 51, 52)],
                         ["a", "z", "aa", "ab", "az", "ba"])
        files = [f"s{i}.json" for i in range(28)]
        for f in files:
            self.folder.write(f, {"provenance": {"schema": "zpccl-provenance/1", "commit": COMMIT, "dirty": False}})
        table = self.rr.Table(self.rr.Store(self.root / "results"), "many", ["x"])
        table.add(["all"], list(reversed(files)))
        self.assertTrue(table.lines()[2].endswith("| a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p, q, r, s, t, u, "
                                                  "v, w, x, y, z, aa, ab |"), table.lines()[2])


    def test_what_the_files_cannot_give_is_refused(self) -> None:
        with self.assertRaisesRegex(self.rr.RenderError, "unknown table 'nope'"):
            self.render("<!-- table: nope -->\n<!-- end table -->\n")
        self.folder.write("legacy.json", {"files": {}})  # the bare array loses its commit
        with self.assertRaisesRegex(self.rr.RenderError, "old.json: no provenance"):
            self.rr.render("<!-- table: shm -->\n<!-- end table -->\n", self.rr.Store(self.root / "results"),
                           self.tables)
        self.folder.write("legacy.json", {"files": {"old.json": {"commit": LEGACY}}})
        self.folder.write("old.json", [perf_row("qwz_all_gather", 8, "shm", 1 << 20, 1.08, 41.8)] * 2)
        with self.assertRaisesRegex(self.rr.RenderError, "old.json holds 2 rows of qwz_all_gather"):
            self.rr.render("<!-- table: shm -->\n<!-- end table -->\n", self.rr.Store(self.root / "results"),
                           self.tables)
        self.folder.write("old.json", [perf_row("qwz_all_gather", b, "shm", 1 << 20, 1.5, 41.8) for b in (8, 4)])
        (self.root / "results" / "new.json").unlink()
        with self.assertRaisesRegex(self.rr.RenderError, "new.json: cannot be read"):
            self.rr.render("<!-- table: shm -->\n<!-- end table -->\n", self.rr.Store(self.root / "results"),
                           self.tables)

    def test_check_fails_with_a_diff_when_a_figure_changes(self) -> None:
        doc = self.root / "doc.md"
        doc.write_text("# Doc\n<!-- table: shm -->\n<!-- end table -->\n")
        self.rr.TABLES, saved = self.tables, self.rr.TABLES
        try:
            def run(*args: str) -> tuple[int, str]:
                out = io.StringIO()
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                    status = self.rr.main(["--results", str(self.root / "results"), *args, str(doc)])
                return status, out.getvalue()

            status, text = run("--check")
            self.assertEqual(status, 1, text)  # the table is empty: it differs
            self.assertIn("differs from what perf/results gives", text)
            self.assertIn("+| int8 | 1.08 |", text)
            self.assertEqual(run()[0], 0)  # rewrite
            self.assertEqual(run("--check"), (0, ""))
            rows = json.loads((self.root / "results" / "new.json").read_text())
            rows["rows"][0]["speedup"] = 2.15  # a file changes under a rendered document
            self.folder.write("new.json", rows)
            status, text = run("--check")
            self.assertEqual(status, 1, text)
            self.assertIn("-| int8 | 1.08 | **2.05†** |", text)
            self.assertIn("+| int8 | 1.08 | **2.15†** |", text)
        finally:
            self.rr.TABLES = saved

    def test_the_projects_documents_are_rendered_from_its_files(self) -> None:
        rr = self.rr
        store = rr.Store(SOURCE_TREE / "perf" / "results")
        for doc in rr.DOCUMENTS:
            path = SOURCE_TREE / doc
            text = path.read_text()
            names = rr.MARKER.findall(text)
            self.assertTrue(names, f"{doc} has no generated table")
            self.assertEqual(rr.render(text, store, where=doc), text, f"{doc}: run tools/render_results.py")
        results = (SOURCE_TREE / "perf" / "RESULTS.md").read_text()
        # A reference, not a notebook: a section per collective and integration, their history in perf/notebook/.
        self.assertLess(len(results.splitlines()), 480)
        # Every table of the script is used, so that none is rendered for nothing.
        used = {m[1] for doc in rr.DOCUMENTS for m in rr.MARKER.findall((SOURCE_TREE / doc).read_text())}
        self.assertEqual(used, set(rr.TABLES))


if __name__ == "__main__":
    unittest.main()
