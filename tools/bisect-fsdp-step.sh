#!/usr/bin/env bash
# Bisects the FSDP2 small step's slide (issue 44, item 5; perf/notebook/fsdp.md): times perf/fsdp_step.py's small
# shape, two processes sharing one GPU as two nodes over sockets, FSDP2 + NCCL (nccl-noreshard) against FSDP2 +
# zpccl (zpccl-hpz), at several commits, each with its own library, package and script.
#
#   bash tools/bisect-fsdp-step.sh --prepare DIR [ENTRY...]
#   bash tools/bisect-fsdp-step.sh --run DIR [--dry-run] [ENTRY...]
#   bash tools/bisect-fsdp-step.sh --summary DIR RESULTS
#     --prepare  here, with git: each entry's tree as DIR/src-<commit>.tar.gz (git archive, without perf/results
#                and images) and DIR/manifest.tsv; entries whose library, package and script are those of an
#                entry before them are left out, and the listing says so. Default entries: every suspect of the
#                slide and its parent, 0731899 (the fast step) and HEAD, and 0731899's script with b6e1f2a's
#                zpccl (the harness against the code).
#     --run      on the GPU machine (no git, no network needed): builds each entry's libzpccl.so from its archive
#                (-Dtests=false -Dperf=false, several builds at once), then runs each entry's own fsdp_step.py
#                in rounds that alternate the entries (forward, then backward), until the time budget is spent,
#                and prints the summary. ENTRY: a label or a name from the manifest (a commit as given to
#                --prepare, e.g. 7a0b980^); default: the coarse split --prepare chose (DIR/run-default).
#                --dry-run unpacks the trees and prints the builds and calls without making them (no GPU
#                needed).
#     --summary  anywhere: the table from a manifest's folder and a results folder (tools/bisect_fsdp_step.py).
# ENTRY for --prepare: a commit (anything git rev-parse takes), or SCRIPT+ZPCCL: SCRIPT's perf/fsdp_step.py and
# examples with ZPCCL's package (tools/python) and library.
#
# Knobs (--run): ZP_BISECT_DEADLINE seconds for the whole call (default 540), ZP_BISECT_ROUNDS fsdp_step rounds a
# run (default 3), ZP_BISECT_STEPS timed steps a round (6), ZP_BISECT_WARMUP (3), ZP_BISECT_MAX_PASSES passes over
# the entries at most (default 8), ZP_BISECT_WORK where trees and builds go (default build-bisect at the top of
# this tree: not carried, so that a warm machine keeps its builds from one call to the next), ZP_BISECT_BUILD_JOBS
# builds at a time (default 3; each is cut at a third of the deadline), ZP_BISECT_PYTHON (python3),
# ZP_BISECT_MESON_ARGS extra `meson setup` options, ZP_BISECT_ENV extra VAR=value words for every run (e.g.
# "ZP_DEBUG=INFO ZP_DEBUG_SUBSYS=ALLOC": the scratch growths of each enable). Every run has NCCL_DEBUG=VERSION: its
# log names the NCCL the process mapped. Meson: on PATH, in .venv/, or a meson-*.whl at the top of this tree, as
# tools/gpu-check.sh finds it. A run's duration is printed after it; a pass stops where the longest run so far
# would not fit in what is left.
# On the device machine: `--prepare .bisect` here (.bisect is ignored), then run
# `bash tools/bisect-fsdp-step.sh --run .bisect [ENTRY...]` there with .bisect carried.
# Results: WORK/results/<label>.r<k>.json and .log per run, build logs, summary.txt and summary.json; with $OUT
# set, $OUT/bisect.txt (the summary and the call's log) and $OUT/bisect.tar.gz (the results folder).
# Exit status: 0 the summary has a figure; 1 no run gave one; 2 bad arguments, nothing prepared, or no GPU.
set -uo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# The suspects (perf/notebook/fsdp.md, issue 44) and the coarse split a first call runs: every change the timed
# zpccl step meets between 0731899 and b6e1f2a falls between two of its neighbours.
SUSPECTS=(4b882fb dc8858a cb3bab9 7a0b980 bdc370e a079dc0 9177042 1333149)
COARSE=(0731899 7a0b980^ 7a0b980 bdc370e^ bdc370e b6e1f2a HEAD 0731899+b6e1f2a)

usage() {
  sed -n '/^#   bash tools\/bisect-fsdp-step.sh --prepare/,/^# examples with ZPCCL/p' "$0" | sed 's/^# \{0,3\}//'
}
die() { echo "bisect-fsdp-step: $*" >&2; exit 2; }

# ---- prepare (here) -------------------------------------------------------------------------------------------

