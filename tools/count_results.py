#!/usr/bin/env python3
"""Sums test outcomes under a results folder and prints 'N passed, N failed' (skips are reported, not passed).

Reads GoogleTest JSON reports (*.json) and small {"passed": N, "failed": N} files (*.count). A suite whose
report is missing (the binary crashed or did not build) counts as one failure, so nothing passes silently.
Exit status: 0 when nothing failed.
"""
import json
import pathlib
import sys

EXPECTED_REPORTS = ("zpccl_host_tests.json", "zpccl_gpu_tests.json", "c_abi.count", "pkgconfig.count",
                    "results.count", "wheel.count", "python.count")


def main(folder: str) -> int:
    root = pathlib.Path(folder)
    passed = failed = skipped = 0
    for name in EXPECTED_REPORTS:
        if not (root / name).exists():
            print(f"missing report {name}: counted as a failure")
            failed += 1
    for report in sorted(root.glob("*.json")):
        try:
            data = json.loads(report.read_text())
        except ValueError:
            print(f"unreadable report {report.name}: counted as a failure")
            failed += 1
            continue
        for suite in data.get("testsuites", []):
            for case in suite.get("testsuite", []):
                if case.get("failures"):
                    failed += 1
                elif case.get("result") == "SKIPPED":
                    skipped += 1
                elif case.get("status") == "RUN":
                    passed += 1
    for count in sorted(root.glob("*.count")):
        data = json.loads(count.read_text())
        passed += int(data.get("passed", 0))
        failed += int(data.get("failed", 0))
        skipped += int(data.get("skipped", 0))
    print(f"# {skipped} skipped (GPU tests without a GPU are skipped, not passed)")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
