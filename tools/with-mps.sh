#!/usr/bin/env bash
# Runs one command with CUDA MPS serving its CUDA processes, then stops MPS, so that a figure measured under MPS
# comes from one command like any other (perf/RESULTS.md, "What the one-GPU stand-in charges"). Processes sharing a
# GPU take turns on it in time slices; under MPS their kernels run together.
#
#   bash tools/with-mps.sh COMMAND [ARG ...]
#   e.g. bash tools/with-mps.sh python3 perf/fsdp_step.py --shape small --nproc 2 --nodes 2
#
# It starts a control daemon of its own (nvidia-cuda-mps-control -d) with its pipes and logs in a fresh folder, runs
# COMMAND with CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY pointing there (so the labels of tools/regimes.sh
# and zpccl.launch end in -mps, and every result file's provenance records the variables), and stops the daemon when
# COMMAND ends, fails or is interrupted. Its exit status is COMMAND's; 2 when MPS cannot be started (no
# nvidia-cuda-mps-control on PATH, a daemon already serving, or no control endpoint within ZP_MPS_WAIT_S seconds,
# default 10), with the daemon's log. Knob: ZP_MPS_DIR, the folder (default a new one under ${TMPDIR:-/tmp}).
set -uo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

if [ $# -eq 0 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
  sed -n '/^#   bash tools\/with-mps.sh/,/^#   e.g./p' "$0" | sed 's/^# \{0,3\}//'
  [ $# -eq 0 ] && exit 2
  exit 0
fi
# shellcheck source=tools/regimes.sh
source "$top/tools/regimes.sh"
if ! command -v nvidia-cuda-mps-control >/dev/null; then
  echo "with-mps: no nvidia-cuda-mps-control on PATH (it ships with the NVIDIA driver's utilities)" >&2
  exit 2
fi
if [ -n "$(zp_sharing_suffix)" ]; then
  echo "with-mps: an MPS daemon already serves ${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}; run the command" \
    "directly, or stop it first (echo quit | nvidia-cuda-mps-control)" >&2
  exit 2
fi

dir=${ZP_MPS_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/zp-mps.XXXXXX")}
mkdir -p "$dir/pipe" "$dir/log"
export CUDA_MPS_PIPE_DIRECTORY=$dir/pipe CUDA_MPS_LOG_DIRECTORY=$dir/log

stop_mps() { echo quit | nvidia-cuda-mps-control >/dev/null 2>&1 || true; }
if ! nvidia-cuda-mps-control -d; then
  echo "with-mps: nvidia-cuda-mps-control -d failed" >&2
  exit 2
fi
trap stop_mps EXIT
trap 'exit 130' INT TERM
wait_s=${ZP_MPS_WAIT_S:-10}
for _ in $(seq $((wait_s * 10))); do
  [ -n "$(zp_sharing_suffix)" ] && break
  sleep 0.1
done
if [ -z "$(zp_sharing_suffix)" ]; then
  echo "with-mps: the daemon made no control endpoint in $CUDA_MPS_PIPE_DIRECTORY within $wait_s s; its log:" >&2
  cat "$CUDA_MPS_LOG_DIRECTORY"/* >&2 2>/dev/null
  exit 2
fi
echo "with-mps: MPS serves $CUDA_MPS_PIPE_DIRECTORY (logs in $CUDA_MPS_LOG_DIRECTORY)" >&2
"$@"
