"""tools/gpu-build-tools.sh's ninja_targets, which tools/gpu-check.sh (and through it tools/perf-gate.sh) and
tools/bisect-fsdp-step.sh build by: a shared library's unversioned name becomes the versioned file ninja has a rule
for. Against a real ninja on a build file shaped as Meson leaves one before its first build (the unversioned names
are links to a file not built yet), and against a stand-in ninja where none is installed."""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import tempfile
import unittest

from . import SOURCE_TREE

TOOLS = SOURCE_TREE / "tools" / "gpu-build-tools.sh"

# A library libfoo.so.1.2.3 and a program, each made by touching its file; libfoo.so and libfoo.so.1 are links
# beside them, as Meson makes them at setup.
BUILD_NINJA = """\
rule touch
  command = touch $out
build libfoo.so.1.2.3: touch
build bin/app: touch
build all: phony libfoo.so.1.2.3 bin/app
default all
"""


def find_ninja() -> str | None:
    found = shutil.which("ninja")
    venv = SOURCE_TREE / ".venv" / "bin" / "ninja"
    return found or (str(venv) if venv.exists() else None)


class NinjaTargets(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.TemporaryDirectory()
        self.root = pathlib.Path(self.tmp.name)
        self.build = self.root / "build"
        self.build.mkdir()
        (self.build / "bin").mkdir()
        (self.build / "build.ninja").write_text(BUILD_NINJA)
        os.symlink("libfoo.so.1", self.build / "libfoo.so")
        os.symlink("libfoo.so.1.2.3", self.build / "libfoo.so.1")

    def tearDown(self) -> None:
        self.tmp.cleanup()

    def targets(self, *names: str, path: str | None = None) -> list[str]:
        env = {**os.environ, "PATH": path} if path else None
        run = subprocess.run(["bash", "-c", 'source "$0"; ninja_targets "$@"', str(TOOLS), str(self.build), *names],
                             capture_output=True, text=True, timeout=60, env=env)
        self.assertEqual(run.returncode, 0, run.stderr)
        return run.stdout.splitlines()

    def check_names(self, path: str | None = None) -> None:
        got = self.targets("bin/app", "libfoo.so", "libfoo.so.1", "libfoo.so.1.2.3", "libbar.so", path=path)
        # The links become the versioned file; a name ninja has a rule for, or no library it knows, stays.
        self.assertEqual(got, ["bin/app", "libfoo.so.1.2.3", "libfoo.so.1.2.3", "libfoo.so.1.2.3", "libbar.so"])
        self.assertEqual(self.targets(path=path), [])

    def test_a_real_ninja_builds_the_library_by_the_name_it_prints(self) -> None:
        ninja = find_ninja()
        if ninja is None:
            raise unittest.SkipTest("no ninja on PATH or in the tree's .venv")
        path = os.path.dirname(ninja) + os.pathsep + os.environ.get("PATH", "")
        # The unversioned name alone builds nothing: its link points to a file with no rule under that name.
        direct = subprocess.run([ninja, "-C", str(self.build), "libfoo.so"], capture_output=True, text=True,
                                timeout=60)
        self.assertNotEqual(direct.returncode, 0)
        # ("unknown target" here; "missing and no known rule to make it" where another edge names the link)
        self.assertRegex(direct.stdout + direct.stderr, "unknown target|no known rule")
        self.assertFalse((self.build / "libfoo.so.1.2.3").exists())

        self.check_names(path)
        built = subprocess.run([ninja, "-C", str(self.build), *self.targets("libfoo.so", path=path)],
                               capture_output=True, text=True, timeout=60)
        self.assertEqual(built.returncode, 0, built.stdout + built.stderr)
        self.assertTrue((self.build / "libfoo.so").exists())  # the link now resolves
        self.assertFalse((self.build / "bin" / "app").exists())  # only what was named

    def test_a_stand_in_ninja_that_lists_the_targets(self) -> None:
        bin_dir = self.root / "bin"
        bin_dir.mkdir()
        # `ninja -C DIR -t targets all` as ninja prints it: the directory line, then "target: rule" lines.
        (bin_dir / "ninja").write_text(
            "#!/bin/sh\necho \"ninja: Entering directory \\`$2'\"\n"
            "printf 'libfoo.so.1.2.3: touch\\nlibfoo.so.1.2.3.p/x.symbols: SHSYM\\nbin/app: touch\\nall: phony\\n'\n")
        (bin_dir / "ninja").chmod(0o755)
        self.check_names(str(bin_dir) + os.pathsep + os.environ.get("PATH", ""))


if __name__ == "__main__":
    unittest.main()
