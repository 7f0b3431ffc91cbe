#!/usr/bin/env bash
# README's test job: set up, build, run every suite (host-only suites everywhere; GPU suites skip without a
# GPU), then print one line "N passed, N failed" counting every test that ran (skips are not passes).
#
# Besides the GoogleTest suites: the C ABI test; the host backend over MPI (tests/test_mpi_host.cc under mpirun, with
# Debian's Open MPI, installed when missing); a C program built with pkg-config against a `meson install`
# tree (tests/pkgconfig_consumer.c, on the host backend); the wheel (pip wheel .), installed with torch into a
# virtual environment made anew each run with the test-only frameworks (torchtitan, transformers, accelerate,
# lightning, deepspeed), where the Python suite runs against the installed package (without meson-python or the
# network, the wheel is skipped and the suite runs against the source tree); clang-format;
# the check that perf/RESULTS.md's tables match perf/results (tools/render_results.py --check);
# tools/run-sanitizers.sh (ZP_SKIP_SANITIZERS=1 skips it). Each step prints the seconds it took.
set -uo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${ZP_BUILD_DIR:-$top/build}
SECONDS=0
# Debian's Open MPI, for the host backend over MPI (libzpccl_mpi and its suite under mpirun), when missing: Meson
# finds it when it configures the build.
if ! command -v mpirun >/dev/null && command -v apt-get >/dev/null; then
  echo "## setup: apt-get install libopenmpi-dev openmpi-bin"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libopenmpi-dev openmpi-bin >/dev/null; } ||
    echo "setup: apt-get could not install Open MPI (no network?): the MPI suite is skipped" >&2
fi
source "$top/tools/setup.sh" || { echo "0 passed, 1 failed"; exit 1; }
set +e
# shellcheck source=tools/regimes.sh
source "$top/tools/regimes.sh"
zp_export_regime nvlink
results=$build/test-results
rm -rf "$results" && mkdir -p "$results"

step_name="" step_start=$SECONDS
step_done() { [ -z "$step_name" ] || echo "## $step_name: $((SECONDS - step_start)) s"; step_name=""; }
step() { step_done; step_name=$1 step_start=$SECONDS; echo "## $step_name"; }  # the next step's title
# count NAME PASSED FAILED [SKIPPED]: one *.count file for tools/count_results.py.
count() { echo "{\"passed\": $2, \"failed\": $3, \"skipped\": ${4:-0}}" >"$results/$1.count"; }
outcome() { if [ "$2" = 0 ]; then count "$1" 1 0; else count "$1" 0 1; fi; }

for suite in zpccl_host_tests zpccl_gpu_tests; do
  step "$suite"
  "$build/tests/$suite" --gtest_output="json:$results/$suite.json" --gtest_brief=1
done
step c_abi_test
"$build/tests/c_abi_test"
outcome c_abi $?

# The host backend over MPI: four ranks as processes under mpirun, with the plans' default chunks and with chunks of
# 16 KiB. Rank 0 writes the report; every test fails there when it failed on any rank.
step "zpccl_mpi_tests and the perf binaries' host mode (mpirun -np 4)"
if [ -x "$build/tests/zpccl_mpi_tests" ] && command -v mpirun >/dev/null; then
  mpi_run=(timeout 300 mpirun -np 4 --oversubscribe)
  [ "$(id -u)" = 0 ] && mpi_run+=(--allow-run-as-root)
  for chunks in default 16384; do
    report=$results/zpccl_mpi_tests_$chunks.json
    env_args=()
    [ "$chunks" = default ] || env_args=(-x "ZP_CHUNK_BYTES=$chunks")
    "${mpi_run[@]}" "${env_args[@]}" "$build/tests/zpccl_mpi_tests" --gtest_output="json:$report" --gtest_brief=1 \
      >"$results/zpccl_mpi_tests_$chunks.log" 2>&1
    rc=$?
    grep -E "PASSED|FAILED" "$results/zpccl_mpi_tests_$chunks.log" | sort | uniq -c
    [ -f "$report" ] || { echo "mpirun exited $rc without a report (log: $results/zpccl_mpi_tests_$chunks.log)"; count "mpi_$chunks" 0 1; }
  done
  # The perf binaries' host mode, one rank a process over MPI: every output checked against the host reference.
  perf_mpi_ok=1
  for bin in qwz_perf hpz_perf qgz_perf all_reduce_perf; do
    [ -x "$build/perf/$bin" ] || continue
    "${mpi_run[@]}" "$build/perf/$bin" -H 1 -b 1K -e 256K -f 4 -n 2 -w 1 >"$results/${bin}_mpi.log" 2>&1 &&
      grep -q "Out of bounds values : 0 OK" "$results/${bin}_mpi.log" ||
      { perf_mpi_ok=0; echo "$bin -H 1 under mpirun failed (log: $results/${bin}_mpi.log)"; }
  done
  outcome perf_mpi_host "$((1 - perf_mpi_ok))"
else
  echo "skipped: no MPI (the build found none, or mpirun is missing)"
  count mpi 0 0 1
fi

