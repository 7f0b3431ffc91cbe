# shellcheck shell=bash
# Sourced on a GPU machine without network before Python runs that need packages the machine lacks (DeepSpeed and
# its dependencies, carried as wheels in .whl/ at the top of the tree):
#   source tools/gpu-python-deps.sh; use_carried_wheels "$top"
# installs the wheels once into build-pydeps/ (keyed by the wheels' names and sizes, so a changed set reinstalls),
# puts that folder on PYTHONPATH, and prepares DeepSpeed's op builder (it compiles the ZeRO++ quantizer on first
# use): TORCH_EXTENSIONS_DIR in build-torch-extensions/ unless set, so a warm machine compiles once, and
# TORCH_CUDA_ARCH_LIST without arch suffixes ("9.0a" -> "9.0"), which that builder reads as plain numbers.
# Without .whl/ it changes nothing. A plain `pip install` is not used: on such machines it may install for another
# interpreter than python3, or into a folder python3 does not search.
use_carried_wheels() {
  local top=$1 dir=$1/build-pydeps key
  compgen -G "$top/.whl/*.whl" >/dev/null || return 0
  key=$(find "$top/.whl" -maxdepth 1 -type f -name '*.whl' -printf '%s %f\n' | sort)
  if [ "$(cat "$dir/.wheels" 2>/dev/null)" != "$key" ]; then
    rm -rf "$dir"
    python3 -m pip install --quiet --no-index --no-deps --target "$dir" "$top"/.whl/*.whl || {
      echo "use_carried_wheels: pip could not install $top/.whl/*.whl into $dir" >&2
      return 1
    }
    printf '%s\n' "$key" >"$dir/.wheels"
  fi
  export PYTHONPATH=$dir${PYTHONPATH:+:$PYTHONPATH}
  export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$top/build-torch-extensions}
  if [ -n "${TORCH_CUDA_ARCH_LIST:-}" ]; then
    TORCH_CUDA_ARCH_LIST=$(sed -E 's/([0-9])[a-z]+/\1/g' <<<"$TORCH_CUDA_ARCH_LIST")
    export TORCH_CUDA_ARCH_LIST
  fi
}

# Here, on a machine with network, makes those wheels: `bash tools/gpu-python-deps.sh make [PYTHON_VERSION]` fills
# .whl/ with the DeepSpeed that tools/python/tests/frameworks.txt pins (built from its source with DS_BUILD_OPS=0,
# so no op is compiled here: the GPU machine compiles what it uses) and the dependencies the GPU machine lacks, as
# binary wheels for its interpreter (PYTHON_VERSION, default 3.12) on x86-64 Linux. DeepSpeed's setup imports torch,
# so the build runs under an interpreter that has it: $ZP_WHEEL_PYTHON, default the virtual environment that
# tools/run-tests.sh makes (build/wheel-venv).
# DeepSpeed's requirements that the GPU machines' image lacks (KINDS.md lists what it has): those without
# requirements of their own, then pydantic with its own (pydantic-core is pinned exactly by the pydantic chosen, so
# pip resolves the pair).
CARRIED_DEPS=(hjson msgpack py-cpuinfo ninja einops)
CARRIED_WITH_DEPS=(pydantic)
make_carried_wheels() {
  local top=$1 pyver=${2:-3.12} py=${ZP_WHEEL_PYTHON:-$1/build/wheel-venv/bin/python} pin src
  pin=$(grep '^deepspeed==' "$top/tools/python/tests/frameworks.txt") || {
    echo "make_carried_wheels: no deepspeed pin in tools/python/tests/frameworks.txt" >&2
    return 1
  }
  "$py" -c 'import torch, setuptools' 2>/dev/null || {
    echo "make_carried_wheels: $py cannot import torch and setuptools: run tools/run-tests.sh once, or set" \
      "ZP_WHEEL_PYTHON to an interpreter that can" >&2
    return 1
  }
  src=$(mktemp -d) && mkdir -p "$top/.whl" || return 1
  "$py" -m pip download --quiet --no-deps --no-binary :all: -d "$src" "$pin" &&
    DS_BUILD_OPS=0 "$py" -m pip wheel --quiet --no-deps --no-build-isolation -w "$top/.whl" "$src"/deepspeed-* &&
    "$py" -m pip download --quiet --no-deps --only-binary :all: --python-version "$pyver" \
      --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
      -d "$top/.whl" "${CARRIED_DEPS[@]}" &&
    "$py" -m pip download --quiet --only-binary :all: --python-version "$pyver" \
      --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
      -d "$top/.whl" "${CARRIED_WITH_DEPS[@]}"
  local status=$?
  rm -rf "$src"
  [ $status = 0 ] && ls "$top/.whl"
  return $status
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  case ${1:-} in
    make) make_carried_wheels "$(cd "$(dirname "$0")/.." && pwd)" "${2:-}" ;;
    *) echo "usage: bash tools/gpu-python-deps.sh make [PYTHON_VERSION]  (or source it and call use_carried_wheels)" >&2
       exit 2 ;;
  esac
fi
