#!/usr/bin/env bash
# On the GPU machine, after tools/gpu-check.sh has built build-gpu: the perf tables of some binaries for several
# values of one zpccl tunable, then one table of speedups (vs NCCL in the same run) with a column per value, so
# that a setting is judged against the default measured in the same call. Every run goes through gpu-check.sh
# (perf steps only, its regimes and two-process launch), tagged by the value, so its JSON lands in
# build-gpu/results-<VAR>-<value> and, when $OUT is set, in $OUT/results-<VAR>-<value>.json.
#
#   VAR=ZP_CHUNK_BYTES VALUES="default 16777216" REGIMES="shm net" BINS="qwz_perf qgz_perf" \
#     MIN=64M MAX=1G bash tools/tunable-sweep.sh
#
# "default" leaves VAR unset. FIXED="A=1 B=2" is added to every run. TAG names this sweep's files, so that several
# sweeps in one call keep theirs (without it, a second sweep of the same VAR and value overwrites the first's). Iterations: ITERS (10), NET_ITERS (5);
# PERF_FLAGS more perf flags (e.g. "-r 5": alternating rounds against NCCL, for the net regime's drift).
# No check of the outputs (-c 0): the tables of gpu-check.sh check them; this is for choosing a value.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=tools/regimes.sh
source tools/regimes.sh
zp_export_regime nvlink
: "${VAR:?set VAR to the tunable to sweep}" "${VALUES:?set VALUES}"
build=${ZP_GPU_CHECK_BUILD_DIR:-build-gpu}
tags=()
for value in $VALUES; do
  tag=-$VAR-$value${TAG:+-$TAG}
  env_words=${FIXED:-}
  [ "$value" != default ] && env_words="$env_words $VAR=$value"
  echo "== $VAR=$value ${FIXED:+(with $FIXED)}"
  ZP_GPU_CHECK_SKIP_BUILD=1 ZP_GPU_CHECK_SKIP_TESTS=1 ZP_GPU_CHECK_TAG=$tag \
    ZP_GPU_CHECK_REGIMES="${REGIMES:-nvlink}" ZP_GPU_CHECK_BINS="${BINS:-qwz_perf qgz_perf}" \
    ZP_GPU_CHECK_MIN="${MIN:-64M}" ZP_GPU_CHECK_MAX="${MAX:-1G}" ZP_GPU_CHECK_ITERS="${ITERS:-10}" \
    ZP_GPU_CHECK_WARMUP=3 ZP_GPU_CHECK_NET_ITERS="${NET_ITERS:-5}" ZP_GPU_CHECK_BITS="${BITS:-8 4}" \
    ZP_GPU_CHECK_EXTRA="-c 0 -p 0 ${PERF_FLAGS:-}" ZP_GPU_CHECK_ENV="$env_words" \
    ZP_GPU_CHECK_BUDGET="${BUDGET:-100000}" ZP_GPU_CHECK_DEADLINE="${DEADLINE:-100000}" \
    bash tools/gpu-check.sh 2>&1 | grep -E '^\[|RESULT' | cut -c1-160
  tags+=("$tag")
done

PYTHONPATH=tools python3 - "$build" "$VAR" "${tags[@]}" <<'PY'
import glob, json, os, sys
from perf_files import load
build, var, tags = sys.argv[1], sys.argv[2], sys.argv[3:]
table, keys = {}, []
for col, tag in enumerate(tags):
    for path in sorted(glob.glob(os.path.join(build, "results" + tag, "*.json"))):
        try:
            rows = load(path)[1]
        except (OSError, ValueError):
            continue
        for r in rows if isinstance(rows, list) else []:
            if not isinstance(r, dict) or "speedup" not in r:
                continue
            key = (r["op"], r.get("bits", "-"), r["regime"], r["size"])
            if key not in table:
                table[key] = [None] * len(tags)
                keys.append(key)
            table[key][col] = (r["speedup"], r["oop"]["time_us"], r["nccl"]["time_us"])
print(f"speedup vs NCCL (zpccl / NCCL time, us) for {var} =", " | ".join(t[len(var) + 2:] for t in tags))
for key in keys:
    op, bits, regime, size = key
    cells = ["%5.2f (%8.1f / %8.1f)" % c if c else "%-27s" % "  -" for c in table[key]]
    print(f"{op:20s} int{bits} {regime:6s} {size >> 20:5d}M  " + "  ".join(cells))
PY
