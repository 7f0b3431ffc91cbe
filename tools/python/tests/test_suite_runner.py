"""tests/run.py's result: each outcome counted once per test method, and a failure's traceback written when it
happens, so that a suite cut by a time limit still says why its tests failed; and tests/frameworks.txt, the
frameworks' versions that CI installs and the framework tests name (tests.pinned)."""
from __future__ import annotations

import io
import pathlib
import re
import tempfile
import unittest
from unittest import mock

import tests
from tests import SOURCE_TREE, pinned
from tests.run import CountingResult, gpu_first, gpu_only


# Named, not written in the calls: a traceback quotes the failing line of source.
FAILED = "the failing assertion's message"
RAISED = "the raised error's message"
SUBTEST = "the subtest's message"


class _Outcomes(unittest.TestCase):
    """One test of each outcome; run only through SuiteRunner (the loader skips names without the test prefix)."""

    def passes(self) -> None:
        pass

    def fails(self) -> None:
        self.assertEqual(1, 2, FAILED)

    def raises(self) -> None:
        raise RuntimeError(RAISED)

    def fails_one_subtest(self) -> None:
        for i in range(3):
            with self.subTest(i=i):
                self.assertNotEqual(i, 1, SUBTEST)

    @unittest.skip("the skip's reason")
    def skips(self) -> None:
        pass


class SuiteRunner(unittest.TestCase):
    def run_outcomes(self, *names: str) -> tuple[dict[str, int], str]:
        stream = io.StringIO()
        suite = unittest.TestSuite(_Outcomes(n) for n in names)
        result = unittest.TextTestRunner(stream=stream, verbosity=1, resultclass=CountingResult).run(suite)
        return result.counts(), stream.getvalue()

    def test_counts_fold_subtests_into_their_test(self) -> None:
        counts, _ = self.run_outcomes("passes", "fails", "raises", "fails_one_subtest", "skips")
        self.assertEqual(counts, {"passed": 1, "failed": 3, "skipped": 1})

    def test_a_failure_is_written_before_the_next_test_runs(self) -> None:
        stream = io.StringIO()
        seen_when_next_ran: list[str] = []

        class Next(unittest.TestCase):
            def runTest(self) -> None:
                seen_when_next_ran.append(stream.getvalue())

        suite = unittest.TestSuite([_Outcomes("fails"), _Outcomes("raises"), _Outcomes("fails_one_subtest"), Next()])
        unittest.TextTestRunner(stream=stream, verbosity=1, resultclass=CountingResult).run(suite)
        before = seen_when_next_ran[0]
        for message in (FAILED, RAISED, SUBTEST, "Traceback (most recent call last)", "(i=1)"):
            self.assertIn(message, before)

    def test_a_slow_test_is_named_with_its_time(self) -> None:
        slow = type("Slow", (CountingResult,), {"SLOW_S": 0.0})
        stream = io.StringIO()
        unittest.TextTestRunner(stream=stream, verbosity=1, resultclass=slow).run(_Outcomes("passes"))
        self.assertRegex(stream.getvalue(), r"slow: \S+_Outcomes\.passes took \d+\.\d s")
        _, fast = self.run_outcomes("passes")
        self.assertNotIn("slow:", fast)

    @staticmethod
    def mixed_suite() -> unittest.TestSuite:
        class AOnCpu(unittest.TestCase):
            def test_1(self) -> None: ...
            def test_2(self) -> None: ...

        class BOnGpus(unittest.TestCase):
            def test_1(self) -> None: ...
            def test_2(self) -> None: ...

        class CTwoGpu(unittest.TestCase):
            def test_1(self) -> None: ...

        class DGpuless(unittest.TestCase):
            def test_1(self) -> None: ...

        load = unittest.TestLoader().loadTestsFromTestCase
        return unittest.TestSuite([unittest.TestSuite([load(AOnCpu), load(BOnGpus)]), load(CTwoGpu),
                                   load(DGpuless)])

    @staticmethod
    def order(suite: unittest.TestSuite) -> list[str]:
        return [f"{type(t).__name__}.{t._testMethodName}" for t in suite]

    def test_gpu_first_moves_the_gpu_classes_ahead_keeping_each_class_together(self) -> None:
        self.assertEqual(self.order(gpu_first(self.mixed_suite())),
                         ["BOnGpus.test_1", "BOnGpus.test_2", "CTwoGpu.test_1", "AOnCpu.test_1", "AOnCpu.test_2",
                          "DGpuless.test_1"])

    def test_gpu_only_keeps_the_gpu_classes_alone_in_order(self) -> None:
        self.assertEqual(self.order(gpu_only(self.mixed_suite())),
                         ["BOnGpus.test_1", "BOnGpus.test_2", "CTwoGpu.test_1"])

    def test_the_summary_names_each_failure_once_without_repeating_its_traceback(self) -> None:
        _, text = self.run_outcomes("fails", "passes")
        self.assertEqual(text.count(FAILED), 1, text)
        self.assertIn("FAIL: fails", text.split(FAILED, 1)[1])



class FrameworkPins(unittest.TestCase):
    FRAMEWORKS = ("torchtitan", "transformers", "accelerate", "lightning", "deepspeed")

    def test_each_framework_has_one_exact_version(self) -> None:
        for name in self.FRAMEWORKS:
            self.assertRegex(pinned(name), r"^\d+(\.\d+)+$", name)
        self.assertEqual(pinned("DeepSpeed"), pinned("deepspeed"))
        with self.assertRaisesRegex(KeyError, "pins no 'megatron'"):
            pinned("megatron")

    def test_a_line_that_pins_no_exact_version_is_refused(self) -> None:
        with tempfile.TemporaryDirectory() as folder:
            path = pathlib.Path(folder) / "frameworks.txt"
            path.write_text("# a comment\n\ntorch==2.15.0  # one pin\n")
            with mock.patch.object(tests, "FRAMEWORKS", path):
                self.assertEqual(pinned("torch"), "2.15.0")
            for line in ("deepspeed>=0.19", "deepspeed==0.19.8,<1", "deepspeed", "==0.19.8", "deepspeed===0.19.8"):
                path.write_text(f"# a comment\n\ntorch==2.15.0  # one pin\n{line}\n")
                with self.subTest(line=line), mock.patch.object(tests, "FRAMEWORKS", path), \
                        self.assertRaisesRegex(ValueError, r"frameworks\.txt:4: .* must pin one exact version"):
                    pinned("torch")

    def test_ci_installs_the_file(self) -> None:
        script = SOURCE_TREE / "tools" / "run-tests.sh"
        if not script.exists():
            self.skipTest(f"{script} not found")
        text = script.read_text()
        for wanted in (r"(?m)^test_frameworks=\$top/tools/python/tests/frameworks\.txt$",
                       r'(?m)^\s*if ! DS_BUILD_OPS=0 "\$\{vpip\[@\]\}" .*-r "\$test_frameworks"',
                       # torch's release without its local label: the index has no 2.15.0+cu132 to resolve against
                       r'(?m)^\s*echo "torch==\$\{torch_version%%\+\*\}" >"\$results/torch-constraint\.txt"$',
                       r"(?m)^\s*count frameworks 0 1$"):
            self.assertIsNotNone(re.search(wanted, text), f"{script} lacks {wanted!r}")
        for name in self.FRAMEWORKS:  # no version of its own beside the file's
            self.assertIsNone(re.search(rf"\b{name}\s*[=<>~]=", text), f"{script} pins {name} itself")


if __name__ == "__main__":
    unittest.main()
