#!/usr/bin/env python3
"""Plots the predicted ZeRO++ speedup over ZeRO-3 against GPU count from zpccl-model's sweep CSV.

    zpccl-model --params 20B --sweep --csv sweep.csv
    python3 tools/plot_model.py sweep.csv -o speedup.png

With --calibrate FILE... the sweep runs on the links, kernels and pipeline overlaps fitted to
the perf JSON files (e.g. perf/results/2026-11-30-h200x2*.json); the inter-node bandwidth of each line replaces
the fitted one, its per-step cost is kept.

One line per inter-node bandwidth (the CSV's inter_gbps column), x = GPUs (log scale), y = step-time speedup;
a second panel shows the communication time per step of both schemes.
"""
import argparse
import csv
import sys
from collections import defaultdict


def read_sweep(path):
    """Rows of the CSV grouped by inter-node bandwidth (Gb/s), each sorted by GPU count."""
    series = defaultdict(list)
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        needed = {"inter_gbps", "gpus", "speedup", "zero3_comm_ms", "zeropp_comm_ms"}
        missing = needed - set(reader.fieldnames or [])
        if missing:
            raise ValueError(f"{path}: not a zpccl-model sweep CSV (missing columns {sorted(missing)})")
        for row in reader:
            series[float(row["inter_gbps"])].append(row)
    for rows in series.values():
        rows.sort(key=lambda r: int(r["gpus"]))
    return series


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", help="sweep CSV written by zpccl-model --sweep")
    parser.add_argument("-o", "--output", default="zpccl_model_speedup.png", help="PNG to write")
    parser.add_argument("--title", default=None, help="figure title")
    args = parser.parse_args(argv)

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_model.py needs matplotlib: pip install matplotlib (the CSV is readable as is)", file=sys.stderr)
        return 2

    try:
        series = read_sweep(args.csv)
    except (OSError, ValueError) as err:
        print(f"plot_model.py: {err}", file=sys.stderr)
        return 1
    if not series:
        print(f"plot_model.py: {args.csv} has no rows", file=sys.stderr)
        return 1

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    first = next(iter(series.values()))[0]
    for bw, rows in sorted(series.items()):
        gpus = [int(r["gpus"]) for r in rows]
        label = f"{bw:g} Gb/s per node"
        ax.plot(gpus, [float(r["speedup"]) for r in rows], marker="o", label=label)
        line = ax2.plot(gpus, [float(r["zero3_comm_ms"]) / 1e3 for r in rows], marker="s", linestyle="--",
                        label=f"ZeRO-3, {label}")
        ax2.plot(gpus, [float(r["zeropp_comm_ms"]) / 1e3 for r in rows], marker="o", color=line[0].get_color(),
                 label=f"ZeRO++, {label}")
    ticks = sorted({int(r["gpus"]) for rows in series.values() for r in rows})
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.set_xticks(ticks)
        a.set_xticklabels([str(t) for t in ticks])
        a.minorticks_off()
        a.set_xlabel(f"GPUs ({first['gpus_per_node']} per node)")
        a.grid(True, which="both", alpha=0.3)
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_ylabel("predicted step speedup, ZeRO++ over ZeRO-3")
    ax.set_ylim(bottom=0)
    ax.legend()
    ax2.set_ylabel("communication per step (s)")
    ax2.set_yscale("log")
    ax2.legend(fontsize="small", loc="lower right")
    params = float(first["params"])
    bucket = float(first.get("bucket_params") or 0)
    calls = f"buckets of {bucket / 1e6:g}M parameters" if bucket > 0 else "one call per collective"
    title = args.title or (f"zpccl cost model: {params / 1e9:g}B parameters, {calls}, "
                           f"compute {float(first['compute_ms']):.0f} ms/step, overlap {float(first['overlap']):g}")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
