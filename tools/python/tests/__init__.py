"""Tests of the zpccl Python package; run them with tools/python/tests/run.py."""
from __future__ import annotations

import importlib.util
import os
import pathlib
import sys
import types
import unittest

#: The source tree the package under test comes from: $ZPCCL_TEST_SOURCE_TREE (run.py --installed sets it, when
#: the suite runs from a copy against the installed package), else the tree holding this folder.
SOURCE_TREE = pathlib.Path(os.environ.get("ZPCCL_TEST_SOURCE_TREE") or pathlib.Path(__file__).resolve().parents[3])


def load_script(relative: str) -> types.ModuleType:
    """A script of the source tree (``relative`` to it, e.g. ``tools/perf_gate.py``) as a module named after its
    file, loaded once and kept in ``sys.modules`` (a script's dataclasses look their module up there); the test
    skips where the tree has no such script (a copy that holds only the package)."""
    path = SOURCE_TREE / relative
    name = path.stem
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(path):
        return sys.modules[name]
    if not path.exists():
        raise unittest.SkipTest(f"{path} not found")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


#: The frameworks' pins that tools/run-tests.sh installs (``pip install -r``): pip requirement lines, ``name==version``.
FRAMEWORKS = pathlib.Path(__file__).resolve().parent / "frameworks.txt"


def pinned(name: str) -> str:
    """The version of framework ``name`` (e.g. ``"deepspeed"``) that FRAMEWORKS pins, the one CI installs."""
    pins = {}
    for number, line in enumerate(FRAMEWORKS.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        package, eq, version = (part.strip() for part in line.partition("=="))
        if not eq or not package or not version or any(c in version for c in "=<>!~,; "):
            raise ValueError(f"{FRAMEWORKS}:{number}: {line!r} must pin one exact version, as name==version")
        pins[package.lower()] = version
    if name.lower() not in pins:
        raise KeyError(f"{FRAMEWORKS} pins no {name!r} (it pins {', '.join(sorted(pins))})")
    return pins[name.lower()]


def ci_installs(name: str) -> str:
    """"CI installs NAME==VERSION": what a framework test's skip message says of a framework it lacks."""
    return f"CI installs {name}=={pinned(name)}"
