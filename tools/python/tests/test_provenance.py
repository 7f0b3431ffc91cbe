"""perf/provenance.py, the record every result file carries: the source state it names inside a git checkout and in
a copy sent to a GPU machine, where ZP_SOURCE_STATE names the commit (the copy has no git folder, or one that is
not its own), and the state a written record stands for; the same record from the C++ perf binaries
(perf/provenance.cc, perf/json_out.cc), whose prefixes and keys are provenance.py's."""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import types
import unittest
from typing import Any
from unittest import mock

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



# ---- the C++ writer (perf/provenance.cc, perf/json_out.cc) against provenance.py ----------------------------------

CPP = SOURCE_TREE / "perf"
# A C++ string or character literal, or a comment: literals are kept, comments blanked.
_LITERAL_OR_COMMENT = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|//[^\n]*|/\*.*?\*/', re.S)
_STRING = r'"((?:\\.|[^"\\])*)"'


def without_comments(code: str) -> str:
    """C++ ``code`` without its comments (a commented-out key or prefix is none)."""
    return _LITERAL_OR_COMMENT.sub(lambda m: " " if m.group(0)[0] == "/" else m.group(0), code)


def cpp_code(path: pathlib.Path) -> str:
    return without_comments(path.read_text())


def cpp_function_body(code: str, name: str) -> str:
    """The body of the function ``name`` defined in ``code`` (comments gone), between its braces."""
    start = re.search(r"\b" + name + r"\s*\([^;{]*\)\s*\{", code)
    if start is None:
        raise AssertionError(f"no definition of {name} found")
    # Braces inside literals do not count: count them where the literals are blanked.
    blank = _LITERAL_OR_COMMENT.sub(lambda m: " " * len(m.group(0)), code)
    depth = 1
    for i in range(start.end(), len(blank)):
        depth += {"{": 1, "}": -1}.get(blank[i], 0)
        if depth == 0:
            return code[start.end():i]
    raise AssertionError(f"{name}'s body does not close")


def cpp_key_tree(body: str) -> list[list[Any]]:
    """The keys a JsonWriter body writes, in order, as [name, children]: children the keys of the object the key
    opens (beginObject), else None; "*" for keys it takes from data (a loop's ``key(name.c_str())``)."""
    token = re.compile(r"\bkey\s*\(\s*" + _STRING + r"\s*\)|\bnullableString\s*\(\s*\w+\s*,\s*" + _STRING +
                       r"|\b(key)\s*\(|\b(beginObject|endObject)\s*\(\s*\)")
    root: list[list[Any]] = []
    stack: list[list[list[Any]]] = []
    for m in token.finditer(body):
        literal, nullable, dynamic, brace = m.groups()
        if brace == "beginObject":
            if stack:
                stack[-1][-1][1] = []
                stack.append(stack[-1][-1][1])
            else:
                stack.append(root)
        elif brace == "endObject":
            stack.pop()
        else:
            stack[-1].append([literal if literal is not None else nullable if nullable is not None else "*", None])
    return root


@unittest.skipUnless(SCRIPT.exists() and (CPP / "provenance.cc").exists(), f"{CPP}'s provenance sources not found")
class CppWriterMatches(unittest.TestCase):
    """The perf binaries write provenance.py's record from C++: the same steering prefixes, schema and keys, in the
    same order, so that one reader (tools/perf_files.py) takes both."""

    def setUp(self) -> None:
        self.provenance = load_module()

    def test_steering_prefixes(self) -> None:
        code = cpp_code(CPP / "provenance.cc")
        m = re.search(r"\bkSteeringPrefixes\s*\[\s*(\d*)\s*\]\s*=\s*\{(.*?)\}\s*;", code, re.S)
        self.assertIsNotNone(m, "provenance.cc defines no kSteeringPrefixes")
        self.assertEqual(tuple(re.findall(_STRING, m.group(2))), self.provenance.STEERING_PREFIXES)
        # The declared sizes: one larger than the list would leave a null prefix for the loop over them.
        declared = re.findall(r"\bkSteeringPrefixes\s*\[\s*(\d+)\s*\]", code + cpp_code(CPP / "provenance.h"))
        self.assertEqual(declared and set(map(int, declared)), {len(self.provenance.STEERING_PREFIXES)})

    def test_schema_and_keys_in_order(self) -> None:
        import zpccl  # noqa: F401  (imported, zpccl's facts are in the record: its "zpccl" object has keys)

        record = self.provenance.provenance("cpu-threads")
        self.assertIsNotNone(record["zpccl"], "zpccl's library did not load, so the record has no zpccl keys")
        body = cpp_function_body(cpp_code(CPP / "json_out.cc"), "provenanceToJson")
        schema = re.search(r"\bkey\s*\(\s*\"schema\"\s*\)\s*\.\s*string\s*\(\s*" + _STRING, body)
        self.assertEqual(schema and schema.group(1), self.provenance.SCHEMA)
        tree = cpp_key_tree(body)
        self.assertEqual([name for name, _ in tree], list(record))
        objects = {name: [k for k, _ in children] for name, children in tree if children is not None}
        self.assertGreaterEqual(set(objects), {"env", "gpu", "nccl", "zpccl"})
        for name, keys in objects.items():
            with self.subTest(key=name):
                self.assertIsInstance(record[name], dict)
                # env's names come from the environment, on both sides
                self.assertEqual(keys, ["*"] if name == "env" else list(record[name]))

    def test_key_tree_reads_any_layout(self) -> None:
        body = """w.beginObject(); w.key( "a" ).string(x);  // w.key("commented").null();
                  nullableString(w,
                                 "b", y);
                  w.key("c")
                      .beginObject();
                  for (auto& [n, v] : env) w.key(n.c_str()).string(v);
                  /* w.key("gone"); */ w.key("d").null();
                  w.endObject(); w.key("e").null(); w.endObject();"""
        self.assertEqual(cpp_key_tree(without_comments(body)),
                         [["a", None], ["b", None], ["c", [["*", None], ["d", None]]], ["e", None]])


@unittest.skipUnless(SCRIPT.exists(), f"{SCRIPT} not found")
class TorchFacts(unittest.TestCase):
    def test_torchs_nccl_version_is_its_parts(self) -> None:
        provenance = load_module()
        for parts, text in (((2, 27, 3), "2.27.3"), ((2, 28, 0, "a1"), "2.28.0")):
            cuda = types.SimpleNamespace(is_available=lambda: True, nccl=types.SimpleNamespace(version=lambda: parts))
            torch = types.SimpleNamespace(__version__="9.9", version=types.SimpleNamespace(cuda="13.0"), cuda=cuda)
            with self.subTest(parts=parts), mock.patch.dict(sys.modules, torch=torch):
                self.assertEqual(provenance._torch_facts(), ({"version": "9.9", "cuda": "13.0"}, "13.0", text))


if __name__ == "__main__":
    unittest.main()
