"""Where a training step's time goes: torch's profiler around one configuration's steps, and a summary small enough
to bring back from a GPU machine (``--trace DIR`` of perf/fsdp_step.py, ddp_step.py and deepspeed_step.py).

Nsight Systems is not on the lent GPU machines, torch's profiler (Kineto, CUPTI underneath) is. After the timed rounds,
``--trace`` runs one more round, untimed in the rows, of every configuration with the profiler around its timed steps
(after the warmup): each rank writes its Chrome trace, ``DIR/CONFIG-rankR.json.gz`` (chrome://tracing or Perfetto
open it), and rank 0 writes ``DIR/trace-summary.json`` (every rank's summary, with the run's provenance) and prints
a table. A rank's summary, per step (the traced steps' means):

=====================  =========================================================================================
``kernel_ms``          device time by class (:func:`kernel_class`): ``compute``, ``nccl``, ``zpccl`` (the kernels
                       of namespace ``zp``), ``memory`` (copies and fills the runtime makes)
``busy_ms``            the union of every device interval, all streams: the device held by this process
``compute_busy_ms``    the union of the compute kernels
``comm_exposed_ms``    the union of the nccl and zpccl kernels not covered by a compute kernel of the same rank: the
                       communication the step does not hide behind its own compute
``kernels``            kernels by class, per step
``annotations_ms``     host time in each ``record_function`` range (FSDP's ``FSDP::...``, DeepSpeed's, the
                       profiler's step marks), the longest first
=====================  =========================================================================================

Each process sees only its own kernels: where ranks share one GPU (net-on1gpu), a rank's busy time leaves out the
other rank's, which the GPU ran in between (time slices) or beside (MPS). On a CPU run (``--cpu``) there are no device
events: the summary has the host's annotations alone (a smoke test).
"""
from __future__ import annotations

import gzip
import json
import os
import pathlib
import shutil
import tempfile
from typing import Any, Iterable

CLASSES = ("compute", "nccl", "zpccl", "memory")
COMM = ("nccl", "zpccl")
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}  # the Chrome trace's categories of device events
TOP_ANNOTATIONS = 16


def kernel_class(name: str, cat: str = "kernel") -> str:
    """The class of a device event of the Chrome trace: ``memory`` for the runtime's copies and fills, ``nccl`` for
    NCCL's kernels, ``zpccl`` for zpccl's (namespace ``zp``), ``compute`` for every other kernel."""
    if cat != "kernel":
        return "memory"
    if name.startswith("nccl") or "ncclDevKernel" in name or "ncclKernel" in name:
        return "nccl"
    if "zp::" in name:
        return "zpccl"
    return "compute"


def merge(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``(start, end)`` intervals, as disjoint intervals in order."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def length(intervals: list[tuple[float, float]]) -> float:
    """The summed lengths of ``intervals`` (of a union from :func:`merge`: its length)."""
    return sum(end - start for start, end in intervals)


def overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """The length of the intersection of two unions (each from :func:`merge`)."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def summarize(trace: dict[str, Any], steps: int) -> dict[str, Any]:
    """A rank's summary (the module's table) from its Chrome trace (``traceEvents``; times in microseconds) over
    ``steps`` steps."""
    per_class: dict[str, list[tuple[float, float]]] = {c: [] for c in CLASSES}
    annotations: dict[str, float] = {}
    for e in trace.get("traceEvents", []):
        if e.get("ph") != "X" or "dur" not in e:
            continue
        start, dur = float(e["ts"]), float(e["dur"])
        if e.get("cat") in DEVICE_CATS:
            per_class[kernel_class(str(e.get("name", "")), e["cat"])].append((start, start + dur))
        elif e.get("cat") == "user_annotation":
            annotations[e["name"]] = annotations.get(e["name"], 0.0) + dur
    ms = 1e-3 / steps  # microseconds in all to milliseconds a step
    merged = {c: merge(v) for c, v in per_class.items()}
    comm = merge(i for c in COMM for i in merged[c])
    top = sorted(annotations.items(), key=lambda kv: -kv[1])[:TOP_ANNOTATIONS]
    return dict(
        steps=steps,
        device_events=sum(len(v) for v in per_class.values()),
        kernel_ms={c: length(per_class[c]) * ms for c in CLASSES},
        kernels={c: len(per_class[c]) / steps for c in CLASSES},
        busy_ms=length(merge(i for v in merged.values() for i in v)) * ms,
        compute_busy_ms=length(merged["compute"]) * ms,
        comm_exposed_ms=(length(comm) - overlap(comm, merged["compute"])) * ms,
        annotations_ms={name: t * ms for name, t in top})


class Tracer:
    """torch's profiler around a block of ``steps`` steps; on exit this rank's trace goes to ``path`` (gzipped)
    and its summary to ``self.summary``."""

    def __init__(self, torch: Any, on_cuda: bool, path: pathlib.Path, steps: int) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if on_cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profile = torch.profiler.profile(activities=activities)
        self.path, self.steps = path, steps
        self.summary: dict[str, Any] | None = None

    def __enter__(self) -> "Tracer":
        self.profile.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.profile.__exit__(*exc)
        if exc[0] is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            plain = os.path.join(tmp, "trace.json")
            self.profile.export_chrome_trace(plain)
            with open(plain, "rb") as f:
                trace = json.loads(f.read())
                f.seek(0)
                with gzip.open(self.path, "wb") as out:
                    shutil.copyfileobj(f, out)
        self.summary = summarize(trace, self.steps)


def table(summaries: dict[str, list[dict[str, Any]]]) -> list[str]:
    """One line a configuration and rank: device time by class, busy, exposed communication (ms a step)."""
    lines = [f"# {'configuration':<16} {'rank':>4} {'compute':>8} {'nccl':>7} {'zpccl':>7} {'memory':>7} "
             f"{'busy':>7} {'comm exposed':>12}   (device ms a step, traced)"]
    for name, ranks in summaries.items():
        for rank, s in enumerate(ranks):
            k = s["kernel_ms"]
            lines.append(f"# {name:<16} {rank:>4} {k['compute']:>8.1f} {k['nccl']:>7.1f} {k['zpccl']:>7.1f} "
                         f"{k['memory']:>7.1f} {s['busy_ms']:>7.1f} {s['comm_exposed_ms']:>12.1f}")
    return lines
