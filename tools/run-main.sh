#!/usr/bin/env bash
# README's main job: set up, build, then bring up communicators and run the perf binaries of the collectives
# that exist: on the visible GPUs with NCCL side by side, or on the host backend (2 emulated nodes x 4 thread
# ranks) when there is no GPU.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${ZP_BUILD_DIR:-$top/build}
source "$top/tools/setup.sh"
export NCCL_NVLS_ENABLE=0

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
status=0
"$build/tools/zpccl-info" || status=1
for bin in "$build"/perf/*_perf; do
  [ -x "$bin" ] || continue
  name=$(basename "$bin")
  if [ "${gpus:-0}" -gt 0 ]; then
    echo "## $name (GPUs, NCCL side by side)"
    "$bin" -b 1M -e 256M -f 4 || status=1
  else
    case $name in nccl_*) echo "## $name: skipped (NCCL baselines need GPUs)"; continue ;; esac
    echo "## $name (host backend, 2 nodes x 4 ranks)"
    "$bin" -H -t 8 -N 2 -b 64K -e 4M -f 4 || status=1
  fi
done
exit $status
