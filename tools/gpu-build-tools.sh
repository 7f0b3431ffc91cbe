# shellcheck shell=bash disable=SC2034  # meson_cmd is for the script that sources this
# Sourced by the scripts that build on a GPU machine (tools/gpu-check.sh, tools/bisect-fsdp-step.sh): finds nvcc
# (puts CUDA's bin folder on PATH where the image keeps it off) and Meson, and sets the array meson_cmd to the way to
# run it: Meson on PATH, else the tree's .venv, else a meson-*.whl at the top of the tree (the machine has no network);
# ninja_targets names what to build in ninja's words.
#   source tools/gpu-build-tools.sh; find_gpu_build_tools "$top"; "${meson_cmd[@]}" setup ...
find_gpu_build_tools() {
  local top=$1 d whl
  for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin; do
    command -v nvcc >/dev/null || { [ -x "$d/nvcc" ] && export PATH=$d:$PATH; }
  done
  meson_cmd=(meson)
  command -v meson >/dev/null && return 0
  if [ -x "$top/.venv/bin/meson" ]; then
    meson_cmd=("$top/.venv/bin/meson")
  else
    whl=$(ls "$top"/meson-*.whl 2>/dev/null | head -1)
    [ -n "$whl" ] && meson_cmd=(env "PYTHONPATH=$whl" python3 -m mesonbuild.mesonmain)
  fi
  return 0
}

# Prints ninja's name for each target NAME of the build in DIR, one a line. Meson makes a shared library's
# unversioned names (libzpccl.so, libzpccl.so.0) links to its versioned file (libzpccl.so.0.2.0), and ninja has a rule
# for that file only: asked for a link whose file is not built yet, it builds nothing ("missing and no known rule").
# A library name ninja has no rule for becomes the versioned one it has; any other name is printed as it is.
#   mapfile -t targets < <(ninja_targets build-gpu perf/qwz_perf libzpccl.so); ninja -C build-gpu "${targets[@]}"
ninja_targets() {  # DIR NAME...
  local dir=$1 name known versioned
  shift
  [ $# -gt 0 ] || return 0
  known=$(ninja -C "$dir" -t targets all 2>/dev/null | sed -n 's/^\([^:]*\): .*/\1/p')
  for name in "$@"; do
    if [[ $name == *.so* ]] && ! grep -qxF -- "$name" <<<"$known"; then
      versioned=$(grep -E "^${name//./\\.}(\.[0-9]+)+\$" <<<"$known" | sort -V | tail -1)
      [ -n "$versioned" ] && name=$versioned
    fi
    printf '%s\n' "$name"
  done
}
