#!/usr/bin/env bash
# On the GPU machine, after tools/gpu-check.sh has built build-gpu: where the time of a small call goes (issue 5's
# 1 MB bound: at most twice NCCL's time). For qwZ and qgZ at 1M..16M over NVLink it prints, per configuration,
# zpccl's time per call, the host's time to enqueue one call (when the two are equal the host sets the pace, not
# the GPU), and NCCL's same two, from the perf JSON (enqueue_us).
#
#   bash tools/small-messages.sh                 # threads and processes, default settings
#   CONFIGS="default ZP_TIMEOUT_MS=0" bash tools/small-messages.sh
#
# CONFIGS: words of VAR=value[,VAR=value...] (or "default"), each a run of its own; REGIMES (default "nvlink
# nvlink-procs"); BITS (default "8 4");
# ITERS (200) calls per timing, so that launch jitter averages out.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=tools/regimes.sh
source tools/regimes.sh
zp_export_regime nvlink
build=${ZP_GPU_CHECK_BUILD_DIR:-build-gpu}
configs=${CONFIGS:-default}
# First the host's cost of each CUDA call a collective makes (tools/api_costs.cu).
"$build/tools/zpccl-api-costs"
tags=()
for config in $configs; do
  tag=-small-${config//[=,]/-}
  env_words=""
  [ "$config" != default ] && env_words=${config//,/ }
  ZP_GPU_CHECK_SKIP_BUILD=1 ZP_GPU_CHECK_SKIP_TESTS=1 ZP_GPU_CHECK_TAG=$tag \
    ZP_GPU_CHECK_REGIMES="${REGIMES:-nvlink nvlink-procs}" ZP_GPU_CHECK_BINS="${BINS:-qwz_perf qgz_perf}" ZP_GPU_CHECK_BITS="${BITS:-8 4}" \
    ZP_GPU_CHECK_MIN=1M ZP_GPU_CHECK_MAX="${MAX:-16M}" ZP_GPU_CHECK_ITERS="${ITERS:-200}" ZP_GPU_CHECK_WARMUP=20 \
    ZP_GPU_CHECK_EXTRA="-c 0 -p 0" ZP_GPU_CHECK_ENV="$env_words" ZP_GPU_CHECK_BUDGET=100000 \
    ZP_GPU_CHECK_DEADLINE=100000 bash tools/gpu-check.sh 2>&1 | grep -E '^\[' | cut -c1-160
  tags+=("$tag")
done

PYTHONPATH=tools python3 - "$build" "${tags[@]}" <<'PY'
import glob, json, os, sys
from perf_files import load
build, tags = sys.argv[1], sys.argv[2:]
print(f"{'config':<24} {'op':<20} {'bits':>4} {'regime':<13} {'size':>5}  {'zpccl us':>9} {'enqueue':>8}"
      f"  {'NCCL us':>8} {'enqueue':>8}  {'x NCCL time':>11}")
for tag in tags:
    for path in sorted(glob.glob(os.path.join(build, f"results{tag}", "*.json"))):
        try:
            rows = load(path)[1]
        except (OSError, ValueError):
            continue
        for r in rows:
            oop, nccl = r.get("oop") or {}, r.get("nccl") or {}
            if "time_us" not in oop or "time_us" not in nccl:
                continue
            print(f"{tag[7:]:<24} {r['op']:<20} {r['bits']:>4} {r['regime']:<13} {r['size'] >> 20:>4}M"
                  f"  {oop['time_us']:9.1f} {oop.get('enqueue_us', float('nan')):8.1f}"
                  f"  {nccl['time_us']:8.1f} {nccl.get('enqueue_us', float('nan')):8.1f}"
                  f"  {oop['time_us'] / nccl['time_us']:11.2f}")
PY
