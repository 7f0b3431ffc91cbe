#!/usr/bin/env python3
"""The short summary that ends tools/run-main.sh, from the perf binaries' JSON files (-J) given as arguments.

Rows measured against NCCL (the cuda backend): per collective, bit width and regime, zpccl's speedup at each
size (NCCL's time / zpccl's, out of place, both in the same run). Host-backend rows: per collective, bit width
and size, the bytes one rank sends per call, by zpccl and by NCCL's ring for the same logical bytes (the
binaries' formulas), in all and across nodes, and the share of the bytes across nodes that zpccl saves. Rows
with neither (a kernel against memcpy) are counted, not shown. Exit status 1 when a row has wrong elements.

    python3 tools/perf_summary.py build/main-results/*.json
"""
from __future__ import annotations

import pathlib
import sys
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # tools/: perf_files
from perf_files import load as load_file  # noqa: E402
from perf_files import size_text  # noqa: E402

DIGITS = 3  # the sizes' and byte counts' significant digits (64K, 1.5G, 3.56K)


def load(paths: list[str]) -> list[dict[str, Any]]:
    rows = []
    for path in paths:
        try:
            rows.extend(load_file(path)[1])
        except (OSError, ValueError) as e:
            print(f"# {path}: unreadable ({e})")
    return rows


def wrong_elements(row: dict[str, Any]) -> int:
    return sum(((row.get(variant) or {}).get("wrong") or 0) for variant in ("oop", "ip"))


def group_key(row: dict[str, Any]) -> tuple[str, str, str]:
    bits = row.get("bits")
    op = (row.get("op") or "?") + (f" {row['grad']}" if row.get("grad") else "")  # gradient rounding: its own row
    return op, f"int{bits}" if bits else "-", row.get("regime") or row.get("backend") or "-"


def local_copy(row: dict[str, Any]) -> bool:
    """hpZ's gather with one rank a node: its group is the rank itself, a copy in its own memory; the backward
    gather it replaces is still NCCL's over every node, so the ratio says nothing about a link."""
    return row.get("op") == "hpz_all_gather" and row.get("nodes") and row.get("nodes") == row.get("ranks")


def speedup_cell(row: dict[str, Any]) -> str:
    """NCCL's median time over zpccl's, and the least and greatest of the rounds' own ratios when there were
    several rounds: "1.62x (1.58-1.66)"."""
    text = f"{row['speedup']:.2f}x"
    if row.get("speedup_min") is not None and row.get("speedup_max") is not None:
        text += f" ({row['speedup_min']:.2f}-{row['speedup_max']:.2f})"
    return text


def speedup_table(rows: list[dict[str, Any]]) -> list[str]:
    groups: dict[tuple[str, str, str], dict[int, str]] = {}
    copies = [r for r in rows if local_copy(r)]
    rows = [r for r in rows if not local_copy(r)]
    for r in rows:
        groups.setdefault(group_key(r), {})[r["size"]] = speedup_cell(r)
    sizes = sorted({size for cells in groups.values() for size in cells})
    width = max([7] + [len(c) for cells in groups.values() for c in cells.values()])
    fmt = "{:<24} {:<5} {:<14}" + f" {{:>{width}}}" * len(sizes)
    lines = ["speedup over NCCL (NCCL's median time / zpccl's, out of place, same run; the rounds' least and "
             "greatest ratios in brackets), by logical size:",
             fmt.format("collective", "bits", "regime", *(size_text(s, DIGITS) for s in sizes))]
    for (op, bits, regime), cells in groups.items():
        lines.append(fmt.format(op, bits, regime, *(cells.get(s, "-") for s in sizes)))
    if copies:
        lines.append("(hpz_all_gather with one rank a node is a local copy, its hpZ group being the rank: not shown; "
                     "qwz_hpz_gathers, the forward and backward gathers together, is the comparison)")
    return lines


def wire_table(rows: list[dict[str, Any]]) -> list[str]:
    fmt = "{:<20} {:<5} {:>8} {:>19} {:>19} {:>8}"
    lines = ["bytes one rank sends per call (host backend: the plans' formulas), zpccl / NCCL's ring:",
             fmt.format("collective", "bits", "logical", "in all", "across nodes", "saved")]
    for r in sorted(rows, key=lambda r: (group_key(r), r["size"])):
        zp, ring = r["wire_bytes_per_rank"]["zpccl"], r["wire_bytes_per_rank"]["nccl_ring"]
        zp_all, ring_all = zp["intra"] + zp["inter"], ring["intra"] + ring["inter"]
        saved = f"{100 * (1 - zp['inter'] / ring['inter']):.0f}%" if ring["inter"] else "-"
        op, bits, _ = group_key(r)
        lines.append(fmt.format(op, bits, size_text(r["size"], DIGITS),
                                f"{size_text(zp_all, DIGITS)} / {size_text(ring_all, DIGITS)}",
                                f"{size_text(zp['inter'], DIGITS)} / {size_text(ring['inter'], DIGITS)}", saved))
    lines.append("saved: the share of NCCL's bytes across nodes that zpccl does not send (the slow link's load)")
    return lines


def main(paths: list[str]) -> int:
    rows = load(paths)
    against_nccl = [r for r in rows if r.get("baseline") == "nccl" and r.get("speedup") is not None]
    with_wire = [r for r in rows if r.get("wire_bytes_per_rank") and r.get("size")]
    lines = []
    if against_nccl:
        lines += speedup_table(against_nccl)
    if with_wire:
        lines += ([""] if lines else []) + wire_table(with_wire)
    shown = len({id(r) for r in against_nccl + with_wire})
    if not lines:
        lines.append("no rows with an NCCL baseline or wire bytes")
    wrong = sum(wrong_elements(r) for r in rows)
    lines.append(f"{len(rows)} rows ({len(rows) - shown} without an NCCL baseline or wire bytes, not shown); "
                 f"wrong elements: {wrong}")
    print("\n".join(lines))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
