"""How a result file was made, so that a reader can reproduce it and check it (DESIGN.md, "Evidence").

Every JSON file the project's measurements write carries ``provenance(regime)`` under the key ``"provenance"``::

    from provenance import provenance
    doc = {"provenance": provenance("net-on1gpu"), "rows": rows}

The record (schema ``zpccl-provenance/1``; the perf binaries' ``-J`` writes the same keys from C++):

=================  ===============================================================================================
schema             ``"zpccl-provenance/1"``
commit             the source tree's ``git rev-parse HEAD`` (``null`` outside a git checkout); when
                   ``ZP_SOURCE_STATE`` is set, the state it names (``<commit>`` or ``<commit>-dirty``) instead: a
                   copy sent to a GPU machine knows no commit, or carries a git folder that is not its own
dirty              whether tracked files differed from that commit (``null`` when unknown)
command            the full command line, shell-quoted, as it was typed (interpreter, script, arguments)
cwd                the working directory it ran in
env                the environment variables that steer NCCL, zpccl, CUDA and torch (prefixes below), sorted
regime             the link regime label the caller gives (``net-on1gpu``, ``nvlink``, ``cpu-threads``, ...)
host               the machine's host name
time_utc           when the record was made, ISO 8601
python             the interpreter's version
torch              ``{"version", "cuda"}`` of the torch imported by the process (``null`` when none is)
gpu                ``{"count", "models", "driver"}``: the CUDA devices the driver shows, and the kernel driver's
                   release (``/proc/driver/nvidia/version``); count 0 on a machine without one
cuda_runtime       the CUDA runtime torch was built with (``null`` without torch or CUDA)
nccl               ``{"loaded", "file", "torch"}``: the version of the NCCL that libzpccl.so resolved in this
                   process and its file, and the one torch reports (each ``null`` when unknown)
zpccl              ``{"version", "library"}`` of the zpccl package the process imported (``null`` when none)
=================  ===============================================================================================

Raw per-round (and per-rank) times belong to the rows themselves, next to the medians computed from them.
"""
from __future__ import annotations

import datetime
import os
import pathlib
import platform
import shlex
import socket
import subprocess
import sys
from typing import Any

SCHEMA = "zpccl-provenance/1"
#: Environment variables with these prefixes steer what a measurement does, so a record keeps them.
STEERING_PREFIXES = ("NCCL_", "ZP_", "ZPCCL_", "CUDA_", "TORCH_", "PYTORCH_", "OMP_", "NVIDIA_")
TOP = pathlib.Path(__file__).resolve().parent.parent


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(TOP), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def parse_source_state(text: str) -> tuple[str | None, bool | None]:
    """(commit, dirty) of ``<commit>`` or ``<commit>-dirty`` (a full lower-case hash); (None, None) otherwise."""
    commit, dirty = text.removesuffix("-dirty"), text.endswith("-dirty")
    valid = len(commit) == 40 and all(c in "0123456789abcdef" for c in commit)
    return (commit, dirty) if valid else (None, None)


def source_state() -> tuple[str | None, bool | None]:
    """(commit, dirty) of the source tree this file belongs to: what ZP_SOURCE_STATE names when it is set (a
    malformed name is unknown, never a guess), else git's answer, else (None, None)."""
    named = os.environ.get("ZP_SOURCE_STATE")
    if named is not None:
        return parse_source_state(named)
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return None, None
    status = _git("status", "--porcelain", "--untracked-files=no")
    return commit, None if status is None else bool(status)


def recorded_source(record: dict[str, Any]) -> tuple[str | None, bool | None]:
    """(commit, dirty) a provenance record stands for. A ZP_SOURCE_STATE in its environment names the tree that was
    measured, also in files whose writer took the commit from a git folder the copy carried but did not match."""
    named = (record.get("env") or {}).get("ZP_SOURCE_STATE")
    if isinstance(named, str):
        return parse_source_state(named)
    return record.get("commit"), record.get("dirty")


def steering_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    env = os.environ if environ is None else environ
    return {k: env[k] for k in sorted(env) if k.startswith(STEERING_PREFIXES)}


def command_line(argv: list[str] | None = None) -> str:
    words = [pathlib.Path(sys.executable).name] + list(sys.argv if argv is None else argv)
    return shlex.join(words)


def _driver_release() -> str | None:
    try:
        text = pathlib.Path("/proc/driver/nvidia/version").read_text(errors="replace")
    except OSError:
        return None
    for word in text.split():
        if word.count(".") >= 1 and word.replace(".", "").isdigit():
            return word
    return None


def _torch_facts() -> tuple[dict[str, Any] | None, str | None, str | None]:
    """({"version", "cuda"}, CUDA runtime, NCCL version "major.minor.patch") of the torch this process imported, if
    any."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None, None, None
    cuda = getattr(torch.version, "cuda", None)
    nccl = None
    try:
        if torch.cuda.is_available():
            # (major, minor, patch[, suffix]): the parts themselves, no version code to decode
            nccl = ".".join(str(part) for part in torch.cuda.nccl.version()[:3])
    except Exception:  # noqa: BLE001 - a torch without NCCL answers nothing
        nccl = None
    return {"version": torch.__version__, "cuda": cuda}, cuda, nccl


def _zpccl_facts() -> tuple[dict[str, Any] | None, dict[str, Any], list[str]]:
    """zpccl's version and library, the NCCL libzpccl.so resolved, and the CUDA devices the driver shows."""
    zpccl = sys.modules.get("zpccl")
    nccl: dict[str, Any] = {"loaded": None, "file": None}
    if zpccl is None:
        return None, nccl, []
    try:
        from zpccl import _lib
        from zpccl.__main__ import _version_text, cuda_devices, nccl_of_library
        from zpccl.comm import version
    except ImportError:
        return None, nccl, []
    facts = None
    try:
        facts = {"version": _version_text(version()), "library": os.path.realpath(_lib.library_path())}
        path, code, _ = nccl_of_library(_lib.lib())
        nccl = {"loaded": _version_text(code) if code is not None else None, "file": path}
    except Exception:  # noqa: BLE001 - a library that does not load leaves these unknown
        pass
    names, _ = cuda_devices()
    return facts, nccl, names


def provenance(regime: str, argv: list[str] | None = None) -> dict[str, Any]:
    """The provenance record of a result made by this process (see the module's docstring for its keys)."""
    commit, dirty = source_state()
    torch, cuda_runtime, torch_nccl = _torch_facts()
    zpccl, nccl, gpus = _zpccl_facts()
    if not gpus and torch is not None:
        mod = sys.modules["torch"]
        if mod.cuda.is_available():
            gpus = [mod.cuda.get_device_name(i) for i in range(mod.cuda.device_count())]
    nccl["torch"] = torch_nccl
    return {
        "schema": SCHEMA,
        "commit": commit,
        "dirty": dirty,
        "command": command_line(argv),
        "cwd": os.getcwd(),
        "env": steering_env(),
        "regime": regime,
        "host": socket.gethostname(),
        "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch,
        "gpu": {"count": len(gpus), "models": sorted(set(gpus)), "driver": _driver_release()},
        "cuda_runtime": cuda_runtime,
        "nccl": nccl,
        "zpccl": zpccl,
    }


if __name__ == "__main__":
    import json

    print(json.dumps(provenance(sys.argv[1] if len(sys.argv) > 1 else "unknown"), indent=1))
