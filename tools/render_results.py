#!/usr/bin/env python3
"""Renders the tables of perf/RESULTS.md, the figures README.md quotes and the tables of perf/notebook/accuracy.md,
fsdp.md, gradient_rounding.md, kernels.md and slow_links.md from perf/results/*.json.

    python3 tools/render_results.py            # rewrite the tables in place
    python3 tools/render_results.py --check    # exit 1, with a diff, when a document differs from the files

A table lives between two marker comments, ``<!-- table: NAME -->`` and ``<!-- end table -->``; everything
outside them is prose and stays as written. NAME is one of TABLES below, which says which files, rows and sizes
the table shows. Every row names its sources by letter, and the lines under the table name each file and the
commit it was measured at: from the file's provenance (perf/provenance.py, perf/provenance.h), else from a
"commit" the file records itself, else from perf/results/legacy.json, the hand-kept manifest of the files written
before provenance was recorded (their commit and command as RESULTS.md's prose gave them, recorded after the
fact). A file measured on a tree that did not land names, in its provenance, the commit on main that holds its
code (``code_commit``), shown beside its own. A file none of these dates is an error, as are a missing file, a row
that is not there and a row that is there twice: a table shows only what a file holds. Loss tables take their files, baselines, targets and statistics
from tools/loss_stats.py's campaigns. tools/run-tests.sh runs ``--check``.
"""
from __future__ import annotations

import argparse
import difflib
import json
import pathlib
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

TOP = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TOP / "tools"))
import loss_stats as ls  # noqa: E402  (the loss runs' campaigns and their paired statistics)
from perf_files import exchanging_calls, provenance_of, size_of  # noqa: E402
DOCUMENTS = ("perf/RESULTS.md", "README.md", "perf/notebook/accuracy.md", "perf/notebook/fsdp.md",
             "perf/notebook/gradient_rounding.md", "perf/notebook/kernels.md", "perf/notebook/slow_links.md")
MARKER = re.compile(r"(<!-- table: ([\w-]+) -->\n)(.*?)(<!-- end table -->)", re.S)
MB = 1 << 20


class RenderError(Exception):
    """A table that the files cannot give; the message names the table, the file and what is missing."""


def wire_limit(bits: int, block: int = 256) -> float:
    """bf16 bytes over a quantized payload's (codes and an fp32 scale per block): the most a link-bound call gains."""
    return 2 * block / (block * bits / 8 + 4)


def num(v: float) -> str:
    return f"{v:.2f}" if abs(v) < 10 else f"{v:.1f}"


# ---- the files ---------------------------------------------------------------------------------------------


@dataclass
class Source:
    name: str
    commit: str  # short
    how: str  # "" (its provenance), "recorded in the file", "legacy manifest", or where an unlanded tree's code is


class Store:
    """The result files of one folder, read once each, and where each one's commit comes from."""

    def __init__(self, folder: pathlib.Path) -> None:
        self.folder = folder
        self._files: dict[str, Any] = {}
        legacy = folder / "legacy.json"
        self.legacy = json.loads(legacy.read_text())["files"] if legacy.exists() else {}

    def data(self, name: str) -> Any:
        if name not in self._files:
            path = self.folder / name
            try:
                self._files[name] = json.loads(path.read_text())
            except (OSError, ValueError) as e:
                raise RenderError(f"{path}: cannot be read ({e})") from None
        return self._files[name]

    def source(self, name: str) -> Source:
        data = self.data(name)
        record = provenance_of(data)
        if record and record.get("commit"):
            code = record.get("code_commit")
            how = f"not on main; its code is {code[:7]}'s" if code else ""
            return Source(name, record["commit"][:7] + ("+dirty" if record.get("dirty") else ""), how)
        if isinstance(data, dict) and isinstance(data.get("commit"), str) and data["commit"]:
            return Source(name, data["commit"][:7], "recorded in the file")
        if name in self.legacy:
            return Source(name, self.legacy[name]["commit"][:7], "legacy manifest")
        raise RenderError(f"{name}: no provenance, no commit of its own and no entry in perf/results/legacy.json")

    def perf_rows(self, name: str) -> list[dict[str, Any]]:
        data = self.data(name)
        rows = data.get("rows") if isinstance(data, dict) else data
        return [r for r in rows or [] if isinstance(r, dict) and "op" in r]


@dataclass
class Pick:
    """Perf rows of one file: op, and whatever else must match (bits, regime, nodes, grad); sizes they cover."""

    file: str
    op: str
    sizes: tuple[str, ...] | None = None  # None: every size of the table
    where: dict[str, Any] = field(default_factory=dict)

    def rows(self, store: Store, size: int) -> list[dict[str, Any]]:
        where = dict(self.where)
        where.setdefault("grad", None)
        out = []
        for r in store.perf_rows(self.file):
            if r.get("op") != self.op or abs((r.get("size") or 0) - size) > size * 0.01:
                continue
            if all(r.get(k) == v for k, v in where.items()):
                out.append(r)
        return out

    def one(self, store: Store, size: int, table: str) -> dict[str, Any]:
        rows = self.rows(store, size)
        if len(rows) != 1:
            what = ", ".join(f"{k}={v}" for k, v in self.where.items())
            raise RenderError(f"table {table}: {self.file} holds {len(rows)} rows of {self.op} ({what}) at "
                              f"{size // MB}M, not one")
        return rows[0]


# ---- a table being built -----------------------------------------------------------------------------------


def source_letter(index: int) -> str:
    """A source's letter by its place: a .. z, then aa, ab .. as a spreadsheet names its columns."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    return source_letter(index // 26 - 1) + letters[index % 26] if index >= 26 else letters[index]


class Table:
    """Markdown rows, each with the letters of its sources, and the source lines under them."""

    def __init__(self, store: Store, name: str, header: list[str]) -> None:
        self.store, self.name, self.header = store, name, header
        self.rows: list[list[str]] = []
        self.sources: list[Source] = []

    def index(self, file: str) -> int:
        """The file's place among the table's sources, added at its first use."""
        names = [s.name for s in self.sources]
        if file not in names:
            self.sources.append(self.store.source(file))
            names.append(file)
        return names.index(file)

    def add(self, cells: list[str], files: list[str]) -> None:
        letters = [source_letter(i) for i in sorted({self.index(f) for f in files})]
        self.rows.append(cells + [", ".join(letters)])

    def lines(self) -> list[str]:
        header = self.header + ["src"]
        out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        out += ["| " + " | ".join(r) + " |" for r in self.rows]
        keys = [f"{source_letter(i)}: `{s.name}`, {s.commit}" + (f" ({s.how})" if s.how else "")
                for i, s in enumerate(self.sources)]
        return out + ["", "Sources: " + "; ".join(keys) + "."]


# ---- kinds of table ----------------------------------------------------------------------------------------


def cell_speedup(row: dict[str, Any], target: float | None, limit: float | None) -> str:
    v = row.get("speedup")
    if v is None:
        return "-"
    text = f"{v:.2f}"
    if limit is not None and v > limit:
        text += "†"
    return f"**{text}**" if target is not None and v >= target else text


@dataclass
class Line:
    """One row of a size table: a label and the picks that give its cells (each covering some sizes)."""

    label: str
    picks: list[Pick]
    value: str = "speedup"  # speedup, speedup-all (every matching row, " / "), nccl-us, nccl-ms
    target: tuple[float, str] | None = None  # bold from this ratio, at and above this size
    limit: bool = False  # mark ratios above the wire-bytes limit of the row's bits


def size_table(store: Store, name: str, first: str, sizes: list[str], lines: list[Line]) -> Table:
    t = Table(store, name, [first] + sizes)
    for line in lines:
        cells, files = [], []
        for s in sizes:
            pick = next((p for p in line.picks if p.sizes is None or s in p.sizes), None)
            if pick is None:
                cells.append("-")
                continue
            files.append(pick.file)
            size = size_of(s)
            if line.value == "speedup-all":
                rows = pick.rows(store, size)
                if not rows:
                    raise RenderError(f"table {name}: {pick.file} holds no {pick.op} at {s}")
                cells.append(" / ".join(f"{r['speedup']:.2f}" for r in rows))
                continue
            row = pick.one(store, size, name)
            if line.value == "speedup":
                target = line.target[0] if line.target and size >= size_of(line.target[1]) else None
                cells.append(cell_speedup(row, target, wire_limit(row["bits"], row.get("block") or 256)
                                          if line.limit and row.get("bits") else None))
            else:
                us = (row.get("nccl") or {}).get("time_us")
                cells.append("-" if us is None else num(us / 1000 if line.value == "nccl-ms" else us))
        t.add([line.label] + cells, files)
    return t


def collective_table(store: Store, name: str, op: str, sizes: list[str], parts: list[tuple[str, tuple | None]],
                     regimes: list[str], order: tuple[int, int], target: dict[int, tuple[float, str]]) -> Table:
    """qwZ's or qgZ's speedup per bit width and size in each regime, from one or more files (each covering some
    sizes), with NCCL's bf16 time under each regime's rows (ms over sockets, else us)."""
    lines = []
    for regime in regimes:
        prefix = f"{regime} " if len(regimes) > 1 else ""
        where = dict(regime=regime)
        lines += [Line(f"{prefix}int{b}", [Pick(f, op, s, dict(where, bits=b)) for f, s in parts],
                       target=target.get(b), limit=True) for b in order]
        ms = regime.startswith("net")
        lines.append(Line(f"{prefix}NCCL bf16, {'ms' if ms else 'us'}",
                          [Pick(f, op, s, dict(where, bits=order[0])) for f, s in parts],
                          value="nccl-ms" if ms else "nccl-us"))
    return size_table(store, name, "", sizes, lines)


def in_place_table(store: Store, name: str, op: str, size: str, files: list[tuple[str, str]],
                   order: tuple[int, ...]) -> Table:
    """A collective's in-place call beside its out-of-place calls and NCCL's bf16 baseline of the same run, one row
    a run and bit width: milliseconds (median and range of the rounds; the perf binaries time the in-place variant in
    the first round only) and NCCL's median over each."""
    t = Table(store, name, ["run", "bits", "out of place ms (median, range)", "in place ms", "NCCL bf16 ms",
                            "vs NCCL: out of place", "vs NCCL: in place"])

    def ms(us: float) -> str:
        return f"{us / 1e3:.1f}"

    for file, label in files:
        for bits in order:
            row = Pick(file, op, where=dict(bits=bits)).one(store, size_of(size), name)
            oop, ip, nccl = row["oop"], row["ip"], row["nccl"]
            t.add([label, f"int{bits}", f"{ms(oop['time_us'])} ({ms(oop['min_us'])}-{ms(oop['max_us'])})",
                   ms(ip["time_us"]), ms(nccl["time_us"]), f"{row['speedup']:.2f}x",
                   f"{nccl['time_us'] / ip['time_us']:.2f}x"], [file])
    return t


