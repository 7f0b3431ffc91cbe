"""The link regimes' two homes agree: tools/regimes.sh (the shell scripts') and zpccl.launch (Python's) give the same
variables for every regime and process, refuse the same mistakes and spell the same labels; the shell's GPU count
follows CUDA_VISIBLE_DEVICES as CUDA reads it (nvidia-smi stood in for); and no script, Python file or C++ GPU test
sets a regime's variable, counts GPUs or spells the label itself. No GPU needed."""
from __future__ import annotations

import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import unittest

import zpccl.launch as launch
from tests import SOURCE_TREE

REGIMES_SH = SOURCE_TREE / "tools" / "regimes.sh"


def sourced(script: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``script`` run by bash after sourcing tools/regimes.sh, with ``args`` as $1, $2, ..."""
    if not REGIMES_SH.exists():
        raise unittest.SkipTest(f"{REGIMES_SH} not found")
    bash = shutil.which("bash")
    if bash is None:
        raise unittest.SkipTest("no bash")
    return subprocess.run([bash, "-c", f'set -euo pipefail; source "$0"; {script}', str(REGIMES_SH), *args],
                          capture_output=True, text=True, timeout=60, env=env)


def shell_env(regime: str, *process: str) -> dict[str, str]:
    run = sourced('zp_regime_env "$@"', regime, *process)
    if run.returncode != 0:
        raise AssertionError(f"zp_regime_env {regime} {' '.join(process)}: exit {run.returncode}: {run.stderr}")
    return dict(line.split("=", 1) for line in run.stdout.splitlines())


class TheTwoHomesAgree(unittest.TestCase):
    def test_the_same_regimes(self) -> None:
        self.assertEqual(sourced('echo "$ZP_REGIMES"').stdout.split(), list(launch.REGIMES))

    def test_the_same_variables_for_every_regime_and_process(self) -> None:
        for regime in launch.REGIMES:
            for process in (0, 1, 3):
                with self.subTest(regime=regime, process=process):
                    self.assertEqual(shell_env(regime, str(process)), launch.regime_env(regime, process))

    def test_what_each_regime_sets(self) -> None:
        net = launch.regime_env("net", 1)
        self.assertEqual(net, {"NCCL_NVLS_ENABLE": "0", "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1",
                               "NCCL_HOSTID": "zp-node-1"})
        self.assertNotEqual(launch.regime_env("net", 0)["NCCL_HOSTID"], net["NCCL_HOSTID"])
        self.assertEqual(launch.regime_env("2x2", 2), {"NCCL_NVLS_ENABLE": "0", "NCCL_HOSTID": "zp-node-2"})
        self.assertEqual(launch.regime_env("shm"), {"NCCL_NVLS_ENABLE": "0", "NCCL_P2P_DISABLE": "1"})
        self.assertEqual(launch.regime_env("nvlink"), {"NCCL_NVLS_ENABLE": "0"})
        # One host for every process: the same id whatever the index.
        self.assertEqual(launch.regime_env("nvlink-procs", 0), launch.regime_env("nvlink-procs", 5))
        self.assertEqual(shell_env("nvlink-procs"), launch.regime_env("nvlink-procs"))

    def test_both_refuse_an_unknown_regime_and_a_missing_index(self) -> None:
        for regime, process in (("nowhere", "0"), ("net", None), ("2x2", None), ("net", "x")):
            with self.subTest(regime=regime, process=process):
                run = sourced('zp_regime_env "$@"', regime, *([process] if process is not None else []))
                self.assertEqual(run.returncode, 2, run.stdout)
                self.assertRegex(run.stderr, "unknown regime|needs the index")
                with self.assertRaisesRegex(ValueError, "unknown regime|needs the index"):
                    launch.regime_env(regime, None if process is None or not process.isdigit() else int(process))

    def test_the_same_label(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=tmp)  # no control pipe there: time slices
            for gpus in range(1, 9):
                self.assertEqual(sourced('zp_net_label "$1"', str(gpus), env=env).stdout.strip(),
                                 launch.net_label(gpus, env))
            self.assertEqual(launch.net_label(1, env), "net-on1gpu")

    def test_under_mps_the_label_says_so(self) -> None:
        """A pipe folder holding MPS's control endpoint (a UNIX socket, or a named pipe as older drivers make it)
        makes the label net-on1gpu-mps, in both; a plain file of that name, or a folder without it, does not."""
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=tmp)
            control = pathlib.Path(tmp, "control")
            listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.addCleanup(listening.close)
            for kind, label in (("none", "net-on1gpu"), ("file", "net-on1gpu"), ("socket", "net-on1gpu-mps"),
                                ("pipe", "net-on1gpu-mps")):
                with self.subTest(control=kind):
                    if control.exists():
                        control.unlink()
                    if kind == "file":
                        control.write_text("")
                    elif kind == "socket":
                        listening.bind(str(control))
                    elif kind == "pipe":
                        os.mkfifo(control)
                    self.assertEqual(launch.net_label(1, env), label)
                    self.assertEqual(sourced('zp_net_label 1', env=env).stdout.strip(), label)
                    self.assertEqual(sourced('echo "2x2-on1gpu$(zp_sharing_suffix)"', env=env).stdout.strip(),
                                     label.replace("net", "2x2"))

    def test_exported_regime_and_default_env(self) -> None:
        run = sourced('zp_export_regime net 2; env | grep "^NCCL_" | sort')
        self.assertEqual(dict(line.split("=", 1) for line in run.stdout.splitlines()), launch.regime_env("net", 2))
        env: dict[str, str] = {"NCCL_NVLS_ENABLE": "1"}
        launch.set_default_env(env)
        self.assertEqual(env, {"NCCL_NVLS_ENABLE": "1"})  # the user's own setting stays
        env.clear()
        launch.set_default_env(env)
        self.assertEqual(env, launch.regime_env("nvlink"))


class OneHomeALanguage(unittest.TestCase):
    """No script, example, test or perf script sets a regime's variable or counts GPUs itself: each takes them from
    its language's home (tools/regimes.sh, zpccl.launch; the C++ GPU tests from tests/child_test.h)."""

    VARIABLE = r"NCCL_(?:HOSTID|P2P_DISABLE|SHM_DISABLE|NVLS_ENABLE)"
    SHELL_SETS = re.compile(rf"\b{VARIABLE}=|nvidia-smi -L|net-on(?:\d|\$)")
    PYTHON_SETS = re.compile(rf"\b{VARIABLE}=|environ(?:\.setdefault\(|\[)\s*[\"']{VARIABLE}|net-on\{{")
    PYTHON_HOMES = ("tools/python/zpccl/launch.py", "tools/python/tests/test_regimes.py")

    def offenders(self, paths: list[pathlib.Path], pattern: re.Pattern[str], comment: str | None) -> list[str]:
        found = []
        for path in paths:
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if comment is not None and line.lstrip().startswith(comment):
                    continue
                if pattern.search(line):
                    found.append(f"{path.relative_to(SOURCE_TREE)}:{number}: {line.strip()}")
        return found

    def test_the_shell_scripts(self) -> None:
        scripts = [p for p in sorted((SOURCE_TREE / "tools").glob("*.sh")) if p != REGIMES_SH]
        if not scripts:
            self.skipTest("no tools/*.sh in this tree")
        self.assertEqual(self.offenders(scripts, self.SHELL_SETS, "#"), [])

    def test_the_python_scripts(self) -> None:
        paths = [p for folder in ("tools/python", "perf") for p in sorted((SOURCE_TREE / folder).rglob("*.py"))
                 if str(p.relative_to(SOURCE_TREE)) not in self.PYTHON_HOMES]
        if not paths:
            self.skipTest("no Python scripts in this tree")
        self.assertEqual(self.offenders(paths, self.PYTHON_SETS, None), [])

    def test_the_cxx_gpu_tests(self) -> None:
        paths = sorted((SOURCE_TREE / "tests").glob("test_*_gpu.cc"))
        if not paths:
            self.skipTest("no C++ GPU tests in this tree")
        self.assertEqual(self.offenders(paths, re.compile(rf'"{self.VARIABLE}='), "//"), [])


class VisibleGpuCount(unittest.TestCase):
    """zp_visible_gpus with a stand-in nvidia-smi listing two GPUs (one of them split into MIG instances)."""

    def count(self, visible: str | None, smi: str = "two") -> int:
        """What zp_visible_gpus prints with the stand-in nvidia-smi ``smi``: "two" lists the GPUs above, "failing"
        exits 9 as nvidia-smi does without a driver, "none" is no nvidia-smi at all. PATH holds only the stand-in
        and grep, so that a machine's own nvidia-smi cannot answer instead."""
        with tempfile.TemporaryDirectory() as tmp:
            bin_dir = pathlib.Path(tmp)
            grep = shutil.which("grep")
            if grep is None:
                self.skipTest("no grep")
            (bin_dir / "grep").symlink_to(grep)
            fake = bin_dir / "nvidia-smi"
            if smi == "two":
                fake.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: GPU-a)'\necho '  MIG 1g.10gb Device 0: "
                                "(UUID: MIG-b)'\necho 'GPU 1: NVIDIA H100 (UUID: GPU-c)'\n")
            elif smi == "failing":
                fake.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed: no driver' >&2\nexit 9\n")
            if fake.exists():
                fake.chmod(0o755)
            env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
            env["PATH"] = str(bin_dir)
            if visible is not None:
                env["CUDA_VISIBLE_DEVICES"] = visible
            run = sourced("zp_visible_gpus", env=env)
            self.assertEqual(run.returncode, 0, run.stderr)
            return int(run.stdout)

    def test_cuda_visible_devices_narrows_the_list(self) -> None:
        for visible, gpus in ((None, 2), ("0", 1), ("1,0", 2), ("", 0), (" 1 ", 1), ("0,1,2,3", 2), ("2", 0),
                              ("-1", 0), ("0,-1,1", 1), ("GPU-c", 1), ("MIG-b,1", 2), ("01", 1)):
            with self.subTest(CUDA_VISIBLE_DEVICES=visible):
                self.assertEqual(self.count(visible), gpus)

    def test_no_nvidia_smi_no_gpu(self) -> None:
        for smi in ("none", "failing"):
            with self.subTest(nvidia_smi=smi):
                self.assertEqual(self.count(None, smi=smi), 0)
                self.assertEqual(self.count("0", smi=smi), 0)


