#!/usr/bin/env bash
# On the GPU machine, after tools/gpu-check.sh has built build-gpu: qwZ and qgZ over NVLink at 256 MB and 1 GB for
# several ZP_NCCL_SMS values (SMs the pipelines' kernels leave to NCCL; 0 = no green context), through
# tools/tunable-sweep.sh (one table, a column per value), then one traced call of each (ZP_TRACE_PIPELINE) at the
# default setting.
# Knobs: SMS="0 16 32 48", BINS="qwz qgz", BITS="8 4", SIZES="256M 1G" (first and last are used), ITERS=10,
# TRACE=0 skips the traced calls. Other ZP_* variables (e.g. ZP_CHUNK_BYTES) pass through.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=tools/regimes.sh
source tools/regimes.sh
zp_export_regime nvlink
build=${ZP_GPU_CHECK_BUILD_DIR:-build-gpu}
sizes=(${SIZES:-256M 1G})
bins=""
for bin in ${BINS:-qwz qgz}; do bins="$bins ${bin}_perf"; done
VAR=ZP_NCCL_SMS VALUES="${SMS:-0 16 32 48}" REGIMES=nvlink BINS="$bins" BITS="${BITS:-8 4}" MIN="${sizes[0]}" \
  MAX="${sizes[-1]}" ITERS="${ITERS:-10}" bash tools/tunable-sweep.sh
[ "${TRACE:-1}" = 0 ] && exit 0
for bin in ${BINS:-qwz qgz}; do
  echo "== trace $bin int8 1G"
  ZP_TRACE_PIPELINE=1 ZP_DEBUG=INFO ZP_DEBUG_SUBSYS=COLL timeout 120 "$build/perf/${bin}_perf" -b 1G -e 1G -n 2 \
    -w 1 -c 0 -p 0 -B 8 2>&1 | grep -o 'trace .*' | tail -2 | cut -c1-900
done
