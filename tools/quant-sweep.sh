#!/usr/bin/env bash
# Issue 3's table: quantize and dequantize throughput as a share of the device-to-device copy measured in the
# same run, 256 MB inputs, every type x bit width x a few block sizes, each checked against the host reference.
# Usage (GPU machine, after a build): tools/quant-sweep.sh [BUILD_DIR] [OUT_DIR]
set -uo pipefail
build=${1:-build-gpu}
out=${2:-$build/results-quant}
mkdir -p "$out"
bin=$build/perf/quantize_perf
[ -x "$bin" ] || { echo "quant-sweep: $bin not built"; exit 1; }
status=0
for type in half bfloat16 float; do
  for bits in 8 4; do
    for g in ${ZP_QUANT_SWEEP_BLOCKS:-32 256 2048 8192}; do
      "$bin" -b 256M -e 256M -d "$type" -B "$bits" -G "$g" -n 20 -w 5 -J "$out/q_${type}_${bits}_${g}.json" \
        >"$out/q_${type}_${bits}_${g}.log" 2>&1 || status=1
    done
  done
done
PYTHONPATH="$(dirname "${BASH_SOURCE[0]}")" python3 - "$out" <<'PY'
import glob, json, os, sys
from perf_files import load
rows = []
for path in sorted(glob.glob(os.path.join(sys.argv[1], "q_*.json"))):
    try:
        rows.extend(load(path)[1])
    except (OSError, ValueError):
        print("unreadable", path)
blocks = sorted({r["block"] for r in rows})
print("% of the D2D copy at 256 MB (quantize / dequantize); #wrong summed over all rows:",
      sum((r.get("oop") or {}).get("wrong", 0) for r in rows))
print("{:<14}".format("type bits") + "".join("{:>14}".format("G=%d" % g) for g in blocks))
for t in ("half", "bfloat16", "float"):
    for b in (8, 4):
        cells = []
        for g in blocks:
            q = [r for r in rows if r["type"] == t and r["bits"] == b and r["block"] == g]
            get = lambda op: next((round(100 * r["speedup"]) for r in q if r["op"] == op and r.get("speedup")), None)
            cells.append("{}/{}".format(get("quantize"), get("dequantize")))
        print("{:<14}".format("%s %d" % (t, b)) + "".join("{:>14}".format(c) for c in cells))
PY
exit $status