class WithMps(unittest.TestCase):
    """tools/with-mps.sh with a stand-in nvidia-cuda-mps-control: ``-d`` binds the control socket in the pipe folder
    (unless told not to) and logs "started"; a command on its standard input is logged and removes the socket."""

    SCRIPT = SOURCE_TREE / "tools" / "with-mps.sh"

    def setUp(self) -> None:
        if not self.SCRIPT.exists():
            self.skipTest(f"{self.SCRIPT} not found")
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.tmp = pathlib.Path(tmp.name)
        self.bin_dir = self.tmp / "bin"
        self.bin_dir.mkdir()
        self.calls = self.tmp / "calls.log"
        daemon = self.bin_dir / "nvidia-cuda-mps-control"
        daemon.write_text(f"""#!/bin/sh
if [ "$1" = -d ]; then
  [ -n "${{NO_ENDPOINT:-}}" ] || "{sys.executable}" -c 'import os, socket
socket.socket(socket.AF_UNIX).bind(os.path.join(os.environ["CUDA_MPS_PIPE_DIRECTORY"], "control"))'
  echo "started $CUDA_MPS_PIPE_DIRECTORY" >>"{self.calls}"
  exit 0
fi
read -r command
echo "$command" >>"{self.calls}"
rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"
""")
        daemon.chmod(0o755)

    def run_script(self, *command: str, **extra: str) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
        env.update(PATH=f"{self.bin_dir}{os.pathsep}{os.environ['PATH']}", ZP_MPS_DIR=str(self.tmp / "mps"))
        env.update(extra)
        return subprocess.run([shutil.which("bash") or "/bin/bash", str(self.SCRIPT), *command], env=env,
                              capture_output=True, text=True, timeout=60)

    def calls_made(self) -> list[str]:
        return self.calls.read_text().splitlines() if self.calls.exists() else []

    def test_the_command_runs_under_mps_and_mps_stops_after_it_whatever_its_status(self) -> None:
        label = f'source "{SOURCE_TREE / "tools" / "regimes.sh"}"; zp_net_label 1; echo "$CUDA_MPS_PIPE_DIRECTORY"'
        for status in (0, 7):
            with self.subTest(status=status):
                self.calls.unlink(missing_ok=True)
                run = self.run_script("bash", "-c", f"{label}; exit {status}")
                self.assertEqual(run.returncode, status, run.stderr)
                lines = run.stdout.splitlines()
                self.assertEqual(lines[0], "net-on1gpu-mps")
                self.assertEqual(lines[1], str(self.tmp / "mps" / "pipe"))
                self.assertEqual(self.calls_made(), [f"started {self.tmp / 'mps' / 'pipe'}", "quit"])
                self.assertFalse((self.tmp / "mps" / "pipe" / "control").exists())

    def test_refusals(self) -> None:
        # PATH without the stand-in, and without a machine's own nvidia-cuda-mps-control: only what the script runs
        bare = self.tmp / "bare"
        bare.mkdir()
        for tool in ("dirname", "true"):
            (bare / tool).symlink_to(shutil.which(tool) or f"/bin/{tool}")
        no_daemon = self.run_script("true", PATH=str(bare))
        self.assertEqual(no_daemon.returncode, 2)
        self.assertIn("no nvidia-cuda-mps-control on PATH", no_daemon.stderr)
        serving = self.tmp / "serving"
        serving.mkdir()
        listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(listening.close)
        listening.bind(str(serving / "control"))
        busy = self.run_script("true", CUDA_MPS_PIPE_DIRECTORY=str(serving))
        self.assertEqual(busy.returncode, 2)
        self.assertIn("already serves", busy.stderr)
        self.assertEqual(self.calls_made(), [])
        silent = self.run_script("touch", str(self.tmp / "ran"), NO_ENDPOINT="1", ZP_MPS_WAIT_S="1")
        self.assertEqual(silent.returncode, 2)
        self.assertIn("no control endpoint", silent.stderr)
        self.assertFalse((self.tmp / "ran").exists())
        self.assertEqual(self.calls_made(), [f"started {self.tmp / 'mps' / 'pipe'}", "quit"])
        usage = self.run_script()
        self.assertEqual(usage.returncode, 2)
        self.assertIn("with-mps.sh COMMAND", usage.stdout)


if __name__ == "__main__":
    unittest.main()