# What decides the library: its sources and the build files (tests/, perf/ and tools/ are not built for it).
lib_key() {
  local c=$1 p out=""
  for p in src device host include meson.build meson.options; do
    out+=$(git -C "$top" rev-parse -q --verify "$c:$p" 2>/dev/null || echo -)
  done
  printf '%s' "$out" | sha1sum | cut -c1-12
}
# What decides the timed Python: the package, and the script with its examples and helpers.
py_key() { git -C "$top" rev-parse -q --verify "$1:tools/python/zpccl" 2>/dev/null || echo -; }
script_key() {
  local c=$1 p out=""
  for p in perf/fsdp_step.py perf/provenance.py tools/python/examples; do
    out+=$(git -C "$top" rev-parse -q --verify "$c:$p" 2>/dev/null || echo -)
  done
  printf '%s' "$out" | sha1sum | cut -c1-12
}
resolve() { git -C "$top" rev-parse -q --verify "$1^{commit}" 2>/dev/null; }

prepare() {
  local dir=$1
  shift
  local entries=("$@") explicit=1
  if [ ${#entries[@]} -eq 0 ]; then
    explicit=0
    entries=(0731899)
    local s
    for s in "${SUSPECTS[@]}"; do entries+=("$s^" "$s"); done
    entries+=(b6e1f2a HEAD 0731899+b6e1f2a)
  fi
  git -C "$top" rev-parse --git-dir >/dev/null 2>&1 || die "--prepare needs this tree's git history"
  mkdir -p "$dir" || die "cannot make $dir"
  local manifest=$dir/manifest.tsv
  declare -A state_label=() archived=()
  local lines=() labels=() e
  for e in "${entries[@]}"; do
    local script_name=$e zpccl_name=$e
    if [[ $e == *+* ]]; then
      script_name=${e%%+*} zpccl_name=${e#*+}
      [ -n "$script_name" ] && [ -n "$zpccl_name" ] && [[ $zpccl_name != *+* ]] ||
        die "entry '$e': SCRIPT+ZPCCL takes two commits"
    fi
    local script zpccl
    script=$(resolve "$script_name") || die "entry '$e': '$script_name' is no commit here"
    zpccl=$(resolve "$zpccl_name") || die "entry '$e': '$zpccl_name' is no commit here"
    [ -n "$(git -C "$top" ls-tree "$script" perf/fsdp_step.py)" ] ||
      die "entry '$e': $script has no perf/fsdp_step.py"
    local lk state label
    lk=$(lib_key "$zpccl")
    state="$lk $(py_key "$zpccl") $(script_key "$script")"
    if [ "$script" = "$zpccl" ]; then label=${script:0:9}; else label=${script:0:9}+${zpccl:0:9}; fi
    if [ -n "${state_label[$state]:-}" ]; then
      local same=${state_label[$state]}
      echo "  $e: the same library, package and script as $same (left out; its name runs $same)"
      local i
      for i in "${!labels[@]}"; do
        [ "${labels[$i]}" = "$same" ] && lines[i]=$(awk -F'\t' -v n="$e" 'BEGIN{OFS="\t"} {$5 = $5 "," n; print}' \
          <<<"${lines[$i]}")
      done
      continue
    fi
    state_label[$state]=$label
    local c
    for c in "$script" "$zpccl"; do
      [ -n "${archived[$c]:-}" ] && continue
      archived[$c]=1
      if [ ! -s "$dir/src-$c.tar.gz" ]; then
        git -C "$top" archive --format=tar.gz -o "$dir/src-$c.tar.gz" "$c" -- . ':(exclude)perf/results' \
          ':(exclude)*.png' || die "git archive of $c failed"
      fi
    done
    local subject
    subject=$(git -C "$top" log -1 --format=%s "$zpccl" | tr '\t' ' ' | cut -c1-100)
    [ "$script" = "$zpccl" ] || subject="$(git -C "$top" log -1 --format=%h "$script")'s fsdp_step with: $subject"
    labels+=("$label")
    lines+=("$label	$script	$zpccl	$lk	$e	$subject")
    printf '  %-20s %s\n' "$label" "$e: $subject"
  done
  {
    echo "# label	script commit	zpccl commit	library key	names	subject (tools/bisect-fsdp-step.sh --prepare)"
    printf '%s\n' "${lines[@]}"
  } >"$manifest"
  # The first call's entries: the coarse split where these are the default entries, else every one.
  local run_default=()
  if [ "$explicit" = 0 ]; then
    for e in "${COARSE[@]}"; do run_default+=("$(awk -F'\t' -v n="$e" '!/^#/ { split($5, a, ","); for (i in a)
      if (a[i] == n) print $1 }' "$manifest" | head -1)"); done
  else
    run_default=("${labels[@]}")
  fi
  printf '%s\n' "${run_default[@]}" | awk 'NF && !seen[$0]++' >"$dir/run-default"
  local bytes
  bytes=$(du -cb "$dir"/src-*.tar.gz | tail -1 | cut -f1)
  echo "prepared ${#lines[@]} entries, $(ls "$dir"/src-*.tar.gz | wc -l) archives ($((bytes / 1024)) KiB) in $dir;" \
    "a first --run takes: $(tr '\n' ' ' <"$dir/run-default")"
}

# ---- run (GPU machine) ----------------------------------------------------------------------------------------

# The manifest line of an entry named by its label, a name given to --prepare, or a label's prefix.
find_entry() {
  awk -F'\t' -v n="$1" '!/^#/ { split($5, a, ","); hit = ($1 == n); for (i in a) if (a[i] == n) hit = 1;
    if (hit) { print; exit } }' "$2" | grep . ||
    awk -F'\t' -v n="$1" '!/^#/ && index($1, n) == 1 { print; exit }' "$2" | grep .
}

run() {
  local dir=$1 dry=0
  shift
  if [ "${1:-}" = --dry-run ]; then dry=1; shift; fi
  local manifest=$dir/manifest.tsv
  [ -f "$manifest" ] || die "no $manifest: make it here with --prepare $dir, and carry $dir"
  local names=("$@")
  if [ ${#names[@]} -eq 0 ]; then
    [ -s "$dir/run-default" ] || die "no entries given and no $dir/run-default"
    mapfile -t names <"$dir/run-default"
  fi
  local picked=() n line
  for n in "${names[@]}"; do
    line=$(find_entry "$n" "$manifest") || die "entry '$n' is not in $manifest (labels: $(awk -F'\t' \
      '!/^#/ { printf "%s ", $1 }' "$manifest"))"
    picked+=("$line")
  done
  # shellcheck source=tools/regimes.sh
  source "$top/tools/regimes.sh"
  if [ "$dry" = 0 ]; then
    [ "$(zp_visible_gpus)" -ge 1 ] || die "no GPU visible (nvidia-smi, CUDA_VISIBLE_DEVICES): --run times the" \
      "step on a GPU machine (--run $dir --dry-run shows what it would do; --summary reads results anywhere)"
  fi
  local work=${ZP_BISECT_WORK:-$top/build-bisect}
  case $work in /*) ;; *) work=$top/$work ;; esac
  local results=$work/results
  local deadline=${ZP_BISECT_DEADLINE:-540} rounds=${ZP_BISECT_ROUNDS:-3} steps=${ZP_BISECT_STEPS:-6}
  local warmup=${ZP_BISECT_WARMUP:-3} passes=${ZP_BISECT_MAX_PASSES:-8} jobs=${ZP_BISECT_BUILD_JOBS:-3}
  local py=${ZP_BISECT_PYTHON:-python3} v
  for v in "$deadline" "$rounds" "$steps" "$warmup" "$passes" "$jobs"; do
    [[ $v =~ ^[1-9][0-9]*$ ]] || die "knob value '$v' is not a positive integer"
  done
  SECONDS=0
  note() { printf '[%4ds] %s\n' "$SECONDS" "$*"; }
  zp_export_regime nvlink
  export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  if [ "$dry" = 0 ]; then
    rm -rf "$results" && mkdir -p "$results" || die "cannot make $results"
    exec > >(tee "$results/bisect.log") 2>&1
  fi
  note "entries: $(printf '%s\n' "${picked[@]}" | cut -f1 | tr '\n' ' ')(deadline ${deadline}s; fsdp_step" \
    "--rounds $rounds --steps $steps --warmup $warmup)"

  # Trees: each needed commit's archive, unpacked once.
  tree_of() { echo "$work/tree-${1:0:12}"; }
  unpack() {
    local c=$1 t
    t=$(tree_of "$c")
    [ -f "$t/meson.build" ] && return 0
    [ -f "$dir/src-$c.tar.gz" ] || { echo "no archive $dir/src-$c.tar.gz" >&2; return 1; }
    rm -rf "$t" && mkdir -p "$t" && tar -xzf "$dir/src-$c.tar.gz" -C "$t"
  }

  # Builds: one a library key, several at once, each ninja with its share of the cores.
  local meson_cmd
  # shellcheck source=tools/gpu-build-tools.sh
  source "$top/tools/gpu-build-tools.sh"
  find_gpu_build_tools "$top"
  local cores
  cores=$(nproc 2>/dev/null || echo 4)
  local per_build=$(((cores + jobs - 1) / jobs)) build_limit=$((deadline / 3))
  declare -A built=()
  local zpccl key t
  build_one() {  # ZPCCL_COMMIT
    local t arch=gpu_archs log=$results/build-${1:0:12}.log
    t=$(tree_of "$1")
    grep -q "option('cuda_archs'" "$t/meson.options" 2>/dev/null && arch=cuda_archs
    # shellcheck disable=SC2086  # extra options are words
    {
      [ -f "$t/build-bisect/build.ninja" ] ||
        timeout "$build_limit" "${meson_cmd[@]}" setup "$t/build-bisect" "$t" -D$arch=90 --buildtype=release \
          -Dtests=false -Dperf=false ${ZP_BISECT_MESON_ARGS:-} || exit 1
      local target
      target=$(ninja_targets "$t/build-bisect" libzpccl.so)
      timeout "$build_limit" ninja -C "$t/build-bisect" -j "$per_build" "${target:-all}"
    } >"$log" 2>&1
  }
  # The built library file of a zpccl commit (empty when there is none).
  lib_file() { find "$(tree_of "$1")/build-bisect" -maxdepth 1 -type f -name 'libzpccl.so*' 2>/dev/null | head -1; }
  local start=$SECONDS pids=() owners=()
  for line in "${picked[@]}"; do
    IFS=$'\t' read -r _ script zpccl key _ _ <<<"$line"
    unpack "$script" && unpack "$zpccl" || die "unpacking $script / $zpccl failed"
    [ -n "${built[$key]:-}" ] && continue
    built[$key]=$zpccl
    t=$(tree_of "$zpccl")
    if [ -n "$(lib_file "$zpccl")" ]; then note "library ${zpccl:0:9}: built before"; continue; fi
    if [ "$dry" = 1 ]; then
      note "would build ${zpccl:0:9}: ${meson_cmd[*]} setup $t/build-bisect -D<arch>=90 --buildtype=release" \
        "-Dtests=false -Dperf=false; ninja -j $per_build libzpccl.so.<version>"
      continue
    fi
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
    build_one "$zpccl" &
    pids+=($!) owners+=("$zpccl")
  done
  local i failed_builds=()
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || failed_builds+=("${owners[$i]:0:9}")
  done
  [ "$dry" = 1 ] ||
    note "builds done ($((SECONDS - start))s)${failed_builds:+; FAILED: ${failed_builds[*]} (see build-*.log)}"

  # The flags a tree's fsdp_step.py has (older ones lack some): from its --help, read once a script here (the
  # calls below run in subshells, which cannot fill the cache).
  declare -A helps=()
  for line in "${picked[@]}"; do
    IFS=$'\t' read -r _ script _ _ _ _ <<<"$line"
    [ -n "${helps[$script]:-}" ] && continue
    helps[$script]=$(cd "$(tree_of "$script")" && "$py" perf/fsdp_step.py --help 2>&1)
    grep -q -- --configs <<<"${helps[$script]}" ||
      note "${script:0:9}: perf/fsdp_step.py --help failed or lists no --configs: $(tail -1 <<<"${helps[$script]}")"
  done
  has_flag() {  # SCRIPT_COMMIT FLAG
    # The flag itself, not one it starts or ends (--steps, not --loss-steps): argparse lists it after a space or
    # a '[', followed by a space, ',', '=' or ']'.
    grep -qE -- "(^|[[ ])$2([] ,=]|\$)" <<<"${helps[$1]}"
  }
  # The call's arguments: the shape, layout, configurations and JSON file are needed (a script without one of them
  # is not run); the rounds, steps and warmup are left out where a script has no such flag.
  fsdp_args() {  # SCRIPT_COMMIT JSON
    local out=() f
    for f in "--shape small" "--nproc 2" "--nodes 2" "--configs nccl-noreshard,zpccl-hpz" "-J $2" \
      "--rounds $rounds" "--steps $steps" "--warmup $warmup"; do
      if has_flag "$1" "${f%% *}"; then
        # shellcheck disable=SC2206  # a flag and its value
        out+=($f)
      elif [[ $f == --shape* || $f == --nproc* || $f == --nodes* || $f == --configs* || $f == -J* ]]; then
        echo "${1:0:9}'s fsdp_step.py has no ${f%% *}" >&2
        return 1
      else
        echo "  (${1:0:9}'s fsdp_step.py has no ${f%% *}: left out)" >&2
      fi
    done
    echo "${out[@]}"
  }

  # Runs: passes over the entries, forward then backward, while the next run fits in what is left.
  local longest=0 pass order done_runs=0 reserve=20 label lib args limit rc took
  declare -A runs_of=()
  for ((pass = 1; pass <= passes; pass++)); do
    order=("${!picked[@]}")
    if ((pass % 2 == 0)); then
      local rev=()
      for ((i = ${#order[@]} - 1; i >= 0; i--)); do rev+=("${order[$i]}"); done
      order=("${rev[@]}")
    fi
    for i in "${order[@]}"; do
      IFS=$'\t' read -r label script zpccl key _ _ <<<"${picked[$i]}"
      lib=$(lib_file "${built[$key]}")
      [ "$dry" = 1 ] && [ -z "$lib" ] && lib="$(tree_of "${built[$key]}")/build-bisect/libzpccl.so.<version>"
      if [ -z "$lib" ]; then
        note "$label: no library (its build failed)"
        continue
      fi
      local left=$((deadline - reserve - SECONDS))
      if [ "$dry" = 0 ] && { [ "$left" -lt 45 ] || [ "$left" -lt $((longest * 11 / 10)) ]; }; then
        note "out of time: $done_runs runs made, pass $pass not finished"
        break 2
      fi
      local k=$((${runs_of[$label]:-0} + 1))
      runs_of[$label]=$k
      if ! args=$(fsdp_args "$script" "$results/$label.r$k.json"); then
        note "$label: not run"
        continue
      fi
      limit=$left
      [ "$limit" -gt 300 ] && limit=300
      t=$(tree_of "$script")
      # NCCL_DEBUG=VERSION: the log names the one NCCL the process mapped (torch's and zpccl's alike).
      local envs=(ZPCCL_LIBRARY="$lib" PYTHONPATH="$(tree_of "$zpccl")/tools/python" ZP_SOURCE_STATE="$script"
        PYTHONUNBUFFERED=1 NCCL_DEBUG=VERSION)
      # shellcheck disable=SC2206  # assignments are words
      [ -n "${ZP_BISECT_ENV:-}" ] && envs+=(${ZP_BISECT_ENV})
      if [ "$dry" = 1 ]; then
        note "pass $pass, $label run $k: (cd $t && ${envs[*]} timeout $limit $py perf/fsdp_step.py $args)"
        continue
      fi
      local t0=$SECONDS
      # shellcheck disable=SC2086  # args are words
      (cd "$t" && env "${envs[@]}" timeout -k 10 "$limit" "$py" perf/fsdp_step.py $args) \
        >"$results/$label.r$k.log" 2>&1
      rc=$? took=$((SECONDS - t0))
      [ "$took" -gt "$longest" ] && longest=$took
      done_runs=$((done_runs + 1))
      note "pass $pass, $label run $k: exit $rc, ${took}s $(grep -E '^ +(nccl-noreshard|zpccl-hpz) ' \
        "$results/$label.r$k.log" | awk '{ printf "%s %s ms  ", $1, $3 }')$(grep -o 'NCCL version [^ ]*' \
        "$results/$label.r$k.log" | sort -u | tr '\n' ' ')"
      [ "$rc" = 0 ] || tail -3 "$results/$label.r$k.log" | sed 's/^/    /'
    done
    [ "$dry" = 1 ] && break
  done
  [ "$dry" = 1 ] && return 0

  cp "$manifest" "$results/manifest.tsv"
  note "summary (zpccl-hpz against nccl-noreshard; a run's figure as its script reports it):"
  "$py" "$top/tools/bisect_fsdp_step.py" "$manifest" "$results" --json "$results/summary.json" |
    tee "$results/summary.txt"
  local status=${PIPESTATUS[0]}
  if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT" && cat "$results/summary.txt" "$results/bisect.log" >"$OUT/bisect.txt"
    tar czf "$OUT/bisect.tar.gz" -C "$results" . 2>/dev/null
  fi
  return "$status"
}

# ---- arguments ------------------------------------------------------------------------------------------------

[ $# -ge 1 ] || { usage >&2; exit 2; }
case $1 in
  --prepare)
    [ $# -ge 2 ] || die "--prepare needs a folder"
    dir=$2
    shift 2
    prepare "$dir" "$@"
    ;;
  --run)
    [ $# -ge 2 ] || die "--run needs the folder --prepare made"
    dir=$2
    shift 2
    run "$dir" "$@"
    exit $?
    ;;
  --summary)
    [ $# -eq 3 ] || die "--summary takes the prepared folder and a results folder"
    python3 "$top/tools/bisect_fsdp_step.py" "$2/manifest.tsv" "$3"
    exit $?
    ;;
  -h | --help) usage ;;
  *) echo "bisect-fsdp-step: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
esac