def ratio_cell(base: dict[str, Any], row: dict[str, Any]) -> str:
    """A step row's ratio to a baseline row of the same run: medians, and in brackets the least and greatest ratio of
    their rounds' medians where both have the same rounds."""
    text = f"{base['median_ms'] / row['median_ms']:.2f}x"
    a, z = base.get("round_median_ms") or [], row.get("round_median_ms") or []
    if a and len(a) == len(z):
        ratios = [x / y for x, y in zip(a, z)]
        text += f" ({min(ratios):.2f}-{max(ratios):.2f})"
    return text


def sent_cell(row: dict[str, Any]) -> str:
    """MiB a rank sent a step, per collective (step files' ``sent_mib``, or ddp_step's ``zpccl_sent_mib``)."""
    sent = row.get("sent_mib") or ({"zpccl": row["zpccl_sent_mib"]} if row.get("zpccl_sent_mib") else {})
    return " + ".join(f"{v:.0f} {k.replace('_', '-')}" for k, v in sorted(sent.items()) if v >= 0.5) or "-"


def fsdp_step_table(store: Store, name: str, files: list[tuple[str, str]], configs: list[tuple[str, str]],
                    first: str = "shape") -> Table:
    """FSDP2 step files (each a shape, or what else ``first`` names): each configuration's step time (median,
    range), tokens/s, peak memory, bytes sent, and its ratio to FSDP2 + NCCL at either resharding (medians; with
    rounds, their least and greatest)."""
    t = Table(store, name, [first, "configuration", "reshard_after_forward", "step ms (median, range)", "tokens/s",
                            "peak MiB / rank", "sent MiB / step / rank", "vs NCCL True", "vs NCCL False"])
    for file, shape in files:
        rows = {r["config"]: r for r in store.data(file)["rows"]}

        def vs(base: str, r: dict[str, Any]) -> str:
            return ratio_cell(rows[base], r) if base in rows else "-"

        for config, label in configs:
            if config not in rows:
                continue
            r = rows[config]
            t.add([shape, label, str(r.get("reshard") or "(hpZ)"),
                   f"{r['median_ms']:.1f} ({r['min_ms']:.1f}-{r['max_ms']:.1f})", f"{r['tokens_per_s']:,.0f}",
                   f"{r['peak_mib']:,.0f}", sent_cell(r), vs("nccl", r), vs("nccl-noreshard", r)], [file])
        if not any(c in rows for c, _ in configs):
            raise RenderError(f"table {name}: {file} has none of the configurations {[c for c, _ in configs]}")
    return t


def fsdp_memory_table(store: Store, name: str, file: str) -> Table:
    """perf/fsdp_memory.py's rank 0: torch's peak after the steps, and the memory outside torch's allocator that
    zpccl's enable took, step by step, and what stays after disable."""
    derived = [r for r in store.data(file)["derived"] if r["rank"] == 0]
    by = {r["config"]: r for r in derived}
    if "nccl" not in by or "zpccl" not in by:
        raise RenderError(f"table {name}: {file} lacks rank 0's nccl or zpccl rows")

    def stage(config: str, which: str, key: str) -> float:
        for s in by[config]["stages"]:
            if s["stage"] == which or (which == "steps" and s["stage"].startswith("step") and s["stage"] != "step 1"):
                return s[key]
        raise RenderError(f"table {name}: {file}: {config} has no stage {which}")

    t = Table(store, name, ["what (rank 0)", "MiB"])
    nccl, zp = stage("nccl", "steps", "peak_mib"), stage("zpccl", "steps", "peak_mib")
    t.add(["torch's peak, FSDP2 + NCCL", f"{nccl:,.1f}"], [file])
    t.add(["torch's peak, FSDP2 + zpccl (difference)", f"{zp:,.1f} ({zp - nccl:+.1f})"], [file])
    t.add(["zpccl's staging buffers (in torch's allocator)", f"{by['zpccl']['staging_bytes'] / MB:.1f}"], [file])
    t.add(["outside torch's allocator after enable", f"{stage('zpccl', 'enabled', 'outside_mib'):.0f}"], [file])
    for step in by["zpccl"].get("enable_steps", []):
        # The probe after the steps (a further communicator of the same group) is not part of enable.
        when = "after the steps, a probe" if "further" in step["step"] else "enable"
        t.add([f"{when}: {step['step']}", f"{step['outside_mib']:+.0f}"], [file])
    after = stage("zpccl", "collected", "outside_mib")
    t.add(["outside torch's allocator after disable and a collection", f"{after:.0f}"], [file])
    return t


@dataclass
class LossLine:
    """A row of a loss table: a configuration of the table's campaign, its label and cells under ``extra``, and
    the configuration it is paired with (None: the campaign's baseline; another: one of the campaign's contrasts)."""

    config: str
    label: str
    cells: list[str] = field(default_factory=list)
    against: str | None = None


def loss_table(store: Store, name: str, campaign: ls.Campaign, lines: list[LossLine], extra: tuple[str, ...] = (),
               label: str = "run") -> Table:
    """Loss runs of one campaign of tools/loss_stats.py (its files, its baseline, its tolerances): for each line,
    the paired gap of its validation loss to the baseline's (or the contrast's) of the same seed, in percent, with
    loss_stats' standard error, 95% interval and what that interval supports. A run found in several files must
    agree (runs are deterministic): pairing across files relies on it; a seed without its pair is refused."""
    try:
        rows = ls.campaign_rows(campaign, store.folder, store.data)
    except ValueError as e:
        raise RenderError(f"table {name}: {e}") from None
    t = Table(store, name, [label, *extra, "seeds", "gap: mean", "standard error", "95% interval", "per seed, %",
                            "the interval supports"])
    for line in lines:
        against = line.against or campaign.reference
        row = next((r for r in rows if r.config == line.config and r.reference == against), None)
        if row is None:
            raise RenderError(f"table {name}: no {line.config} runs paired with {against} in campaign {campaign.name}"
                              f" ({', '.join(campaign.files)})")
        if row.unpaired:
            raise RenderError(f"table {name}: {line.config} seeds {list(row.unpaired)} have no {against} run to "
                              "pair with")
        t.add([line.label, *line.cells, *ls.gap_cells(row.stats), ls.describe(row)], list(row.files))
    return t


