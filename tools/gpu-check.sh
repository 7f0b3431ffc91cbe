#!/usr/bin/env bash
# On the GPU machine (2x H200; meson, ninja, nvcc and NCCL installed, maybe Open MPI): build into build-gpu, run
# the GPU and host test suites, then every perf binary in three link regimes (their variables: tools/regimes.sh):
#   nvlink  default
#   shm     NCCL_P2P_DISABLE=1
#   net     NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1, as two processes with distinct NCCL_HOSTID (two "nodes"),
#           meeting through the perf harness's file rendezvous (-P 2 -I i -D dir; no mpirun needed); on one GPU
#           both share it (perf -S, rows labelled net-on1gpu: outputs checked, times not the regime's)
#   2x2     four ranks as two nodes of two (NVLink inside a node, sockets across; issue 9), only when
#           ZP_GPU_CHECK_REGIMES names it: on four GPUs two such processes of two GPUs each; with fewer, the
#           processes share the GPUs (perf -S, rows labelled 2x2-on2gpus / 2x2-on1gpu: outputs checked, times not
#           the layout's): two processes of two ranks on two GPUs, or four of one rank (-N 2, all over sockets)
#   nvlink-procs  as nvlink, but one process per GPU (as most jobs run), only when ZP_GPU_CHECK_REGIMES names it
# quantize_perf and reduce_perf use one GPU and no link: they run once per bit width, regime "local" (reduce_perf
# up to 256M at most: its 8-source cases at 1G need ~10 GB of host memory and a slow host check).
# JSON and logs go to build-gpu/results (one JSON per binary and regime, a log per step). When $OUT is set (the
# GPU machine's folder of files that come back), it receives three files, refreshed after every step so that a run
# cut short still leaves them: gpu-check.tar.gz (all logs and JSON), results.json (every perf row of the run,
# each naming its file, and each file's provenance: {"provenance_by_file": {...}, "rows": [...]}) and summary.txt. A compact summary table is printed LAST; the exit
# status is 1 if any step failed (build, a test suite, a perf run, a wrong element), 3 if steps were only
# skipped for lack of time, else 0. Every step runs even after a failure.
#
# Knobs (environment):
#   ZP_GPU_CHECK_QUICK=1      1M..64M, 5 iterations, regimes nvlink and net (a quick look, ~2 minutes)
#   ZP_GPU_CHECK_REGIMES      regimes to run, in order, default "nvlink net shm"
#   ZP_GPU_CHECK_BINS         perf binaries (names), default every build-gpu/perf/*_perf
#   ZP_GPU_CHECK_MIN/MAX/STEP sweep -b/-e/-f, default 1M / 1G / 4 (reduce_perf: at most 256M)
#   ZP_GPU_CHECK_ITERS/WARMUP -n/-w, default 20 / 5
#   ZP_GPU_CHECK_NET_ITERS/NET_WARMUP/NET_MAX   for the net regime, default 5 / 2 / MAX
#   ZP_GPU_CHECK_ROUNDS       alternating rounds of zpccl's and the baselines' timing (-r), default the binaries'
#                             own (5 against a baseline: median and the rounds' spread in every row)
#   ZP_GPU_CHECK_NET_ROUNDS   the same over sockets (net, 2x2), default ZP_GPU_CHECK_ROUNDS: their drift (NCCL's
#                             own time moves 10 - 20% between runs) hits every variant alike
#   ZP_GPU_CHECK_BITS         bit widths of the quantized binaries, default "8 4"
#   ZP_GPU_CHECK_EXTRA        extra flags for every perf binary
#   ZP_GPU_CHECK_GRAD         gradient-rounding variants of qgz_perf, reduce_perf and quantize_perf, each also run
#                             beside today's rows (issue 33: within 5% of today's qgZ): "sr" (-s), "ef" (-E),
#                             "sr+ef" (-s -E); default "sr ef"; "" runs none. Their JSON rows carry "grad", their
#                             files a _sr / _ef / _sr+ef suffix
#   ZP_GPU_CHECK_BUDGET       no step starts after this many seconds, default 450
#   ZP_GPU_CHECK_DEADLINE     no step runs past this many seconds (its time limit shrinks), default 540, so
#                             that the summary prints within a 10-minute call
#   ZP_GPU_CHECK_STEP_TIMEOUT seconds per perf step, default 150; ZP_GPU_CHECK_TEST_TIMEOUT per suite, 180
#   ZP_GPU_CHECK_ENV          extra VAR=value words for every perf step (e.g. ZP_CHUNK_BYTES=16777216)
#   ZP_GPU_CHECK_TAG          suffix of the results folder and of the files in $OUT, so that several runs in one
#                             call keep their own (e.g. a sweep of a tunable)
#   ZP_GPU_CHECK_TEST_FILTER  --gtest_filter of the GPU suite (default: every test, then the steps of other
#                             configurations that the comment before them lists: other, direct, shm, shm p2p,
#                             shm caller)
#   ZP_GPU_CHECK_SANITIZERS   compute-sanitizer tools to run over the GPU suites, e.g. "memcheck racecheck
#                             initcheck synccheck" (default none); ZP_GPU_CHECK_SANITIZER_FILTER/_TIMEOUT
#   ZP_GPU_CHECK_TARGETS      targets of the build (default all), e.g. "perf/qwz_perf libzpccl.so" (a library's
#                             unversioned name builds its versioned file: ninja_targets, tools/gpu-build-tools.sh)
#   ZP_GPU_CHECK_SKIP_BUILD=1 / ZP_GPU_CHECK_SKIP_TESTS=1 (the GoogleTest suites) / ZP_GPU_CHECK_SKIP_PYTHON=1
#                             (the Python suite and steps) / ZP_GPU_CHECK_SKIP_PERF=1;
#   ZP_GPU_CHECK_BUILD_DIR (default build-gpu); ZP_GPU_CHECK_MESON_ARGS extra `meson setup` options (e.g.
#                             -Dnccl_home=DIR for an NCCL with its device API, nccl_device.h)
set -uo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$top"
build=${ZP_GPU_CHECK_BUILD_DIR:-build-gpu}
out_tag=${ZP_GPU_CHECK_TAG:-}  # (run_perf uses $tag)
case $build in /*) results=$build/results$out_tag ;; *) results=$top/$build/results$out_tag ;; esac
rm -rf "$results" && mkdir -p "$results"
# shellcheck source=tools/regimes.sh
source "$top/tools/regimes.sh"
zp_export_regime nvlink  # every step starts from NCCL's own links; the perf steps then take their regime's
gpu_count=$(zp_visible_gpus)

quick=${ZP_GPU_CHECK_QUICK:-0}
if [ "$quick" = 1 ]; then
  def_regimes="nvlink net" def_max=64M def_iters=5 def_warmup=2
else
  def_regimes="nvlink net shm" def_max=1G def_iters=20 def_warmup=5
fi
regimes=${ZP_GPU_CHECK_REGIMES:-$def_regimes}
min=${ZP_GPU_CHECK_MIN:-1M}
max=${ZP_GPU_CHECK_MAX:-$def_max}
step=${ZP_GPU_CHECK_STEP:-4}
iters=${ZP_GPU_CHECK_ITERS:-$def_iters}
warmup=${ZP_GPU_CHECK_WARMUP:-$def_warmup}
net_iters=${ZP_GPU_CHECK_NET_ITERS:-5}
net_warmup=${ZP_GPU_CHECK_NET_WARMUP:-2}
rounds=${ZP_GPU_CHECK_ROUNDS:-}
net_rounds=${ZP_GPU_CHECK_NET_ROUNDS:-$rounds}
net_max=${ZP_GPU_CHECK_NET_MAX:-$max}
bits_list=${ZP_GPU_CHECK_BITS:-8 4}
extra=${ZP_GPU_CHECK_EXTRA:-}
grad_list=${ZP_GPU_CHECK_GRAD-sr ef}
budget=${ZP_GPU_CHECK_BUDGET:-450}
deadline=${ZP_GPU_CHECK_DEADLINE:-540}
step_timeout=${ZP_GPU_CHECK_STEP_TIMEOUT:-150}
test_timeout=${ZP_GPU_CHECK_TEST_TIMEOUT:-180}

manifest=$results/gpu-check.tsv
: >"$manifest"
SECONDS=0

note() { printf '[%4ds] %s\n' "$SECONDS" "$*"; }

# Few files in $OUT: the machine that runs this may bring back only a handful.
publish() {
  [ -n "${OUT:-}" ] || return 0
  mkdir -p "$OUT"
  tar czf "$OUT/gpu-check$out_tag.tar.gz.tmp" -C "$results" . 2>/dev/null &&
    mv "$OUT/gpu-check$out_tag.tar.gz.tmp" "$OUT/gpu-check$out_tag.tar.gz"
  PYTHONPATH="$top/tools" python3 - "$results" "$OUT/results$out_tag.json" <<'PY' 2>/dev/null || true
import glob, json, os, sys
from perf_files import load
rows, provenance = [], {}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    try:
        record, mine = load(path)
    except (OSError, ValueError):
        continue
    name = os.path.basename(path)
    provenance[name] = record
    rows.extend(dict(r, file=name) for r in mine)
with open(sys.argv[2], "w") as f:
    f.write('{"provenance_by_file": ' + json.dumps(provenance) + ',\n "rows": [\n' +
            ",\n".join("  " + json.dumps(r) for r in rows) + "\n ]}\n")
PY
}

# record NAME REGIME KIND STATUS SECONDS LOG [JSON]
record() {
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "$6" "${7:-}" >>"$manifest"
  publish
}

# No new step after the budget, and none shorter than 15 s before the deadline.
over_budget() { [ "$SECONDS" -ge "$budget" ] || [ $((deadline - SECONDS)) -lt 15 ]; }
# A step's time limit, cut so that it ends by the deadline.
capped() { local left=$((deadline - SECONDS)); [ "$1" -lt "$left" ] && echo "$1" || echo "$left"; }

# Runs "$@" for at most $1 seconds (exit 124 when it overruns, like timeout). Before killing an overrun, logs
# every thread's backtrace of it and of its children (with gdb, when installed), so that a hang shows where
# it waits.
run_with_backtraces() {
  local limit=$1 waited=0 pid p
  shift
  "$@" &
  pid=$!
  while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt "$limit" ]; do
    sleep 1
    waited=$((waited + 1))
  done
  if ! kill -0 "$pid" 2>/dev/null; then
    wait "$pid"
    return
  fi
  if command -v gdb >/dev/null; then
    for p in $pid $(pgrep -P "$pid"); do
      echo "==== gpu-check: process $p still running after ${limit}s; its threads:"
      timeout 60 gdb -p "$p" -batch -ex "thread apply all bt 12" 2>&1 | grep -E '^(Thread|#)' | head -300
    done
  fi
  kill -TERM "$pid" 2>/dev/null
  sleep 5
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  return 124
}

# run_step NAME REGIME KIND LOG JSON TIMEOUT CMD...: runs CMD with a time limit, logs, records the exit status.
run_step() {
  local name=$1 regime=$2 kind=$3 log=$4 json=$5 limit=$6
  shift 6
  if over_budget; then
    note "$regime $name: skipped (out of time: budget ${budget}s, deadline ${deadline}s)"
    record "$name" "$regime" "$kind" skipped 0 "$log" "$json"
    return
  fi
  local start=$SECONDS rc
  limit=$(capped "$limit")
  if [ "$kind" = test ]; then
    run_with_backtraces "$limit" "$@" >"$log" 2>&1
  else
    timeout -k 5 "$limit" "$@" >"$log" 2>&1
  fi
  rc=$?
  note "$regime $name: exit $rc ($((SECONDS - start))s) -> $log"
  record "$name" "$regime" "$kind" "$rc" "$((SECONDS - start))" "$log" "$json"
}

# ---- build -------------------------------------------------------------------------------------------------
# shellcheck source=tools/gpu-build-tools.sh
source "$top/tools/gpu-build-tools.sh"
find_gpu_build_tools "$top"
# shellcheck source=tools/gpu-python-deps.sh
source "$top/tools/gpu-python-deps.sh"
# The architecture option was renamed once (cuda_archs is reserved by Meson); take whichever this tree has.
arch_opt=gpu_archs
grep -q "option('cuda_archs'" meson.options 2>/dev/null && arch_opt=cuda_archs

if [ "${ZP_GPU_CHECK_SKIP_BUILD:-0}" != 1 ]; then
  build_log=$results/build.log
  start=$SECONDS
  (
    if [ ! -f "$build/build.ninja" ]; then
      "${meson_cmd[@]}" setup "$build" -D$arch_opt=90 --buildtype=release -Dperf=true -Dtests=true \
        ${ZP_GPU_CHECK_MESON_ARGS:-} || exit 1
    fi
    # shellcheck disable=SC2086  # the targets are words
    mapfile -t targets < <(ninja_targets "$build" ${ZP_GPU_CHECK_TARGETS:-})
    ninja -C "$build" -k 0 "${targets[@]}"  # keep going: one broken target must not hide the others
  ) >"$build_log" 2>&1
  rc=$?
  note "build: exit $rc ($((SECONDS - start))s) -> $build_log"
  record build - build "$rc" "$((SECONDS - start))" "$build_log"
  grep -q "MPI for cpp found: YES" "$build_log" && note "built with MPI (the perf binaries also run under mpirun)"
fi

# ---- test suites -------------------------------------------------------------------------------------------
if [ "${ZP_GPU_CHECK_SKIP_TESTS:-0}" != 1 ]; then
  for suite in zpccl_gpu_tests zpccl_host_tests; do
    if [ -x "$build/tests/$suite" ]; then
      filter=()
      [ "$suite" = zpccl_gpu_tests ] && [ -n "${ZP_GPU_CHECK_TEST_FILTER:-}" ] &&
        filter=(--gtest_filter="$ZP_GPU_CHECK_TEST_FILTER")
      run_step "$suite" - test "$results/$suite.log" "" "$test_timeout" "$build/tests/$suite" "${filter[@]}"
    else
      note "$suite: not built"
      record "$suite" - test missing 0 -
    fi
  done
  # The tests that run chunk pipelines or several communicators at once, again in the other configuration users
  # can choose: the quantized gathers' kernels on every SM (ZP_NCCL_SMS=0; by default a green context), qgZ's
  # two-rank exchanges as one all-gather on one node too (ZP_PAIR_ALLGATHER=1; by default only across nodes,
  # which the two-node tests of the first pass cover), and no direct loads (ZP_DIRECT_MIN_BYTES=-1: every size
  # through NCCL and the pipelines).
  # Then every collective test with direct loads whose waits are kernels of their own at every size
  # (ZP_DIRECT_INLINE_WAIT_BYTES=0; by default calls up to 4 MiB, most test cases, wait inside their kernels), in
  # one process and in two (src/cuda/peer_window.h); GpuFaults.PeerKilledMidNcclPipeline left out there, since it sets
  # ZP_DIRECT_MIN_BYTES=-1 for its processes and would repeat the first pass's run.
  # Then the collective tests over host shared memory (NCCL_P2P_DISABLE=1: the world is split with
  # ZP_SHM_MIN_CTAS channels, qgZ's pair exchange gathers), with the own slot worked early at every size
  # (ZP_OWN_SLOT_EARLY_BYTES=0; by default from 16 MiB, beyond most cases); qgZ's tests there again with its
  # point-to-point exchange, which then leaves the kept slot out (ZP_PAIR_ALLGATHER=0); and last, with a short
  # limit of its own, GpuFromNccl there (a caller's communicator is not split with ZP_SHM_MIN_CTAS: splitting it
  # hung this test). The "other" step also works the own slot early: its two-node cases are slow-link ones.
  if [ -x "$build/tests/zpccl_gpu_tests" ] && [ -z "${ZP_GPU_CHECK_TEST_FILTER:-}" ]; then
    mapfile -t shm_env < <(zp_regime_env shm)
    # ~30 s when it works: a short limit, so that a hang costs little device time (its backtraces are logged).
    collective_tests='GpuConcurrency.*:GpuPipeline.*:GpuGraphs.*:GpuQwz.*:GpuQgz.*:GpuHpz.*:GpuReliability.*'
    run_step "zpccl_gpu_tests other" - test "$results/zpccl_gpu_tests_other.log" "" 90 \
      env ZP_NCCL_SMS=0 ZP_PAIR_ALLGATHER=1 ZP_DIRECT_MIN_BYTES=-1 ZP_OWN_SLOT_EARLY_BYTES=0 \
      "$build/tests/zpccl_gpu_tests" \
      --gtest_filter="$collective_tests"
    run_step "zpccl_gpu_tests direct" - test "$results/zpccl_gpu_tests_direct.log" "" 120 \
      env ZP_DIRECT_MIN_BYTES=0 ZP_DIRECT_INLINE_WAIT_BYTES=0 "$build/tests/zpccl_gpu_tests" \
      --gtest_filter="$collective_tests:GpuFromNccl.*:GpuLifecycle.*:GpuFaults.*:GpuSanitized.EachCollectiveInTwoProcesses-GpuFaults.PeerKilledMidNcclPipeline"
    run_step "zpccl_gpu_tests shm" - test "$results/zpccl_gpu_tests_shm.log" "" 90 \
      env "${shm_env[@]}" ZP_OWN_SLOT_EARLY_BYTES=0 "$build/tests/zpccl_gpu_tests" \
      --gtest_filter="$collective_tests:GpuLifecycle.*"
    run_step "zpccl_gpu_tests shm p2p" - test "$results/zpccl_gpu_tests_shm_p2p.log" "" 60 \
      env "${shm_env[@]}" ZP_OWN_SLOT_EARLY_BYTES=0 ZP_PAIR_ALLGATHER=0 "$build/tests/zpccl_gpu_tests" \
      --gtest_filter='GpuQgz.*:GpuPipeline.*'
    run_step "zpccl_gpu_tests shm caller" - test "$results/zpccl_gpu_tests_shm_caller.log" "" 30 \
      env "${shm_env[@]}" "$build/tests/zpccl_gpu_tests" --gtest_filter="GpuFromNccl.*"
  fi
fi

# ---- Python: the package's GPU test classes (run.py --gpu-only: FSDP2, DDP and DeepSpeed in spawned processes
# sharing the GPUs as emulated nodes over sockets; CI runs the rest of the suite, which takes longer than this
# step's limit) and the FSDP2 training step (perf/fsdp_step.py: FSDP2 with NCCL against FSDP2 with zpccl and the
# hand-rolled ZeRO-3 loop, alternating rounds). torch is the machine's.
# Then the device memory of FSDP2 with zpccl against FSDP2 with NCCL (perf/fsdp_memory.py), once plain and once
# per experiment of ZP_GPU_CHECK_FSDP_MEMORY_ENV ("|"-separated, each a list of VAR=value words; default none).
# ZP_GPU_CHECK_FSDP_ARGS replaces the step's arguments; ZP_GPU_CHECK_FSDP names the FSDP runs (default
# "step memory"); ZP_GPU_CHECK_SKIP_PYTHON=1 skips all of it.
if [ "${ZP_GPU_CHECK_SKIP_PYTHON:-0}" != 1 ]; then
  if [ -f "$build/libzpccl.so" ] && python3 -c "import torch" 2>/dev/null; then
    use_carried_wheels "$top" || note "python: the wheels of .whl/ did not install; DeepSpeed's tests will skip"
    run_step "python suite" - test "$results/python.log" "" 300 \
      env ZPCCL_LIBRARY="$build/libzpccl.so" python3 tools/python/tests/run.py -v --gpu-only --count "$results/python.count"
    fsdp_regime=$(zp_net_label "$gpu_count")
    fsdp_runs=" ${ZP_GPU_CHECK_FSDP-step memory} "
    if [[ $fsdp_runs == *" step "* ]]; then
      # shellcheck disable=SC2086
      run_step "fsdp_step" "$fsdp_regime" perf "$results/fsdp_step.log" "$results/fsdp_step.json" 300 \
        env ZPCCL_LIBRARY="$build/libzpccl.so" python3 perf/fsdp_step.py \
        ${ZP_GPU_CHECK_FSDP_ARGS:---shape small --nproc 2 --nodes 2} -J "$results/fsdp_step.json"
    fi
    if [[ $fsdp_runs == *" memory "* ]]; then
      IFS='|' read -ra memory_envs <<<"|${ZP_GPU_CHECK_FSDP_MEMORY_ENV:-}"
      for i in "${!memory_envs[@]}"; do
        env_flags=()
        for word in ${memory_envs[$i]}; do env_flags+=(--env "$word"); done
        run_step "fsdp_memory${i/#0/}" "$fsdp_regime" perf "$results/fsdp_memory$i.log" \
          "$results/fsdp_memory$i.json" 240 env ZPCCL_LIBRARY="$build/libzpccl.so" python3 perf/fsdp_memory.py \
          --nproc 2 --nodes 2 "${env_flags[@]}" --log-dir "$results/fsdp_memory$i-logs" \
          -J "$results/fsdp_memory$i.json"
      done
    fi
  else
    note "python: skipped (no $build/libzpccl.so or no torch)"
    record "python suite" - test missing 0 -
  fi
fi

# ---- compute-sanitizer -------------------------------------------------------------------------------------
# Each tool over small calls of the three collectives on two GPUs (GpuSanitized) and the kernel suites (the
# full sweeps, soak, replay and fault tests are left out: minutes each under instrumentation). NCCL's own kernels
# are not instrumented (--kernel-name-exclude): they are not ours, and racecheck/memcheck on them take far longer.
# CUDA API errors are not reported (--report-api-errors no): NCCL's init probes return expected ones (kernels not
# built for this GPU, peer access already enabled), hundreds of them; zpccl checks the result of every call it
# makes. ZP_CHUNK_BYTES=4096 sends the larger small cases through the chunk pipelines (side streams, green
# context) while the smaller ones stay on the one-stream path. A step passes when the tool reports
# "ERROR SUMMARY: 0 errors" and the suite passes.
# The collectives run one process per GPU (GpuSanitized.EachCollectiveInTwoProcesses; --target-processes all
# instruments the children), as jobs deploy them: under racecheck, and under initcheck once the green context was
# on, the variant that drives both GPUs from one process stalled, though it passes without a tool (likely the
# tool's serialization of that process's kernels: NCCL's kernels on the two GPUs must run at the same time).
# ZP_GPU_CHECK_SANITIZER_FILTER='GpuSanitized.*:...' brings the one-process variant back.
# With one GPU, the same cases run as two nodes sharing it (GpuSanitized.EachCollectiveAsTwoNodesOnOneGpu) and
# four ranks as two nodes of two (GpuLayouts.TwoNodesOfTwoOnOneGpu: two-hop qgZ, its requantize kernel), over
# sockets; ZP_OWN_SLOT_EARLY_BYTES=0 works the own slot early at every size on those slow-link paths.
default_sanitizer_filter='GpuSanitized.EachCollectiveInTwoProcesses:GpuSanitized.EachCollectiveAsTwoNodesOnOneGpu'
default_sanitizer_filter+=':GpuLayouts.TwoNodesOfTwoOnOneGpu:GpuReduce.*:QuantGpu.BatchedSegmentsMatchHostReference'
sanitizer_filter=${ZP_GPU_CHECK_SANITIZER_FILTER:-$default_sanitizer_filter}
for tool in ${ZP_GPU_CHECK_SANITIZERS:-}; do
  log=$results/sanitizer_$tool.log
  if ! command -v compute-sanitizer >/dev/null; then
    note "compute-sanitizer: not installed"
    record "sanitizer $tool" - test missing 0 "$log"
    continue
  fi
  extra_flags=()
  [ "$tool" = racecheck ] && extra_flags=(--racecheck-report all)
  run_step "sanitizer $tool" - test "$log" "" "${ZP_GPU_CHECK_SANITIZER_TIMEOUT:-240}" \
    env ZP_CHUNK_BYTES=4096 ZP_OWN_SLOT_EARLY_BYTES=0 compute-sanitizer --tool "$tool" --error-exitcode 9 --report-api-errors no \
    --target-processes all --kernel-name-exclude kns=nccl "${extra_flags[@]}" "$build/tests/zpccl_gpu_tests" \
    --gtest_filter="$sanitizer_filter"
done

# ---- perf --------------------------------------------------------------------------------------------------
if [ -n "${ZP_GPU_CHECK_BINS:-}" ]; then
  bins=$ZP_GPU_CHECK_BINS
else
  bins=$(cd "$build/perf" 2>/dev/null && ls -1 *_perf 2>/dev/null | sort | tr '\n' ' ')
fi
if [ "${ZP_GPU_CHECK_SKIP_PERF:-0}" = 1 ]; then
  bins=""
elif [ -z "$bins" ]; then
  note "no perf binaries under $build/perf"
  record perf - perf missing 0 -
fi

# Several processes, each with its regime's variables (tools/regimes.sh): hosts of their own, so that NCCL and zpccl
# see several nodes: two of one GPU each (regime net), or the 2x2 layout (see the top); or, in regime nvlink-procs,
# all naming one host: one node, a process per GPU.
perf_procs() {  # NAME LOG JSON CMD...
  local name=$1 log=$2 json=$3
  shift 3
  local procs=2 threads=1 label=$regime layout=()
  if [ "$regime" = 2x2 ]; then
    threads=2
    if [ "$gpu_count" -lt 4 ]; then label=2x2-on${gpu_count}gpus$(zp_sharing_suffix) layout=(-S 1); fi
    if [ "$gpu_count" -lt 2 ]; then procs=4 threads=1 label=2x2-on1gpu$(zp_sharing_suffix) layout=(-S 1 -N 2); fi
  elif [ "$regime" = net ] && [ "$gpu_count" -lt 2 ]; then
    label=$(zp_net_label 1) layout=(-S 1)  # both "nodes" on the one GPU: outputs checked, times not the regime's
  fi
  if over_budget; then
    note "$label $name: skipped (out of time: budget ${budget}s, deadline ${deadline}s)"
    record "$name" "$label" perf skipped 0 "$log" "$json"
    return
  fi
  local rdv start=$SECONDS limit i pids=() rc=0 rcs=()
  limit=$(capped "$step_timeout")
  rdv=$(mktemp -d "${TMPDIR:-/tmp}/zp-rdv.XXXXXX")
  local out json_flag proc_env
  for ((i = 0; i < procs; i++)); do
    mapfile -t proc_env < <(zp_regime_env "$regime" "$i")
    out=$log.proc$i json_flag=()
    [ "$i" = 0 ] && out=$log json_flag=(-J "$json")  # process 0 writes the table and the JSON
    ZP_PERF_RENDEZVOUS_TIMEOUT=60 timeout -k 5 "$limit" env "${proc_env[@]}" "${extra_env[@]}" \
      "$@" -P "$procs" -I "$i" -D "$rdv" -t "$threads" "${layout[@]}" -R "$label" "${json_flag[@]}" >"$out" 2>&1 &
    pids+=($!)
  done
  for i in "${pids[@]}"; do
    wait "$i"
    rcs+=($?)
  done
  rm -rf "$rdv"
  for i in "${rcs[@]}"; do [ "$rc" = 0 ] && rc=$i; done
  note "$label $name: exit $(IFS=/; echo "${rcs[*]}") ($((SECONDS - start))s) -> $log (+ .proc1...)"
  record "$name" "$label" perf "$rc" "$((SECONDS - start))" "$log" "$json"
}

# Quantized binaries run once per bit width; the NCCL-only baselines once.
bit_widths() { case $1 in nccl_*) echo "-" ;; *) echo "$bits_list" ;; esac; }
# Regimes run as several processes (perf_procs); those with sockets between them take the net iterations.
is_multi_procs() { [ "$1" = net ] || [ "$1" = 2x2 ] || [ "$1" = nvlink-procs ]; }
over_sockets() { [ "$1" = net ] || [ "$1" = 2x2 ]; }
# The gradient-rounding variants (ZP_GPU_CHECK_GRAD) of the binaries that have them.
grad_variants() { case $1 in qgz_perf | reduce_perf | quantize_perf) echo "$grad_list" ;; esac; }
# Binaries on one GPU with no link run once, as regime "local".
is_local() { [ "$1" = quantize_perf ] || [ "$1" = reduce_perf ]; }
# The smaller of two sizes as the perf flags spell them ("256M": K, M, G, T binary, as numfmt's IEC suffixes).
min_size() { [ "$(numfmt --from=iec "${1^^}")" -gt "$(numfmt --from=iec "${2^^}")" ] && echo "$2" || echo "$1"; }

run_perf() {  # REGIME BIN
  local regime=$1 bin=$2 path=$build/perf/$2 bits flags tag file sweep lo=$min hi=$max
  if [ ! -x "$path" ]; then
    note "$bin: not built"
    record "$bin" "$regime" perf missing 0 -
    return
  fi
  if over_sockets "$regime"; then
    sweep=(-b "$min" -e "$net_max" -f "$step" -n "$net_iters" -w "$net_warmup")
    [ -n "$net_rounds" ] && sweep+=(-r "$net_rounds")
  else
    # reduce_perf's host memory and check grow with its 8 sources: at most 256M, whatever the knobs say.
    [ "$bin" = reduce_perf ] && lo=$(min_size "$min" 256M) hi=$(min_size "$max" 256M)
    sweep=(-b "$lo" -e "$hi" -f "$step" -n "$iters" -w "$warmup")
    [ -n "$rounds" ] && sweep+=(-r "$rounds")
  fi
  for bits in $(bit_widths "$bin"); do
    flags=() tag=$bin file=${regime}_${bin%_perf}
    if [ "$bits" != - ]; then
      flags=(-B "$bits") tag="$bin int$bits" file=${file}_int$bits
    fi
    local variant gflags gtag gfile
    for variant in - $(grad_variants "$bin"); do
      gflags=() gtag=$tag gfile=$file
      if [ "$variant" != - ]; then
        gtag="$tag $variant" gfile=${file}_$variant
        case $variant in sr) gflags=(-s 1) ;; ef) gflags=(-E 1) ;; sr+ef) gflags=(-s 1 -E 1) ;; esac
      fi
      if is_multi_procs "$regime"; then
        perf_procs "$gtag" "$results/$gfile.log" "$results/$gfile.json" "$path" "${sweep[@]}" "${flags[@]}" \
          "${gflags[@]}" $extra
      else
        run_step "$gtag" "$regime" perf "$results/$gfile.log" "$results/$gfile.json" "$step_timeout" \
          env "${regime_env[@]}" "$path" "${sweep[@]}" "${flags[@]}" "${gflags[@]}" -R "$regime" \
          -J "$results/$gfile.json" $extra
      fi
    done
    # hpZ's backward gather over shared memory as two emulated nodes of one GPU (zpccl's -N 2; NCCL still
    # moves the forward gather through shm): the two-node ratio of the shm regime.
    if [ "$regime" = shm ] && [ "$bin" = hpz_perf ]; then
      run_step "$tag 2 nodes" "$regime" perf "$results/${file}_2nodes.log" "$results/${file}_2nodes.json" \
        "$step_timeout" env "${regime_env[@]}" "$path" "${sweep[@]}" "${flags[@]}" -N 2 -R "$regime" \
        -J "$results/${file}_2nodes.json" $extra
    fi
  done
}

# regime_env: the variables of a step of one process (run_perf), those of the regime and ZP_GPU_CHECK_ENV's; a step
# of several processes (perf_procs) takes each process's own and extra_env.
mapfile -t regime_env < <(zp_regime_env nvlink)  # the local binaries': no link between GPUs
for bin in $bins; do is_local "$bin" && run_perf local "$bin"; done
# shellcheck disable=SC2206  # VAR=value words
extra_env=(${ZP_GPU_CHECK_ENV:-})
for regime in $regimes; do
  if ! zp_is_regime "$regime"; then
    note "unknown regime $regime ($ZP_REGIMES)"; record "regime $regime" "$regime" perf unknown 0 -; continue
  fi
  regime_env=()
  is_multi_procs "$regime" || mapfile -t regime_env < <(zp_regime_env "$regime")
  regime_env+=("${extra_env[@]}")
  for bin in $bins; do is_local "$bin" || run_perf "$regime" "$bin"; done
done

# ---- summary (last) ----------------------------------------------------------------------------------------
summary=$results/summary.txt
PYTHONPATH="$top/tools" python3 - "$manifest" "$SECONDS" >"$summary" <<'PY'
import json, sys
from perf_files import is_step_file, load as load_file

manifest, elapsed = sys.argv[1], sys.argv[2]
# 64M: where the issues' slow-link targets begin.
targets = [(16 << 20, "16M"), (64 << 20, "64M"), (256 << 20, "256M"), (1 << 30, "1G")]

def load(path):
    try:
        return load_file(path)[1]
    except (OSError, ValueError):
        return []

def at(rows, size, get):
    # Sizes are rounded down to whole elements per rank: take the row within 1% of the target.
    best = [r for r in rows if r.get("size") and abs(r["size"] - size) <= size * 0.01]
    if not best:
        return "-"
    v = get(best[0])
    if v is None:
        return "-"
    return "{:.0f}".format(v) if v >= 100 else "{:.3g}".format(v)

def gtest_counts(log):
    """(passed, failed) from a GoogleTest log, or from the Python suite's last line."""
    passed = failed = None
    try:
        for line in open(log, errors="replace"):
            if line.startswith("[  PASSED  ]"):
                passed = line.split()[3]
            if line.startswith("[  FAILED  ]") and "listed below" in line:
                failed = line.split()[3]
            if line.startswith("python: ") and " passed, " in line:  # "python: N passed, M failed, K skipped"
                words = line.split()
                passed, failed = words[1], words[3]
    except OSError:
        pass
    return passed, failed

def fsdp_rows(path):
    """perf/fsdp_step.py's JSON: {"rows": [{"config": ...}, ...], "losses": [...]}, or None for another file (the
    perf binaries' rows name an "op")."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if is_step_file(data) else None

def sanitizer_errors(log):
    """The errors of every 'ERROR SUMMARY: N errors' line summed (one per instrumented process), or None when
    the log has none. A racecheck summary counts its errors, not its warnings."""
    count = None
    try:
        for line in open(log, errors="replace"):
            found = None
            if "ERROR SUMMARY:" in line and "not printed" not in line:
                found = line.split("ERROR SUMMARY:")[1].split()[0]
            elif "RACECHECK SUMMARY:" in line and "(" in line:  # "... hazards displayed (N errors, M warnings)"
                found = line.split("(")[1].split()[0]
            if found is not None and found.isdigit():
                count = (count or 0) + int(found)
    except OSError:
        pass
    return count

def last_words(log, status):
    """The last error-looking lines of a step's log(s), for the reader who cannot open them."""
    lines = []
    if status in ("124", "137"):
        try:
            running = [l.strip() for l in open(log, errors="replace") if l.startswith("[ RUN")]
        except OSError:
            running = []
        return "timed out" + (" in " + running[-1][12:].strip() if running else "")
    for path in (log, log + ".proc1"):
        try:
            text = [l.strip() for l in open(path, errors="replace") if l.strip()]
        except OSError:
            continue
        errors = [l for l in text if not l.startswith("#") and ("fail" in l.lower() or "error" in l.lower()
                                                                 or "perf:" in l or "timed out" in l)]
        lines.extend((errors or text)[-2:])
    return " | ".join(dict.fromkeys(lines))[:300] or "no log"

why, bound = [], []
fmt = "{:<30} {:<12} {:<8} {:>27} {:>27} {:>7}"
print("==== zpccl gpu-check summary ({} s) ====".format(elapsed))
print(fmt.format("step", "regime", "status", "busbw GB/s 16M/64M/256M/1G", "speedup 16M/64M/256M/1G", "wrong"))
failed, skipped = [], []
for line in open(manifest):
    parts = line.rstrip("\n").split("\t")
    if len(parts) < 6:
        continue
    name, regime, kind, status, secs, log = parts[:6]
    jsons = [p for p in parts[6:] if p]
    ok = status == "0"
    label = {"0": "ok", "124": "timeout", "137": "killed", "skipped": "skipped", "missing": "missing"}.get(
        status, "exit " + status)
    if kind in ("build", "test"):
        extra = ""
        if kind == "test" and status not in ("missing", "skipped"):
            p, f = gtest_counts(log)
            extra = "passed {} failed {}".format(p or "?", f or 0)
            san = sanitizer_errors(log)
            if san is not None:
                extra = "{} errors, {}".format(san, extra.replace("passed", "p").replace("failed", "f"))
        print(fmt.format(name, regime, label, extra, "", ""))
    elif name.startswith("fsdp_memory"):  # perf/fsdp_memory.py: its summary lines, from the log
        print(fmt.format(name, regime, label, "", "", ""))
        try:
            for l in open(log, errors="replace"):
                if l.startswith(("zpccl - nccl after", "  enable in all", "zpccl-")):
                    print("  " + l.strip())
        except OSError:
            pass
    elif any(fsdp_rows(j) for j in jsons):
        data = next(fsdp_rows(j) for j in jsons if fsdp_rows(j))
        ms = {r["config"]: r["median_ms"] for r in data["rows"]}
        for r in data["rows"]:
            vs = "/".join("{:.2f}".format(ms[b] / r["median_ms"]) if b in ms else "-"
                          for b in ("nccl", "nccl-noreshard"))
            print(fmt.format("fsdp " + r["config"], regime, label, "{:.1f} ms, {:.0f} MiB".format(
                r["median_ms"], r["peak_mib"]), "x nccl/noreshard " + vs, ""))
        for x in data.get("losses", []):
            print("  loss {} {}: validation {:.4f} after {} steps".format(
                x["comm"], "" if x.get("grad_bits") is None else "w%s/g%s" % (x.get("weight_bits"), x["grad_bits"]),
                x["valid"], x["steps"]))
    else:
        rows = [r for j in jsons for r in load(j)]
        ops = sorted({r.get("op") for r in rows}) or [None]
        for op in ops:
            mine = [r for r in rows if r.get("op") == op]
            bw = "/".join(at(mine, s, lambda r: (r.get("oop") or {}).get("busbw")) for s, _ in targets)
            sp = "/".join(at(mine, s, lambda r: r.get("speedup")) for s, _ in targets)
            wrong = sum(((r.get(v) or {}).get("wrong") or 0) for r in mine for v in ("oop", "ip"))
            if mine and wrong:
                ok = False
            bits = mine[0].get("bits") if mine else None
            title = "{}{}".format(op, " int%d" % bits if bits else "") if mine else name
            print(fmt.format(title[:30], regime, label, bw if mine else "no rows", sp if mine else "", wrong))
            # Issue 5's small-message bound: qwZ at 1 MB in at most twice NCCL's time.
            small = [r for r in mine if op == "qwz_all_gather" and abs((r.get("size") or 0) - (1 << 20)) <= 1 << 13]
            for r in small:
                zp, nccl = (r.get("oop") or {}).get("time_us"), (r.get("nccl") or {}).get("time_us")
                if zp and nccl:
                    bound.append("{} int{} {}: {:.1f} us / NCCL {:.1f} us = {:.2f}x NCCL's time".format(
                        op, r.get("bits"), regime, zp, nccl, zp / nccl))
    if status == "skipped":
        skipped.append(name + " " + regime)
    elif not ok:
        failed.append(name + " (" + regime + ")")
        why.append((name, regime, last_words(log, status)))
for line in bound:
    print("1 MB (bound 2x): " + line)
for name, regime, words in why:
    print("  {} ({}): {}".format(name, regime, words))
if failed:
    print("RESULT: FAILED: " + ", ".join(failed))
    sys.exit(1)
if skipped:
    print("RESULT: INCOMPLETE: skipped " + ", ".join(skipped))
    sys.exit(3)
print("RESULT: OK")
PY
rc=$?
if [ ! -s "$summary" ]; then
  { echo "(python3 failed; raw steps: name, regime, kind, status, seconds, log, json)"; cat "$manifest"; } >"$summary"
  rc=1
fi
[ -n "${OUT:-}" ] && cp "$summary" "$OUT/summary$out_tag.txt"
publish
echo
cat "$summary"
exit $rc
