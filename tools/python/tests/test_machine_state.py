"""perf/machine_state.py: what the machine did while a round was timed. /proc/stat's CPU line read into busy and
stolen shares, the rank's own CPU time, and the GPU's figures from NVML, here through a stand-in for pynvml whose
counters the test moves (so that each figure is a difference over the round, not a reading), queries a GPU does not
support left out, and no NVML at all leaving every GPU figure None; CUDA waits made to sleep, through a stand-in
for the driver."""
from __future__ import annotations

import ctypes
import os
import pathlib
import tempfile
import types
import unittest
from typing import Any

from . import load_script


class FakeNvml:
    """pynvml's calls that machine_state makes, over counters the test sets; ``unsupported`` names calls that raise
    as NVML does for a query the GPU lacks."""

    NVML_PERF_POLICY_POWER, NVML_PERF_POLICY_THERMAL, NVML_PERF_POLICY_SYNC_BOOST = 0, 1, 2
    NVML_PERF_POLICY_BOARD_LIMIT, NVML_PERF_POLICY_RELIABILITY = 3, 5
    NVML_CLOCK_SM = 1

    def __init__(self, unsupported: tuple[str, ...] = ()) -> None:
        self.energy_mj, self.clock_mhz = 1000, 1980
        self.violation_ns = {0: 0, 1: 0, 2: 0, 3: 0, 5: 0}
        self.unsupported, self.handles = unsupported, []

    def _check(self, name: str) -> None:
        if name in self.unsupported:
            raise RuntimeError(f"NVML: {name} not supported")

    def nvmlInit(self) -> None:
        self._check("nvmlInit")

    def nvmlDeviceGetHandleByPciBusId(self, bus: bytes) -> Any:
        self.handles.append(bus)
        return "gpu"

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self.handles.append(index)
        return "gpu"

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        self._check("energy")
        return self.energy_mj

    def nvmlDeviceGetViolationStatus(self, handle: Any, policy: int) -> Any:
        self._check(f"violation{policy}")
        return types.SimpleNamespace(referenceTime=0, violationTime=self.violation_ns[policy])

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int:
        return self.clock_mhz


class HostCpu(unittest.TestCase):
    def test_proc_stat_line(self) -> None:
        ms = load_script("perf/machine_state.py")
        # user nice system idle iowait irq softirq steal guest guest_nice
        got = ms.host_cpu_times("cpu  100 5 20 800 30 1 2 42 7 0\n")
        self.assertEqual(got, {"total": 1000, "idle": 830, "steal": 42})  # guest time is inside user's already
        self.assertEqual(ms.host_cpu_times("cpu  10 0 5 85\n"), {"total": 100, "idle": 85, "steal": 0})
        self.assertIsNone(ms.host_cpu_times("intr 1 2 3\n"))
        self.assertIsNone(ms.host_cpu_times(""))

    def test_a_round_on_a_cpu(self) -> None:
        ms = load_script("perf/machine_state.py")
        state = ms.MachineState(None)
        mark = state.mark()
        sum(i * i for i in range(300_000))  # some CPU time of this process
        got = state.since(mark)
        self.assertGreater(got["wall_s"], 0)
        self.assertGreater(got["rank_cpu_s"], 0)
        self.assertGreaterEqual(got["rank_preempted"], 0)
        if got["host_busy"] is not None:  # Linux: /proc/stat
            self.assertTrue(0 <= got["host_steal"] <= got["host_busy"] <= 1, got)
        self.assertEqual((got["gpu_sm_mhz"], got["gpu_power_w"], got["gpu_held_back_ms"]), (None, None, None))
        if got["rank_cpu"] is not None:  # Linux: /proc/thread-self
            self.assertIn(got["rank_cpu"], os.sched_getaffinity(0))
            self.assertGreaterEqual(got["rank_migrations"], 0)


