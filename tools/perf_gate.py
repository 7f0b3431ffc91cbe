#!/usr/bin/env python3
"""The perf gate's figures and their comparison with a recorded reference (tools/perf-gate.sh runs the measurements).

    python3 tools/perf_gate.py RESULTS_DIR [--reference FILE] [--record [--allow-dirty]] [--margin 0.03]

RESULTS_DIR holds the gate's result files: the perf binaries' JSON (perf/json_out.h; every row with its rounds) and
perf/fsdp_step.py's (``fsdp_<shape>.json``). A figure is, per row of the perf binaries, zpccl's speedup over NCCL
(the ratio of medians, spread: the least and greatest of the rounds' own ratios); per configuration of an FSDP2 step,
its step time (median, spread: the least and greatest round median) and its speedup over each NCCL configuration of
the same file (ratio of medians, spread: the rounds' own ratios).

The reference (default ``perf/gate/<GPUs>x-<model>.json``, by the machine the files' provenance names) holds the
same figures as a recorded run gave them. A figure **regressed** when its median is worse than the worst of the
reference's range by more than ``--margin`` (a fraction; default 3%): below ``lo * (1 - margin)`` where higher is
better, above ``hi * (1 + margin)`` where lower is; **improved** when better than the best of that range by as much;
else **ok**. A reference figure the run lacks is **missing**; a figure with no reference is **new**.

Exit status: 0 nothing regressed or missing; 1 something did, or the files cannot be read; 3 no reference is recorded
for this machine (``--record`` writes this run as the reference: refused when a file's source tree was dirty, unless
``--allow-dirty``).
"""
from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import re
import sys
from dataclasses import asdict, dataclass
from typing import Any

TOOLS = pathlib.Path(__file__).resolve().parent
TOP = TOOLS.parent
sys.path.insert(0, str(TOOLS))
from perf_files import is_step_file, provenance_of, rows_of, size_text  # noqa: E402

SCHEMA = "zpccl-perf-gate/1"
FLOOR = "no-comm"  # fsdp_step.py's configuration with no collective: the machine's floor, gated by its step time


@dataclass
class Figure:
    value: float
    lo: float
    hi: float
    higher_is_better: bool
    unit: str  # "x" or "ms"
    file: str = ""


def perf_figures(rows: list[dict[str, Any]], file: str) -> dict[str, Figure]:
    """zpccl's speedup over NCCL per row that has one, named "op intB regime size" (gradient variants named too)."""
    out = {}
    for r in rows:
        if r.get("baseline") != "nccl" or r.get("speedup") is None:
            continue
        bits = f" int{r['bits']}" if r.get("bits") else ""
        grad = f" {r['grad']}" if r.get("grad") else ""
        name = f"{r['op']}{bits}{grad} {r.get('regime') or '-'} {size_text(int(r['size']))}"
        if name in out:
            raise ValueError(f"{file}: two rows named {name}")
        lo, hi = r.get("speedup_min"), r.get("speedup_max")
        v = float(r["speedup"])
        out[name] = Figure(v, v if lo is None else float(lo), v if hi is None else float(hi), True, "x", file)
    return out


def fsdp_figures(data: dict[str, Any], shape: str, file: str) -> dict[str, Figure]:
    """An FSDP2 step file's step times and each configuration's speedup over each NCCL configuration."""
    rows = {r["config"]: r for r in data.get("rows", [])}
    out = {}
    for name, r in rows.items():
        rounds = r.get("round_median_ms") or [r["median_ms"]]
        out[f"fsdp {shape} {name} step"] = Figure(r["median_ms"], min(rounds), max(rounds), False, "ms", file)
    for base in ("nccl", "nccl-noreshard", "nccl-2comm"):
        if base not in rows:
            continue
        for name, r in rows.items():
            # zpccl's ratios to each NCCL step, and the ablation's to the step it changes: what the targets name.
            # The floor is gated by its step time alone.
            ablation = name == "nccl-2comm" and base == "nccl-noreshard"
            if name == FLOOR or (name.startswith("nccl") and not ablation):
                continue
            a, b = rows[base].get("round_median_ms") or [], r.get("round_median_ms") or []
            ratio = rows[base]["median_ms"] / r["median_ms"]
            per_round = [x / y for x, y in zip(a, b)] if a and len(a) == len(b) else [ratio]
            out[f"fsdp {shape} {name} vs {base}"] = Figure(ratio, min(per_round), max(per_round), True, "x", file)
    return out


