#!/usr/bin/env python3
"""Runs the zpccl Python test suite (unittest) and writes {"passed": N, "failed": N, "skipped": N}.

    ZPCCL_LIBRARY=build/libzpccl.so PYTHONPATH=tools/python python tools/python/tests/run.py --count out.count
    python <copy of tools/python/tests>/run.py --installed <source tree> --count out.count

The first runs the package of the source tree; the second, from a copy of this folder (so that the source tree's
zpccl is not on sys.path), the installed one: it refuses to run unless ``import zpccl`` finds an installed package
with its library inside, and tells the tests where the source tree is (test_install.py compares the two).

Counts are per test method: one whose subtests fail counts once as failed; a skipped test is not passed; an
import error or a failing setUpClass counts as a failure. Exit status 0 when nothing failed.

Unless already set, the library's WARN log is silenced (``ZP_DEBUG=NONE``: many tests provoke errors on purpose;
``--verbose`` keeps it), and host-backend waits are bounded to 30 s (``ZP_HOST_TIMEOUT_MS``,
``ZP_INIT_TIMEOUT_MS``) so that a bug fails the suite instead of hanging it.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import sys
import time
import unittest

HERE = pathlib.Path(__file__).resolve().parent


class CountingResult(unittest.TextTestResult):
    """Records each test method's outcome, subtests folded into their test. A failure's traceback is printed when it
    happens, not only in the summary at the end: a suite that a time limit cuts (tools/gpu-check.sh gives it one)
    still says why its tests failed."""

    #: A test that takes longer is named with its time when it ends (the GPU machine's calls have a time limit, and
    #: planning them needs to know what the suite spends it on).
    SLOW_S = 10.0

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.passed_ids: set[str] = set()
        self.failed_ids: set[str] = set()
        self.skipped_ids: set[str] = set()
        self._started = 0.0

    def startTest(self, test: unittest.TestCase) -> None:
        self._started = time.monotonic()
        super().startTest(test)

    def stopTest(self, test: unittest.TestCase) -> None:
        super().stopTest(test)
        took = time.monotonic() - self._started
        if took >= self.SLOW_S:
            self.stream.writeln(f"  (slow: {test.id()} took {took:.1f} s)")
            self.stream.flush()

    def addSuccess(self, test: unittest.TestCase) -> None:
        super().addSuccess(test)
        self.passed_ids.add(test.id())

    def addFailure(self, test, err) -> None:  # type: ignore[no-untyped-def]
        super().addFailure(test, err)
        self._failed_now(test, "FAIL", err)

    def addError(self, test, err) -> None:  # type: ignore[no-untyped-def]
        super().addError(test, err)
        self._failed_now(test, "ERROR", err)

    def addSubTest(self, test, subtest, err) -> None:  # type: ignore[no-untyped-def]
        super().addSubTest(test, subtest, err)
        if err is not None:
            kind = "FAIL" if issubclass(err[0], test.failureException) else "ERROR"
            self._failed_now(subtest, kind, err, test.id())

    def printErrorList(self, flavour, errors) -> None:  # type: ignore[no-untyped-def]
        """The summary at the end names each failure; its traceback was printed when it happened."""
        for test, _ in errors:
            self.stream.writeln(f"{flavour}: {self.getDescription(test)}")

    def _failed_now(self, test, kind: str, err, test_id: str | None = None) -> None:  # type: ignore[no-untyped-def]
        self.failed_ids.add(test_id or test.id())
        self.stream.writeln(f"\n{kind} (as it happened): {self.getDescription(test)}")
        self.stream.writeln(self._exc_info_to_string(err, test))
        self.stream.flush()

    def addSkip(self, test, reason) -> None:  # type: ignore[no-untyped-def]
        super().addSkip(test, reason)
        self.skipped_ids.add(test.id())

    def addUnexpectedSuccess(self, test) -> None:  # type: ignore[no-untyped-def]
        super().addUnexpectedSuccess(test)
        self.failed_ids.add(test.id())

    def counts(self) -> dict[str, int]:
        failed = self.failed_ids
        return {"passed": len(self.passed_ids - failed), "failed": len(failed),
                "skipped": len(self.skipped_ids - failed)}


#: The classes of GPU tests (FsdpOnGpus, DdpOnGpu, CudaTensorsOnTwoGpus, ...): what ``--gpu-first`` runs first and
#: ``--gpu-only`` runs alone. A class that needs a GPU is named so; one that does not must not end in Gpu or Gpus.
GPU_CLASS = re.compile(r"Gpus?$")


def flat(suite: unittest.TestSuite) -> list[unittest.TestCase]:
    out: list[unittest.TestCase] = []
    for item in suite:
        out.extend(flat(item) if isinstance(item, unittest.TestSuite) else [item])
    return out


def gpu_first(suite: unittest.TestSuite) -> unittest.TestSuite:
    """The suite with the GPU classes' tests first, each class's tests still together and in order: on the GPU
    machine the suite runs under a time limit, and the tests CI cannot run come before those it runs anyway."""
    tests = flat(suite)
    return unittest.TestSuite(sorted(tests, key=lambda t: not GPU_CLASS.search(type(t).__name__)))


def gpu_only(suite: unittest.TestSuite) -> unittest.TestSuite:
    """The GPU classes' tests alone, in order: what a GPU machine adds to CI, which runs every other test on a CPU;
    the whole suite takes longer than a GPU machine's call gives it."""
    return unittest.TestSuite([t for t in flat(suite) if GPU_CLASS.search(type(t).__name__)])


