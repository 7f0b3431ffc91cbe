#!/usr/bin/env bash
# README's test job: set up, build, run every suite (host-only suites everywhere; GPU suites skip without a
# GPU), then print one line "N passed, N failed" counting every test that ran (skips are not passes).
set -uo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${ZP_BUILD_DIR:-$top/build}
source "$top/tools/setup.sh" || { echo "0 passed, 1 failed"; exit 1; }
set +e
export NCCL_NVLS_ENABLE=0
results=$build/test-results
rm -rf "$results" && mkdir -p "$results"

for suite in zpccl_host_tests zpccl_gpu_tests; do
  echo "## $suite"
  "$build/tests/$suite" --gtest_output="json:$results/$suite.json" --gtest_brief=1
done
echo "## c_abi_test"
if "$build/tests/c_abi_test"; then echo '{"passed": 1, "failed": 0}' >"$results/c_abi.count"
else echo '{"passed": 0, "failed": 1}' >"$results/c_abi.count"; fi
# Style: every C/C++/CUDA file clang-formatted (.clang-format), counted as one test when clang-format exists.
if command -v clang-format >/dev/null; then
  echo "## clang-format"
  unformatted=$(cd "$top" && git ls-files '*.h' '*.c' '*.cc' '*.cu' '*.cuh' 2>/dev/null |
    while read -r f; do clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || echo "$f"; done)
  if [ -z "$unformatted" ]; then echo '{"passed": 1, "failed": 0}' >"$results/format.count"
  else echo "not clang-formatted: $unformatted"; echo '{"passed": 0, "failed": 1}' >"$results/format.count"; fi
fi
if [ -d "$top/tools/python/tests" ]; then
  echo "## python"
  ZPCCL_LIBRARY=$build/libzpccl.so PYTHONPATH=$top/tools/python "$top/.venv/bin/python" \
    "$top/tools/python/tests/run.py" --count "$results/python.count"
fi

# Sanitizers: the host-only suites under ASan + UBSan (clang, no nvcc) and a bounded libFuzzer run over the
# argument checks and the planners; counted as one test. ZP_SKIP_SANITIZERS=1 skips it (a quick local run).
if [ "${ZP_SKIP_SANITIZERS:-0}" != 1 ]; then
  echo "## sanitizers (tools/run-sanitizers.sh)"
  if bash "$top/tools/run-sanitizers.sh" >"$results/sanitizers.log" 2>&1; then
    echo '{"passed": 1, "failed": 0}' >"$results/sanitizers.count"
  else
    echo '{"passed": 0, "failed": 1}' >"$results/sanitizers.count"
  fi
  tail -3 "$results/sanitizers.log"
fi

exec "$top/.venv/bin/python" "$top/tools/count_results.py" "$results"
