#!/usr/bin/env bash
# The host-only pieces of zpccl under AddressSanitizer + UndefinedBehaviorSanitizer, built by Meson with clang and
# without nvcc (a machine without a GPU is enough):
#   1. configures ${ZP_SAN_BUILD_DIR:-build-sanitizers} once (meson setup: -Ddevice_kernels=false, so that
#      tests/sanitizer_device_stubs.cc stands in for the CUDA kernels; -Db_sanitize=address,undefined;
#      -Dfuzz=true, which gives the library libFuzzer's coverage and builds tests/fuzz_host.cc) and builds it
#      (ninja, incremental): the library, the perf harness, the cost model, the host-only GoogleTest suites of
#      tests/meson.build (zpccl_host_tests), the C ABI test and the fuzzer;
#   2. runs the host suites and the C ABI test (meson test host c_abi; host backend,
#      ZP_SOAK_ITERS=${ZP_SOAK_ITERS:-1000}); every UBSan report counts as a failure;
#   3. runs the fuzzer for ${ZP_FUZZ_SECONDS:-60} s (meson test fuzz) beside step 2, its corpus kept in the build
#      folder (later runs start from what earlier ones found), a failing input saved in fuzz-artifacts/.
# With --build-only it stops after step 1 (tools/run-tests.sh builds while pip downloads, then runs the rest).
# Prints "N passed, N failed" last (every test of the suite, the C ABI test, the UBSan check, the fuzzer) and exits
# non-zero on any failure. Installs clang, its sanitizer/fuzzer runtimes, GoogleTest and ninja with apt-get when
# missing.
set -uo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${ZP_SAN_BUILD_DIR:-$top/build-sanitizers}
soak_iters=${ZP_SOAK_ITERS:-1000}
fuzz_seconds=${ZP_FUZZ_SECONDS:-60}
build_only=0
[ "${1:-}" = --build-only ] && build_only=1
start=$(date +%s)
say() { echo "## run-sanitizers: $*"; }
fail_setup() { echo "run-sanitizers: $*" >&2; echo "0 passed, 1 failed"; exit 1; }

# ---- tools -------------------------------------------------------------------------------------------------
runtime_has() {  # a clang runtime library (asan, ubsan_standalone, fuzzer) is installed
  command -v clang++ >/dev/null && [ -f "$(clang++ --print-runtime-dir 2>/dev/null)/libclang_rt.$1-x86_64.a" ]
}
[ -x "$top/.venv/bin/meson" ] && export PATH=$top/.venv/bin:$PATH  # tools/setup.sh's Meson
missing=()
command -v clang++ >/dev/null || missing+=(clang)
runtime_has asan && runtime_has fuzzer || missing+=(libclang-rt-dev)
[ -f /usr/lib/x86_64-linux-gnu/libgtest.a ] || [ -f /usr/lib/libgtest.a ] || missing+=(libgtest-dev)
command -v ninja >/dev/null || missing+=(ninja-build)
command -v meson >/dev/null || missing+=(meson)
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd=sudo
  $sudo_cmd apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" \
    >/dev/null || fail_setup "apt-get install ${missing[*]} failed"
fi
runtime_has asan && runtime_has fuzzer || fail_setup "clang's asan/fuzzer runtimes not found"
# CUDA's headers and runtime (the ABI header includes cuda_runtime.h; without a GPU every CUDA call fails
# cleanly) and NCCL (linked by src/init.cc and the cuda backend, never started here): Meson finds the toolkit
# through nvcc on PATH (or /usr/local/cuda), CUDA_HOME's when set.
[ -n "${CUDA_HOME:-}" ] && export PATH=$CUDA_HOME/bin:$PATH
nccl_flag=()
[ -n "${NCCL_HOME:-}" ] && nccl_flag=(-Dnccl_home="$NCCL_HOME")

