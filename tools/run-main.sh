#!/usr/bin/env bash
# README's main job: set up, build, bring up communicators (zpccl-info), then run the perf binaries of the
# collectives in the one comparison this machine can honestly make, and end with a short summary
# (tools/perf_summary.py):
#   no GPU        the host backend, 2 emulated nodes x 4 thread-ranks: outputs checked against the host
#                 reference, and the bytes each rank would send (zpccl's plans against NCCL's ring); binaries that
#                 run device kernels or NCCL only say so and are skipped
#   one GPU       two processes sharing it as two nodes over sockets (regime net of tools/regimes.sh:
#                 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1, distinct NCCL_HOSTID; rows labelled net-on1gpu: the GPU is
#                 time-shared, so ratios read lower than on two GPUs), NCCL measured in the same run; the one-GPU
#                 kernels against memcpy (local)
#   several GPUs  one process driving every visible GPU (nvidia-smi's, narrowed by CUDA_VISIBLE_DEVICES; rows
#                 labelled nvlink when nvidia-smi shows NVLink between them, else pcie), NCCL side by side; the
#                 kernels (local) on GPU 0
# Comparisons take the perf binaries' five alternating rounds, and every JSON file carries its provenance (commit,
# command, environment, GPUs, NCCL loaded: perf/provenance.h) and each round's times; the summary gives ratios of
# medians with the rounds' least and greatest. Prints a line per step with the time it took; JSON and logs go to
# $build/main-results. Exit status 1 when a step failed (wrong elements included), else 0. ZP_MAIN_QUICK=1 runs the
# smallest sweeps.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${ZP_BUILD_DIR:-$top/build}
source "$top/tools/setup.sh"
# shellcheck source=tools/regimes.sh
source "$top/tools/regimes.sh"
set +e
zp_export_regime nvlink
results=$build/main-results
rm -rf "$results" && mkdir -p "$results"
SECONDS=0
status=0

note() { printf '[%4ds] %s\n' "$SECONDS" "$*"; }

gpus=$(zp_visible_gpus)
net_label=$(zp_net_label 1)

# run_step NAME LOG CMD...: runs CMD, its output to LOG, shown as it is (tables); notes exit status and time.
run_step() {
  local name=$1 log=$2 start=$SECONDS rc
  shift 2
  "$@" 2>&1 | tee "$log" | grep -v '^#  rank '
  rc=${PIPESTATUS[0]}
  note "$name: exit $rc ($((SECONDS - start)) s)"
  [ "$rc" = 0 ] || status=1
}

# A binary that cannot run here (device kernels only, NCCL only on the host backend) says so before it runs
# anything: such a refusal is a skip, with the binary's reason.
refusal() { grep -m1 -E 'runs device kernels only|needs the cuda backend' "$1"; }

# run_on_host BIN TAG FLAGS...: one binary on the host backend (2 nodes x 4 thread-ranks); returns 2 when the
# binary refuses the host backend.
run_on_host() {
  local bin=$1 tag=$2 log=$results/host_$2.log json=$results/host_$2.json start=$SECONDS rc
  shift 2
  "$build/perf/$bin" -H -t 8 -N 2 -b 64K -e "$host_max" -f 4 -R host -J "$json" "$@" >"$log" 2>&1
  rc=$?
  local why
  if [ "$rc" != 0 ] && why=$(refusal "$log"); then
    note "$bin: skipped on the host backend ($why)"
    rm -f "$json"
    return 2
  fi
  grep -v '^#  rank ' "$log"
  note "$tag (host backend, 2 nodes x 4 ranks): exit $rc ($((SECONDS - start)) s)"
  [ "$rc" = 0 ] || status=1
}

