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
