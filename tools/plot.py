#!/usr/bin/env python3
"""Plot the perf binaries' JSON (-J) rows: speedup over the baseline (or bus bandwidth) against size.

One line per (regime, bits, op), from one or more JSON files, into one PNG:

    python3 tools/plot.py -o speedup.png results/*.json
    python3 tools/plot.py --metric busbw -o busbw.png results/nvlink_*.json

Rows without the metric (e.g. speedup of an NCCL-only binary) are skipped; a file without perf rows is an
error. Needs matplotlib (pip install matplotlib).
"""
import argparse
import pathlib
import sys
from collections import defaultdict

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # tools/: perf_files
from perf_files import load  # noqa: E402


def load_rows(paths):
    rows = []
    for path in paths:
        try:
            _, mine = load(path)
        except (OSError, ValueError) as e:
            sys.exit(f"plot.py: cannot read {path}: {e}")
        if not mine:
            sys.exit(f"plot.py: {path} holds no perf rows (perf/json_out.h)")
        rows.extend(mine)
    return rows


def metric_of(row, metric):
    if metric == "speedup":
        return row.get("speedup")
    part = row.get("oop") or {}
    return part.get(metric)


def series(rows, metric):
    """{(regime, bits, op): [(size, value), ...]} sorted by size; later files win for repeated sizes."""
    lines = defaultdict(dict)
    for r in rows:
        value = metric_of(r, metric)
        if value is None or r.get("size") in (None, 0):
            continue
        key = (r.get("regime") or "-", r.get("bits"), r.get("op") or "?")
        lines[key][r["size"]] = value
    return {k: sorted(v.items()) for k, v in lines.items()}


def label_of(key):
    regime, bits, op = key
    return f"{op} {'int%d' % bits if bits else 'unquantized'} ({regime})"


def size_label(size):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if size >= 1 << shift:
            return f"{size / (1 << shift):g}{unit}"
    return str(size)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", nargs="+", help="JSON files written by the perf binaries (-J)")
    parser.add_argument("-o", "--output", default="speedup.png", help="PNG to write (default speedup.png)")
    parser.add_argument("--metric", choices=["speedup", "busbw", "algbw", "time_us"], default="speedup",
                        help="what to plot: speedup over the baseline (default) or an out-of-place figure")
    parser.add_argument("--title", default=None, help="plot title")
    args = parser.parse_args()

    try:
        import matplotlib
        matplotlib.use("Agg")  # no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot.py: matplotlib is not installed; install it with 'pip install matplotlib' "
                 "(or read the JSON directly: every row has size, speedup and oop.busbw)")

    lines = series(load_rows(args.json), args.metric)
    if not lines:
        sys.exit(f"plot.py: no row of {', '.join(args.json)} has a {args.metric} value")

    fig, ax = plt.subplots(figsize=(9, 5.5))
    for key in sorted(lines, key=lambda k: (str(k[0]), k[1] or 0, k[2])):
        points = lines[key]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label_of(key))
    ax.set_xscale("log", base=2)
    sizes = sorted({p[0] for pts in lines.values() for p in pts})
    ax.set_xticks(sizes)
    ax.set_xticklabels([size_label(s) for s in sizes], rotation=45)
    ax.set_xlabel("size (logical bytes)")
    ylabels = {"speedup": "speedup (baseline time / zpccl time)", "busbw": "bus bandwidth (GB/s)",
               "algbw": "algorithm bandwidth (GB/s)", "time_us": "time (us)"}
    ax.set_ylabel(ylabels[args.metric])
    if args.metric == "speedup":
        ax.axhline(1.0, color="gray", linewidth=0.8, linestyle="--")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(args.title or f"zpccl {args.metric} vs size")
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"plot.py: wrote {args.output} ({len(lines)} lines)")


if __name__ == "__main__":
    main()
