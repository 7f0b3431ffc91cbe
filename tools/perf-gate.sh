#!/usr/bin/env bash
# The perf gate (DESIGN.md, "Evidence"): one command on a GPU machine, under ten minutes, that reruns the headline
# figures on one GPU and says which regressed against the reference recorded in the tree (perf/gate/<GPUs>x-<model>
# .json). Run it after every change to src/, device/, host/ or zpccl.fsdp, before the issue that made it is resolved.
#   qwZ and qgZ, int8 and int4, and hpZ's exact gather and forward + backward pair (int8): net-on1gpu (two processes
#   sharing the GPU as two nodes over sockets, through tools/gpu-check.sh) at 16M, 64M and 256M, each against NCCL
#   in the same run, five alternating rounds (the perf binaries' default), every output checked against the host
#   backend; the quantized all-reduce, int8 and int4, the same way against ncclAllReduce;
#   the FSDP2 step, small and large shapes (perf/fsdp_step.py: five alternating rounds, every rank timed): FSDP2 +
#   NCCL with reshard_after_forward True and False, the ablation nccl-2comm (its reduce-scatters on a second NCCL
#   communicator), the floor no-comm (FSDP's collectives as local copies: the step with no network) and FSDP2 +
#   zpccl;
# then tools/perf_gate.py compares each figure (median and the rounds' spread) with the reference, one line a figure,
# and prints last "GATE: OK" or "GATE: FAILED: <figures>". Exit status 0 OK; 1 a figure regressed or is missing, or a
# step failed; 2 bad arguments or no GPU; 3 no reference is recorded for this machine yet (--record makes this run
# the reference: commit the file it writes).
#
#   bash tools/perf-gate.sh [--record] [--quick] [--compare-only DIR]
#     --record            write this run's figures as the machine's reference (refused from a dirty tree)
#     --quick             fewer timed FSDP2 steps a round (the rounds stay five)
#     --compare-only DIR  compare the result files of an earlier run with the reference (no GPU needed)
# Knobs: ZP_GATE_BUILD_DIR (default build-gpu, shared with tools/gpu-check.sh), ZP_GATE_REFERENCE (another reference
# file), ZP_GATE_MARGIN (beyond the reference's range, default 0.03), ZP_GATE_SKIP_BUILD=1, ZP_GATE_SKIP_FSDP=1,
# ZP_GATE_DEADLINE (seconds the whole gate may take, default 570), ZP_GPU_CHECK_MESON_ARGS (e.g. -Dnccl_home=DIR).
# It needs nvcc, NCCL, ninja and Meson there (Meson on PATH, in .venv/, or as a meson-*.whl at the top of the tree,
# as tools/gpu-check.sh finds it) and torch for the FSDP2 steps; nothing from the network and nothing outside the
# tree. Result files and logs: $build/perf-gate (tools/gpu-check.sh's own stay in $build/results-gate*); with $OUT
# set, also $OUT/gate.txt (the report) and $OUT/gate.tar.gz (the files).
set -uo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$top"

