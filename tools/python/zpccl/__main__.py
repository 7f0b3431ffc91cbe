"""``python -m zpccl``: what this installation of zpccl loads, for a bug report or a first check.

Prints the library's path and version, the NCCL it resolved (its file, found in ``/proc/self/maps`` from the
address of ``ncclGetVersion`` looked up through libzpccl's handle, and that function's answer), any other NCCL
copies mapped into the process, for a wheel the NCCL headers it was built with (the direct loads need the same
major.minor at run time), the backend a communicator gets by default, and the CUDA devices the driver shows. Exits 0 when the library loads (with or without a GPU), 1 when it does not.
"""
from __future__ import annotations

import ctypes
import os
import sys
import types
from typing import Any, Callable

from . import _lib
from .comm import loaded_nccl_libraries, version


def _version_text(code: int) -> str:
    """``major.minor.patch`` of a NCCL or zpccl version code (major * 10000 + minor * 100 + patch)."""
    return f"{code // 10000}.{code // 100 % 100}.{code % 100}"


def _mapped_file(address: int) -> str | None:
    """The file mapped at ``address`` in this process (``/proc/self/maps``), or None."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) < 6:
                    continue
                start, end = (int(x, 16) for x in fields[0].split("-"))
                if start <= address < end:
                    return os.path.realpath(fields[5].strip())
    except OSError:
        pass
    return None


def nccl_of_library(library: ctypes.CDLL) -> tuple[str | None, int | None, str]:
    """(file, version code, note) of the NCCL that ``library`` resolved.

    ``ncclGetVersion`` looked up through the library's handle is the one of its own dependency tree (libzpccl.so
    exports only zp* symbols), so its address names the NCCL file that libzpccl.so uses.
    """
    try:
        fn = library.ncclGetVersion
    except AttributeError:
        return None, None, "ncclGetVersion not found through libzpccl.so"
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(ctypes.c_int)]
    code = ctypes.c_int(0)
    result = fn(ctypes.byref(code))
    path = _mapped_file(ctypes.cast(fn, ctypes.c_void_p).value or 0)
    if result != 0:
        return path, None, f"ncclGetVersion returned {result}"
    return path, code.value, ""


def build_info() -> types.ModuleType | None:
    """The wheel's ``_build_info`` module (meson.build writes it), or None in a source tree."""
    try:
        from . import _build_info
    except ImportError:
        return None
    return _build_info


def direct_loads_state(built: Any, nccl_code: int | None) -> str:
    """Whether the direct loads can run, as src/cuda/peer_window.cc decides from the NCCL versions."""
    if not built.DIRECT_LOADS:
        return "not built (NCCL without its device API)"
    if nccl_code is not None and nccl_code // 100 != built.NCCL_VERSION_CODE // 100:
        return (f"off: NCCL {_version_text(nccl_code)} is another major.minor than the headers; "
                "pip install --no-build-isolation . builds against the installed one")
    return "built"


def cuda_devices() -> tuple[list[str], str]:
    """(names of the CUDA devices the driver shows, why there are none) through libcuda.so.1 itself, so that
    a machine without a driver or a GPU answers instead of failing."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return [], "no CUDA driver (libcuda.so.1 not found)"
    result = cuda.cuInit(0)
    if result != 0:
        return [], f"cuInit failed with CUresult {result}"
    count = ctypes.c_int(0)
    result = cuda.cuDeviceGetCount(ctypes.byref(count))
    if result != 0:
        return [], f"cuDeviceGetCount failed with CUresult {result}"
    names = []
    for ordinal in range(count.value):
        device = ctypes.c_int(0)
        name = ctypes.create_string_buffer(256)
        if cuda.cuDeviceGet(ctypes.byref(device), ordinal) == 0 and cuda.cuDeviceGetName(name, 256, device) == 0:
            names.append(name.value.decode(errors="replace"))
        else:
            names.append("(name unavailable)")
    return names, "" if names else "the driver shows no device"


def default_backend(device_count: int) -> tuple[str, str]:
    """(backend, why) as the library chooses it for a communicator without a backend in its config."""
    env = os.environ.get("ZP_BACKEND", "")
    if env:
        return env, "ZP_BACKEND is set"
    if device_count > 0:
        return "cuda", "a CUDA device is visible; ZP_BACKEND=host overrides"
    return "host", "no CUDA device; ranks are threads, buffers host memory"


def main(out: Callable[[str], None] = print) -> int:
    try:
        library = _lib.lib()
    except _lib.LibraryNotFoundError as e:
        out(str(e))
        return 1
    out(f"zpccl {_version_text(version())}: {os.path.realpath(_lib.library_path())}")
    nccl_path, nccl_code, note = nccl_of_library(library)
    nccl_version = _version_text(nccl_code) if nccl_code is not None else "unknown"
    out(f"NCCL {nccl_version}: {nccl_path or 'file not found in /proc/self/maps'}" + (f" ({note})" if note else ""))
    built = build_info()
    if built is not None:
        out(f"built with NCCL {_version_text(built.NCCL_VERSION_CODE)}'s headers; "
            f"direct loads (one NVLink node) {direct_loads_state(built, nccl_code)}")
    others = [p for p in loaded_nccl_libraries() if p != nccl_path]
    if others:
        out("other NCCL copies in this process (an ncclComm_t must not cross them): " + ", ".join(others))
    names, why_none = cuda_devices()
    backend, why = default_backend(len(names))
    out(f"default backend: {backend} ({why})")
    if names:
        out(f"CUDA devices: {len(names)}: " + "; ".join(f"{i} {n}" for i, n in enumerate(names)))
    else:
        out(f"CUDA devices: none: {why_none}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
