"""What the smoke tests of the training-step benchmarks (perf/ddp_step.py, perf/deepspeed_step.py) share: running a
script on the CPU as a newcomer would, and the checks every timed row of the step protocol must pass."""
from __future__ import annotations

import gzip
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import unittest
from typing import Any

from . import SOURCE_TREE


def run_step_script(test: unittest.TestCase, relative: str, args: list[str],
                    timeout: float = 600) -> tuple[dict[str, Any], str]:
    """Runs the script at ``relative`` (in the source tree) with ``args`` and ``-J FILE``, its ranks spawned by
    the script itself; asserts that it succeeded and gives the JSON it wrote and its standard output."""
    script = SOURCE_TREE / relative
    if not script.exists():
        raise unittest.SkipTest(f"{script} not found")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rows.json")
        env = dict(os.environ, OMP_NUM_THREADS="1")
        env.pop("RANK", None)  # not one rank of a launched world: the script spawns its ranks
        done = subprocess.run([sys.executable, str(script), *args, "-J", path], capture_output=True, text=True,
                              timeout=timeout, env=env)
        test.assertEqual(done.returncode, 0, done.stderr[-3000:])
        with open(path) as f:
            return json.load(f), done.stdout


def check_timed_row(test: unittest.TestCase, row: dict[str, Any], rounds: int, ranks: int, steps: int) -> None:
    """A timed row keeps every rank's raw times (round, rank, step), all positive; a step takes its slowest rank's
    time, and the median is over every step of every round; each round says what every rank's machine did."""
    raw = row["step_ms_per_rank"]
    test.assertEqual([len(raw)] + sorted({len(rnd) for rnd in raw}) + sorted({len(s) for rnd in raw for s in rnd}),
                     [rounds, ranks, steps], row["config"])
    test.assertTrue(all(t > 0 for rnd in raw for s in rnd for t in s))
    slowest = [[max(s[i] for s in rnd) for i in range(steps)] for rnd in raw]
    test.assertEqual(row["step_ms"], slowest)
    test.assertEqual(row["median_ms"], statistics.median(t for rnd in slowest for t in rnd))
    # What the machine did in each round, every rank's: on a CPU run the host's shares and the rank's own CPU time,
    # and no GPU figure.
    machine = row["machine"]
    test.assertEqual([len(machine)] + sorted({len(rnd) for rnd in machine}), [rounds, ranks], row["config"])
    for m in (m for rnd in machine for m in rnd):
        test.assertGreater(m["wall_s"], 0)
        test.assertGreater(m["rank_cpu_s"], 0)
        test.assertGreaterEqual(m["rank_preempted"], 0)
        if m["rank_cpu"] is not None:  # Linux: /proc/thread-self; the rank's CPUs are this test's too
            test.assertIn(m["rank_cpu"], os.sched_getaffinity(0), m)
            test.assertGreaterEqual(m["rank_migrations"], 0, m)
        if m["host_busy"] is None:
            # /proc/stat counts in clock ticks (10 ms): a round shorter than a tick may see none pass.
            test.assertLess(m["wall_s"], 0.05, m)
            test.assertIsNone(m["host_steal"], m)
        else:
            test.assertTrue(0 <= m["host_busy"] <= 1 and 0 <= m["host_steal"] <= m["host_busy"], m)
        test.assertEqual((m["gpu_sm_mhz"], m["gpu_power_w"], m["gpu_held_back_ms"]), (None, None, None))


def check_trace(test: unittest.TestCase, folder: pathlib.Path, configs: list[str], ranks: int, steps: int,
                annotation: str) -> dict[str, Any]:
    """What ``--trace folder`` leaves (perf/step_trace.py): each rank's Chrome trace of each configuration, and rank
    0's summary of every rank's steps; on the CPU no device events, and the host's annotations hold one starting
    with ``annotation`` (the framework's own ranges). Gives the summary."""
    for config in configs:
        for rank in range(ranks):
            with gzip.open(folder / f"{config}-rank{rank}.json.gz") as f:
                test.assertTrue(json.load(f)["traceEvents"], (config, rank))
    summary = json.loads((folder / "trace-summary.json").read_text())
    test.assertIn("--trace", summary["provenance"]["command"])
    test.assertEqual((summary["regime"], summary["ranks"], summary["steps"]), ("cpu", ranks, steps))
    test.assertEqual(list(summary["configs"]), configs)
    for config, per_rank in summary["configs"].items():
        test.assertEqual(len(per_rank), ranks)
        for s in per_rank:
            test.assertEqual((s["steps"], s["device_events"], s["busy_ms"]), (steps, 0, 0.0))
            test.assertGreater(s["traced_step_ms"], 0)
            test.assertTrue(any(a.startswith(annotation) for a in s["annotations_ms"]), (config, s["annotations_ms"]))
    return summary