usage() { sed -n '/^#   bash tools\/perf-gate.sh/,/^#     --compare-only/p' "$0" | sed 's/^# \{0,3\}//'; }
record=() quick=0 compare_only=""
while [ $# -gt 0 ]; do
  case $1 in
    --record) record=(--record) ;;
    --quick) quick=1 ;;
    --compare-only)
      [ $# -ge 2 ] || { echo "perf-gate: --compare-only needs a folder" >&2; usage >&2; exit 2; }
      compare_only=$2
      shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "perf-gate: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
margin=${ZP_GATE_MARGIN:-0.03}
reference=()
[ -n "${ZP_GATE_REFERENCE:-}" ] && reference=(--reference "$ZP_GATE_REFERENCE")
compare() { python3 "$top/tools/perf_gate.py" "$1" --margin "$margin" "${reference[@]}" "${record[@]}"; }

if [ -n "$compare_only" ]; then
  [ -d "$compare_only" ] || { echo "perf-gate: $compare_only is not a folder" >&2; exit 2; }
  compare "$compare_only"
  exit $?
fi

# shellcheck source=tools/regimes.sh
source "$top/tools/regimes.sh"
if [ "$(zp_visible_gpus)" -lt 1 ]; then
  echo "perf-gate: no GPU visible (nvidia-smi, CUDA_VISIBLE_DEVICES): the gate measures on a GPU machine;" \
    "--compare-only DIR compares an earlier run's files anywhere" >&2
  exit 2
fi
if [ -n "$(zp_sharing_suffix)" ]; then
  echo "perf-gate: CUDA MPS serves this machine's processes, and the references were measured in time slices (their" \
    "labels carry no -mps suffix): stop MPS first (echo quit | nvidia-cuda-mps-control)" >&2
  exit 2
fi
zp_export_regime nvlink
build=${ZP_GATE_BUILD_DIR:-build-gpu}
case $build in /*) ;; *) build=$top/$build ;; esac
results=$build/perf-gate  # not results-gate: tools/gpu-check.sh empties that one as it starts
rm -rf "$results" && mkdir -p "$results"
deadline=${ZP_GATE_DEADLINE:-570}
SECONDS=0
status=0
note() { printf '[%4ds] %s\n' "$SECONDS" "$*"; }

# The perf binaries, through tools/gpu-check.sh (its build, its two processes sharing the GPU over sockets), in two
# calls: qwZ and qgZ at both bit widths, hpZ at int8, the all-reduce at both. They must end by the time the FSDP2
# steps need.
fsdp_seconds=$([ "${ZP_GATE_SKIP_FSDP:-0}" = 1 ] && echo 0 || echo 270)
perf_check() {  # TAG BINS BITS SKIP_BUILD
  local left=$((deadline - fsdp_seconds - SECONDS))
  [ "$left" -gt 30 ] || { note "perf $2: skipped (out of time)"; status=1; return; }
  env -u OUT ZP_GPU_CHECK_BUILD_DIR="$build" ZP_GPU_CHECK_TAG="$1" ZP_GPU_CHECK_BINS="$2" ZP_GPU_CHECK_BITS="$3" \
    ZP_GPU_CHECK_SKIP_BUILD="$4" \
    ZP_GPU_CHECK_TARGETS="perf/qwz_perf perf/qgz_perf perf/hpz_perf perf/all_reduce_perf libzpccl.so" \
    ZP_GPU_CHECK_SKIP_TESTS=1 ZP_GPU_CHECK_SKIP_PYTHON=1 ZP_GPU_CHECK_REGIMES=net ZP_GPU_CHECK_GRAD="" \
    ZP_GPU_CHECK_MIN=16M ZP_GPU_CHECK_MAX=256M ZP_GPU_CHECK_STEP=4 ZP_GPU_CHECK_DEADLINE="$left" \
    ZP_GPU_CHECK_BUDGET=$((left - 20)) bash "$top/tools/gpu-check.sh" >"$results/gpu-check$1.log" 2>&1
  local rc=$?
  note "perf $2 (int ${3// /, int}): exit $rc -> $results/gpu-check$1.log"
  grep -E '^(qwz|qgz|hpz)_|^quant_all_reduce' "$results/gpu-check$1.log" | sed 's/^/    /'
  [ "$rc" = 0 ] || { status=1; grep -E '^(  |RESULT)' "$results/gpu-check$1.log" | tail -5; }
  cp "$build/results$1"/*.json "$results/" 2>/dev/null
}
perf_check -gate "qwz_perf qgz_perf" "8 4" "${ZP_GATE_SKIP_BUILD:-0}"
perf_check -gate-hpz hpz_perf 8 1
perf_check -gate-all-reduce all_reduce_perf "8 4" 1

# The FSDP2 steps, five rounds each; zpccl from the build above.
fsdp_step() {  # SHAPE STEPS WARMUP LIMIT
  local left=$((deadline - SECONDS - 5)) limit=$4
  [ "$left" -lt "$limit" ] && limit=$left
  [ "$limit" -gt 30 ] || { note "fsdp $1: skipped (out of time)"; status=1; return; }
  ZPCCL_LIBRARY="$build/libzpccl.so" PYTHONUNBUFFERED=1 timeout -k 10 "$limit" python3 perf/fsdp_step.py \
    --shape "$1" --nproc 2 --nodes 2 --configs nccl,nccl-noreshard,nccl-2comm,no-comm,zpccl-hpz --rounds 5 \
    --steps "$2" --warmup "$3" -J "$results/fsdp_$1.json" >"$results/fsdp_$1.log" 2>&1
  local rc=$?
  note "fsdp $1: exit $rc -> $results/fsdp_$1.log"
  grep -E '^ +(nccl|no-comm|zpccl)' "$results/fsdp_$1.log" | sed 's/^/    /'
  [ "$rc" = 0 ] || { status=1; tail -3 "$results/fsdp_$1.log"; }
}
if [ "${ZP_GATE_SKIP_FSDP:-0}" != 1 ]; then
  if [ "$quick" = 1 ]; then fsdp_step small 5 2 130; fsdp_step large 3 2 130; else
    fsdp_step small 10 3 150; fsdp_step large 5 2 130; fi
fi

if [ "$status" != 0 ] && [ ${#record[@]} -gt 0 ]; then
  note "not recording: a step failed, so this run is no reference"
  record=()
fi
note "comparing with the reference"
compare "$results" | tee "$results/gate.txt"
rc=${PIPESTATUS[0]}
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT" && cp "$results/gate.txt" "$OUT/gate.txt"
  tar czf "$OUT/gate.tar.gz" -C "$results" . 2>/dev/null
fi
[ "$status" = 0 ] || { echo "perf-gate: a step failed (see above): the gate fails whatever the figures say"; rc=1; }
note "perf-gate done"
exit "$rc"