class FormatErrors:
    """perf/experiments/format_error.py's rows of one file, by tensor, format, layout (gradients) or rank count
    (weights), capture step and class of tensors."""

    def __init__(self, store: Store, table: str, file: str) -> None:
        data = store.data(file)
        try:
            self.steps, self.layouts = data["setup"]["captures"], data["setup"]["layouts"]
            self.index = {(r["tensor"], r["format"], r.get("layout") or r["ranks"], r["step"], r["class"]): r
                          for r in data["rows"]}
        except (KeyError, TypeError) as e:
            raise RenderError(f"table {table}: {file} is not format_error.py's ({e!r} missing)") from None
        self.last, self.first = self.steps[-1], self.layouts[0]

    def formats(self, tensor: str) -> list[str]:
        return list(dict.fromkeys(k[1] for k in self.index if k[0] == tensor))

    def cell(self, tensor: str, fmt: str, where: Any, step: int, key: str, spec: str, cls: str = "all") -> str:
        """One figure; "-" where the file has no such row (not every format ran on every layout)."""
        r = self.index.get((tensor, fmt, where, step, cls))
        return "-" if r is None or r.get(key) is None else format(r[key], spec)


def format_error_gradients(store: Store, name: str, file: str, tensor: str = "gradients") -> Table:
    """Each gradient format's error against the float64 mean, of qgZ avg (``tensor`` "gradients") or of DDP's
    all-reduce ("allreduce"): per call on the first layout at every capture step, the window sum's, per call on the
    other layouts, cosine and worst block at the last step."""
    fe = FormatErrors(store, name, file)
    last, first = fe.last, fe.first

    def hops(lay: str) -> str:
        r = next((v for k, v in fe.index.items() if k[0] == tensor and k[2] == lay), None)
        if r is None:
            raise RenderError(f"table {name}: {file} has no {tensor} rows on layout {lay}")
        return f"{lay}, {r['hops']} hop{'s' if r['hops'] > 1 else ''}"

    others = fe.layouts[1:]
    t = Table(store, name, [tensor, f"{hops(first)}: step {' / '.join(map(str, fe.steps))}",
                            f"window sum, step {last}", *[f"{hops(lay)}, step {last}" for lay in others],
                            f"cosine, {first}, step {last}", f"worst block, {first}, step {last}"])
    for fmt in fe.formats(tensor):
        t.add([fmt, " / ".join(fe.cell(tensor, fmt, first, s, "rel_err", ".2e") for s in fe.steps),
               fe.cell(tensor, fmt, first, last, "window_rel_err", ".2e"),
               *[fe.cell(tensor, fmt, lay, last, "rel_err", ".2e") for lay in others],
               fe.cell(tensor, fmt, first, last, "cosine", ".6f"),
               fe.cell(tensor, fmt, first, last, "block_err_max", ".3f")], [file])
    return t


def format_error_adam(store: Store, name: str, file: str, tensor: str = "allreduce") -> Table:
    """Each gradient format on the first layout, per call at every capture step: its relative error, the same with
    every element scaled as AdamW scales its update (and the window sum's so scaled at the last step), and the
    share of non-zero elements it rounds to zero. Steps before the optimizer's first (no moments) are left out."""
    fe = FormatErrors(store, name, file)
    last, first = fe.last, fe.first
    scaled = [s for s in fe.steps if any(k[0] == tensor and k[3] == s and "adam_rel_err" in r
                                         for k, r in fe.index.items())]
    if not scaled:
        raise RenderError(f"table {name}: {file} has no Adam-scaled figure of {tensor}")
    steps = " / ".join(map(str, scaled))
    t = Table(store, name, [f"{tensor}, {first}", f"error: step {steps}", f"as Adam scales it: step {steps}",
                            f"window sum as Adam scales it, step {last}", f"rounded to zero: step {steps}"])
    for fmt in fe.formats(tensor):
        def cells(key: str, spec: str) -> str:
            return " / ".join(fe.cell(tensor, fmt, first, s, key, spec) for s in scaled)

        row = [fmt, cells("rel_err", ".2e"), cells("adam_rel_err", ".2e"),
               fe.cell(tensor, fmt, first, last, "window_adam_rel_err", ".2e"), cells("zeroed", ".2%")]
        if any("-" in c.split(" / ") for c in row[1:]):
            raise RenderError(f"table {name}: {file} lacks an Adam-scaled figure of {tensor} {fmt} on {first}")
        t.add(row, [file])
    return t


def format_error_weights(store: Store, name: str, file: str) -> Table:
    """Each weight format's error (qwZ against the bf16 weights): on the fewest ranks at every capture step, on
    the other rank counts, cosine and worst block at the last step."""
    fe = FormatErrors(store, name, file)
    last = fe.last
    ranks = sorted({k[2] for k in fe.index if k[0] == "weights"})
    t = Table(store, name, ["weights", f"{ranks[0]} ranks: step {' / '.join(map(str, fe.steps))}",
                            *[f"{n} ranks, step {last}" for n in ranks[1:]], f"cosine, step {last}",
                            f"worst block, step {last}"])
    for fmt in fe.formats("weights"):
        t.add([fmt, " / ".join(fe.cell("weights", fmt, ranks[0], s, "rel_err", ".2e") for s in fe.steps),
               *[fe.cell("weights", fmt, n, last, "rel_err", ".2e") for n in ranks[1:]],
               fe.cell("weights", fmt, ranks[0], last, "cosine", ".6f"),
               fe.cell("weights", fmt, ranks[0], last, "block_err_max", ".3f")], [file])
    return t


def format_error_classes(store: Store, name: str, file: str, classes: tuple[str, ...]) -> Table:
    """Per class of tensors at the last step: gradients on the first layout rounded to nearest (no -sr or -ef),
    weights on the fewest ranks."""
    fe = FormatErrors(store, name, file)
    last, first = fe.last, fe.first
    ranks = min(k[2] for k in fe.index if k[0] == "weights")
    t = Table(store, name, [f"step {last}, by class", *classes])
    for tensor, where in (("gradients", first), ("weights", ranks)):
        names = [f for f in fe.formats(tensor) if tensor == "weights" or f == "bf16" or f.count("-") == 1]
        for fmt in names:
            label = f"{tensor} {fmt} ({where}{' ranks' if tensor == 'weights' else ''})"
            cells = [fe.cell(tensor, fmt, where, last, "rel_err", ".2e", c) for c in classes]
            if "-" in cells:
                raise RenderError(f"table {name}: {file} lacks a class of {tensor} {fmt} at step {last}")
            t.add([label, *cells], [file])
    return t


def kernel_table(store: Store, name: str, file: str, ops: list[tuple[str, str, dict[str, Any]]], sizes: list[str],
                 copy: bool = True, gbps: bool = False) -> Table:
    """Local kernels against a memcpy in the same run: us (and GB/s) at each size, the copy's us beside."""
    header = ["kernel"]
    for s in sizes:
        header += [f"{s} us"] + (["GB/s"] if gbps else []) + (["copy us"] if copy else [])
    t = Table(store, name, header)
    for op, label, where in ops:
        cells = [label]
        for s in sizes:
            r = Pick(file, op, None, where).one(store, size_of(s), name)
            cells.append(num(r["oop"]["time_us"]))
            if gbps:
                cells.append(f"{r['oop']['busbw']:.0f}")
            if copy:
                cells.append(num((r.get("memcpy") or {})["time_us"]))
        t.add(cells, [file])
    return t


def reduce_table(store: Store, name: str, file: str, ops: list[tuple[str, str]], sizes: list[str]) -> Table:
    """qgZ's reduction kernels against a memcpy of their inputs, per bit width: us at each size ("a / b")."""
    t = Table(store, name, ["kernel"] + [h for b in (4, 8) for h in (f"int{b} us", "copy us")])
    for op, label in ops:
        cells = [label]
        for bits in (4, 8):
            rows = [Pick(file, op, None, dict(bits=bits)).one(store, size_of(s), name) for s in sizes]
            cells.append(" / ".join(num(r["oop"]["time_us"]) for r in rows))
            cells.append(" / ".join(num((r.get("memcpy") or {})["time_us"]) for r in rows))
        t.add(cells, [file])
    return t


