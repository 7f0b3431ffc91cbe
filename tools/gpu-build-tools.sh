# shellcheck shell=bash disable=SC2034  # meson_cmd is for the script that sources this
# Sourced by the scripts that build on a GPU machine (tools/gpu-check.sh, tools/bisect-fsdp-step.sh): finds nvcc
# (puts CUDA's bin folder on PATH where the image keeps it off) and Meson, and sets the array meson_cmd to the way to
# run it: Meson on PATH, else the tree's .venv, else a meson-*.whl at the top of the tree (the machine has no network).
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
