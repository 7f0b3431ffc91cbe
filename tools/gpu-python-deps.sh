# shellcheck shell=bash
# Sourced on a GPU machine without network before Python runs that need packages the machine lacks (DeepSpeed and
# its dependencies, carried as wheels in .whl/ at the top of the tree; perf/deepspeed_step.py says how to make them):
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
