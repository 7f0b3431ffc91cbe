"""What the machine did while a round of training steps was timed, so that a round slowed by the machine can be told
from one slowed by the code: the host's CPUs (busy, and stolen by a hypervisor), the rank's own CPU time and the
times the kernel took its threads off a CPU against their will, and its GPU's SM clock, power and the time NVML
counts the GPU was held back (power, thermal, ...). One commit's FSDP2 step has taken 43.7 ms in one run and 67.0 ms
in another, NCCL's step slowing with it (perf/notebook/fsdp.md, "The bisect's third run"): these fields say what
such a run's machine was doing.

    state = MachineState(cuda_index)    # once a process (None on a CPU)
    mark = state.mark()                 # as the timed steps begin
    ...
    row = state.since(mark)             # as they end: plain numbers, None where the machine does not tell

The GPU's figures come from NVML (the ``pynvml`` module of nvidia-ml-py, which the GPU machines have); without it,
or without a GPU, they are None and nothing else changes.
"""
from __future__ import annotations

import os
import pathlib
import resource
import time
from typing import Any

#: NVML's "performance policies" whose violation time (how long the GPU ran below the clocks it asked for, and why)
#: a round reports, by the name the row uses.
HELD_BACK_POLICIES = {"power": "NVML_PERF_POLICY_POWER", "thermal": "NVML_PERF_POLICY_THERMAL",
                      "board_limit": "NVML_PERF_POLICY_BOARD_LIMIT", "reliability": "NVML_PERF_POLICY_RELIABILITY",
                      "sync_boost": "NVML_PERF_POLICY_SYNC_BOOST"}