# run_two_nodes_on_one_gpu BIN TAG FLAGS...: two processes sharing the GPU as two nodes over sockets; process 0
# prints the table and writes the JSON.
run_two_nodes_on_one_gpu() {
  local bin=$1 tag=$2 log=$results/${net_label}_$2.log json=$results/${net_label}_$2.json start=$SECONDS
  shift 2
  local rdv pids=() rc=0 i proc_env
  rdv=$(mktemp -d "${TMPDIR:-/tmp}/zp-rdv.XXXXXX")
  for i in 0 1; do
    local out=$log.proc$i json_flag=()
    [ "$i" = 0 ] && out=$log json_flag=(-J "$json")
    mapfile -t proc_env < <(zp_regime_env net "$i")
    env "${proc_env[@]}" ZP_PERF_RENDEZVOUS_TIMEOUT=60 \
      timeout -k 5 300 "$build/perf/$bin" "$@" -P 2 -I "$i" -D "$rdv" -t 1 -S 1 -R "$net_label" "${json_flag[@]}" \
      >"$out" 2>&1 &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || rc=$?; done
  rm -rf "$rdv"
  grep -v '^#  rank ' "$log"
  [ "$rc" = 0 ] || tail -3 "$log.proc1"
  note "$tag ($net_label: 2 processes, 2 nodes, 1 GPU): exit $rc ($((SECONDS - start)) s)"
  [ "$rc" = 0 ] || status=1
}

quick=${ZP_MAIN_QUICK:-0}
host_max=4M
gpu_sweep=(-b 1M -e 256M -f 4 -n 20 -w 5)
net_sweep=(-b 1M -e 64M -f 4 -n 5 -w 2)
local_sweep=(-b 1M -e 64M -f 4 -n 20 -w 5)
if [ "$quick" = 1 ]; then
  host_max=256K gpu_sweep=(-b 1M -e 16M -f 4 -n 5 -w 2) net_sweep=(-b 1M -e 4M -f 4 -n 3 -w 1)
  local_sweep=(-b 1M -e 4M -f 4 -n 5 -w 2)
fi

if [ "$gpus" -eq 0 ]; then
  note "no GPU visible: the host backend (ranks are threads, buffers host memory)"
  run_step "zpccl-info (host backend)" "$results/zpccl-info.log" "$build/tools/zpccl-info" -H
else
  note "$gpus GPU(s) visible"
  run_step "zpccl-info (one communicator over the visible GPUs)" "$results/zpccl-info.log" "$build/tools/zpccl-info"
fi

regime=nvlink
if [ "$gpus" -gt 1 ] && ! nvidia-smi topo -m 2>/dev/null | grep -qE '\bNV[0-9]+\b'; then regime=pcie; fi
for path in "$build"/perf/*_perf; do
  [ -x "$path" ] || continue
  bin=$(basename "$path")
  name=${bin%_perf}
  case $bin in
    nccl_*)
      # NCCL's own numbers are the baseline columns of the zpccl tables, measured in the same runs.
      if [ "$gpus" -eq 0 ]; then note "$bin: skipped (NCCL alone needs GPUs)"; else
        note "$bin: skipped (NCCL's numbers are the baseline columns of the zpccl tables)"; fi
      continue ;;
    quantize_perf | reduce_perf) local_op=1 ;;
    *) local_op=0 ;;
  esac
  # hpZ's gather is exact: one run, its quantized variant at the default bits.
  bit_widths="8 4"
  [ "$bin" = hpz_perf ] && bit_widths=8
  for bits in $bit_widths; do
    tag=${name}_int$bits
    if [ "$gpus" -eq 0 ]; then
      run_on_host "$bin" "$tag" -B "$bits"
      [ $? = 2 ] && break
    elif [ "$local_op" = 1 ]; then
      # One GPU and no link: the kernels against a memcpy of the same bytes.
      run_step "$tag (local: one GPU, against memcpy)" "$results/local_$tag.log" \
        "$path" "${local_sweep[@]}" -B "$bits" -t 1 -R local -J "$results/local_$tag.json"
    elif [ "$gpus" -eq 1 ]; then
      run_two_nodes_on_one_gpu "$bin" "$tag" "${net_sweep[@]}" -B "$bits"
    else
      run_step "$tag ($regime: $gpus GPUs, one process)" "$results/${regime}_$tag.log" \
        "$path" "${gpu_sweep[@]}" -B "$bits" -R "$regime" -J "$results/${regime}_$tag.json"
    fi
  done
done

echo
echo "==== zpccl main job summary ($SECONDS s; JSON and logs in $results) ===="
python3 "$top/tools/perf_summary.py" "$results"/*.json || status=1
exit $status
