#!/usr/bin/env bash
# Installs what building zpccl needs on a fresh Debian machine (idempotent), then configures and builds into
# ${ZP_BUILD_DIR:-build}. Sourced by run-main.sh and run-tests.sh.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${ZP_BUILD_DIR:-$top/build}

# Meson, Ninja and NumPy (for the Python package's tests) in a private virtual environment.
venv=$top/.venv
if [ ! -x "$venv/bin/meson" ]; then
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check meson ninja numpy
fi
export PATH=$venv/bin:$PATH

# GoogleTest from Debian, when missing.
if ! pkg-config --exists gtest 2>/dev/null && [ ! -f /usr/lib/x86_64-linux-gnu/libgtest.a ]; then
  if command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libgtest-dev pkg-config >/dev/null
  fi
fi

# nvcc: on PATH, or the usual toolkit folder.
if ! command -v nvcc >/dev/null; then
  for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin; do [ -x "$d/nvcc" ] && export PATH=$d:$PATH && break; done
fi

if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" "$top" --buildtype=release ${ZP_MESON_ARGS:-}
fi
ninja -C "$build"