def host_cpu_times(stat_text: str | None = None) -> dict[str, int] | None:
    """The host's CPU time so far, summed over its CPUs, in clock ticks: ``total``, ``idle`` (idle and waiting for
    I/O) and ``steal`` (taken by the hypervisor for other guests), from /proc/stat's first line; None where there is
    no /proc/stat."""
    if stat_text is None:
        try:
            with open("/proc/stat") as f:
                stat_text = f.readline()
        except OSError:
            return None
    words = stat_text.split()
    if not words or words[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal [guest guest_nice: already counted in user and nice]
    ticks = [int(w) for w in words[1:9]] + [0] * max(0, 9 - len(words))
    return {"total": sum(ticks), "idle": ticks[3] + ticks[4], "steal": ticks[7]}


def thread_sched(sched_text: str | None = None, stat_text: str | None = None) -> dict[str, int | None]:
    """The calling thread's ``migrations`` (how often the kernel has moved it to another CPU, /proc/thread-self/sched's
    ``se.nr_migrations``) and the ``cpu`` it last ran on (/proc/thread-self/stat's 39th field); None for what the
    kernel does not tell. A rank whose host work runs slower in some rounds than in others may be moved between
    CPUs that share a core, or a cache, with other busy threads: these say where it ran."""
    def read(path: str) -> str | None:
        try:
            with open(path) as f:
                return f.read()
        except OSError:
            return None

    sched_text = read("/proc/thread-self/sched") if sched_text is None else sched_text
    stat_text = read("/proc/thread-self/stat") if stat_text is None else stat_text
    migrations = cpu = None
    for line in (sched_text or "").splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "se.nr_migrations" and value.strip().isdigit():
            migrations = int(value)
    # The command name, in parentheses, may hold spaces: the fields after it are counted from its closing one.
    fields = (stat_text or "").rpartition(")")[2].split()
    if len(fields) > 36 and fields[36].lstrip("-").isdigit():  # field 39 is the 37th after the name (field 2)
        cpu = int(fields[36])
    return {"migrations": migrations, "cpu": cpu}


def parse_cpu_list(text: str) -> list[int]:
    """CPUs in taskset's list syntax (``0-3,8,10-11``), sorted, each once; ValueError naming what is wrong."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"CPU list {text!r}: {part.strip()!r} is not a CPU number or a range FIRST-LAST")
        lo, hi = int(first), int(last) if dash else int(first)
        if hi < lo:
            raise ValueError(f"CPU list {text!r}: range {part.strip()!r} runs backwards")
        cpus.update(range(lo, hi + 1))
    return sorted(cpus)


def pin_to_cpus(cpus: list[int]) -> None:
    """Runs this process, and the threads it starts from now on, on ``cpus`` only (os.sched_setaffinity); raises
    RuntimeError naming the CPUs this process may not use."""
    allowed = os.sched_getaffinity(0)
    missing = sorted(set(cpus) - allowed)
    if missing:
        raise RuntimeError(f"pin_to_cpus: CPUs {missing} are not among this process's ({sorted(allowed)})")
    os.sched_setaffinity(0, cpus)
    if os.sched_getaffinity(0) != set(cpus):
        raise RuntimeError(f"pin_to_cpus: asked for CPUs {sorted(cpus)}, got {sorted(os.sched_getaffinity(0))}")


def host_cpus(cpu_root: str = "/sys/devices/system/cpu", cpuinfo: str = "/proc/cpuinfo") -> dict[str, Any]:
    """The host's CPUs as a result file records them: ``model`` (/proc/cpuinfo's first model name), ``count``, and
    ``shared_cores``, the groups of CPUs that the kernel says are threads of one core (``[]``: every CPU a core of
    its own, as a virtual machine may show CPUs that share cores on its host; None where the kernel does not say)."""
    model = None
    try:
        with open(cpuinfo) as f:
            model = next((line.partition(":")[2].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        pass
    groups: set[tuple[int, ...]] | None = set()
    for cpu in sorted(pathlib.Path(cpu_root).glob("cpu[0-9]*")):
        try:
            groups.add(tuple(parse_cpu_list((cpu / "topology" / "thread_siblings_list").read_text().strip())))
        except (OSError, ValueError):
            groups = None
            break
    shared = None if not groups else sorted(list(g) for g in groups if len(g) > 1)
    return {"model": model, "count": os.cpu_count(), "shared_cores": shared}


class MachineState:
    """Samples the machine as a round's timed steps begin (:meth:`mark`) and end (:meth:`since`)."""

    def __init__(self, cuda_index: int | None, pci_bus_id: str | None = None, nvml: Any = None) -> None:
        """``cuda_index``: the rank's GPU (None on a CPU); ``pci_bus_id`` finds it in NVML, whose numbering may differ
        from CUDA's (else the index is used); ``nvml``: the pynvml module, imported here when not given."""
        self.nvml, self.gpu = None, None
        if cuda_index is None:
            return
        try:
            if nvml is None:
                import pynvml as nvml  # noqa: PLC0415 - optional: only GPU machines have it
            nvml.nvmlInit()
            self.gpu = (nvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id.encode()) if pci_bus_id
                        else nvml.nvmlDeviceGetHandleByIndex(cuda_index))
            self.nvml = nvml
        except Exception:  # noqa: BLE001 - no NVML, no driver, or no such device: the GPU's fields stay None
            self.nvml, self.gpu = None, None

    def _gpu_call(self, name: str, *args: Any) -> Any:
        try:
            return getattr(self.nvml, name)(self.gpu, *args)
        except Exception:  # noqa: BLE001 - a query this GPU or driver does not support
            return None

    def _held_back_ns(self) -> dict[str, int | None]:
        out: dict[str, int | None] = {}
        for name, policy in HELD_BACK_POLICIES.items():
            got = self._gpu_call("nvmlDeviceGetViolationStatus", getattr(self.nvml, policy, -1))
            out[name] = None if got is None else int(got.violationTime)
        return out

    def mark(self) -> dict[str, Any]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        mark: dict[str, Any] = {"wall": time.perf_counter(), "host": host_cpu_times(),
                                "cpu_s": usage.ru_utime + usage.ru_stime, "nivcsw": usage.ru_nivcsw,
                                "thread": thread_sched()}
        if self.nvml is not None:
            mark["energy_mj"] = self._gpu_call("nvmlDeviceGetTotalEnergyConsumption")
            mark["held_back_ns"] = self._held_back_ns()
        return mark

    def since(self, mark: dict[str, Any]) -> dict[str, Any]:
        """The machine between ``mark`` and now: ``wall_s``; ``host_busy`` and ``host_steal``, shares of every CPU's
        time (0 to 1); ``rank_cpu_s``, this process's CPU seconds (all its threads); ``rank_preempted``, how often
        the kernel took one of its threads off a CPU that it still wanted; ``rank_migrations``, how often the
        calling (main) thread moved to another CPU, and ``rank_cpu``, the CPU it ran on last; ``gpu_sm_mhz`` (now),
        ``gpu_power_w`` (the mean) and ``gpu_held_back_ms`` (per NVML policy)."""
        now = self.mark()
        wall = now["wall"] - mark["wall"]
        before, after = mark["host"], now["host"]
        busy = steal = None
        if before and after and after["total"] > before["total"]:
            total = after["total"] - before["total"]
            busy = 1 - (after["idle"] - before["idle"]) / total
            steal = (after["steal"] - before["steal"]) / total
        out: dict[str, Any] = {"wall_s": wall, "host_cpus": os.cpu_count(), "host_busy": busy, "host_steal": steal,
                               "rank_cpu_s": now["cpu_s"] - mark["cpu_s"],
                               "rank_preempted": now["nivcsw"] - mark["nivcsw"],
                               "rank_migrations": None, "rank_cpu": now["thread"]["cpu"],
                               "gpu_sm_mhz": None, "gpu_power_w": None, "gpu_held_back_ms": None}
        moved = [m["thread"]["migrations"] for m in (mark, now)]
        if None not in moved:
            out["rank_migrations"] = moved[1] - moved[0]
        if self.nvml is not None:
            clock = self._gpu_call("nvmlDeviceGetClockInfo", getattr(self.nvml, "NVML_CLOCK_SM", 1))
            out["gpu_sm_mhz"] = None if clock is None else int(clock)
            if mark.get("energy_mj") is not None and now.get("energy_mj") is not None and wall > 0:
                out["gpu_power_w"] = (now["energy_mj"] - mark["energy_mj"]) / 1e3 / wall
            held = {name: (after_ns - mark["held_back_ns"][name]) / 1e6
                    for name, after_ns in now["held_back_ns"].items()
                    if after_ns is not None and mark["held_back_ns"].get(name) is not None}
            out["gpu_held_back_ms"] = held or None
        return out


