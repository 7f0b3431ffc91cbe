#!/usr/bin/env python3
"""Where perf/deepspeed_step.py's peak memory goes, measured on DeepSpeed's CPU accelerator: the measurement behind
perf/notebook/deepspeed_memory.md.

    python perf/experiments/deepspeed_memory.py --configs deepspeed,zpccl,deepspeed,zpccl
    python perf/experiments/deepspeed_memory.py --configs deepspeed,zpccl,deepspeed,zpccl --keep-engines

Two ranks as two nodes over gloo (zpccl's host backend) run perf/deepspeed_step.py's configurations in turn in one
pair of processes, each on a fresh engine made and released by that script's Bench, for ``--steps`` steps. The
model and config are the script's (default: the 57M GPT, DeepSpeed's default buckets) at one sequence of 64 bytes a
rank: the parameters, buckets and collective calls are the GPU run's, the activations small. ``--keep-engines``
releases engines without ``forget_engine`` (what DeepSpeed 0.19 keeps of them stays). torch's profiler records
every CPU tensor allocation and free (with its address); per configuration, rank 0 prints the bytes allocated when
it starts (what the engines before it left), its peak above that, where the peak fell, what was allocated at the
peak by where it was allocated (initialize, each step's phases, zpccl's staging), and what it left allocated.
Needs DeepSpeed (``pip install 'deepspeed>=0.19'``) and torch with gloo.
"""
from __future__ import annotations

import collections
import functools
import gc
import json
import os
import pathlib
import sys
import tempfile
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "perf"))
os.environ["DS_ACCELERATOR"] = "cpu"  # before any rank imports DeepSpeed
os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # the profiler's library logs an error for the GPU it does not find

import deepspeed_step as ds_step  # noqa: E402  (perf/deepspeed_step.py: its Bench makes and releases the engines)


def parse_args(argv: list[str] | None = None) -> Any:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default="deepspeed,zpccl,deepspeed,zpccl")
    p.add_argument("--steps", type=int, default=3, help="steps per configuration")
    p.add_argument("--keep-engines", action="store_true", help="release engines without forget_engine")
    p.add_argument("--layers", default="8")
    p.add_argument("--d-model", default="768")
    p.add_argument("--heads", default="12")
    p.add_argument("--seq", default="64")
    p.add_argument("--batch", default="1")
    ours, rest = p.parse_known_args(argv)
    configs = [c for c in ours.configs.split(",") if c]
    bench_args = ds_step.parse_args(["--cpu", "--nproc", "2", "--nodes", "2", "--layers", ours.layers, "--d-model",
                                     ours.d_model, "--heads", ours.heads, "--seq", ours.seq, "--batch", ours.batch,
                                     "--configs", ",".join(sorted(set(configs))), *rest])
    bench_args.sequence, bench_args.memory_steps, bench_args.keep_engines = configs, ours.steps, ours.keep_engines
    return bench_args


def labelled(record_function: Any, label: str, fn: Any) -> Any:
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with record_function(label):
            return fn(*args, **kwargs)

    return run


def main(args: Any) -> None:
    from torch.profiler import ProfilerActivity, profile, record_function

    import zpccl.deepspeed._collectives as zc

    bench = ds_step.Bench(args)
    if args.keep_engines:
        ds_step.forget_engine = lambda engine: None
    zc.Collectives.staging = labelled(record_function, "zpccl staging", zc.Collectives.staging)
    calls = []
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for i, name in enumerate(args.sequence):
            with record_function(f"config {i} {name}"):
                with record_function("initialize"):
                    engine, zp, _ = bench.engine(name, args.seed, args.memory_steps + 1)
                for s in range(args.memory_steps):
                    with record_function(f"step {s}"):
                        bench.step(engine, s)
                calls.append({k: v["calls"] for k, v in zp.summary().items()} if zp is not None else None)
                bench.release(engine, zp)
                if args.keep_engines:
                    bench.released.clear()  # the check of the next engine() would stop the run
                del engine, zp
                gc.collect()  # as perf/deepspeed_step.py's fresh_peak before the next configuration
    if bench.where.rank == 0:
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "trace.json")
            prof.export_chrome_trace(path)
            with open(path, encoding="utf-8") as f:
                events = json.load(f)["traceEvents"]
        for row, called in zip(analyse(events), calls):
            print(json.dumps(dict(row, zpccl_calls=called)), flush=True)


def analyse(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per configuration: the MiB allocated since the profiler started and not freed when it starts, its peak above
    its start, the innermost range the peak fell in, what was allocated at the peak by the innermost range it was
    allocated in, and what it allocated that was never freed."""
    ranges = [e for e in events if e.get("ph") == "X" and not e["name"].startswith(("aten::", "c10d::", "gloo:"))]
    configs = sorted((e for e in ranges if e["name"].startswith("config ")), key=lambda e: e["ts"])
    memory = sorted((e["ts"], e["args"]["Bytes"], e["args"]["Addr"]) for e in events if e.get("name") == "[memory]")

    def inside(ts: float, within: dict[str, Any]) -> str:
        best = None
        for r in ranges:
            if r["ts"] <= ts <= r["ts"] + r["dur"] and within["ts"] <= r["ts"] and r is not within:
                if best is None or r["dur"] < best["dur"]:
                    best = r
        return best["name"] if best is not None else "-"

    rows, level, live, j = [], 0, {}, 0  # live: address -> (bytes, when allocated)

    def take(ts: float, nbytes: int, addr: int) -> None:
        nonlocal level
        level += nbytes
        if nbytes > 0:
            live[addr] = (nbytes, ts)
        else:
            live.pop(addr, None)

    for c in configs:
        while j < len(memory) and memory[j][0] < c["ts"]:
            take(*memory[j])
            j += 1
        held = sum(nbytes for nbytes, _ in live.values())
        start, peak, peak_ts, at_peak = level, level, c["ts"], dict(live)
        while j < len(memory) and memory[j][0] <= c["ts"] + c["dur"]:
            take(*memory[j])
            if level > peak:
                peak, peak_ts, at_peak = level, memory[j][0], dict(live)
            j += 1
        by: collections.Counter[str] = collections.Counter()
        for nbytes, ts in at_peak.values():
            if ts >= c["ts"]:
                by[inside(ts, c)] += nbytes
        rows.append(dict(config=c["name"], held_at_start_mib=round(held / 2**20, 1), peak_above_start_mib=round(
            (peak - start) / 2**20, 1), peak_in=inside(peak_ts, c), allocated_at_peak_mib=mib(by)))
    for row, c in zip(rows, configs):  # what each configuration allocated that the profiler never saw freed
        left: collections.Counter[str] = collections.Counter()
        for nbytes, ts in live.values():
            if c["ts"] <= ts <= c["ts"] + c["dur"]:
                left[inside(ts, c)] += nbytes
        row["left_at_end_mib"] = mib(left)
    return rows


def mib(by: collections.Counter[str]) -> dict[str, float]:
    return {k: round(v / 2**20, 1) for k, v in by.most_common() if v >= 2**20 / 10}


if __name__ == "__main__":
    arguments = parse_args()
    ds_step.ex.launch(main, arguments)
