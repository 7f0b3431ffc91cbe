#!/usr/bin/env python3
"""Plot perf/experiments/grad_numerics.py's JSON (-J; several files are merged, each configuration and seed taken
once, from the first file that has it): the training loss of every configuration (mean over seeds, smoothed),
and each configuration's validation-loss gap to exact bf16 gradients (per seed and mean, with the issue's 0.1%
target).

    python3 tools/plot_grad_numerics.py -o perf/figures/grad-numerics.png perf/results/<date>-h200x1-grad-numerics.json
    python3 tools/plot_grad_numerics.py -o perf/figures/grad-numerics.png seeds01.json seeds23.json   # merged

Needs matplotlib (pip install matplotlib).
"""
import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # tools/: loss_stats
import loss_stats  # noqa: E402  (the paired gaps)


def smooth(values, window):
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json", nargs="+")
    p.add_argument("-o", "--output", default="grad-numerics.png")
    p.add_argument("--window", type=int, default=25, help="steps of the moving average")
    args = p.parse_args()
    files, runs, seen = [], [], set()
    for path in args.json:
        try:
            with open(path) as f:
                data = json.load(f)
            for r in data["runs"]:
                if (r["config"], r["seed"]) not in seen:
                    seen.add((r["config"], r["seed"]))
                    runs.append(r)
        except (OSError, ValueError, KeyError, TypeError) as e:
            sys.exit(f"plot_grad_numerics.py: {path} is not perf/experiments/grad_numerics.py's JSON: {e}")
        files.append(data)
    data = files[0]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = list(dict.fromkeys(r["config"] for r in runs))
    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 5.2))
    for c in configs:
        curves = [r["losses"] for r in runs if r["config"] == c]
        steps = min(len(x) for x in curves)
        mean = [sum(x[i] for x in curves) / len(curves) for i in range(steps)]
        left.plot(smooth(mean, args.window), label=c, linewidth=1.2)
    left.set_xlabel("step")
    left.set_ylabel(f"training loss (mean over seeds, {args.window}-step average)")
    left.legend()
    a = data.get("args", {})
    where = "threads on the CPU, host backend" if a.get("cpu") else "processes on the GPU"
    left.set_title(f"{a.get('nproc')} ranks as {a.get('nodes')} nodes ({where}), "
                   f"{a.get('layers')}x{a.get('d_model')} GPT, {a.get('steps')} steps\n"
                   f"(commit {', '.join(dict.fromkeys(str((d.get('provenance') or {}).get('commit') or d.get('commit', '?'))[:10] for d in files))})", fontsize=9)
    gaps = loss_stats.gaps_by_config(runs, "exact")  # percent, per configuration and seed
    names = [c for c in configs if c in gaps and c != "exact"]
    for i, c in enumerate(names):
        per_seed = list(gaps[c].values())
        right.scatter([i] * len(per_seed), per_seed, color="gray", s=14, zorder=3)
        right.bar(i, sum(per_seed) / len(per_seed), color="C%d" % (configs.index(c)), alpha=0.8)
    right.axhline(0.1, color="red", linestyle="--", linewidth=1, label="target +0.1%")
    right.axhline(0.0, color="black", linewidth=0.8)
    right.set_xticks(range(len(names)))
    right.set_xticklabels(names, rotation=30, ha="right")
    right.set_ylabel("validation loss vs exact bf16 gradients (%)")
    right.legend()
    fig.tight_layout()
    fig.savefig(args.output, dpi=130)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