class WhereARankRuns(unittest.TestCase):
    """The main thread's migrations and CPU from /proc, CPU lists in taskset's syntax, pinning, and the CPUs the
    kernel says share a core, from a stand-in sysfs tree."""

    def setUp(self) -> None:
        self.ms = load_script("perf/machine_state.py")

    def test_the_threads_migrations_and_cpu(self) -> None:
        sched = "python3 (4242, #threads: 3)\n----\nse.exec_start : 1.5\nse.nr_migrations    :   17\nnr_switches : 40\n"
        # The command name may hold spaces and parentheses; the CPU is the 39th field, counted after its end.
        fields = " ".join(str(i) for i in range(3, 53))
        stat = f"4242 (a (b) c) {fields}"
        self.assertEqual(self.ms.thread_sched(sched, stat), {"migrations": 17, "cpu": 39})
        self.assertEqual(self.ms.thread_sched("nr_switches : 4\n", "1 (x) S 2"), {"migrations": None, "cpu": None})

    def test_cpu_lists(self) -> None:
        self.assertEqual(self.ms.parse_cpu_list("8,0-3, 10-11,2"), [0, 1, 2, 3, 8, 10, 11])
        for bad, why in (("", "is not a CPU number"), ("0-", "is not a CPU number"), ("a", "is not a CPU number"),
                         ("3-1", "runs backwards"), ("-1", "is not a CPU number")):
            with self.subTest(bad=bad), self.assertRaisesRegex(ValueError, why):
                self.ms.parse_cpu_list(bad)

    def test_pinning_takes_and_refuses_cpus_the_process_may_not_use(self) -> None:
        allowed = sorted(os.sched_getaffinity(0))
        try:
            self.ms.pin_to_cpus(allowed[:1])
            self.assertEqual(os.sched_getaffinity(0), {allowed[0]})
            with self.assertRaisesRegex(RuntimeError, rf"CPUs \[{allowed[-1] + 1000}\] are not among"):
                self.ms.pin_to_cpus([allowed[0], allowed[-1] + 1000])
            self.assertEqual(os.sched_getaffinity(0), {allowed[0]})  # a refusal leaves the process where it was
        finally:
            os.sched_setaffinity(0, allowed)

    def test_cores_shared_by_threads(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            root = pathlib.Path(tmp)
            info = root / "cpuinfo"
            info.write_text("processor\t: 0\nmodel name\t: Some CPU @ 2.0GHz\nprocessor\t: 1\n")
            for cpu, siblings in ((0, "0,2"), (1, "1,3"), (2, "0,2"), (3, "1,3"), (4, "4")):
                (root / f"cpu{cpu}" / "topology").mkdir(parents=True)
                (root / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(siblings + "\n")
            (root / "cpufreq").mkdir()  # not a CPU
            got = self.ms.host_cpus(str(root), str(info))
            self.assertEqual((got["model"], got["shared_cores"]), ("Some CPU @ 2.0GHz", [[0, 2], [1, 3]]))
            for cpu in range(4):
                (root / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(f"{cpu}\n")
            self.assertEqual(self.ms.host_cpus(str(root), str(info))["shared_cores"], [])  # every CPU a core
            (root / "cpu4" / "topology" / "thread_siblings_list").unlink()
            self.assertIsNone(self.ms.host_cpus(str(root), str(info))["shared_cores"])  # the kernel does not say
            self.assertIsNone(self.ms.host_cpus(str(root / "none"), str(root / "none"))["model"])


class GpuFromNvml(unittest.TestCase):
    def test_figures_are_differences_over_the_round(self) -> None:
        ms = load_script("perf/machine_state.py")
        nvml = FakeNvml()
        nvml.violation_ns[0] = 5_000_000  # held back before the round: not the round's
        state = ms.MachineState(0, "0000:19:00.0", nvml=nvml)
        self.assertEqual(nvml.handles, [b"0000:19:00.0"])  # by PCI bus id, not by CUDA's index
        mark = state.mark()
        nvml.energy_mj += 7_000  # 7 J
        nvml.violation_ns[0] += 2_500_000  # 2.5 ms for power
        nvml.violation_ns[1] += 1_000_000  # 1 ms thermal
        nvml.clock_mhz = 1410
        got = state.since(mark)
        self.assertEqual(got["gpu_sm_mhz"], 1410)
        self.assertAlmostEqual(got["gpu_power_w"], 7.0 / got["wall_s"])
        self.assertEqual(got["gpu_held_back_ms"], {"power": 2.5, "thermal": 1.0, "board_limit": 0.0,
                                                   "reliability": 0.0, "sync_boost": 0.0})

    def test_what_the_gpu_does_not_support_is_left_out(self) -> None:
        ms = load_script("perf/machine_state.py")
        nvml = FakeNvml(unsupported=("energy", "violation1", "violation2", "violation3", "violation5"))
        state = ms.MachineState(3, None, nvml=nvml)
        self.assertEqual(nvml.handles, [3])  # no PCI bus id: CUDA's index
        got = state.since(state.mark())
        self.assertIsNone(got["gpu_power_w"])
        self.assertEqual(got["gpu_held_back_ms"], {"power": 0.0})
        nvml = FakeNvml(unsupported=("energy",) + tuple(f"violation{p}" for p in (0, 1, 2, 3, 5)))
        state = ms.MachineState(0, None, nvml=nvml)
        got = state.since(state.mark())
        self.assertIsNone(got["gpu_held_back_ms"])
        self.assertEqual(got["gpu_sm_mhz"], 1980)

    def test_no_nvml_leaves_every_gpu_figure_none(self) -> None:
        ms = load_script("perf/machine_state.py")
        state = ms.MachineState(0, None, nvml=FakeNvml(unsupported=("nvmlInit",)))
        got = state.since(state.mark())
        self.assertEqual((got["gpu_sm_mhz"], got["gpu_power_w"], got["gpu_held_back_ms"]), (None, None, None))
        self.assertGreaterEqual(got["rank_cpu_s"], 0)


if __name__ == "__main__":
    unittest.main()


class FakeDriver:
    """libcuda's calls that block_in_cuda_waits makes, over two GPUs; ``keeps`` makes the flags not take (as on a
    context already active), ``fails`` names a call that returns an error."""

    def __init__(self, keeps: bool = False, fails: str = "") -> None:
        self.flags = {0: 0, 1: 0}
        self.keeps, self.fails, self.calls = keeps, fails, []

    def _rc(self, name: str) -> int:
        self.calls.append(name)
        return 999 if name == self.fails else 0

    def cuInit(self, flags: int) -> int:
        return self._rc("cuInit")

    def cuDeviceGetCount(self, count: Any) -> int:
        ctypes.cast(count, ctypes.POINTER(ctypes.c_int))[0] = 2
        return self._rc("cuDeviceGetCount")

    def cuDeviceGet(self, device: Any, ordinal: int) -> int:
        ctypes.cast(device, ctypes.POINTER(ctypes.c_int))[0] = ordinal
        return self._rc("cuDeviceGet")

    def cuDevicePrimaryCtxSetFlags_v2(self, device: Any, flags: Any) -> int:
        if not self.keeps:
            self.flags[device.value] = flags.value
        return self._rc("cuDevicePrimaryCtxSetFlags")

    def cuDevicePrimaryCtxGetState(self, device: Any, flags: Any, active: Any) -> int:
        ctypes.cast(flags, ctypes.POINTER(ctypes.c_uint))[0] = self.flags[device.value] | 0x08
        ctypes.cast(active, ctypes.POINTER(ctypes.c_int))[0] = int(self.keeps)
        return self._rc("cuDevicePrimaryCtxGetState")


class CudaWaits(unittest.TestCase):
    def setUp(self) -> None:
        self.ms = load_script("perf/machine_state.py")

    def test_every_gpu_blocks_in_its_waits(self) -> None:
        driver = FakeDriver()
        self.ms.block_in_cuda_waits(driver)
        self.assertEqual(driver.flags, {0: 0x04, 1: 0x04})  # CU_CTX_SCHED_BLOCKING_SYNC, on both GPUs
        self.assertEqual(driver.calls[0], "cuInit")

    def test_flags_that_do_not_take_and_failing_calls_raise(self) -> None:
        with self.assertRaises(RuntimeError) as caught:
            self.ms.block_in_cuda_waits(FakeDriver(keeps=True))
        self.assertIn("GPU 0's primary context kept scheduling flags 0x0 (its context was active: True)",
                      str(caught.exception))
        for call in ("cuInit", "cuDeviceGet", "cuDevicePrimaryCtxSetFlags"):
            with self.subTest(call=call), self.assertRaises(RuntimeError) as caught:
                self.ms.block_in_cuda_waits(FakeDriver(fails=call))
            self.assertIn(f"{call} returned CUDA driver error 999", str(caught.exception))
