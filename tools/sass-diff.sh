#!/usr/bin/env bash
# Whether two versions of the tree run the same GPU code, on a machine without a GPU: builds each (the library
# and the test binaries, device code for ${ZP_SASS_ARCHS:-80,90}) and compares the SASS of every kernel, function
# by function (tools/sass_diff.py). A change whose kernels all stay identical is not a change to what the GPU
# runs (CONTRIBUTING.md).
#
#   tools/sass-diff.sh                 # main against the working tree (uncommitted changes included)
#   tools/sass-diff.sh BASE            # BASE (any commit) against the working tree
#   tools/sass-diff.sh BASE HEAD       # two commits
#
# A commit is built from `git archive` into ${ZP_SASS_DIR:-build-sass}/<commit>/ and kept there, so a second
# comparison against it builds nothing; the working tree is built in ${ZP_SASS_DIR}/worktree/ (incremental).
# The last line says "every function identical" or how many differ; exit status 0 only when all are identical.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=${ZP_SASS_DIR:-$top/build-sass}
archs=${ZP_SASS_ARCHS:-80,90}
base=${1:-main}
head=${2:-}
binaries=(libzpccl.so tests/zpccl_host_tests tests/zpccl_gpu_tests)
targets=(zpccl zpccl_host_tests zpccl_gpu_tests)  # their Meson targets
python=${ZP_PYTHON:-python3}
[ -x "$top/.venv/bin/meson" ] && export PATH=$top/.venv/bin:$PATH
command -v meson >/dev/null || { echo "sass-diff: meson not found (tools/setup.sh installs it into .venv)" >&2; exit 2; }

# build SOURCE BUILD: configure once, then build only what holds kernels.
build() {
  if [ ! -f "$2/build.ninja" ]; then
    meson setup "$2" "$1" --buildtype=release -Dgpu_archs="$archs" -Dperf=false >"$2.setup.log" 2>&1 ||
      { echo "sass-diff: meson setup failed (log: $2.setup.log)" >&2; tail -5 "$2.setup.log" >&2; exit 2; }
  fi
  echo "## sass-diff: building ${binaries[*]} in $2"
  meson compile -C "$2" "${targets[@]}" >"$2.build.log" 2>&1 ||
    { echo "sass-diff: build failed (log: $2.build.log)" >&2; grep -E "error|FAILED" "$2.build.log" | head -20 >&2; exit 2; }
}

# side REV: builds a commit (exported once) or, for an empty REV, the working tree; leaves its build folder in $dir.
side() {
  if [ -z "$1" ]; then
    dir=$work/worktree
    build "$top" "$dir"
    return
  fi
  local sha
  sha=$(git -C "$top" rev-parse --verify "$1^{commit}") || { echo "sass-diff: no commit $1" >&2; exit 2; }
  if [ ! -f "$work/$sha/build/libzpccl.so" ]; then
    rm -rf "$work/$sha/src" && mkdir -p "$work/$sha/src"
    git -C "$top" archive "$sha" | tar -x -C "$work/$sha/src"
  fi
  dir=$work/$sha/build
  build "$work/$sha/src" "$dir"
}

mkdir -p "$work"
side "$base"
a=$dir
side "$head"
b=$dir
echo "## sass-diff: ${base} ($a) against ${head:-the working tree} ($b), device code for sm_${archs//,/, sm_}"
"$python" "$top/tools/sass_diff.py" compare "$a" "$b" "${binaries[@]/#/--binary=}"