def installed_package_problem(source_tree: pathlib.Path) -> str:
    """Why ``import zpccl`` here does not give an installed package with its library inside, or ""."""
    if os.environ.get("ZPCCL_LIBRARY"):
        return "ZPCCL_LIBRARY is set: the installed package must find its own library"
    try:
        import zpccl
    except ImportError as e:
        return f"import zpccl failed: {e}"
    package = pathlib.Path(zpccl.__file__).resolve().parent
    if package == source_tree / "tools" / "python" / "zpccl":
        return f"zpccl is imported from the source tree ({package})"
    try:
        library = pathlib.Path(zpccl.library_path()).resolve()
    except zpccl.LibraryNotFoundError as e:
        return str(e)
    if library.parent != package:
        return f"the library loaded is {library}, not the one inside the package {package}"
    return ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", help="write the JSON counts here")
    parser.add_argument("-v", "--verbose", action="store_true", help="one line per test, library warnings on")
    parser.add_argument("-k", dest="patterns", action="append", help="only tests whose name contains this")
    parser.add_argument("--gpu-first", action="store_true",
                        help="run the GPU test classes (names ending in Gpu or Gpus) before the others")
    parser.add_argument("--gpu-only", action="store_true",
                        help="run the GPU test classes alone (CI runs the others on a CPU)")
    parser.add_argument("--installed", metavar="SOURCE_TREE",
                        help="test the installed package (built from SOURCE_TREE), not a source tree's")
    args = parser.parse_args()
    if args.installed:
        problem = installed_package_problem(pathlib.Path(args.installed).resolve())
        if problem:
            print(f"run.py --installed: {problem}")
            if args.count:
                pathlib.Path(args.count).write_text(json.dumps({"passed": 0, "failed": 1, "skipped": 0}) + "\n")
            return 1
        os.environ["ZPCCL_TEST_SOURCE_TREE"] = str(pathlib.Path(args.installed).resolve())

    if not args.verbose:
        os.environ.setdefault("ZP_DEBUG", "NONE")
    os.environ.setdefault("ZP_HOST_TIMEOUT_MS", "30000")
    os.environ.setdefault("ZP_INIT_TIMEOUT_MS", "30000")
    top = str(HERE.parent)  # tools/python: holds the zpccl package and this tests package
    if top not in sys.path:
        sys.path.insert(0, top)

    # torch first, when installed: a zpccl built outside a wheel links whatever libnccl.so.2 its build found,
    # and loaded first it would take that soname for torch's libraries too (README: import torch, then zpccl).
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    loader = unittest.TestLoader()
    if args.patterns:
        loader.testNamePatterns = [f"*{p}*" for p in args.patterns]
    suite = loader.discover(start_dir=str(HERE), pattern="test_*.py", top_level_dir=top)
    if args.gpu_only:
        suite = gpu_only(suite)
    elif args.gpu_first:
        suite = gpu_first(suite)
    runner = unittest.TextTestRunner(stream=sys.stdout, verbosity=2 if args.verbose else 1,
                                     resultclass=CountingResult)
    start = time.monotonic()
    result = runner.run(suite)
    counts = result.counts()  # type: ignore[attr-defined]
    if args.count:
        path = pathlib.Path(args.count)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(counts) + "\n")
    print(f"python: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped "
          f"in {time.monotonic() - start:.1f} s")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
