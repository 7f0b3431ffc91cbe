#!/usr/bin/env python3
"""Device memory of FSDP2 with zpccl against FSDP2 with NCCL at the same resharding, stage by stage, and where the
memory that ``zpccl.fsdp.enable`` takes outside torch's allocator goes.

    python perf/fsdp_memory.py --nproc 2 --nodes 2 -J perf/results/fsdp-memory.json   # one GPU: two "nodes"
    python perf/fsdp_memory.py --nproc 2 --nodes 2 --reshard true
    python perf/fsdp_memory.py --nproc 2 --nodes 2 --env NCCL_BUFFSIZE=1048576 --env NCCL_NCHANNELS_PER_NET_PEER=1

The model, its sharding, the launch and the training step are perf/fsdp_step.py's (``--shape``, ``--nodes``, its
``Bench``). An untimed warm-up configuration (FSDP2 with NCCL, one step) first loads torch's kernels and connects
torch's NCCL communicator, so that neither measured configuration pays for them (``--no-warmup`` keeps them in the
first). Then each configuration of ``--configs``, in order, starts from collected garbage (an FSDP2 model is
cyclic: a dropped one keeps its memory until the garbage collector runs) and a fresh peak, and goes through the
stages: model built and sharded, zpccl enabled, first step, ``--steps`` steps, torn down (before and after the
garbage collector). At each stage, per rank: ``torch.cuda.memory_allocated``, ``max_memory_allocated`` since the
configuration began, ``memory_reserved``, and the device memory outside torch's allocator since the
configuration began:

* ``outside``: device-wide used memory (``torch.cuda.mem_get_info``) less what the torch allocators of every rank
  on the GPU reserve, divided by the ranks on the GPU (read between barriers, every rank synchronized);
* ``own``: where NVML lists this process (a container's PID namespace may hide it), its own used memory less its
  allocator's reserve: exact per rank.

For zpccl, the sub-steps of ``enable`` are measured the same way (``Comm.from_torch_group`` and ``Comm.reserve``
wrapped while it runs): the reduce-scatters' communicator (an NCCL world of its own, and its node-layout splits;
the first communicator of the process also loads zpccl's kernels and makes the device's green context), the
gathers' (wrapping torch's NCCL communicator, and its splits), each one's ``reserve`` (scratch, and NCCL's
point-to-point connections to every peer), the rest (staging buffers). After the steps, a further communicator
of the same group is made, reserved the same and closed: what each one more costs, so that the first one's
one-time costs show as the difference.

Experiments (``--env NAME=VALUE``, set in every process before NCCL starts; they reach torch's NCCL communicator
too, so the NCCL rows move as well):

=====================================  ==================================================================
``NCCL_BUFFSIZE=1048576``              the Simple protocol's buffer per connection (default 4 MiB)
``NCCL_NCHANNELS_PER_NET_PEER=1``      channels (so connections) per network peer
``NCCL_MAX_NCHANNELS=2``               channels per communicator
``NCCL_PROTO=Simple``                  no LL / LL128 buffers
``NCCL_RUNTIME_CONNECT=0``             every algorithm connected at init (NCCL's default: on first use)
``ZP_NCCL_SMS=0``                      no green context for zpccl's kernels
=====================================  ==================================================================

``--log-dir DIR``: NCCL's allocations (``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ALLOC``), zpccl's (``ZP_DEBUG=INFO
ZP_DEBUG_SUBSYS=INIT,ALLOC``: scratch) and zpccl.fsdp's debug log (staging, reserve sizes), one file a process.
The whole run stops after ``--deadline`` seconds (stacks dumped). JSON (``-J``): the run's provenance
(perf/provenance.py), every rank's snapshots and the derived figures.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import faulthandler
import gc
import json
import logging
import os
import pathlib
import socket
import sys
from typing import Any, Iterator

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import fsdp_step as fs  # noqa: E402  (perf/fsdp_step.py: the model, the launch, the step)
import step_protocol as sp  # noqa: E402
from provenance import provenance  # noqa: E402

ex = fs.ex
MIB = 2**20


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ex.add_model_args(p)
    ex.add_launch_args(p)
    p.add_argument("--shape", choices=sorted(sp.SHAPES), default=None, help="preset model and batch shape")
    p.add_argument("--reshard", default="false", help="reshard_after_forward of both configurations: true, "
                   "false, or k (hpZ groups of k with zpccl)")
    p.add_argument("--configs", default="nccl,zpccl,zpccl",
                   help="nccl and/or zpccl, in the order they run; a repeat runs again as NAME-2, NAME-3, ... (the "
                        "default's second zpccl: what a further enable/disable cycle keeps, which a leak would grow)")
    p.add_argument("--steps", type=int, default=5)
    ex.add_quant_args(p, ("weight_bits", "grad_bits", "block_size"))
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--no-warmup", action="store_true", help="no untimed NCCL configuration first")
    p.add_argument("--no-probe", action="store_true", help="no further zpccl communicator after the steps")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="set in every process")
    p.add_argument("--log-dir", help="NCCL's, zpccl's and zpccl.fsdp's allocation logs here")
    p.add_argument("--deadline", type=float, default=220, help="seconds before the run gives up")
    p.add_argument("-J", "--json", help="write the results here")
    args = p.parse_args(argv)
    if args.shape:
        args.layers, args.d_model, args.heads, args.seq, args.batch = sp.SHAPES[args.shape]
    args.reshard = ex.parse_reshard(args.reshard)
    args.cpu = False  # fsdp_step's Bench launches on CPUs under --cpu; what this script measures is CUDA's memory
    args.cuda_waits = "spin"  # fsdp_step's Bench can make CUDA waits sleep; memory does not depend on it
    args.rank_cpu_lists = None  # fsdp_step's Bench can pin ranks to CPUs; memory does not depend on it
    return args


def experiment_env(args: argparse.Namespace) -> dict[str, str]:
    env = {}
    for item in args.env:
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise SystemExit(f"fsdp_memory: --env {item!r} is not NAME=VALUE")
        env[name] = value
    if args.log_dir:
        d = pathlib.Path(args.log_dir).resolve()
        d.mkdir(parents=True, exist_ok=True)
        env.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,ALLOC", NCCL_DEBUG_FILE=str(d / "nccl.%h.%p.log"),
                   ZP_DEBUG="INFO", ZP_DEBUG_SUBSYS="INIT,ALLOC", ZP_DEBUG_FILE=str(d / "zpccl.%h.%p.log"))
    return env


# ---- measuring ---------------------------------------------------------------------------------------------------


class Nvml:
    """This process's used device memory as NVML counts it (its CUDA context included), or None where NVML does not
    list the process or is missing."""

    class _Info(ctypes.Structure):  # nvmlProcessInfo_t (v2 and v3)
        _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong), ("gpuInstanceId", ctypes.c_uint),
                    ("computeInstanceId", ctypes.c_uint)]

    def __init__(self, torch: Any, device: Any) -> None:
        self.handle = None
        try:
            self.lib = ctypes.CDLL("libnvidia-ml.so.1")
            self.query = getattr(self.lib, "nvmlDeviceGetComputeRunningProcesses_v3", None) or \
                self.lib.nvmlDeviceGetComputeRunningProcesses_v2
            if self.lib.nvmlInit_v2() != 0:
                return
            handle = ctypes.c_void_p()
            uuid = "GPU-" + str(torch.cuda.get_device_properties(device).uuid)
            if self.lib.nvmlDeviceGetHandleByUUID(uuid.encode(), ctypes.byref(handle)) == 0:
                self.handle = handle
        except (OSError, AttributeError):
            self.handle = None

    def used(self) -> int | None:
        if self.handle is None:
            return None
        count = ctypes.c_uint(64)
        infos = (self._Info * count.value)()
        if self.query(self.handle, ctypes.byref(count), infos) != 0:
            return None
        pid = os.getpid()
        mine = [i.usedGpuMemory for i in infos[:count.value] if i.pid == pid]
        return mine[0] if mine and mine[0] < 2**63 else None


class Probe:
    """Snapshots of this rank's memory, every rank synchronized and in step (barriers on a gloo group before and
    after the device-wide read, so that no rank allocates while another reads)."""

    def __init__(self, torch: Any, device: Any) -> None:
        self.torch, self.device, self.dist = torch, device, torch.distributed
        self.group = self.dist.new_group(backend="gloo")
        self.nvml = Nvml(torch, device)

    def take(self) -> dict[str, Any]:
        cuda = self.torch.cuda
        cuda.synchronize(self.device)
        self.dist.barrier(group=self.group)
        free, total = cuda.mem_get_info(self.device)
        snap = dict(allocated=cuda.memory_allocated(self.device), peak=cuda.max_memory_allocated(self.device),
                    reserved=cuda.memory_reserved(self.device), device_used=total - free, process_used=self.nvml.used())
        self.dist.barrier(group=self.group)
        return snap


def measured(probe: Probe, steps: list[dict[str, Any]], label: str, call: Any, **facts: Any) -> Any:
    """``call()``, with snapshots before and after it in ``steps``."""
    before = probe.take()
    out = call()
    steps.append(dict(step=label, before=before, after=probe.take(), **facts))
    return out


@contextlib.contextmanager
def enable_steps(zpccl: Any, probe: Probe, steps: list[dict[str, Any]]) -> Iterator[None]:
    """Measures each communicator ``zpccl.fsdp.enable`` makes and each ``reserve`` it calls, in ``steps``."""
    Comm = zpccl.Comm
    make, reserve = Comm.__dict__["from_torch_group"], Comm.reserve
    names: dict[int, str] = {}

    def from_torch_group(cls: Any, *a: Any, **k: Any) -> Any:
        label = "reduce-scatters' comm" if k.get("wrap") is False else "gathers' comm"
        comm = measured(probe, steps, label, lambda: make.__func__(cls, *a, **k))
        names[id(comm)] = label
        steps[-1].update(nodes=comm.node_count, local_size=comm.local_size, hpz_size=comm.hpz_size)
        return comm

    def reserved(self: Any, max_bytes: int) -> None:
        measured(probe, steps, f"reserve {names.get(id(self), 'comm')}", lambda: reserve(self, max_bytes),
                 max_bytes=max_bytes)

    Comm.from_torch_group, Comm.reserve = classmethod(from_torch_group), reserved
    try:
        yield
    finally:
        Comm.from_torch_group, Comm.reserve = make, reserve


# ---- one configuration ---------------------------------------------------------------------------------------


def run_config(bench: Any, probe: Probe, name: str, steps: int, args: argparse.Namespace) -> dict[str, Any]:
    torch, where = bench.torch, bench.where
    stages: list[tuple[str, dict[str, Any]]] = []
    row: dict[str, Any] = dict(config=name, stages=stages, enable_steps=[])
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(where.device)
    stages.append(("start", probe.take()))
    model = bench.build(args.reshard)
    stages.append(("built", probe.take()))
    zp = None
    if name.startswith("zpccl"):
        with enable_steps(bench.zpccl, probe, row["enable_steps"]):
            zp = bench.zpccl.fsdp.enable(model, weight_bits=args.weight_bits, grad_bits=args.grad_bits,
                                         block_size=args.block_size, ranks_per_node=where.ranks_per_node)
        stages.append(("enabled", probe.take()))
        row.update(staging_bytes=zp.reserved_bytes, residual_bytes=zp.residual_bytes)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    for s in range(steps):
        bench.step(model, opt, s)
        if s in (0, steps - 1):
            stages.append((f"step {s + 1}", probe.take()))
    if zp is not None:
        row.update(calls={k: v["calls"] for k, v in zp.summary().items()},
                   staging_grown=zp.staging_grown)
        if not args.no_probe:
            further_comm(bench, probe, row)
        zp.disable()
    del model, opt, zp
    stages.append(("torn down", probe.take()))
    gc.collect()
    torch.cuda.empty_cache()
    stages.append(("collected", probe.take()))
    return row


def further_comm(bench: Any, probe: Probe, row: dict[str, Any]) -> None:
    """One more communicator like the reduce-scatters' one: made, reserved as it was, closed."""
    args, steps = bench.args, row["enable_steps"]
    size = next((s["max_bytes"] for s in steps if s["step"] == "reserve reduce-scatters' comm"), 0)
    config = dict(weight_bits=args.weight_bits, grad_bits=args.grad_bits, block_size=args.block_size,
                  ranks_per_node=bench.where.ranks_per_node)
    comm = measured(probe, steps, "further comm", lambda: bench.zpccl.Comm.from_torch_group(
        bench.mesh.get_group(), device=bench.where.device, wrap=False, **config))
    measured(probe, steps, "reserve further comm", lambda: comm.reserve(size), max_bytes=size)
    measured(probe, steps, "close further comm", comm.close)