# ---- C users: meson install, then a program built with pkg-config against the installed tree ---------------
step "pkg-config consumer (meson install, tests/pkgconfig_consumer.c)"
install_root=$build/install-test
consume() {
  rm -rf "$install_root"
  meson install -C "$build" --destdir "$install_root" --quiet >"$results/install.log" 2>&1 ||
    { echo "meson install failed:"; tail -5 "$results/install.log"; return 1; }
  local pc
  pc=$(find "$install_root" -name zpccl.pc | head -1)
  [ -n "$pc" ] || { echo "meson install wrote no zpccl.pc"; return 1; }
  local flags
  flags=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --cflags --libs zpccl) || return 1
  local libdir
  libdir=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --variable=libdir zpccl) || return 1
  echo "pkg-config --cflags --libs zpccl: $flags"
  # shellcheck disable=SC2086  # the flags are words
  cc -std=c11 -Wall -Wextra -Werror "$top/tests/pkgconfig_consumer.c" $flags -pthread -Wl,-rpath,"$libdir" \
    -o "$install_root/pkgconfig_consumer" || return 1
  ZP_BACKEND=host "$install_root/pkgconfig_consumer"
}
consume
outcome pkgconfig $?

# Style: every C/C++/CUDA file clang-formatted (.clang-format), counted as one test when clang-format exists.
if command -v clang-format >/dev/null; then
  step clang-format
  unformatted=$(cd "$top" && git ls-files '*.h' '*.c' '*.cc' '*.cu' '*.cuh' 2>/dev/null |
    while read -r f; do clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || echo "$f"; done)
  [ -z "$unformatted" ] || echo "not clang-formatted: $unformatted"
  outcome format "$([ -z "$unformatted" ]; echo $?)"
fi

# Evidence: perf/RESULTS.md's tables and README.md's quoted figures are what perf/results/*.json give
# (tools/render_results.py renders them); counted as one test.
step "results tables (tools/render_results.py --check)"
"$ZP_PYTHON" "$top/tools/render_results.py" --check
outcome results $?

# ---- Python: the wheel, installed into a fresh virtual environment with torch -------------------------------
# How the wheel can be built: against the build Python's own meson-python and nvidia-nccl-cu13 (pip install
# --no-build-isolation, which needs no network), else in pip's isolated build environment (fetches them).
step "wheel (pip wheel .)"
wheel_dir=$build/wheel
wheel_venv=$build/wheel-venv
# The versions the framework tests (test_torchtitan, test_recipes, test_foreign_models, test_deepspeed) were written
# against: pip requirement lines, which the tests read too (tests.pinned).
test_frameworks=$top/tools/python/tests/frameworks.txt
rm -rf "$wheel_dir"
index_reachable() {
  local probe
  probe=$(mktemp -d)
  "$ZP_PYTHON" -m pip download -q --no-deps --no-cache-dir --retries 0 --timeout 15 -d "$probe" meson-python \
    >/dev/null 2>&1
  local rc=$?
  rm -rf "$probe"
  return $rc
}
wheel_args=() wheel_skip=""
if "$ZP_PYTHON" -c 'import mesonpy, nvidia.nccl' 2>/dev/null && command -v patchelf >/dev/null; then
  wheel_args=(--no-build-isolation -Cbuild-dir="$build/wheel-build")
  echo "building against $ZP_PYTHON's meson-python and nvidia-nccl-cu13 (--no-build-isolation)"
elif index_reachable; then
  rm -rf "$build/wheel-build"  # the isolated environment moves each run, and the NCCL headers with it
  wheel_args=(-Cbuild-dir="$build/wheel-build")
  echo "building in pip's isolated environment (meson-python, Meson, NCCL from the package index)"
else
  wheel_skip="meson-python (with nvidia-nccl-cu13 and patchelf) is not installed for $ZP_PYTHON and the package index cannot be reached"
fi
wheel=""
if [ -z "$wheel_skip" ]; then
  "$ZP_PYTHON" -m pip wheel "$top" --no-deps -w "$wheel_dir" "${wheel_args[@]}" >"$results/wheel.log" 2>&1
  wheel_rc=$?
  wheel=$(ls "$wheel_dir"/zpccl-*.whl 2>/dev/null | head -1)
  if [ $wheel_rc -ne 0 ] || [ -z "$wheel" ]; then
    echo "pip wheel failed (exit $wheel_rc; log $results/wheel.log):"
    grep -E "ERROR|error:|FAILED" "$results/wheel.log" | head -10
    wheel=""
  else
    echo "built $wheel"
  fi
fi
python_under_test=$ZP_PYTHON
# The sanitizers' build (clang, its own folder) runs while pip installs, which mostly waits on downloads and leaves
# a core idle; it ends before the Python suite, whose multi-process tests keep to their time limits on two cores.
sanitizer_build=""
if [ "${ZP_SKIP_SANITIZERS:-0}" != 1 ]; then
  bash "$top/tools/run-sanitizers.sh" --build-only >"$results/sanitizers-build.log" 2>&1 &
  sanitizer_build=$!
