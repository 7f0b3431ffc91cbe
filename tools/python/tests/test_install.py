"""The installed package (pip install .): the library and header inside it, every module of the source tree, the
RUNPATH that finds the nvidia-nccl-cu13 wheel's NCCL, one NCCL in a process with torch; and ``python -m zpccl``.
The installed-package tests skip when the package is used from its source tree."""
from __future__ import annotations

import ast
import os
import pathlib
import shutil
import subprocess
import sys
import types
import unittest

import zpccl
from zpccl import __main__ as main_module

from . import SOURCE_TREE

PACKAGE = pathlib.Path(zpccl.__file__).resolve().parent
SOURCE_PACKAGE = SOURCE_TREE / "tools" / "python" / "zpccl"


def run_python(*args: str, **env: str) -> subprocess.CompletedProcess:
    """``python args...`` in a child that imports zpccl from where this process did."""
    full_env = dict(os.environ, **env)
    full_env["PYTHONPATH"] = str(PACKAGE.parent)
    return subprocess.run([sys.executable, *args], env=full_env, capture_output=True, text=True, timeout=120)


def torch_importable() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


class MainModule(unittest.TestCase):
    def test_prints_library_nccl_backend_and_devices_and_exits_0(self) -> None:
        out = run_python("-m", "zpccl")
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        lines = out.stdout.splitlines()
        optional = ("other NCCL", "built with")  # several NCCLs; a wheel's build
        self.assertEqual([line.split(" ", 1)[0] for line in lines if not line.startswith(optional)],
                         ["zpccl", "NCCL", "default", "CUDA"], out.stdout)
        self.assertIn(os.path.realpath(zpccl.library_path()), lines[0])
        nccl_line = lines[1]
        self.assertNotIn("unknown", nccl_line)
        self.assertIn("libnccl", nccl_line)
        self.assertTrue(os.path.exists(nccl_line.split(": ", 1)[1]), nccl_line)

    def test_backend_follows_zp_backend(self) -> None:
        out = run_python("-m", "zpccl", ZP_BACKEND="host")
        self.assertIn("default backend: host (ZP_BACKEND is set)", out.stdout, out.stderr)

    def test_nccl_is_the_one_libzpccl_resolved(self) -> None:
        path, code, note = main_module.nccl_of_library(zpccl._lib.lib())
        self.assertEqual(note, "")
        self.assertIn(path, zpccl.loaded_nccl_libraries())
        self.assertGreaterEqual(code, 22800, "NCCL 2.28+ (major * 10000 + minor * 100 + patch)")

    def test_direct_loads_state_compares_major_minor_as_the_library_does(self) -> None:
        built = types.SimpleNamespace(DIRECT_LOADS=True, NCCL_VERSION_CODE=23203)
        self.assertEqual(main_module.direct_loads_state(built, 23201), "built")
        self.assertTrue(main_module.direct_loads_state(built, 23007).startswith("off: NCCL 2.30.7"))
        self.assertTrue(main_module.direct_loads_state(built, 33203).startswith("off: NCCL 3.32.3"))
        built.DIRECT_LOADS = False
        self.assertTrue(main_module.direct_loads_state(built, 23203).startswith("not built"))

    def test_missing_library_exits_1_with_the_places_tried(self) -> None:
        out = run_python("-m", "zpccl", ZPCCL_LIBRARY="/nonexistent/libzpccl.so")
        self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
        self.assertIn("/nonexistent/libzpccl.so (no such file)", out.stdout)


@unittest.skipIf(PACKAGE == SOURCE_PACKAGE.resolve(), "zpccl is used from its source tree, not installed")
class InstalledPackage(unittest.TestCase):
    def test_library_is_loaded_from_inside_the_package(self) -> None:
        self.assertNotIn("ZPCCL_LIBRARY", os.environ)
        self.assertEqual(pathlib.Path(zpccl.library_path()).resolve(), PACKAGE / "libzpccl.so")

    def test_header_is_the_source_trees(self) -> None:
        installed = PACKAGE / "include" / "zpccl.h"
        self.assertTrue(installed.exists(), installed)
        self.assertEqual(installed.read_bytes(), (SOURCE_TREE / "include" / "zpccl.h").read_bytes())

    def test_every_file_of_the_source_package_is_installed_as_it_is(self) -> None:
        sources = sorted(p.relative_to(SOURCE_PACKAGE) for p in SOURCE_PACKAGE.rglob("*")
                         if p.is_file() and "__pycache__" not in p.parts)
        self.assertIn(pathlib.Path("__init__.py"), sources)
        for rel in sources:
            with self.subTest(file=str(rel)):
                self.assertEqual((PACKAGE / rel).read_bytes(), (SOURCE_PACKAGE / rel).read_bytes())

    def test_runpath_finds_the_nccl_wheel_beside_the_package(self) -> None:
        readelf = shutil.which("readelf")
        if readelf is None:
            self.skipTest("readelf not installed")
        dynamic = subprocess.run([readelf, "-d", str(PACKAGE / "libzpccl.so")], capture_output=True, text=True,
                                 check=True).stdout
        self.assertIn("[$ORIGIN/../nvidia/nccl/lib]", dynamic)
        self.assertIn("[libnccl.so.2]", dynamic)
        self.assertNotIn("libcudart", dynamic, "the CUDA runtime is linked statically")

    def test_build_info_names_the_nccl_headers_built_with(self) -> None:
        built = main_module.build_info()
        self.assertIsNotNone(built, "meson.build writes zpccl/_build_info.py into the wheel")
        self.assertGreaterEqual(built.NCCL_VERSION_CODE, 22800)
        out = run_python("-m", "zpccl")
        self.assertIn(f"built with NCCL {main_module._version_text(built.NCCL_VERSION_CODE)}'s headers", out.stdout)

    def test_nccl_comes_from_the_nvidia_nccl_wheel(self) -> None:
        # Beside the package (its RUNPATH), else the first on sys.path, as torch finds it.
        beside = PACKAGE.parent / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
        expected = beside if beside.exists() else zpccl._lib.nccl_wheel_library()
        self.assertIsNotNone(expected, "nvidia-nccl-cu13, a dependency of the package, is not installed")
        path, _, _ = main_module.nccl_of_library(zpccl._lib.lib())
        self.assertEqual(pathlib.Path(path), pathlib.Path(expected).resolve())


class OneNcclWithTorch(unittest.TestCase):
    """Installed or from a build folder (linked to the system's NCCL), zpccl and torch share torch's NCCL."""

    def test_one_nccl_with_torch_whichever_is_imported_first(self) -> None:
        if not torch_importable():
            self.skipTest("torch is not installed")
        report = "; print(zpccl.loaded_nccl_libraries())"
        alone = run_python("-c", "import torch, zpccl" + report)
        self.assertEqual(alone.returncode, 0, alone.stderr)
        torch_nccl = ast.literal_eval(alone.stdout.strip().splitlines()[-1])
        if not torch_nccl:
            self.skipTest("this torch maps no NCCL (a CPU-only build)")
        for order in ("import torch, zpccl; zpccl.version()", "import zpccl; zpccl.version(); import torch"):
            with self.subTest(order=order):
                out = run_python("-c", order + report)
                self.assertEqual(out.returncode, 0, out.stderr)
                self.assertEqual(ast.literal_eval(out.stdout.strip().splitlines()[-1]), torch_nccl)


if __name__ == "__main__":
    unittest.main()