def collect(folder: pathlib.Path) -> tuple[dict[str, Figure], list[dict[str, Any]]]:
    """Every figure of the folder's result files, and each file's provenance (with its file name)."""
    figures: dict[str, Figure] = {}
    records = []
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except ValueError as e:
            raise ValueError(f"{path}: not JSON ({e})") from None
        fsdp = re.fullmatch(r"fsdp_(\w+)\.json", path.name)  # the shape names the step's figures
        if is_step_file(data) != bool(fsdp):
            raise ValueError(f"{path}: a training step's file must be named fsdp_<shape>.json, and only such a file"
                             " may be")
        mine = fsdp_figures(data, fsdp.group(1), path.name) if fsdp else perf_figures(rows_of(data), path.name)
        if not mine:
            continue
        clash = set(mine) & set(figures)
        if clash:
            raise ValueError(f"{path}: figures also in another file: {', '.join(sorted(clash))}")
        figures.update(mine)
        record = provenance_of(data)
        records.append(dict(record or {}, file=path.name))
    return figures, records


def machine_of(records: list[dict[str, Any]]) -> str:
    """"1x-nvidia-h200" from the files' provenance: the GPUs they ran on (every file must agree)."""
    keys = set()
    for r in records:
        gpu = r.get("gpu") or {}
        if gpu.get("count"):
            models = "-".join(gpu.get("models") or ["unknown"])
            keys.add(re.sub(r"[^a-z0-9]+", "-", f"{gpu['count']}x-{models}".lower()).strip("-"))
    if len(keys) != 1:
        raise ValueError(f"the result files name {'no GPU' if not keys else 'several machines: ' + ', '.join(keys)}")
    return keys.pop()


def verdict(ref: Figure, now: Figure, margin: float) -> str:
    if ref.higher_is_better:
        if now.value < ref.lo * (1 - margin):
            return "REGRESSED"
        return "improved" if now.value > ref.hi * (1 + margin) else "ok"
    if now.value > ref.hi * (1 + margin):
        return "REGRESSED"
    return "improved" if now.value < ref.lo * (1 - margin) else "ok"


def compare(reference: dict[str, Figure], figures: dict[str, Figure], margin: float) -> list[tuple[str, str]]:
    """(figure, verdict) for every figure of either side, reference order first."""
    out = [(name, verdict(ref, figures[name], margin) if name in figures else "MISSING")
           for name, ref in reference.items()]
    return out + [(name, "new") for name in figures if name not in reference]


def fmt(f: Figure | None) -> str:
    if f is None:
        return "-"
    unit = "x" if f.unit == "x" else " ms"
    spread = f" ({f.lo:.2f}-{f.hi:.2f})" if (f.lo, f.hi) != (f.value, f.value) else ""
    return f"{f.value:.2f}{unit}{spread}"