# ---- the run -----------------------------------------------------------------------------------------------------


def main(args: argparse.Namespace) -> None:
    faulthandler.dump_traceback_later(args.deadline, exit=True)
    bench = fs.Bench(args)
    torch, where = bench.torch, bench.where
    if args.log_dir:
        handler = logging.FileHandler(pathlib.Path(args.log_dir) / f"fsdp.{where.rank}.log")
        logging.getLogger("zpccl.fsdp").addHandler(handler)
        logging.getLogger("zpccl.fsdp").setLevel(logging.DEBUG)
    probe = Probe(torch, where.device)
    torch.distributed.barrier()  # torch's communicator connected for its all-reduce before any snapshot
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    if any(n not in ("nccl", "zpccl") for n in names):
        raise SystemExit(f"fsdp_memory: --configs {args.configs!r}: nccl and zpccl only")
    names = [n if names[:i].count(n) == 0 else f"{n}-{names[:i].count(n) + 1}" for i, n in enumerate(names)]
    rows = [] if args.no_warmup else [dict(run_config(bench, probe, "nccl", 1, args), config="warmup")]
    rows += [run_config(bench, probe, n, args.steps, args) for n in names]
    props = torch.cuda.get_device_properties(where.device)
    mine = dict(rank=where.rank, gpu=(socket.gethostname(), str(getattr(props, "uuid", where.device.index))), rows=rows)
    everyone: list[Any] = [None] * where.world
    torch.distributed.all_gather_object(everyone, mine, group=probe.group)
    if where.rank == 0:
        from zpccl import _lib, _torch

        derived = derive(everyone)
        report(derived, args, bench)
        if args.json:
            path = pathlib.Path(args.json)
            path.parent.mkdir(parents=True, exist_ok=True)
            label = ex.import_zpccl().launch.net_label(torch.cuda.device_count()) if args.nodes else "local"
            path.write_text(json.dumps(dict(
                provenance=provenance(label), args={k: v for k, v in vars(args).items()}, env=experiment_env(args),
                zpccl_wraps_torch_nccl=_torch.same_nccl_as_torch(_lib.lib()),
                params=sum(p.numel() for p in bench.base.parameters()), derived=derived, ranks=everyone),
                indent=1, default=str) + "\n")
    torch.distributed.destroy_process_group()


