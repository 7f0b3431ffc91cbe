#!/usr/bin/env python3
"""Plot perf/fsdp_step.py's JSON (-J): step time of each configuration (median, with its min-max range), one
panel per file (shape / layout), and the loss runs' training curves beside them when the files hold any.

    python3 tools/plot_fsdp.py -o perf/figures/fsdp-step.png perf/results/fsdp-small.json perf/results/fsdp-large.json

Needs matplotlib (pip install matplotlib).
"""
import argparse
import json
import sys


def load(path):
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"plot_fsdp.py: cannot read {path}: {e}")
    if not isinstance(data, dict) or "rows" not in data:
        sys.exit(f"plot_fsdp.py: {path} is not perf/fsdp_step.py's JSON")
    return data


def title_of(data):
    r = data["rows"][0]
    nodes = f"{r['nodes']} nodes of {r['ranks_per_node']}" if r.get("nodes") else f"{r['ranks']} ranks"
    return (f"{r['params'] / 1e6:.0f}M params, {r['batch']}x{r['seq']} tokens/rank, {nodes} ({r['regime']})\n"
            f"zpccl int{r['weight_bits']} weights, int{r['grad_bits']} grads")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-o", "--output", required=True)
    p.add_argument("files", nargs="+")
    args = p.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datas = [load(f) for f in args.files]
    curves = [d for d in datas if d.get("losses")]
    cols = len(datas) + len(curves)
    fig, axes = plt.subplots(1, cols, figsize=(5.2 * cols, 4.2), squeeze=False)
    for ax, data in zip(axes[0], datas):
        rows = data["rows"]
        names = [r["config"] for r in rows]
        med = [r["median_ms"] for r in rows]
        err = [[m - r["min_ms"] for m, r in zip(med, rows)], [r["max_ms"] - m for m, r in zip(med, rows)]]
        colors = ["#888888" if n.startswith("nccl") else "#2a7fd4" if n.startswith("zpccl") else "#7fbf3f"
                  for n in names]
        ax.bar(range(len(rows)), med, yerr=err, color=colors, capsize=4)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(names, rotation=20, ha="right")
        ax.set_ylabel("step time, ms (median, min-max)")
        ax.set_title(title_of(data), fontsize=9)
        for i, m in enumerate(med):
            ax.text(i, m, f"{m:.0f}", ha="center", va="bottom", fontsize=8)
    for ax, data in zip(axes[0][len(datas):], curves):
        for run in data["losses"]:
            steps, losses = zip(*run["curve"])
            weight_bits = run.get("weight_bits") or data["rows"][0]["weight_bits"]
            label = run["comm"] + ("" if run.get("grad_bits") is None else f" w{weight_bits}/g{run['grad_bits']}")
            ax.plot(steps, losses, label=f"{label}: valid {run['valid']:.4f}")
        ax.set_xlabel("step")
        ax.set_ylabel("training loss (mean over ranks)")
        ax.set_title("loss runs, " + title_of(data).split("\n")[0], fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)


if __name__ == "__main__":
    main()