def variants_table(store: Store, name: str, file: str, size: str, ops: list[tuple[str, str, str]]) -> Table:
    """qgZ's gradient rounding: each op's time to nearest / with stochastic rounding / with error feedback, per bit
    width, each variant's ratio to nearest's beside it (same run)."""
    t = Table(store, name, ["", "int8 nearest / SR / EF", "int4 nearest / SR / EF"])
    for op, label, regime in ops:
        cells = [label]
        for bits in (8, 4):
            times = [Pick(file, op, None, dict(bits=bits, regime=regime, grad=g)).one(store, size_of(size), name)
                     ["oop"]["time_us"] for g in (None, "sr", "ef")]
            scale = 1000 if regime != "local" else 1
            cells.append(" / ".join([num(times[0] / scale)] + [f"{num(x / scale)} ({x / times[0]:.2f}x)"
                                                                for x in times[1:]]))
        t.add(cells, [file])
    return t


def wire_table(store: Store, name: str, rows: list[tuple[str, str, str, dict[str, Any]]]) -> Table:
    """Bytes one rank sends per call (host backend: the plans' formulas), zpccl's and NCCL's ring's."""
    t = Table(store, name, ["call", "size", "zpccl MB intra / inter", "NCCL ring MB intra / inter",
                            "inter-node bytes, ring / zpccl"])
    for file, op, label, where in rows:
        r = Pick(file, op, None, where).one(store, 64 * MB, name)
        zp, ring = r["wire_bytes_per_rank"]["zpccl"], r["wire_bytes_per_rank"]["nccl_ring"]
        ratio = f"{ring['inter'] / zp['inter']:.2f}x" if zp["inter"] else "none cross"
        t.add([label, "64M", f"{zp['intra'] / 1e6:.2f} / {zp['inter'] / 1e6:.2f}",
               f"{ring['intra'] / 1e6:.2f} / {ring['inter'] / 1e6:.2f}", ratio], [file])
    return t


# ---- the tables of the documents ---------------------------------------------------------------------------

R = "2026-11-30-h200x2-"
R1 = "2026-12-01-h200x1-"
R2 = "2026-12-02-h200x1-"
R3 = "2026-12-03-h200x1-"
R5 = "2026-12-05-h200x1-"
H100 = "2026-12-05-h100x1-"
H100_6 = "2026-12-06-h100x1-"
H100_7 = "2026-12-07-h100x1-"
SIZES = ["1M", "4M", "16M", "64M", "256M", "1G"]
UPPER = ("64M", "256M", "1G")
LOWER = ("1M", "4M", "16M")
NVLINK = R + "check-c6724ef-nvlink.json"
SLOW = R + "check-c6724ef-shm-net.json"
SLOW_OLD = R + "check-af5e648-shm-net.json"
EVERY_OP = R + "nvlink-shm-every-op.json"
H200X2 = "2026-11-30-h200x2.json"
FORMAT_ERROR = "2026-12-05-cpu-threads-format-error-6508252.json"
FORMAT_ERROR_ALLREDUCE = "2026-12-06-cpu-threads-format-error-allreduce-a223ca0.json"
FORMAT_ERROR_ALLREDUCE_INT8_BLOCKS = "2026-12-07-cpu-threads-format-error-allreduce-int8-blocks-59feb63.json"
FORMAT_ERROR_ALLREDUCE_ADAM = "2026-12-07-cpu-threads-format-error-allreduce-adam-598d311.json"
QWZ_TARGET = {8: (1.9, "64M"), 4: (3.5, "64M")}  # over shm and net
HOST_WIRE = "2026-12-05-cpu-host-wire-bytes-"
GRAD_COLUMNS = ("blocks", "bytes vs bf16")


def fmt_blocks(bits: int, block: int) -> list[str]:
    """The gradient rows' blocks and wire ratio over bf16 (by the format, not measured)."""
    return [str(block), f"{wire_limit(bits, block):.2f}x"]


def grad_loss(store: Store, name: str, campaign: str, lines: list[LossLine]) -> Table:
    """A loss table of grad_numerics.py's runs: gradient formats with their blocks and bytes."""
    return loss_table(store, name, ls.campaign(campaign), lines, GRAD_COLUMNS, "gradients")


def int4_lines(label: str, configs: list[tuple[str, int]], against: str | None = None) -> list[LossLine]:
    return [LossLine(c, label, fmt_blocks(4, b), against) for c, b in configs]


def headline(store: Store) -> Table:
    rows = []
    for op, bits, label in (("qwz_all_gather", 8, "qwZ int8"), ("qwz_all_gather", 4, "qwZ int4"),
                            ("qgz_reduce_scatter", 4, "qgZ int4"), ("qgz_reduce_scatter", 8, "qgZ int8")):
        rows.append(Line(f"{label}, nvlink", [Pick(NVLINK, op, None, dict(bits=bits, regime="nvlink"))], limit=True))
        for regime in ("shm", "net"):
            rows.append(Line(f"{label}, {regime}", [Pick(SLOW, op, None, dict(bits=bits, regime=regime))],
                             limit=True))
    pair = dict(op="qwz_hpz_gathers", bits=8)
    rows += [Line("qwZ int8 fwd + hpZ bwd, nvlink", [Pick(NVLINK, pair["op"], None, dict(bits=8, regime="nvlink"))]),
             Line("qwZ int8 fwd + hpZ bwd, shm, one node",
                  [Pick(EVERY_OP, pair["op"], None, dict(bits=8, regime="shm", nodes=1))]),
             Line("qwZ int8 fwd + hpZ bwd, shm, two nodes",
                  [Pick(EVERY_OP, pair["op"], None, dict(bits=8, regime="shm", nodes=2))]),
             Line("qwZ int8 fwd + hpZ bwd, net", [Pick(H200X2, pair["op"], None, dict(bits=8, regime="net"))])]
    return size_table(store, "headline", "collective, regime", ["256M", "1G"], rows)


def one_gpu(store: Store) -> Table:
    """qwZ, hpZ and qgZ on one time-shared GPU: two nodes of one rank (net-on1gpu) and of two (2x2-on1gpu)."""
    check, check25, check5e, two_by_two = R5 + "check-1c1aab7.json", R1 + "check-2533cb1.json", \
        R1 + "check-5e33917.json", R1 + "2x2-on1gpu.json"
    net, grid = dict(regime="net-on1gpu"), dict(regime="2x2-on1gpu")
    lines = []
    for op, label in (("qwz_all_gather", "qwZ"), ("qgz_reduce_scatter", "qgZ")):
        lines += [Line(f"{label} net-on1gpu int{b}", [Pick(check, op, None, dict(net, bits=b))], limit=True)
                  for b in (8, 4)]
    lines += [Line(f"qwZ int{b} + hpZ, net-on1gpu", [Pick(check, "qwz_hpz_gathers", None, dict(net, bits=b))])
              for b in (8, 4)]
    lines += [Line(f"qwZ 2x2-on1gpu int{b}", [Pick(check, "qwz_all_gather", None, dict(grid, bits=b))], limit=True)
              for b in (8, 4)]
    lines.append(Line("qgZ 2x2-on1gpu int8", [Pick(check, "qgz_reduce_scatter", None, dict(grid, bits=8))]))
    lines.append(Line("qgZ 2x2-on1gpu int4", [Pick(check5e, "qgz_reduce_scatter", ("64M", "256M"),
                                                   dict(grid, bits=4))]))
    lines.append(Line("hpZ exact, 2x2-on1gpu", [Pick(check25, "hpz_all_gather", ("64M",), grid, ),
                                                Pick(two_by_two, "hpz_all_gather", ("256M",), grid)],
                      value="speedup-all"))
    lines += [Line(f"qwZ int{b} + hpZ, 2x2-on1gpu", [Pick(check25, "qwz_hpz_gathers", ("64M",), dict(grid, bits=b))]
                   + ([Pick(two_by_two, "qwz_hpz_gathers", ("256M",), dict(grid, bits=b))] if b == 4 else []))
              for b in (8, 4)]
    return size_table(store, "on1gpu", "", ["16M", "64M", "256M"], lines)


