"""The summary of tools/bisect-fsdp-step.sh: one line a bisected entry (a commit, or one commit's fsdp_step with
another's zpccl), from the manifest its --prepare wrote and the JSON files its --run left.

    python3 tools/bisect_fsdp_step.py MANIFEST RESULTS [--json OUT]
        [--results-file FILE --commit HASH --command TEXT]

Every run file is one perf/fsdp_step.py call of that entry (``<label>.r<k>.json``). A run's figure is the
median its script reports: over rank 0's steps for fsdp_step.py before provenance (those rows carry no per-rank
times), over each step's slowest rank after; where the per-rank times are there, rank 0's median is given too, so
that old and new scripts compare. An entry's figure is the median of its runs' figures, and its ratio NCCL's over
zpccl's. The table says which timing each entry's script used and, where the files have rounds, zpccl's median
round by round (a step that slows as a process goes through its rounds shows there).

--results-file writes what perf/results keeps of a bisect: the summary, every run's file as it came back, and the
provenance of the call (the tool's tree, ``--commit``, and its command line, ``--command``, over the machine facts
of the newest run that recorded provenance)."""
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


WHAT = ("tools/bisect-fsdp-step.sh over the FSDP2 small step (perf/fsdp_step.py --shape small, nccl-noreshard "
        "against zpccl-hpz), each entry with its own library, package and script; runs alternate the entries, "
        "{rounds} rounds of {steps} timed steps a run. Runs whose script records provenance keep it (the entry they "
        "stand for); the others stand for the entry the summary names.")


def results_document(rows: list[dict[str, Any]], results: pathlib.Path, commit: str, command: str) -> dict[str, Any]:
    """The perf/results file of a bisect: provenance, what was run, the summary rows and every run's file."""
    runs = {f[: -len(".json")]: json.loads((results / f).read_text()) for r in rows for f in r["files"]}
    timed = [d for d in runs.values() if d.get("provenance")]
    if not timed:
        raise ValueError(f"no run file in {results} records provenance: the call's machine is unknown")
    newest = max(timed, key=lambda d: d["provenance"].get("time_utc", ""))
    provenance = dict(newest["provenance"], commit=commit, dirty=False, command=command)
    shape = next((row for d in timed for row in d.get("rows", []) if row.get("config") == ZPCCL), {})
    rounds = len(shape.get("round_median_ms") or []) or "?"
    steps = shape.get("steps", "?")
    if isinstance(steps, int) and isinstance(rounds, int):
        steps //= rounds
    return {"provenance": provenance, "what": WHAT.format(rounds=rounds, steps=steps),
            "regime": provenance.get("regime"), "summary": rows, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("manifest", type=pathlib.Path)
    p.add_argument("results", type=pathlib.Path)
    p.add_argument("--json", type=pathlib.Path, help="also write the rows here")
    p.add_argument("--results-file", type=pathlib.Path, help="write the perf/results file of this bisect here")
    p.add_argument("--commit", help="with --results-file: the full hash of the tree the bisect tool ran from")
    p.add_argument("--command", help="with --results-file: the bisect's command line as it was run")
    args = p.parse_args(argv)
    if args.results_file and not (args.commit and args.command):
        p.error("--results-file needs --commit (the tool's tree) and --command (the call as it was run)")
    if not args.manifest.is_file():
        p.error(f"no manifest at {args.manifest} (tools/bisect-fsdp-step.sh --prepare writes it)")
    if not args.results.is_dir():
        p.error(f"{args.results} is not a folder")
    entries = read_manifest(args.manifest)
    rows = summary_rows(entries, collect(entries, args.results))
    print(render(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    if args.results_file:
        doc = results_document(rows, args.results, args.commit, args.command)
        args.results_file.write_text(json.dumps(doc, indent=1) + "\n")
    return 0 if any(r["runs"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