#: The CUDA driver's CU_CTX_SCHED_BLOCKING_SYNC: a context whose host threads sleep in CUDA waits.
_SCHED_BLOCKING_SYNC = 0x04


def block_in_cuda_waits(driver: Any = None) -> None:
    """Makes this process's CUDA waits sleep instead of spinning, on every GPU it sees, so that ``rank_cpu_s``
    counts the rank's own work and not its waits for the GPU (CUDA spins by default while a process has fewer
    contexts than CPUs, and a process sharing a GPU in time slices waits for the other's slice). It sets the
    primary contexts' flags through the driver (``driver``: a loaded libcuda; default ``libcuda.so.1``), so it must
    run before this process's first CUDA call; it checks that the flags took, and raises RuntimeError naming the
    driver call that failed."""
    import ctypes

    cuda = ctypes.CDLL("libcuda.so.1") if driver is None else driver

    def check(call: str, rc: int) -> None:
        if rc != 0:
            raise RuntimeError(f"block_in_cuda_waits: {call} returned CUDA driver error {rc}")

    set_flags = getattr(cuda, "cuDevicePrimaryCtxSetFlags_v2", None) or cuda.cuDevicePrimaryCtxSetFlags
    check("cuInit", cuda.cuInit(0))
    count = ctypes.c_int()
    check("cuDeviceGetCount", cuda.cuDeviceGetCount(ctypes.byref(count)))
    for ordinal in range(count.value):
        device, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
        check("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(device), ordinal))
        check("cuDevicePrimaryCtxSetFlags", set_flags(device, ctypes.c_uint(_SCHED_BLOCKING_SYNC)))
        check("cuDevicePrimaryCtxGetState",
              cuda.cuDevicePrimaryCtxGetState(device, ctypes.byref(flags), ctypes.byref(active)))
        if flags.value & 0x07 != _SCHED_BLOCKING_SYNC:
            raise RuntimeError(f"block_in_cuda_waits: GPU {ordinal}'s primary context kept scheduling flags "
                               f"{flags.value & 0x07:#x} (its context was active: {bool(active.value)})")
