"""tools/perf_files.py, the Python tools' reader of result files: sizes written and read as the perf flags spell them
(the gate's figure names, the summaries' columns, the rendered tables' picks), and which files are a training
step's (the gate, tools/gpu-check.sh's summary)."""
from __future__ import annotations

import json
import unittest
from typing import Any

from . import SOURCE_TREE, load_script

MIB = 1 << 20
pf = load_script("tools/perf_files.py")


def tree_files(folder: str) -> list[Any]:
    """The source tree's JSON files in ``folder``, parsed, with their paths; the test skips where there are none."""
    paths = sorted((SOURCE_TREE / folder).glob("*.json"))
    if not paths:
        raise unittest.SkipTest(f"no {folder}/*.json")
    return [(path, json.loads(path.read_text())) for path in paths]


class Sizes(unittest.TestCase):
    def test_a_sizes_name_is_whole_units_as_the_flags_spell_it(self) -> None:
        size_text = pf.size_text
        for nbytes, name in ((0, "0"), (1000, "1000"), (1024, "1K"), (64 << 10, "64K"), (16 * MIB, "16M"),
                             (15872 << 10, "15872K"), (1536 * MIB, "1536M"), (1 << 30, "1G"), (3646, "3646")):
            with self.subTest(nbytes=nbytes):
                self.assertEqual(size_text(nbytes), name)
        # A size rounded up to whole elements by a few bytes keeps its flag's name; one rounded further does not.
        self.assertEqual(size_text(16 * MIB + 12), "16M")
        self.assertEqual(size_text(16 * MIB + MIB // 2), "16896K")

    def test_for_reading_a_size_is_rounded_to_its_digits(self) -> None:
        size_text = pf.size_text
        for nbytes, text in ((0, "0"), (1000, "1000"), (3646, "3.56K"), (15872 << 10, "15.5M"),
                             (1536 * MIB, "1.5G"), (64 * MIB, "64M"), (2.5, "2")):
            with self.subTest(nbytes=nbytes):
                self.assertEqual(size_text(nbytes, 3), text)
        self.assertEqual(size_text(1536 * MIB, 1), "2G")

    def test_sizes_read_back(self) -> None:
        size_of, size_text = pf.size_of, pf.size_text
        for text, nbytes in (("4096", 4096), ("64K", 64 << 10), ("16m", 16 * MIB), (" 1G ", 1 << 30),
                             ("1.5G", 1536 * MIB), ("0.5K", 512)):
            with self.subTest(text=text):
                self.assertEqual(size_of(text), nbytes)
        for nbytes in (1, 4096, 15872 << 10, 1536 * MIB, 3 << 30):
            self.assertEqual(size_of(size_text(nbytes)), nbytes)
        for bad in ("", "K", "16MiB", "-1M", "1.5", ".5M", "1e3K", "nanK", "16 M"):
            with self.subTest(bad=bad), self.assertRaisesRegex(ValueError, f"size_of: {bad!r} is not a size"):
                size_of(bad)

    def test_the_gates_recorded_names_are_its_sizes(self) -> None:
        """The reference's figure names hold sizes as size_text names them: the names a run's rows must give."""
        seen = 0
        for path, reference in tree_files("perf/gate"):
            for name in reference["figures"]:
                if not name.startswith("fsdp "):
                    size = name.split()[-1]
                    self.assertEqual(pf.size_text(pf.size_of(size)), size, f"{path.name}: {name}")
                    seen += 1
        self.assertGreater(seen, 0)


class StepFiles(unittest.TestCase):
    def test_a_training_steps_file_is_told_by_its_rows(self) -> None:
        is_step_file = pf.is_step_file
        step_row = {"config": "nccl", "median_ms": 1.0}
        for data, want in (({"rows": [step_row]}, True),
                           ({"rows": [], "losses": [{"spec": "nccl"}]}, True),  # --loss-only
                           ({"rows": [], "losses": []}, True),
                           ({"rows": []}, False),  # a perf binary's file without rows
                           ({"rows": [{"op": "qwz_all_gather"}]}, False),
                           ({"rows": [step_row, {"op": "qwz_all_gather"}]}, False),
                           ({"rows": [{"collective": "x"}], "losses": []}, False),  # format_error's
                           ([step_row], False),  # a bare array is a perf binary's
                           ({"runs": []}, False), ("text", False), (None, False)):
            with self.subTest(data=data):
                self.assertIs(is_step_file(data), want)

    def test_the_trees_result_files(self) -> None:
        """Every file in perf/results/ of a step script is one (by its name), and none of the perf binaries'."""
        steps = 0
        for path, data in tree_files("perf/results"):
            if pf.is_step_file(data):
                steps += 1
                self.assertRegex(path.name, r"-(fsdp|ddp|deepspeed)-(step|loss)", path.name)
                self.assertEqual(pf.rows_of(data), [], path.name)
        self.assertGreater(steps, 0)


if __name__ == "__main__":
    unittest.main()