def fsdp_runs_table(store: Store, name: str, files: list[tuple[str, str]]) -> Table:
    """Separate runs of one FSDP2 step shape: FSDP2 + zpccl's step time and its ratio to FSDP2 + NCCL at either
    resharding and to the ablation (NCCL with the reduce-scatters on a second communicator), each ratio of medians
    with the least and greatest ratio of the rounds' medians; and the step with no network (``no-comm``) with
    NCCL's over it, the most any collective could gain in that run. A run that lacks a configuration shows "-"."""
    t = Table(store, name, ["run", "rounds", "zpccl ms (median, range)", "NCCL True ms", "NCCL False ms",
                            "NCCL 2 comms ms", "vs NCCL True", "vs NCCL False", "vs NCCL 2 comms",
                            "no network ms (NCCL True / False over it)"])
    for file, label in files:
        rows = {r["config"]: r for r in store.data(file)["rows"]}
        if "zpccl-hpz" not in rows:
            raise RenderError(f"table {name}: {file} has no zpccl-hpz row")
        z = rows["zpccl-hpz"]
        rounds = z.get("round_median_ms") or []

        def ms(config: str) -> str:
            return f"{rows[config]['median_ms']:.1f}" if config in rows else "-"

        def vs(config: str) -> str:
            return ratio_cell(rows[config], z) if config in rows else "-"

        floor = "-"
        if "no-comm" in rows:
            over = [f"{rows[c]['median_ms'] / rows['no-comm']['median_ms']:.2f}x" if c in rows else "-"
                    for c in ("nccl", "nccl-noreshard")]
            floor = f"{ms('no-comm')} ({' / '.join(over)})"
        t.add([label, str(len(rounds)) if rounds else "-",
               f"{z['median_ms']:.1f} ({z['min_ms']:.1f}-{z['max_ms']:.1f})", ms("nccl"), ms("nccl-noreshard"),
               ms("nccl-2comm"), vs("nccl"), vs("nccl-noreshard"), vs("nccl-2comm"), floor], [file])
    return t


def cpu_share_table(store: Store, name: str, files: list[tuple[str, str]], configs: list[tuple[str, str]],
                    where: bool = False) -> Table:
    """Step runs with the rounds' machine records (perf/machine_state.py): each configuration's step time (median,
    range) and the CPU time each rank's process spent over the round's wall time, least and greatest over the
    rounds and ranks (100%: one CPU busy the whole round; the process's threads add up). With ``where``, also the
    CPUs each rank's main thread was on at the rounds' ends (ranks separated by '/') and its migrations a round,
    least and greatest over the rounds and ranks."""
    t = Table(store, name, ["run", "configuration", "step ms (median, range)", "a rank's CPU time / wall"]
              + (["CPUs at rounds' ends, per rank", "migrations a round"] if where else []))
    for file, label in files:
        rows = {r["config"]: r for r in store.data(file)["rows"]}
        for config, config_label in configs:
            if config not in rows:
                continue
            r = rows[config]
            rounds = [rnd for rnd in r.get("machine") or [] if rnd]
            shares = [rank["rank_cpu_s"] / rank["wall_s"] * 100 for rnd in rounds for rank in rnd]
            if not shares:
                raise RenderError(f"table {name}: {file}'s {config} row has no machine records")
            cells = [label, config_label, f"{r['median_ms']:.1f} ({r['min_ms']:.1f}-{r['max_ms']:.1f})",
                     f"{min(shares):.0f} - {max(shares):.0f}%"]
            if where:
                if any(rank.get("rank_cpu") is None for rnd in rounds for rank in rnd):
                    raise RenderError(f"table {name}: {file}'s {config} row does not say where its ranks ran")
                cpus = [sorted({rnd[i]["rank_cpu"] for rnd in rounds}) for i in range(len(rounds[0]))]
                moved = [rank["rank_migrations"] for rnd in rounds for rank in rnd]
                cells += [" / ".join(",".join(map(str, c)) for c in cpus), f"{min(moved)} - {max(moved)}"]
            t.add(cells, [file])
    return t


def calls_cell(row: dict[str, Any]) -> str:
    """The collective calls a step that exchange data (deepspeed_step's ``calls_per_step``)."""
    calls = row.get("calls_per_step")
    if calls is None:
        raise RenderError(f"row {row.get('config')!r} has no calls_per_step")
    return str(exchanging_calls(calls))


def step_table(store: Store, name: str, file: str, configs: list[tuple[str, str]], against: list[str],
               calls: bool = False) -> Table:
    """One training-step file of perf/step_protocol.py's rows (fsdp_step, ddp_step, deepspeed_step): each
    configuration's step time (median, range), tokens/s, peak memory, bytes a rank sent (and with ``calls``, the
    calls a step that exchange data), and its ratio to each configuration of ``against`` (medians; in brackets the
    least and greatest ratio of the rounds' medians)."""
    return step_runs_table(store, name, [(file, "")], "", configs, against, calls)


def step_runs_table(store: Store, name: str, files: list[tuple[str, str]], first: str, configs: list[tuple[str, str]],
                    against: list[str], calls: bool = False) -> Table:
    """step_table over several runs of the same configurations, one after the other, each row led by its run's
    label under the column ``first`` (none when ``first`` is empty); ratios are within a run."""
    runs = []
    for file, label in files:
        rows = {r["config"]: r for r in store.data(file)["rows"]}
        for config in [c for c, _ in configs] + against:
            if config not in rows:
                raise RenderError(f"table {name}: {file} has no {config} row")
        runs.append((file, label, rows))
    t = Table(store, name, ([first] if first else []) + [
        "configuration", "step ms (median, range)", "tokens/s", "peak MiB / rank", "sent MiB / step / rank"]
        + (["calls / step"] if calls else []) + [f"vs {a}" for a in against])
    for file, label, rows in runs:
        for config, config_label in configs:
            r = rows[config]
            t.add(([label] if first else []) + [
                config_label, f"{r['median_ms']:.1f} ({r['min_ms']:.1f}-{r['max_ms']:.1f})",
                f"{r['tokens_per_s']:,.0f}", f"{r['peak_mib']:,.0f}", sent_cell(r)]
                + ([calls_cell(r)] if calls else []) + [ratio_cell(rows[a], r) for a in against], [file])
    return t


def trace_table(store: Store, name: str, file: str, configs: list[tuple[str, str]]) -> Table:
    """perf/step_trace.py's summary of a traced round (``--trace``): per configuration and rank, a step's device time
    by kernel class, the union of all of it, the communication no compute kernel of the rank covers, the kernels
    a step, and the step's host time under the profiler."""
    t = Table(store, name, ["configuration", "rank", "compute ms", "NCCL kernels ms", "zpccl kernels ms",
                            "copies ms", "device busy ms", "communication not hidden ms", "kernels: compute / NCCL / "
                            "zpccl", "step ms under the profiler"])
    summary = store.data(file)["configs"]
    for config, label in configs:
        if config not in summary:
            raise RenderError(f"table {name}: {file} has no trace of {config}")
        for rank, r in enumerate(summary[config]):
            ms, n = r["kernel_ms"], r["kernels"]
            t.add([label, str(rank), f"{ms['compute']:.1f}", f"{ms['nccl']:.1f}", f"{ms['zpccl']:.1f}",
                   f"{ms['memory']:.1f}", f"{r['busy_ms']:.1f}", f"{r['comm_exposed_ms']:.1f}",
                   f"{n['compute']:.0f} / {n['nccl']:.0f} / {n['zpccl']:.0f}", f"{r['traced_step_ms']:.1f}"], [file])
    return t


def bisect_table(store: Store, name: str, file: str, each_run: bool = False) -> Table:
    """tools/bisect-fsdp-step.sh's entries that ran, in the manifest's order: zpccl's step (the median of the runs'
    medians, the runs' range, and the fastest and slowest step of all its runs), FSDP2 + NCCL's, and their ratio;
    with each_run, every run's pair in the order the runs were made (whether the slow runs are NCCL's slow runs
    too)."""
    t = Table(store, name, ["entry", "zpccl at", "runs", "zpccl ms (runs' range)", "steps' range", "NCCL ms",
                            "vs NCCL"] + (["each run: zpccl / NCCL ms"] if each_run else []))
    doc = store.data(file)
    for entry in doc["summary"]:
        if not entry["runs"]:
            continue
        steps = [row for f in entry["files"] for row in doc["runs"][f.removesuffix(".json")]["rows"]
                 if row["config"] == "zpccl-hpz"]
        runs = entry["zpccl_runs_ms"]
        pairs = ["; ".join(f"{z:.1f} / {n:.1f}" for z, n in zip(runs, entry["nccl_runs_ms"]))] if each_run else []
        t.add([", ".join(entry["names"]), entry["zpccl"][:7], str(entry["runs"]),
               f"{entry['zpccl_ms']:.1f} ({min(runs):.1f}-{max(runs):.1f})",
               f"{min(r['min_ms'] for r in steps):.1f}-{max(r['max_ms'] for r in steps):.1f}",
               f"{entry['nccl_ms']:.1f}", f"{entry['ratio']:.2f}x", *pairs], [file])
    return t


