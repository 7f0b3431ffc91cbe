#!/usr/bin/env bash
# Finds an NCCL with its device API (nccl_device.h, NCCL 2.28+), which zpccl's direct loads need
# (src/peer_window.h): the CUDA toolkit's, the system's, or the nvidia-nccl wheel's (PyTorch's). Prints what it
# saw on stderr and, on stdout, a folder to pass as -Dnccl_home (nothing when none has the device API). A wheel
# ships lib/libnccl.so.2 only, so its folder is presented through links in $TMPDIR/zp-nccl-root, with
# lib/libnccl.so for the linker; run the binaries with that lib folder first in LD_LIBRARY_PATH.
set -uo pipefail
version() { grep -hE '^#define NCCL_(MAJOR|MINOR|PATCH) ' "$1/include/nccl.h" 2>/dev/null | awk '{printf "%s.", $3}'; }
wheel=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null ||
  python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "nccl"))' 2>/dev/null)
for root in /usr/local/cuda /usr ${wheel:-}; do
  [ -f "$root/include/nccl.h" ] || continue
  dev=no
  [ -f "$root/include/nccl_device.h" ] && dev=yes
  echo "nccl under $root: version $(version "$root") device API: $dev" >&2
  [ "$dev" = yes ] || continue
  if compgen -G "$root/lib*/libnccl.so" >/dev/null || [ -e "$root/lib/x86_64-linux-gnu/libnccl.so" ]; then
    echo "$root"
  else
    link=${TMPDIR:-/tmp}/zp-nccl-root
    rm -rf "$link" && mkdir -p "$link/lib"
    ln -s "$root/include" "$link/include"
    ln -s "$(ls "$root"/lib/libnccl.so.* | head -1)" "$link/lib/libnccl.so"
    echo "$link"
  fi
  exit 0
done