# Out-of-range enum values (a datatype of 99, an op of -1) are what C and ctypes callers can pass; in C++ an
# unscoped enum without a fixed underlying type cannot hold them, so UBSan's enum check flags the library's
# every read of such an argument. That is a header issue reported separately (the fix: give zpccl.h's enums a
# fixed int underlying type in C++); ZP_SAN_ENUM=1 turns the check back on.
cpp_args="-fno-omit-frame-pointer"
[ "${ZP_SAN_ENUM:-0}" = 1 ] || cpp_args="$cpp_args -fno-sanitize=enum"

# ---- build -------------------------------------------------------------------------------------------------
options=(-Ddevice_kernels=false -Dfuzz=true -Db_sanitize=address,undefined -Db_lundef=false -Dmpi=disabled
  -Doptimization=1 -Ddebug=true -Dcpp_args="$cpp_args" "${nccl_flag[@]}")
# A folder that an older version of this script wrote (its own build.ninja, no Meson) is set up anew; its fuzz
# corpus is kept.
if [ -f "$build/build.ninja" ] && [ ! -d "$build/meson-private" ]; then
  say "replacing the hand-written build in $build with a Meson one"
  [ -d "$build/fuzz-corpus" ] && mv "$build/fuzz-corpus" "$build.fuzz-corpus"
  rm -rf "$build"
  mkdir -p "$build"
  [ -d "$build.fuzz-corpus" ] && mv "$build.fuzz-corpus" "$build/fuzz-corpus"
fi
mkdir -p "$build"
if [ -f "$build/build.ninja" ]; then
  meson configure "$build" "${options[@]}" >"$build/setup.log" 2>&1
else
  CC=clang CXX=clang++ meson setup "$build" "$top" "${options[@]}" >"$build/setup.log" 2>&1
fi || { tail -20 "$build/setup.log"; fail_setup "meson setup failed (log: $build/setup.log)"; }
say "building in $build ($(nproc) jobs)"
if ! ninja -C "$build" -j "$(nproc)" >"$build/build.log" 2>&1; then
  grep -E "error|FAILED" -A3 "$build/build.log" | head -40
  fail_setup "build failed (full log: $build/build.log)"
fi
grep -E "warning:" "$build/build.log" | sort -u | head -20
built=$(date +%s)
say "built in $((built - start)) s"
[ $build_only = 1 ] && exit 0

# ---- the host-only suites and the C ABI test ---------------------------------------------------------------
passed=0 failed=0
# Leaks are checked at exit; the shadow gap stays readable for a CUDA driver, should one be present.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:protect_shadow_gap=0:abort_on_error=0:halt_on_error=1}
rm -f "$build"/ubsan.*
export ZP_BACKEND=host ZP_SOAK_ITERS=$soak_iters
# shellcheck source=tools/regimes.sh
source "$top/tools/regimes.sh"
zp_export_regime nvlink
suite=$build/tests/zpccl_host_tests
# The suite's test groups (DISABLED_ tests run as children of others: tests/child_test.h).
groups=$("$suite" --gtest_list_tests | awk '$1 ~ /^[A-Za-z0-9_\/]+\.$/ { sub(/\.$/, "", $1); print $1 }')
# The groups that take longest here (a minute or more each: they rerun the collective suites in children, or sweep
# every float) go first, so that the short ones fill in beside them instead of one long group running alone at the
# end. A name no longer in the suite is left out.
longest="CallbackTransport QuantMath CollPlanHost AllReduce/AllReduceLayout Qgz/QgzLayout"
groups="$(for g in $longest; do printf '%s\n' $groups | grep -qx "$g" && echo "$g"; done)
$(printf '%s\n' $groups | grep -vxF "$(printf '%s\n' $longest)")"
total=$("$suite" --gtest_list_tests | grep '^  ' | grep -vc '^  DISABLED_')
jobs=$(nproc)
say "running zpccl_host_tests ($total tests, ZP_SOAK_ITERS=$soak_iters, its test groups $jobs at a time) and c_abi_test"
# One process a test group, as many at once as there are cores: most of the suite's time is a few tests that rerun
# the collective suites in children or sweep every float, and a rank's threads mostly wait on each other, so one
# process leaves cores idle.
# No timeout: the sanitizers slow the soak tests several times over. Each group's output is kept in tests.log.
rm -rf "$build/host.d" && mkdir -p "$build/host.d"
# The fuzzer (step 3) runs beside the suites: it keeps to one core for its fixed time, and the groups fill the rest.
# It ends before the C ABI test's `meson test` (below) writes the same build folder's test log.
mkdir -p "$build/fuzz-corpus" "$build/fuzz-artifacts"
say "fuzzing for $fuzz_seconds s beside the suites (corpus $build/fuzz-corpus)"
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  meson test -C "$build" --no-rebuild -v fuzz \
  --test-args="-max_total_time=$fuzz_seconds -artifact_prefix=$build/fuzz-artifacts/ $build/fuzz-corpus" \
  >"$build/fuzz.log" 2>&1 &