#: The configurations of the FSDP2 step's runs against its no-network floor, and what their ratios are taken to.
FLOOR_RUN = ([("nccl-noreshard", "FSDP2 + NCCL, reshard_after_forward=False"),
              ("no-comm", "FSDP2, collectives as local copies (no network)"), ("zpccl-hpz", "FSDP2 + zpccl")],
             ["nccl-noreshard", "no-comm"])

#: The traced small step's configurations (perf/step_trace.py's summaries), time-sliced and under MPS alike.
TRACED_RUN = [("nccl-noreshard", "FSDP2 + NCCL, False"), ("no-comm", "no network"), ("zpccl-hpz", "FSDP2 + zpccl")]

TABLES: dict[str, Callable[[Store], Table]] = {
    "headline": headline,
    "fsdp-step": lambda s: fsdp_step_table(s, "fsdp-step", [(R5 + "fsdp-step-small-gate-1c1aab7.json", "small"),
                                                             (R5 + "fsdp-step-large-gate-1c1aab7.json", "large")], [
        ("nccl", "FSDP2 + NCCL"), ("nccl-noreshard", "FSDP2 + NCCL"), ("nccl-2comm", "FSDP2 + NCCL, 2 comms"),
        ("zpccl-hpz", "FSDP2 + zpccl")]),
    "fsdp-step-runs": lambda s: fsdp_runs_table(s, "fsdp-step-runs", [
        (R5 + "fsdp-step-small-gate-1c1aab7.json", "1c1aab7, the gate's run"),
        *((R5 + f"fsdp-step-small-run{i}-1c1aab7.json", f"1c1aab7, run {i}") for i in range(2, 7)),
        (R5 + "fsdp-step-small-0731899-rerun.json", "0731899, same machine, after run 6"),
        (R2 + "fsdp-step-small-0731899.json", "0731899, a lease of its own"),
        *((H100_6 + f"fsdp-step-small-run{i}-02aeef1.json", f"02aeef1, one H100, run {i}") for i in (1, 2, 3)),
        (H100_7 + "fsdp-step-small-gate-d3af8f8.json", "d3af8f8, one H100, the gate's run"),
        *((H100_7 + f"fsdp-step-small-run{i}-d3af8f8.json", f"d3af8f8, one H100, run {i}") for i in (2, 3, 4)),
        (H100_7 + "fsdp-step-small-gpu-check-1de25a2.json", "1de25a2, one H100, gpu-check's run"),
        (H100_7 + "fsdp-step-small-block-1de25a2.json", "1de25a2, one H100, CUDA waits asleep"),
        *((H100_7 + f"fsdp-step-small-run{i}-128839a.json", f"128839a, one H100, run {i}") for i in (1, 2)),
        *((H100_7 + f"fsdp-step-small-run{i}-ff14e0a.json", f"ff14e0a, one H100, run {i}") for i in (1, 2, 3)),
        (H100_7 + "fsdp-step-small-gpu-check-ff14e0a.json", "ff14e0a, one H100, gpu-check's run"),
        *((H100_7 + f"fsdp-step-small-run{i}-1ac985b.json", f"1ac985b, one H100, run {i}") for i in range(1, 7)),
        (R5 + "fsdp-step-large-gate-1c1aab7.json", "large shape: 1c1aab7, the gate's run"),
        (R2 + "fsdp-step-large-0731899.json", "large shape: 0731899, a lease of its own"),
        (H100_7 + "fsdp-step-large-gate-d3af8f8.json", "large shape: d3af8f8, one H100, the gate's run")]),
    "fsdp-cuda-waits": lambda s: cpu_share_table(s, "fsdp-cuda-waits", [
        *((H100_7 + f"fsdp-step-small-waits-{w}-{i}-1de25a2.json", f"{i}, CUDA waits {how}")
          for i in (1, 2) for w, how in (("spin", "spin"), ("block", "asleep"))),
        (H100_7 + "fsdp-step-small-gpu-check-1de25a2.json", "gpu-check's, CUDA waits spin"),
        (H100_7 + "fsdp-step-small-block-1de25a2.json", "all five, CUDA waits asleep")], [
        ("nccl", "FSDP2 + NCCL, True"), ("nccl-noreshard", "FSDP2 + NCCL, False"), ("no-comm", "no network"),
        ("zpccl-hpz", "FSDP2 + zpccl")]),
    "fsdp-rank-cpus": lambda s: cpu_share_table(s, "fsdp-rank-cpus", [
        (H100_7 + f"fsdp-step-small-cpus-{where}-{i}-57a46d5.json", f"{i}, {how}")
        for i in (1, 2, 3) for where, how in (("free", "where the kernel puts them"), ("far", "0-3 / 8-11"),
                                              ("near", "0-1 / 2-3"))], [
        ("no-comm", "no network"), ("zpccl-hpz", "FSDP2 + zpccl")], where=True),
    "fsdp-staging-split": lambda s: step_runs_table(s, "fsdp-staging-split", [
        (H100_7 + f"fsdp-step-small-staging-{how}-{i}-128839a.json", f"{i}, {label}")
        for i in (1, 2, 3) for how, label in (("split", "one split"), ("views", "a view per part"))], "run", [
        ("zpccl-hpz", "FSDP2 + zpccl, False"), ("zpccl-reshard", "FSDP2 + zpccl, True")], ["nccl-noreshard"]),
    "fsdp-bisect-h100": lambda s: bisect_table(s, "fsdp-bisect-h100", H100 + "fsdp-bisect-0731899-562bc89.json"),
    "fsdp-bisect-h100-run2": lambda s: bisect_table(s, "fsdp-bisect-h100-run2",
                                                    H100 + "fsdp-bisect-run2-0731899-562bc89.json"),
    "fsdp-bisect-h100-run3": lambda s: bisect_table(s, "fsdp-bisect-h100-run3",
                                                    H100_6 + "fsdp-bisect-run3-bdc370e-562bc89.json", each_run=True),
    "fsdp-floor": lambda s: step_table(s, "fsdp-floor", H100 + "fsdp-step-small-floor-2edefb7.json", *FLOOR_RUN),
    "fsdp-step-trace": lambda s: step_table(s, "fsdp-step-trace", H100_6 + "fsdp-step-small-trace-94f9fee.json",
                                            *FLOOR_RUN),
    "fsdp-trace": lambda s: trace_table(s, "fsdp-trace", H100_6 + "fsdp-step-small-trace-summary-94f9fee.json",
                                        TRACED_RUN),
    "fsdp-trace-mps": lambda s: trace_table(s, "fsdp-trace-mps",
                                            H100_6 + "fsdp-step-small-mps-trace-summary-02aeef1.json", TRACED_RUN),
    "all-reduce-net": lambda s: collective_table(s, "all-reduce-net", "quant_all_reduce", ["16M", "64M", "256M"],
                                                 [(H100 + "all-reduce-net-2edefb7.json", None)], ["net-on1gpu"],
                                                 (8, 4), {8: (1.6, "64M"), 4: (2.5, "64M")}),
    "all-reduce-in-place": lambda s: in_place_table(s, "all-reduce-in-place", "quant_all_reduce", "64M", [
        (H100 + "all-reduce-net-2edefb7.json", "2edefb7, 16M - 256M"),
        *((H100_7 + f"all-reduce-64m-run{i}-d3af8f8.json", f"d3af8f8, run {i}") for i in (1, 2, 3))], (8, 4)),
    "ddp-step": lambda s: step_table(s, "ddp-step", H100 + "ddp-step-2edefb7.json", [
        ("nccl", "DDP, NCCL all-reduce (fp32 buckets)"), ("bf16-compress", "DDP, torch's bf16_compress_hook"),
        ("powersgd", "DDP, torch's PowerSGD hook (rank 1)"), ("zpccl", "DDP, zpccl.ddp (int4, blocks of 256)")],
        ["nccl", "bf16-compress"]),
    "ddp-step-mps": lambda s: step_runs_table(s, "ddp-step-mps", [
        (H100_6 + "ddp-step-f6ead09.json", "time slices"), (H100_6 + "ddp-step-mps-f6ead09.json", "MPS")],
        "GPU shared by", [("nccl", "DDP, NCCL all-reduce (fp32 buckets)"),
                          ("bf16-compress", "DDP, torch's bf16_compress_hook"),
                          ("zpccl", "DDP, zpccl.ddp (int4, blocks of 256)")], ["nccl", "bf16-compress"]),
    "ddp-loss": lambda s: loss_table(s, "ddp-loss", ls.campaign("ddp-57m-int4"), [
        LossLine("zpccl", "zpccl.ddp, int4 gradients (blocks of 256)"),
        LossLine("bf16-compress", "torch's bf16_compress_hook (gradients rounded to bf16: a perturbation)")]),
    "ddp-loss-int8": lambda s: loss_table(s, "ddp-loss-int8", ls.campaign("ddp-57m-int8"), [
        LossLine("zpccl grad_block_size=256", "zpccl.ddp, int8 gradients (blocks of 256)"),
        LossLine("zpccl grad_block_size=64", "zpccl.ddp, int8 gradients in blocks of 64"),
        LossLine("zpccl grad_block_size=64", "blocks of 64 against blocks of 256, seed by seed",
                 against="zpccl grad_block_size=256"),
        LossLine("bf16-compress", "torch's bf16_compress_hook (gradients rounded to bf16: a perturbation)"),
        LossLine("zpccl grad_block_size=64", "blocks of 64 against bf16_compress_hook, seed by seed",
                 against="bf16-compress")]),
    "deepspeed-step": lambda s: step_table(s, "deepspeed-step", H100_6 + "deepspeed-step-511ec81.json", [
        ("deepspeed", "DeepSpeed ZeRO-3"), ("zeropp", "DeepSpeed ZeRO++ (its own qwZ, qgZ)"),
        ("zpccl", "DeepSpeed ZeRO-3 + zpccl.deepspeed (int8 weights, int4 gradients)"),
        ("zpccl-exact", "DeepSpeed ZeRO-3 + zpccl.deepspeed, exact collectives (persistent parameters in one call)"),
        ("no-comm", "DeepSpeed ZeRO-3, collectives as local copies (no network)")], ["deepspeed", "zeropp"],
        calls=True),
    "deepspeed-step-mps": lambda s: step_table(s, "deepspeed-step-mps", H100_6 + "deepspeed-step-mps-511ec81.json", [
        ("deepspeed", "DeepSpeed ZeRO-3"),
        ("zpccl", "DeepSpeed ZeRO-3 + zpccl.deepspeed (int8 weights, int4 gradients)"),
        ("zpccl-exact", "DeepSpeed ZeRO-3 + zpccl.deepspeed, exact collectives (persistent parameters in one call)"),
        ("no-comm", "DeepSpeed ZeRO-3, collectives as local copies (no network)")], ["deepspeed", "no-comm"],
        calls=True),
    "fsdp-step-mps": lambda s: fsdp_step_table(s, "fsdp-step-mps", [
        (H100_6 + "fsdp-step-small-511ec81.json", "time slices"), (H100_6 + "fsdp-step-small-mps-511ec81.json", "MPS")], [
        ("nccl", "FSDP2 + NCCL"), ("nccl-noreshard", "FSDP2 + NCCL"),
        ("no-comm", "FSDP2, collectives as local copies (no network)"), ("zpccl-reshard", "FSDP2 + zpccl"),
        ("zpccl-hpz", "FSDP2 + zpccl")], first="GPU shared by"),
    "fsdp-step-mps-runs": lambda s: fsdp_runs_table(s, "fsdp-step-mps-runs", [
        (H100_6 + "fsdp-step-small-pair-run1-511ec81.json", "time slices, run 1 (8 rounds)"),
        (H100_6 + "fsdp-step-small-pair-mps-511ec81.json", "MPS (8 rounds)"),
        (H100_6 + "fsdp-step-small-pair-run2-511ec81.json", "time slices, run 2 (8 rounds)"),
        (H100_6 + "fsdp-step-small-mps-511ec81.json", "MPS, five configurations"),
        (H100_6 + "fsdp-step-small-511ec81.json", "time slices, five configurations"),
        *((H100_6 + f"fsdp-step-small-mps-run{i}-0c6a455.json", f"MPS, 0c6a455, run {i}") for i in (1, 2, 3)),
        (H100_6 + "fsdp-step-small-mps-trace-02aeef1.json", "MPS, 02aeef1, 3 rounds, traced")]),
    "collectives-mps": lambda s: size_table(s, "collectives-mps", "", ["16M", "64M"], [
        Line(f"{name} int{b}, {how}", [Pick(H100_6 + f"collectives-net{tag}-511ec81.json", op, None,
                                            dict(bits=b, regime="net-on1gpu"))], limit=True)
        for op, name in (("qwz_all_gather", "qwZ"), ("qgz_reduce_scatter", "qgZ")) for b in (8, 4)
        for tag, how in (("", "time slices"), ("-mps", "MPS"))] + [
        Line(f"NCCL all-gather bf16 ms, {how}", [Pick(H100_6 + f"collectives-net{tag}-511ec81.json",
                                                      "qwz_all_gather", None, dict(bits=8, regime="net-on1gpu"))],
             value="nccl-ms") for tag, how in (("", "time slices"), ("-mps", "MPS"))]),
    "small-calls-mps": lambda s: size_table(s, "small-calls-mps", "", ["1K", "4K", "16K", "64K"], [
        Line(f"NCCL all-gather bf16 us, {how}", [Pick(f, "qwz_all_gather", None, dict(bits=8, regime="net-on1gpu"))],
             value="nccl-us")
        for f, how in ((H100_6 + "qwz-small-calls-0277107.json", "time slices (0277107)"),
                       (H100_6 + "qwz-small-calls-mps-511ec81.json", "MPS"))]),
    "fsdp-memory": lambda s: fsdp_memory_table(s, "fsdp-memory", H100_6 + "fsdp-memory-0c6a455.json"),
    "fsdp-loss": lambda s: loss_table(s, "fsdp-loss", ls.campaign("fsdp2-57m"), [
        LossLine("nccl-fp32", "NCCL, fp32 reduction (noise floor)"),
        LossLine("zpccl:8:4", "zpccl int8 weights, int4 gradients"),
        LossLine("zpccl:8:8", "zpccl int8 weights, int8 gradients")]),
    **{f"ddp-loss-cpu-int{bits}": (lambda s, bits=bits: loss_table(
        s, f"ddp-loss-cpu-int{bits}", ls.campaign(f"ddp-small-cpu-int{bits}"),
        [LossLine("zpccl", f"zpccl.ddp, int{bits} gradients (blocks of 256), small GPT on the CPU")]))
       for bits in (8, 4)},
    "deepspeed-loss-b64": lambda s: loss_table(s, "deepspeed-loss-b64", ls.campaign("deepspeed-57m-b64"), [
        LossLine("zpccl:8:4", "DeepSpeed ZeRO-3 + zpccl.deepspeed, int8 weights, int4 gradients in blocks of 64"),
        LossLine("deepspeed-fp32", "DeepSpeed ZeRO-3, gradients reduced and accumulated in fp32 (noise floor)")]),
    "deepspeed-loss-b64-cpu": lambda s: loss_table(s, "deepspeed-loss-b64-cpu", ls.campaign("deepspeed-small-cpu-b64"),
                                                   [LossLine("zpccl:8:4", "DeepSpeed ZeRO-3 + zpccl.deepspeed")]),
    "fsdp-loss-b64-cpu": lambda s: loss_table(s, "fsdp-loss-b64-cpu", ls.campaign("fsdp2-small-cpu-b64"),
                                              [LossLine("zpccl:8:4", "FSDP2 + zpccl.fsdp")]),
    "fsdp-loss-b64": lambda s: loss_table(s, "fsdp-loss-b64", ls.campaign("fsdp2-57m-b64"), [
        LossLine("zpccl:8:4", "zpccl int8 weights, int4 gradients in blocks of 64")]),
    "fsdp-loss-b64-bf16start": lambda s: loss_table(s, "fsdp-loss-b64-bf16start",
                                                    ls.campaign("fsdp2-57m-b64-bf16start"), [
        LossLine("zpccl:8:4", "FSDP2 + zpccl.fsdp from bf16 weights, int8 weights, int4 gradients in blocks of 64")]),
    "qwz-nvlink": lambda s: collective_table(s, "qwz-nvlink", "qwz_all_gather", SIZES, [(NVLINK, None)], ["nvlink"],
                                             (8, 4), {8: (1.3, "256M")}),
    "qwz-shm-net": lambda s: collective_table(s, "qwz-shm-net", "qwz_all_gather", SIZES,
                                              [(SLOW, UPPER), (SLOW_OLD, LOWER)], ["shm", "net"], (8, 4), QWZ_TARGET),
    "hpz-nvlink": lambda s: size_table(s, "hpz-nvlink", "", SIZES, [
        Line("exact (two runs)", [Pick(NVLINK, "hpz_all_gather", None, dict(regime="nvlink"))],
             value="speedup-all")] + [
        Line(f"qwZ int{b} + hpZ", [Pick(NVLINK, "qwz_hpz_gathers", None, dict(bits=b, regime="nvlink"))])
        for b in (8, 4)]),
    "hpz-shm-net": lambda s: size_table(s, "hpz-shm-net", "", SIZES, [
        Line("shm exact, one node (two runs)", [Pick(EVERY_OP, "hpz_all_gather", None, dict(regime="shm", nodes=1))],
             value="speedup-all")] + [
        Line(f"shm qwZ int{b} + hpZ, {n} node{'s' if nodes > 1 else ''}",
             [Pick(EVERY_OP, "qwz_hpz_gathers", None, dict(bits=b, regime="shm", nodes=nodes))])
        for nodes, n in ((1, "one"), (2, "two")) for b in (8, 4)] + [
        Line(f"net qwZ int{b} + hpZ", [Pick(H200X2, "qwz_hpz_gathers", None, dict(bits=b, regime="net"))])
        for b in (8, 4)]),
    "qgz-nvlink": lambda s: collective_table(s, "qgz-nvlink", "qgz_reduce_scatter", SIZES, [(NVLINK, None)],
                                             ["nvlink"], (4, 8), {4: (1.5, "256M")}),
    "qgz-shm-net": lambda s: collective_table(s, "qgz-shm-net", "qgz_reduce_scatter", SIZES,
                                              [(SLOW, UPPER), (SLOW_OLD, LOWER)], ["shm", "net"], (4, 8), QWZ_TARGET),
    "on1gpu": one_gpu,
    "wire-bytes": lambda s: wire_table(s, "wire-bytes", [
        (HOST_WIRE + "qgz.json", "qgz_reduce_scatter", "qgZ int4, two hops", dict(bits=4)),
        (HOST_WIRE + "qwz.json", "qwz_all_gather", "qwZ int4", dict(bits=4)),
        (HOST_WIRE + "hpz.json", "hpz_all_gather", "hpZ (backward gather)", {})]),
    "quantize-kernels": lambda s: kernel_table(s, "quantize-kernels", R1 + "quantize-kernels.json", [
        (op, f"{op} int{b}", dict(bits=b)) for op in ("quantize", "dequantize") for b in (4, 8)], ["32M", "256M"],
        gbps=True),
    "reduce-kernels": lambda s: reduce_table(s, "reduce-kernels", R2 + "check-cc65977.json", [
        (f"reduce_{k}_s{n}", f"{k} S = {n}") for k, ns in (("finish", (2, 3, 4, 8)), ("requantize", (2, 4, 8)))
        for n in ns], ["64M", "256M"]),
    "grad-kernels": lambda s: variants_table(s, "grad-kernels", "2026-12-04-h200x1-grad-kernels-13e7109.json", "64M", [
        ("quantize_grad", "sender's quantize (`quantize_grad`), us", "local"),
        ("reduce_requantize_s2", "requantize, S = 2, us", "local"),
        ("reduce_requantize_s4", "requantize, S = 4, us", "local"),
        ("reduce_requantize_s8", "requantize, S = 8, us", "local"),
        ("qgz_reduce_scatter", "qgZ net-on1gpu, ms", "net-on1gpu")]),
    "grad-loss-cpu": lambda s: grad_loss(s, "grad-loss-cpu", "grad-cpu", [
        LossLine("exact-fp32", "FSDP's, fp32 reduction (noise floor)", ["", "1"])]
        + int4_lines("int4, nearest", [("int4", 256)])
        + int4_lines("int4, stochastic rounding", [("int4-sr", 256)])
        + int4_lines("int4, error feedback", [("int4-ef", 256)]) + int4_lines("int4, SR + EF", [("int4-sr-ef", 256)])
        + int4_lines("int4, nearest", [("int4-b64", 64)])
        + int4_lines("int4, stochastic rounding", [("int4-b64-sr", 64)])
        + int4_lines("int4, nearest", [("int4-b32", 32)]) + [LossLine("int8", "int8, nearest", fmt_blocks(8, 256))]
        + int4_lines("int4, nearest, against blocks of 256", [("int4-b64", 64), ("int4-b32", 32)], "int4")
        + int4_lines("int4, stochastic rounding, against nearest", [("int4-sr", 256)], "int4")
        + int4_lines("int4, error feedback, against nearest", [("int4-ef", 256)], "int4")),
    "grad-loss-gpu": lambda s: grad_loss(s, "grad-loss-gpu", "grad-gpu", int4_lines(
        "int4, nearest", [("int4", 256), ("int4-b64", 64), ("int4-b32", 32)])
        + int4_lines("int4, nearest, against blocks of 256", [("int4-b64", 64), ("int4-b32", 32)], "int4")),
    "readme-grad-loss": lambda s: grad_loss(s, "readme-grad-loss", "grad-cpu", int4_lines(
        "int4", [("int4", 256), ("int4-b64", 64), ("int4-b32", 32)])),
    "format-error-gradients": lambda s: format_error_gradients(s, "format-error-gradients", FORMAT_ERROR),
    "format-error-weights": lambda s: format_error_weights(s, "format-error-weights", FORMAT_ERROR),
    "format-error-allreduce": lambda s: format_error_gradients(s, "format-error-allreduce", FORMAT_ERROR_ALLREDUCE,
                                                               "allreduce"),
    "format-error-allreduce-int8-blocks": lambda s: format_error_gradients(
        s, "format-error-allreduce-int8-blocks", FORMAT_ERROR_ALLREDUCE_INT8_BLOCKS, "allreduce"),
    "format-error-allreduce-adam": lambda s: format_error_adam(s, "format-error-allreduce-adam",
                                                               FORMAT_ERROR_ALLREDUCE_ADAM),
    "format-error-classes": lambda s: format_error_classes(s, "format-error-classes", FORMAT_ERROR, (
        "attention", "mlp", "embedding", "head", "norm", "bias", "all")),
}