def report(reference: dict[str, Figure], figures: dict[str, Figure], verdicts: list[tuple[str, str]],
           margin: float) -> str:
    width = max([len("figure")] + [len(n) for n, _ in verdicts])
    lines = [f"{'figure':<{width}}  {'reference (range)':>24}  {'now (range)':>24}  verdict"]
    for name, v in verdicts:
        lines.append(f"{name:<{width}}  {fmt(reference.get(name)):>24}  {fmt(figures.get(name)):>24}  {v}")
    counts = {k: sum(1 for _, v in verdicts if v == k) for k in ("REGRESSED", "MISSING", "improved", "ok", "new")}
    lines.append(f"{len(verdicts)} figures: " + ", ".join(f"{n} {k.lower()}" for k, n in counts.items() if n) +
                 f" (margin {100 * margin:.0f}% beyond the reference's range)")
    bad = [n for n, v in verdicts if v in ("REGRESSED", "MISSING")]
    floors = [n for n in bad if re.fullmatch(rf"fsdp \w+ {FLOOR} step", n)]
    if floors:
        # No zpccl or NCCL code runs in the floor: when it slows, the machine did (fsdp.md: the step's two modes).
        lines.append(f"{', '.join(floors)}: the no-network floor ran slower than its reference, and no collective "
                     "runs in it: the machine was slower in this run, so its FSDP2 steps do not judge the code; "
                     "run the gate again")
    lines.append("GATE: " + ("FAILED: " + ", ".join(bad) if bad else "OK"))
    return "\n".join(lines)


def load_reference(path: pathlib.Path) -> dict[str, Figure]:
    data = json.loads(path.read_text())
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a perf gate reference (schema {data.get('schema')!r})")
    return {name: Figure(**f) for name, f in data["figures"].items()}


def record(path: pathlib.Path, figures: dict[str, Figure], records: list[dict[str, Any]], machine: str) -> None:
    commits = sorted({(r.get("commit") or "unknown") + ("+dirty" if r.get("dirty") else "") for r in records})
    doc = dict(schema=SCHEMA, machine=machine, recorded_utc=datetime.datetime.now(datetime.timezone.utc)
               .isoformat(timespec="seconds"), commits=commits, files=records,
               figures={name: asdict(f) for name, f in figures.items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", help="the folder of the gate run's result files")
    p.add_argument("--reference", help="default: perf/gate/<machine>.json, by the files' provenance")
    p.add_argument("--record", action="store_true", help="write this run as the reference")
    p.add_argument("--allow-dirty", action="store_true", help="record even from files of a dirty source tree")
    p.add_argument("--margin", type=float, default=0.03, help="beyond the reference's range, as a fraction")
    args = p.parse_args(argv)
    if not 0 <= args.margin < 1:
        p.error("--margin is a fraction in [0, 1)")
    try:
        figures, records = collect(pathlib.Path(args.results))
        if not figures:
            raise ValueError(f"{args.results} holds no gate figures (perf binaries' or fsdp_step's JSON)")
        machine = machine_of(records)
    except (OSError, ValueError, KeyError) as e:
        print(f"perf_gate: {e}")
        return 1
    path = pathlib.Path(args.reference) if args.reference else TOP / "perf" / "gate" / f"{machine}.json"
    if args.record:
        dirty = [r["file"] for r in records if r.get("dirty") is not False]
        if dirty and not args.allow_dirty:
            print(f"perf_gate: not recorded: {', '.join(dirty)} came from a dirty (or unknown) source tree; commit, "
                  "rerun, or pass --allow-dirty")
            return 1
        record(path, figures, records, machine)
        print(f"perf_gate: recorded {len(figures)} figures of {machine} as the reference: {path}")
        return 0
    if not path.exists():
        print(f"perf_gate: no reference recorded for {machine} yet ({path}): {len(figures)} figures measured, none "
              "compared. Rerun with --record (tools/perf-gate.sh --record) to make this run the reference.")
        return 3
    try:
        reference = load_reference(path)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"perf_gate: {e}")
        return 1
    verdicts = compare(reference, figures, args.margin)
    print(f"perf gate: {machine}, reference {path}")
    print(report(reference, figures, verdicts, args.margin))
    return 1 if any(v in ("REGRESSED", "MISSING") for _, v in verdicts) else 0


if __name__ == "__main__":
    sys.exit(main())
