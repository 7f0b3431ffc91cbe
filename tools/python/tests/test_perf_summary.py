"""tools/perf_summary.py, the summary that ends tools/run-main.sh, on rows shaped as the perf binaries' JSON."""
from __future__ import annotations

import contextlib
import io
import json
import tempfile
import unittest
from typing import Any

from . import load_script


def gpu_row(op: str, bits: int, size: int, zp_us: float, nccl_us: float, wrong: int = 0) -> dict[str, Any]:
    return {"op": op, "regime": "net-on1gpu", "backend": "cuda", "size": size, "bits": bits,
            "oop": {"time_us": zp_us, "wrong": wrong}, "ip": {"time_us": zp_us, "wrong": 0},
            "baseline": "nccl", "nccl": {"time_us": nccl_us}, "speedup": nccl_us / zp_us}


def host_row(op: str, bits: int, size: int, zp: tuple[int, int], ring: tuple[int, int]) -> dict[str, Any]:
    return {"op": op, "regime": "host", "backend": "host", "size": size, "bits": bits,
            "oop": {"wrong": 0}, "ip": {"wrong": 0}, "baseline": None, "speedup": None,
            "wire_bytes_per_rank": {"zpccl": {"intra": zp[0], "inter": zp[1]},
                                    "nccl_ring": {"intra": ring[0], "inter": ring[1]}}}


class PerfSummary(unittest.TestCase):
    def summarize(self, *files: Any) -> tuple[int, str]:
        script = load_script("tools/perf_summary.py")
        with tempfile.TemporaryDirectory() as folder:
            paths = []
            for i, rows in enumerate(files):
                paths.append(f"{folder}/{i}.json")
                with open(paths[-1], "w", encoding="utf-8") as f:
                    json.dump(rows, f)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                status = script.main(paths)
        return status, out.getvalue()

    def test_speedups_per_collective_bits_and_size(self) -> None:
        status, text = self.summarize([gpu_row("qwz_all_gather", 8, 1 << 20, 100.0, 150.0),
                                       gpu_row("qwz_all_gather", 8, 64 << 20, 1000.0, 3000.0)],
                                      [gpu_row("qgz_reduce_scatter", 4, 1 << 20, 200.0, 100.0)])
        self.assertEqual(status, 0, text)
        lines = {line.split()[0]: line.split() for line in text.splitlines() if line.startswith("q")}
        self.assertEqual(lines["qwz_all_gather"], ["qwz_all_gather", "int8", "net-on1gpu", "1.50x", "3.00x"])
        self.assertEqual(lines["qgz_reduce_scatter"], ["qgz_reduce_scatter", "int4", "net-on1gpu", "0.50x", "-"])
        self.assertIn(" 1M ", text)
        self.assertIn(" 64M", text)

    def test_bytes_saved_across_nodes_on_the_host_backend(self) -> None:
        status, text = self.summarize([host_row("qgz_reduce_scatter", 4, 4 << 20, (800, 132), (2816, 896)),
                                       host_row("hpz_all_gather", 0, 4 << 20, (3072, 0), (2688, 896))])
        self.assertEqual(status, 0, text)
        rows = [line.split() for line in text.splitlines() if line.startswith(("qgz", "hpz"))]
        self.assertEqual(rows[0][0], "hpz_all_gather")
        self.assertEqual(rows[0][-1], "100%")
        self.assertEqual(rows[1][-1], "85%")  # 1 - 132 / 896

    def test_hpz_with_one_rank_a_node_is_not_shown_as_a_speedup(self) -> None:
        copy = dict(gpu_row("hpz_all_gather", 0, 1 << 20, 10.0, 2000.0), ranks=2, nodes=2, bits=None)
        pair = dict(gpu_row("qwz_hpz_gathers", 8, 1 << 20, 1000.0, 2000.0), ranks=2, nodes=2)
        status, text = self.summarize([copy, pair])
        self.assertEqual(status, 0, text)
        self.assertFalse([line for line in text.splitlines() if line.startswith("hpz_all_gather ")], text)
        self.assertIn("is a local copy", text)
        self.assertIn("2.00x", text)  # the pair's row stays

    def test_files_with_provenance_and_rounds(self) -> None:
        row = dict(gpu_row("qgz_reduce_scatter", 4, 64 << 20, 1000.0, 3000.0), speedup_min=2.75, speedup_max=3.25)
        row["oop"]["rounds_us"] = [1000.0, 1050.0, 980.0]
        fsdp = {"provenance": {"commit": "x"}, "rows": [{"config": "nccl", "median_ms": 100.0}]}
        status, text = self.summarize({"provenance": {"schema": "zpccl-provenance/1", "commit": "a" * 40},
                                       "rows": [row]}, fsdp)
        self.assertEqual(status, 0, text)
        line = next(line.split() for line in text.splitlines() if line.startswith("qgz"))
        self.assertEqual(line[3:], ["3.00x", "(2.75-3.25)"])
        self.assertIn("1 rows (0 without", text)  # the FSDP step's file holds no perf rows

    def test_wrong_elements_fail_the_summary(self) -> None:
        status, text = self.summarize([gpu_row("qwz_all_gather", 8, 1 << 20, 100.0, 150.0, wrong=3)])
        self.assertEqual(status, 1)
        self.assertIn("wrong elements: 3", text)

    def test_rows_without_a_baseline_or_wire_bytes_are_counted_not_shown(self) -> None:
        kernel = {"op": "quantize", "size": 1 << 20, "bits": 8, "baseline": "memcpy", "speedup": 0.8,
                  "oop": {"wrong": 0}, "ip": None}
        status, text = self.summarize([kernel])
        self.assertEqual(status, 0)
        self.assertIn("1 rows (1 without an NCCL baseline or wire bytes, not shown)", text)
        self.assertNotIn("quantize ", text)


if __name__ == "__main__":
    unittest.main()
