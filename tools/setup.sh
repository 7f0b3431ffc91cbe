#!/usr/bin/env bash
# Installs what building zpccl needs on a fresh Debian machine (idempotent), then configures and builds into
# ${ZP_BUILD_DIR:-build}. Sourced by run-main.sh and run-tests.sh; leaves ZP_PYTHON set to the Python that sees
# what it installed.
#
# The machine's own Meson, Ninja and NumPy are used when they are there, so that a machine without network access
# (a cluster's compute node) builds as long as they are installed: .venv is created with --system-site-packages
# and pip installs into it only what is missing. Meson must be at least meson.build's meson_version.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${ZP_BUILD_DIR:-$top/build}
setup_start=$SECONDS
setup_say() { echo "## setup: $*"; }

venv=$top/.venv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv --system-site-packages "$venv" ||
    { echo "setup: 'python3 -m venv' failed; on Debian: apt-get install python3-venv" >&2; exit 1; }
fi
export PATH=$venv/bin:$PATH
ZP_PYTHON=$venv/bin/python
# When python3 is itself a virtual environment (a machine's torch environment, say), --system-site-packages
# reaches only its base interpreter's packages: a .pth file adds the environment's own, once.
outer=$(python3 -c 'import sys, sysconfig; print(sysconfig.get_paths()["purelib"] if sys.prefix != sys.base_prefix else "")')
if [ -n "$outer" ]; then
  inner=$("$ZP_PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  [ "$outer" = "$inner" ] || echo "$outer" >"$inner/zpccl-outer-environment.pth"
fi

meson_min=$(sed -n "s/.*meson_version: *'>=\([0-9.]*\)'.*/\1/p" "$top/meson.build")
# True when `meson --version` is at least $meson_min (sort -V orders version strings).
meson_usable() {
  local have
  have=$(meson --version 2>/dev/null) || return 1
  [ "$(printf '%s\n%s\n' "$meson_min" "$have" | sort -V | head -1)" = "$meson_min" ]
}
missing=()
meson_usable || missing+=("meson>=$meson_min")
command -v ninja >/dev/null || missing+=(ninja)
"$ZP_PYTHON" -c 'import numpy' 2>/dev/null || missing+=(numpy)
if [ ${#missing[@]} -gt 0 ]; then
  setup_say "pip install ${missing[*]} into .venv"
  "$ZP_PYTHON" -m pip install -q --disable-pip-version-check --retries 1 --timeout 20 "${missing[@]}" ||
    echo "setup: pip could not install ${missing[*]} (no network?)" >&2
fi
meson_usable || { echo "setup: Meson >= $meson_min is needed: pip install meson, or put it on PATH" >&2; exit 1; }
command -v ninja >/dev/null || { echo "setup: Ninja is needed: apt-get install ninja-build or pip install ninja" >&2; exit 1; }
# NumPy serves the Python package's tests only: without it they are reported as skipped (tools/run-tests.sh).
"$ZP_PYTHON" -c 'import numpy' 2>/dev/null || echo "setup: NumPy not installed: the Python suite will be skipped" >&2
export ZP_PYTHON

# GoogleTest from Debian, when missing.
if ! pkg-config --exists gtest 2>/dev/null && [ ! -f /usr/lib/x86_64-linux-gnu/libgtest.a ]; then
  if command -v apt-get >/dev/null; then
    setup_say "apt-get install libgtest-dev pkg-config"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libgtest-dev pkg-config >/dev/null ||
      echo "setup: apt-get could not install libgtest-dev (no network?)" >&2
  fi
fi

# nvcc: on PATH, or the usual toolkit folder.
if ! command -v nvcc >/dev/null; then
  for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin; do [ -x "$d/nvcc" ] && export PATH=$d:$PATH && break; done
fi

setup_say "tools ready ($((SECONDS - setup_start)) s): meson $(meson --version), ninja $(ninja --version)"
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" "$top" --buildtype=release ${ZP_MESON_ARGS:-}
fi
build_start=$SECONDS
ninja -C "$build"
setup_say "built $build ($((SECONDS - build_start)) s)"