def derive(everyone: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rank, configuration and stage: MiB in torch's allocator, and outside it since the configuration began
    (device-wide, shared among the ranks on the GPU; and the process's own where NVML tells it); per enable step,
    what it took outside the allocator."""
    out = []
    for me in everyone:
        peers = [p for p in everyone if p["gpu"] == me["gpu"]]
        k = len(peers)
        for c, row in enumerate(me["rows"]):
            def outside(i: int) -> float:
                snap = row["stages"][i][1]
                return (snap["device_used"] - sum(p["rows"][c]["stages"][i][1]["reserved"] for p in peers)) / k

            def own(i: int) -> float | None:
                snap = row["stages"][i][1]
                return None if snap["process_used"] is None else snap["process_used"] - snap["reserved"]

            stages = []
            for i, (label, snap) in enumerate(row["stages"]):
                o, o0 = own(i), own(0)
                stages.append(dict(stage=label, allocated_mib=snap["allocated"] / MIB, peak_mib=snap["peak"] / MIB,
                                   reserved_mib=snap["reserved"] / MIB, outside_mib=(outside(i) - outside(0)) / MIB,
                                   own_outside_mib=None if o is None or o0 is None else (o - o0) / MIB))
            steps = []
            for j, st in enumerate(row["enable_steps"]):
                peer_steps = [p["rows"][c]["enable_steps"][j] for p in peers]
                used = st["after"]["device_used"] - st["before"]["device_used"]
                reserved = sum(s["after"]["reserved"] - s["before"]["reserved"] for s in peer_steps)
                steps.append(dict({key: v for key, v in st.items() if key not in ("before", "after")},
                                  outside_mib=(used - reserved) / k / MIB,
                                  reserved_mib=(st["after"]["reserved"] - st["before"]["reserved"]) / MIB))
            facts = {key: v for key, v in row.items() if key not in ("stages", "enable_steps")}
            at = {s["stage"]: s for s in stages}
            if "enabled" in at:
                facts["enable_outside_mib"] = at["enabled"]["outside_mib"] - at["built"]["outside_mib"]
            out.append(dict(facts, rank=me["rank"], ranks_on_gpu=k, stages=stages, enable_steps=steps))
    return out


def report(derived: list[dict[str, Any]], args: argparse.Namespace, bench: Any) -> None:
    """One line a configuration and stage (the warm-up's in one line), each figure as rank 0's/rank 1's/..."""
    where = bench.where
    print(f"# FSDP2 memory: {where.world} ranks ({f'{args.nodes} nodes over sockets, ' if args.nodes else ''}"
          f"{bench.on_device} a GPU), shape {args.shape or 'from the model flags'}, reshard_after_forward="
          f"{args.reshard}, {args.steps} steps; zpccl int{args.weight_bits} weights, int{args.grad_bits} gradients, "
          f"blocks of {args.block_size}" + (f"; env {' '.join(args.env)}" if args.env else ""))
    configs = list(dict.fromkeys(r["config"] for r in derived))
    rows = {c: sorted((r for r in derived if r["config"] == c), key=lambda r: r["rank"]) for c in configs}

    def each(ranks: list[dict[str, Any]], value: Any) -> str:
        got = [value(r) for r in ranks]
        return "/".join("-" if v is None else f"{v:.1f}" for v in got)

    if "warmup" in rows:
        print("warm-up (nccl, 1 step; torch's kernels and NCCL connections), MiB outside torch's allocator after it: "
              + each(rows["warmup"], lambda r: r["stages"][-1]["outside_mib"]))
    print(f"MiB per rank (rank 0/1/...); outside: device memory outside torch's allocator since the configuration's "
          f"start (own: this process's, from NVML)\n{'config':>7} {'stage':>10} {'allocated':>15} {'peak':>15} "
          f"{'reserved':>15} {'outside':>15} {'own':>13}")
    for c in configs:
        if c == "warmup":
            continue
        for i, st in enumerate(rows[c][0]["stages"]):
            cells = [each(rows[c], lambda r, key=key: r["stages"][i][key])
                     for key in ("allocated_mib", "peak_mib", "reserved_mib", "outside_mib", "own_outside_mib")]
            print(f"{c:>7} {st['stage']:>10} " + " ".join(f"{x:>15}" for x in cells[:4]) + f" {cells[4]:>13}")
    if "zpccl" in rows:
        z = rows["zpccl"]
        print("zpccl enable step by step, MiB per rank outside torch's allocator (in torch's reserve):")
        for j, st in enumerate(z[0]["enable_steps"]):
            size = f", for {st['max_bytes'] / MIB:.1f} MiB collectives" if st.get("max_bytes") else ""
            layout = f", {st['nodes']} nodes of {st['local_size']}" if "nodes" in st else ""
            print(f"  {st['step'] + size + layout:<60} {each(z, lambda r: r['enable_steps'][j]['outside_mib']):>15} "
                  f"({each(z, lambda r: r['enable_steps'][j]['reserved_mib'])})")
        print(f"  enable in all: {each(z, lambda r: r['enable_outside_mib'])} MiB outside torch's allocator; staging "
              f"{z[0]['staging_bytes'] / MIB:.1f} MiB in it (grown in the loop: {z[0]['staging_grown']})")
    for c in configs:
        if c.startswith("zpccl-"):  # a further cycle: what its enable took, and what it left behind
            print(f"{c} (a further enable/disable cycle): enable {each(rows[c], lambda r: r['enable_outside_mib'])} "
                  f"MiB outside torch's allocator, left after collection "
                  f"{each(rows[c], lambda r: r['stages'][-1]['outside_mib'])}")
    if "zpccl" in rows and "nccl" in rows:
        last = f"step {args.steps}"

        def diff(key: str) -> Any:
            return lambda r: r["at"]["zpccl"][last][key] - r["at"]["nccl"][last][key]

        both = [dict(at={c: {s["stage"]: s for s in rows[c][k]["stages"]} for c in ("zpccl", "nccl")})
                for k in range(len(rows["zpccl"]))]
        print(f"zpccl - nccl after {last}: peak {each(both, diff('peak_mib'))} MiB, allocated "
              f"{each(both, diff('allocated_mib'))}, outside {each(both, diff('outside_mib'))}; a dropped model kept "
              f"{each(rows['nccl'], lambda r: r['stages'][-2]['allocated_mib'] - r['stages'][-1]['allocated_mib'])} "
              "MiB (nccl) until the garbage collector ran")


if __name__ == "__main__":
    arguments = parse_args()
    os.environ.update(experiment_env(arguments))
    ex.launch(main, arguments)
