"""The summary of tools/bisect-fsdp-step.sh: one line a bisected entry (a commit, or one commit's fsdp_step with
another's zpccl), from the manifest its --prepare wrote and the JSON files its --run left.

    python3 tools/bisect_fsdp_step.py MANIFEST RESULTS [--json OUT]

Every run file is one perf/fsdp_step.py call of that entry (``<label>.r<k>.json``). A run's figure is the
median its script reports: over rank 0's steps for fsdp_step.py before provenance (those rows carry no per-rank
times), over each step's slowest rank after; where the per-rank times are there, rank 0's median is given too, so
that old and new scripts compare. An entry's figure is the median of its runs' figures, and its ratio NCCL's over
zpccl's. The table says which timing each entry's script used and, where the files have rounds, zpccl's median
round by round (a step that slows as a process goes through its rounds shows there)."""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
from dataclasses import dataclass, field
from typing import Any

ZPCCL = "zpccl-hpz"
NCCL = "nccl-noreshard"


@dataclass
class Entry:
    """One line of the manifest: what --prepare archived for it."""

    label: str
    script: str  # commit whose perf/fsdp_step.py and examples run
    zpccl: str  # commit whose tools/python/zpccl and library run
    lib_key: str
    names: list[str]
    subject: str


@dataclass
class Runs:
    """One entry's runs: per run, each configuration's reported median and rank 0's (None where not recorded)."""

    zpccl: list[float] = field(default_factory=list)
    nccl: list[float] = field(default_factory=list)
    zpccl_rank0: list[float] = field(default_factory=list)
    #: zpccl's median of each round of each run, where the file has rounds (slowest rank a step): a step that
    #: slows from round to round within a process shows here.
    zpccl_rounds: list[list[float]] = field(default_factory=list)
    timing: set[str] = field(default_factory=set)
    files: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def read_manifest(path: pathlib.Path) -> list[Entry]:
    """The entries of a manifest (tab-separated: label, script commit, zpccl commit, library key, names
    comma-separated, subject), in its order; lines starting with '#' are comments."""
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) != 6:
            raise ValueError(f"{path}:{n}: {len(parts)} tab-separated fields, not 6")
        label, script, zpccl, lib_key, names, subject = parts
        out.append(Entry(label, script, zpccl, lib_key, names.split(","), subject))
    return out


def run_figures(doc: dict[str, Any]) -> dict[str, tuple[float, float | None, str]]:
    """config -> (the median the script reports, rank 0's median or None, "slowest rank" or "rank 0")."""
    out = {}
    for row in doc.get("rows", []):
        per_rank = row.get("step_ms_per_rank")
        rank0 = None
        if per_rank:
            rank0 = statistics.median(t for rnd in per_rank for t in rnd[0])
        out[row["config"]] = (float(row["median_ms"]), rank0, "slowest rank" if row.get("step_ms") else "rank 0")
    return out


def collect(entries: list[Entry], results: pathlib.Path) -> dict[str, Runs]:
    """Each entry's runs from ``<label>.r<k>.json`` in ``results``; a run whose log exists without its JSON, or
    whose JSON lacks a configuration, is listed as failed."""
    by_label: dict[str, Runs] = {e.label: Runs() for e in entries}
    for e in entries:
        runs = by_label[e.label]
        logs = sorted(results.glob(f"{glob_escape(e.label)}.r*.log"))
        for log in logs:
            js = log.with_suffix(".json")
            if not js.exists():
                runs.failed.append(log.name)
                continue
            figures = run_figures(json.loads(js.read_text()))
            if ZPCCL not in figures or NCCL not in figures:
                runs.failed.append(js.name)
                continue
            runs.files.append(js.name)
            z, z0, timing = figures[ZPCCL]
            runs.zpccl.append(z)
            runs.nccl.append(figures[NCCL][0])
            if z0 is not None:
                runs.zpccl_rank0.append(z0)
            rounds = round_medians(json.loads(js.read_text()), ZPCCL)
            if rounds:
                runs.zpccl_rounds.append(rounds)
            runs.timing.add(timing)
    return by_label


def round_medians(doc: dict[str, Any], config: str) -> list[float]:
    """A configuration's median of each round, in round order ([] where the file has no rounds)."""
    for row in doc.get("rows", []):
        if row["config"] == config:
            return [float(x) for x in row.get("round_median_ms") or []]
    return []


def by_round(runs: list[list[float]]) -> list[float]:
    """The median over runs of each round's median, round by round (as far as every run goes)."""
    depth = min((len(r) for r in runs), default=0)
    return [statistics.median(r[i] for r in runs) for i in range(depth)]


def glob_escape(text: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)


def summary_rows(entries: list[Entry], runs: dict[str, Runs]) -> list[dict[str, Any]]:
    rows = []
    for e in entries:
        r = runs[e.label]
        z = statistics.median(r.zpccl) if r.zpccl else None
        n = statistics.median(r.nccl) if r.nccl else None
        rows.append(dict(label=e.label, names=e.names, script=e.script, zpccl=e.zpccl, subject=e.subject,
                         runs=len(r.zpccl), failed=r.failed, files=r.files, timing=sorted(r.timing),
                         zpccl_ms=z, zpccl_runs_ms=r.zpccl, nccl_ms=n, nccl_runs_ms=r.nccl,
                         zpccl_rank0_ms=statistics.median(r.zpccl_rank0) if r.zpccl_rank0 else None,
                         zpccl_by_round_ms=by_round(r.zpccl_rounds),
                         ratio=n / z if z and n else None))
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'entry':<20} {'names':<22} {'runs':>4} {'zpccl ms':>9} {'(runs min-max)':>15} {'rank 0':>7} "
             f"{'NCCL ms':>8} {'ratio':>6}  timing / subject"]
    for r in rows:
        fig = lambda v: f"{v:.1f}" if v is not None else "-"  # noqa: E731
        spread = f"{min(r['zpccl_runs_ms']):.1f}-{max(r['zpccl_runs_ms']):.1f}" if r["zpccl_runs_ms"] else "-"
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] else "-"
        note = "/".join(r["timing"]) or "no run"
        if r["failed"]:
            note += f", {len(r['failed'])} failed"
        if r["zpccl_by_round_ms"]:
            note += ", rounds " + " ".join(f"{v:.0f}" for v in r["zpccl_by_round_ms"])
        lines.append(f"{r['label']:<20} {','.join(r['names'])[:22]:<22} {r['runs']:>4} {fig(r['zpccl_ms']):>9} "
                     f"{spread:>15} {fig(r['zpccl_rank0_ms']):>7} {fig(r['nccl_ms']):>8} {ratio:>6}  "
                     f"{note}; {r['subject'][:60]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("manifest", type=pathlib.Path)
    p.add_argument("results", type=pathlib.Path)
    p.add_argument("--json", type=pathlib.Path, help="also write the rows here")
    args = p.parse_args(argv)
    if not args.manifest.is_file():
        p.error(f"no manifest at {args.manifest} (tools/bisect-fsdp-step.sh --prepare writes it)")
    if not args.results.is_dir():
        p.error(f"{args.results} is not a folder")
    entries = read_manifest(args.manifest)
    rows = summary_rows(entries, collect(entries, args.results))
    print(render(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if any(r["runs"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
