"""perf/provenance.py, the record every result file carries: the source state it names inside a git checkout and in
a copy sent to a GPU machine, where ZP_SOURCE_STATE names the commit (the copy has no git folder, or one that is
not its own), and the state a written record stands for."""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import unittest

from . import SOURCE_TREE

SCRIPT = SOURCE_TREE / "perf" / "provenance.py"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
PRINT_STATE = "import provenance, json; print(json.dumps(provenance.source_state()))"


def load_module():
    spec = importlib.util.spec_from_file_location("zpccl_perf_provenance", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def source_state_in(folder: pathlib.Path, state: str | None) -> list:
    env = {k: v for k, v in os.environ.items() if k != "ZP_SOURCE_STATE"}
    env["GIT_CEILING_DIRECTORIES"] = str(folder.parent)  # git must not find a repository above the copy
    if state is not None:
        env["ZP_SOURCE_STATE"] = state
    done = subprocess.run([sys.executable, "-c", PRINT_STATE], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=60, check=True)
    return json.loads(done.stdout)


@unittest.skipUnless(SCRIPT.exists(), f"{SCRIPT} not found")
class SourceStateOutsideGit(unittest.TestCase):
    def setUp(self) -> None:
        self.top = pathlib.Path(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, self.top)
        (self.top / "perf").mkdir()
        shutil.copy(SCRIPT, self.top / "perf" / "provenance.py")
        self.folder = self.top / "perf"

    def test_named_commit_is_taken(self) -> None:
        self.assertEqual(source_state_in(self.folder, COMMIT), [COMMIT, False])

    def test_named_dirty_commit_is_dirty(self) -> None:
        self.assertEqual(source_state_in(self.folder, COMMIT + "-dirty"), [COMMIT, True])

    def test_nothing_named_is_unknown(self) -> None:
        self.assertEqual(source_state_in(self.folder, None), [None, None])

    def test_a_malformed_name_is_unknown(self) -> None:
        for bad in ("HEAD", COMMIT[:12], COMMIT.upper(), "", COMMIT + "-dirty-dirty"):
            with self.subTest(state=bad):
                self.assertEqual(source_state_in(self.folder, bad), [None, None])


@unittest.skipUnless(SCRIPT.exists(), f"{SCRIPT} not found")
class SourceStateInsideGit(unittest.TestCase):
    def test_a_named_state_wins_over_the_git_folder(self) -> None:
        # The copy on a GPU machine may carry a git folder of another commit: the sender's name is the truth.
        self.assertEqual(source_state_in(SCRIPT.parent, COMMIT), [COMMIT, False])

    def test_git_answers_when_nothing_is_named(self) -> None:
        commit, dirty = source_state_in(SCRIPT.parent, None)
        self.assertRegex(commit, "^[0-9a-f]{40}$")
        self.assertIsInstance(dirty, bool)


@unittest.skipUnless(SCRIPT.exists(), f"{SCRIPT} not found")
class RecordedSource(unittest.TestCase):
    def setUp(self) -> None:
        self.provenance = load_module()

    def test_the_environment_names_the_measured_tree(self) -> None:
        other = "f" * 40
        record = {"commit": other, "dirty": True, "env": {"ZP_SOURCE_STATE": COMMIT}}
        self.assertEqual(self.provenance.recorded_source(record), (COMMIT, False))

    def test_without_a_name_the_record_stands(self) -> None:
        record = {"commit": COMMIT, "dirty": True, "env": {"NCCL_NVLS_ENABLE": "0"}}
        self.assertEqual(self.provenance.recorded_source(record), (COMMIT, True))

    def test_a_malformed_name_is_unknown(self) -> None:
        record = {"commit": COMMIT, "dirty": False, "env": {"ZP_SOURCE_STATE": "main"}}
        self.assertEqual(self.provenance.recorded_source(record), (None, None))


def load_perf_files():
    sys.path.insert(0, str(SOURCE_TREE / "tools"))
    import perf_files
    return perf_files


class GatheredFiles(unittest.TestCase):
    """tools/perf_files.py's provenance_of for a file that gathers several runs (tools/gpu-check.sh's results.json):
    one source when every run stands for the same tree, none when they differ."""

    def setUp(self) -> None:
        self.perf_files = load_perf_files()

    def gathered(self, *records: dict) -> dict:
        return {"provenance_by_file": {f"run{i}.json": r for i, r in enumerate(records)}, "rows": []}

    def test_runs_of_one_tree_stand_for_it(self) -> None:
        stale = {"commit": "f" * 40, "dirty": True, "env": {"ZP_SOURCE_STATE": COMMIT}}
        got = self.perf_files.provenance_of(self.gathered(stale, dict(stale)))
        self.assertEqual((got["commit"], got["dirty"], got["runs"]), (COMMIT, False, 2))

    def test_runs_of_different_trees_stand_for_none(self) -> None:
        a = {"commit": COMMIT, "dirty": False}
        b = {"commit": "f" * 40, "dirty": False}
        self.assertIsNone(self.perf_files.provenance_of(self.gathered(a, b)))
        self.assertIsNone(self.perf_files.provenance_of(self.gathered(a, {"commit": COMMIT, "dirty": True})))


if __name__ == "__main__":
    unittest.main()