# ---- documents -----------------------------------------------------------------------------------------------


def render(text: str, store: Store, tables: dict[str, Callable[[Store], Table]] | None = None, where: str = "") -> str:
    """The document with every table between its markers rendered anew (tables: TABLES unless given)."""
    tables = TABLES if tables is None else tables

    def one(m: re.Match[str]) -> str:
        name = m.group(2)
        if name not in tables:
            raise RenderError(f"{where}: unknown table {name!r} (known: {', '.join(sorted(tables))})")
        return m.group(1) + "\n".join(tables[name](store).lines()) + "\n" + m.group(4)

    return MARKER.sub(one, text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 with a diff where a table differs")
    p.add_argument("--results", default=str(TOP / "perf" / "results"), help="the result files' folder")
    p.add_argument("documents", nargs="*", default=[str(TOP / d) for d in DOCUMENTS])
    args = p.parse_args(argv)
    store = Store(pathlib.Path(args.results))
    status = 0
    for doc in args.documents:
        path = pathlib.Path(doc)
        old = path.read_text()
        try:
            new = render(old, store, where=str(path))
        except RenderError as e:
            print(f"render_results: {e}", file=sys.stderr)
            return 2
        if new == old:
            continue
        if args.check:
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True), str(path),
                                                       f"{path} (rendered from the results)"))
            print(f"render_results: {path} differs from what perf/results gives: run tools/render_results.py")
            status = 1
        else:
            path.write_text(new)
            print(f"render_results: rewrote the tables of {path}")
    return status


if __name__ == "__main__":
    sys.exit(main())