fi
# A pip install, once more without pip's cache when it fails: a download cut short in an earlier run can leave a
# cached file that fails its hash check on every later one.
vinstall() { "$@" || { echo "retrying without pip's cache: ${*: -1}"; "$@" --no-cache-dir; }; }
if [ -n "$wheel" ]; then
  step "virtual environment with the wheel and torch ($wheel_venv)"
  rm -rf "$wheel_venv"
  # The system's packages stay visible (a machine's own torch and NumPy, offline); the wheel goes on top.
  installed=0
  if "$ZP_PYTHON" -m venv --system-site-packages "$wheel_venv"; then
    vpip=(vinstall "$wheel_venv/bin/python" -m pip install -q --disable-pip-version-check --retries 2 --timeout 30)
    if ! "$wheel_venv/bin/python" -c 'import torch' 2>/dev/null; then
      "${vpip[@]}" torch || echo "pip could not install torch (no network?): the torch tests will skip"
    fi
    if "${vpip[@]}" "$wheel"; then
      installed=1
      python_under_test=$wheel_venv/bin/python
    else
      echo "pip could not install $wheel with its dependencies into $wheel_venv"
    fi
    # Test-only: the frameworks whose recipes and models the suite runs zpccl.fsdp and zpccl.deepspeed under, each
    # with the torch already there (a constraint keeps pip from replacing it); their tests skip, saying so, when
    # missing. DeepSpeed's source distribution builds none of its CUDA ops (DS_BUILD_OPS=0): the tests run its CPU
    # accelerator, and zpccl replaces the collectives those ops would serve.
    if [ $installed = 1 ] && torch_version=$("$wheel_venv/bin/python" -c 'import torch; print(torch.__version__)' \
      2>/dev/null); then
      # A file, not a pipe: vinstall's second try reads the constraint again. The release without its local label
      # (2.15.0 of 2.15.0+cu132): pip resolves a constraint against the index, which has no local labels, and a
      # release constraint still matches the installed build.
      echo "torch==${torch_version%%+*}" >"$results/torch-constraint.txt"
      # Where the index answers, a failed install is CI's failure (a pin that no longer resolves), not a silent
      # skip of every framework test; offline, those tests skip, saying so.
      if ! DS_BUILD_OPS=0 "${vpip[@]}" -c "$results/torch-constraint.txt" -r "$test_frameworks" \
        >"$results/frameworks.log" 2>&1; then
        pins=$(grep -Ev '^[[:space:]]*(#|$)' "$test_frameworks" | tr '\n' ' ')
        if index_reachable; then
          echo "pip could not install $pins(log $results/frameworks.log): counted as a failure"
          count frameworks 0 1
        else
          echo "pip could not install $pins(no network; log $results/frameworks.log): their tests skip"
        fi
      fi
    fi
  fi
  if [ $installed = 0 ] && ! index_reachable; then
    echo "skipped: the wheel's dependencies (numpy, nvidia-nccl-cu13) are not installed system-wide and the" \
      "package index cannot be reached; the Python suite runs against the source tree"
    count wheel 0 0 1
  else
    outcome wheel $((1 - installed))
  fi
elif [ -n "$wheel_skip" ]; then
  echo "skipped: $wheel_skip; the Python suite runs against the source tree"
  count wheel 0 0 1
else
  outcome wheel 1
fi

if [ -n "$sanitizer_build" ]; then
  step "sanitizers' build, begun with the virtual environment (tools/run-sanitizers.sh --build-only)"
  wait "$sanitizer_build" || echo "the sanitizers' build failed (log: $results/sanitizers-build.log)"
fi
step python
if ! "$python_under_test" -c 'import numpy' 2>/dev/null; then
  echo "skipped: NumPy is not installed for $python_under_test"
  count python 0 0 1
elif [ "$python_under_test" != "$ZP_PYTHON" ]; then
  # From a copy of the suite, outside the source tree: nothing of tools/python is on sys.path.
  suite_copy=$build/installed-suite
  rm -rf "$suite_copy" && mkdir -p "$suite_copy" && cp -r "$top/tools/python/tests" "$suite_copy/"
  (cd "$suite_copy" && env -u PYTHONPATH -u ZPCCL_LIBRARY "$python_under_test" "$suite_copy/tests/run.py" \
    --installed "$top" --count "$results/python.count")
else
  ZPCCL_LIBRARY=$build/libzpccl.so PYTHONPATH=$top/tools/python "$python_under_test" \
    "$top/tools/python/tests/run.py" --count "$results/python.count"
fi

# Sanitizers: the host-only suites under ASan + UBSan (clang, no nvcc) and a bounded libFuzzer run over the
# argument checks and the planners; counted as one test. ZP_SKIP_SANITIZERS=1 skips it (a quick local run).
if [ "${ZP_SKIP_SANITIZERS:-0}" != 1 ]; then
  step "sanitizers (tools/run-sanitizers.sh)"
  bash "$top/tools/run-sanitizers.sh" >"$results/sanitizers.log" 2>&1
  outcome sanitizers $?
  tail -3 "$results/sanitizers.log"
fi
step_done
echo "## total: $SECONDS s"

exec "$ZP_PYTHON" "$top/tools/count_results.py" "$results"