fuzz_pid=$!
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=0:log_path=$build/ubsan
# shellcheck disable=SC2016  # expanded by the shell xargs starts
printf '%s\n' $groups | xargs -P "$jobs" -I{} sh -c \
  'f=$3/$(echo "$2" | tr / _); "$1" --gtest_brief=1 --gtest_filter="$2.*" --gtest_output="json:$f.json" >"$f.log" 2>&1
    echo $? >"$f.rc"' \
  _ "$suite" {} "$build/host.d"
wait "$fuzz_pid"
frc=$?
cat "$build"/host.d/*.log >"$build/tests.log"
rc=$(cat "$build"/host.d/*.rc | sort -rn | head -1)
# The suite's own counts (its JSON reports); a report that is missing (a sanitizer abort) fails every test not seen.
counts=$(python3 - "$build"/host.d/*.json <<'PY'
import json, sys
tests = []
for path in sys.argv[1:]:
    try:
        suites = json.load(open(path)).get("testsuites", [])
    except (OSError, ValueError):
        suites = []
    tests += [t for s in suites for t in s.get("testsuite", []) if t.get("status") != "NOTRUN"]  # DISABLED_ ones
skipped = sum(1 for t in tests if t.get("result") == "SKIPPED")
bad = sum(1 for t in tests if t.get("failures"))
print(len(tests) - skipped - bad, skipped)
PY
)
ok=${counts% *} skipped=${counts#* }
bad=$((total - ok - skipped))
if [ "${rc:-1}" -ne 0 ] && [ $bad -eq 0 ]; then bad=1; fi  # a sanitizer abort after a group's last test
grep -E "^\[  (FAILED|PASSED|SKIPPED) \]|^==[0-9]+==ERROR|SUMMARY: " "$build/tests.log" | grep -v PASSED | head -40
passed=$((passed + ok)) failed=$((failed + bad))
meson test -C "$build" --no-rebuild --print-errorlogs c_abi >>"$build/tests.log" 2>&1
if [ $? -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)) && say "c_abi_test failed"; fi
ubsan_reports=$(cat "$build"/ubsan.* 2>/dev/null | grep -c "runtime error" || true)
if [ "${ubsan_reports:-0}" -eq 0 ]; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
  say "$ubsan_reports UBSan reports; distinct ones:"
  cat "$build"/ubsan.* | grep "runtime error" | sed 's/^.*zpccl\///' | sort | uniq -c | sort -rn | head -20
fi
tested=$(date +%s)
say "suites: $ok passed, $bad failed, $skipped skipped, $ubsan_reports UBSan reports in $((tested - built)) s (log: $build/tests.log)"

# ---- the fuzzer's outcome (it ran beside the suites) -------------------------------------------------------
grep -E "^#[0-9]+[[:space:]]+(DONE|INITED)|stat::number_of_executed_units|stat::peak_rss|ERROR|invariant violated|Test unit written" \
  "$build/fuzz.log" | head -20
if [ $frc -eq 0 ]; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
  say "the fuzzer failed (exit $frc); reproduce with: $build/tests/fuzz_host $build/fuzz-artifacts/<crash file>"
fi
say "total $(($(date +%s) - start)) s"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
