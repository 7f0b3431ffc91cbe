#!/usr/bin/env python3
"""FSDP2 training step: FSDP2 with NCCL against FSDP2 with zpccl (and the hand-rolled ZeRO-3 example), same model,
same process, alternating rounds.

    python perf/fsdp_step.py --nproc 2 --nodes 2 -J perf/results/fsdp.json       # one GPU: two "nodes"
    python perf/fsdp_step.py --nproc 4 --nodes 2 --configs nccl,zpccl-hpz        # two nodes of two

Each of ``--rounds`` rounds (default 5) runs every configuration in turn on a freshly built and sharded model (so
that each one's peak memory is its own): ``--warmup`` steps, then ``--steps`` timed ones (CUDA synchronized around
each). Every rank times its own steps; a step's time is its slowest rank's (each rank's times are gathered after
the configuration's run and kept raw in the JSON). Per configuration: step time median and spread (min/max over
all rounds' steps) and each round's median, tokens per second (all ranks), peak memory per rank (torch's
allocator), the bytes each collective sent from a rank per step, and for zpccl the device memory its ``enable``
took (communicators and scratch, outside torch's allocator). The report's ratios are of medians, with the least
and greatest of the rounds' own ratios (each round's median against the other's in the same round).
``--loss-only`` skips all that.

``--loss-steps N`` then trains each of ``--loss-runs`` for N steps on a fresh model and reports the validation
loss and the training loss over the last 20 steps. A loss run is ``nccl`` or ``nccl-noreshard`` (FSDP's own
collectives, as below), ``nccl-fp32`` (as ``nccl-noreshard`` with gradients reduced in fp32, not bf16: a second
exact run whose gap to the first is the noise floor of the comparison, since any perturbation of the gradients,
however small, sends a run along another trajectory), or ``zpccl:W:G``: zpccl as in ``zpccl-hpz`` with W-bit weights
(qwZ) and G-bit gradients (qgZ); W = 0 leaves the weight all-gathers on FSDP's own (exact bf16) and G = 0 the
gradient reduce-scatters.
``--loss-seeds 0,1,2`` repeats every loss run per seed, seed-major (every run of one seed, then the next), so that
runs cut short leave whole seeds; a seed sets the model's initialization and the training batches' order, the
same for every run of that seed, so that runs are compared seed by seed against the NCCL run of the same seed
(the validation batches are the same for every seed). The report gives each run's mean and spread over seeds
and its paired gap to NCCL's validation loss. ``-J`` is rewritten after every loss run.

    python perf/fsdp_step.py --nproc 2 --nodes 2 --loss-only --loss-steps 400 --loss-seeds 0,1,2 \
        --loss-runs nccl-noreshard,zpccl:8:4,zpccl:0:4 -J perf/results/fsdp-loss.json

Configurations:

=================  ==========================================================================================
nccl               FSDP2's own collectives, ``reshard_after_forward=True`` (backward regathers over the shard
                   group)
nccl-noreshard     FSDP2's own collectives, ``reshard_after_forward=False`` (full weights kept to backward)
nccl-2comm         FSDP2's own collectives with zpccl-hpz's ``reshard_after_forward``, its reduce-scatters on a
                   second NCCL process group of the same ranks (``SecondGroupReduceScatter``), so that they
                   overlap the all-gathers as zpccl's reduce-scatters do on a communicator of their own: the
                   ablation that separates the gain of that overlap from quantization's
zpccl-hpz          zpccl, ``reshard_after_forward=k`` with k the ranks per node (hpZ); with one rank per node,
                   ``False`` (the hpZ group is the rank itself: same memory as nccl-noreshard)
zpccl-reshard      zpccl, ``reshard_after_forward=True`` (qwZ in backward too: nccl's memory)
zero3              ``tools/python/examples/zero3_train.py``'s hand-rolled ZeRO-3 loop on zpccl (same shape)
=================  ==========================================================================================

Bytes: NCCL's are counted in a short untimed pass whose hooks count and then call FSDP's own collectives;
zpccl's come from its counters (``(n - 1)`` copies of a rank's payloads). JSON (``-J``): the run's provenance
(perf/provenance.py), one row per configuration with every figure and the raw step times (``step_ms_per_rank``:
round, rank, step; none with ``--loss-only``), the loss runs (one row per run and seed) and their summary.
"""
from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import pathlib
import statistics
import sys
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "tools" / "python" / "examples"
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from provenance import provenance  # noqa: E402


def load_example(name: str) -> Any:
    """An example script as a module (importable by name, so that spawned processes find its functions)."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    return importlib.import_module(name)


ex = load_example("fsdp2_train")

SHAPES = {  # name: (layers, d_model, heads, seq, batch)
    "small": (8, 768, 12, 256, 8),
    "large": (8, 768, 12, 512, 32),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ex.add_model_args(p)
    ex.add_launch_args(p)
    p.add_argument("--shape", choices=sorted(SHAPES), default=None, help="preset model and batch shape")
    p.add_argument("--configs", default="nccl,nccl-noreshard,nccl-2comm,zpccl-hpz,zpccl-reshard,zero3")
    p.add_argument("--rounds", type=int, default=5,
                   help="alternating rounds of every configuration (at least 5 for a comparison: DESIGN.md)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per configuration and round")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--loss-steps", type=int, default=0, help="also train this many steps per loss run")
    p.add_argument("--loss-runs", default="nccl,zpccl:8:4,zpccl:8:8",
                   help="the loss runs, in order: nccl, nccl-noreshard, or zpccl:WEIGHT_BITS:GRAD_BITS (bits 4 "
                        "or 8; 0: that collective stays on FSDP's own, exact)")
    p.add_argument("--loss-seeds", default=None,
                   help="comma-separated seeds (model initialization and data order), each loss run once per "
                        "seed, seed-major (default: --seed)")
    p.add_argument("--loss-only", action="store_true", help="skip the timed rounds: only the loss runs")
    p.add_argument("--weight-bits", type=int, default=8)
    p.add_argument("--grad-bits", type=int, default=4)
    p.add_argument("--block-size", type=int, default=256)
    p.add_argument("--grad-block-size", type=int, default=None,
                   help="zpccl: the gradients' own quantization blocks (default: --block-size)")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--lr-final", type=float, default=0.1,
                   help="loss runs: the learning rate at the last step, as a fraction of --lr (cosine decay after "
                        "the warmup; 1: constant)")
    p.add_argument("-J", "--json", help="write the rows here")
    p.add_argument("--label", default="", help="regime label for the rows (default: from the layout)")
    args = p.parse_args(argv)
    if args.shape:
        args.layers, args.d_model, args.heads, args.seq, args.batch = SHAPES[args.shape]
    try:
        args.loss_specs = [parse_loss_spec(t) for t in args.loss_runs.split(",") if t.strip()]
        args.seeds = parse_seeds(args.loss_seeds, args.seed)
    except ValueError as e:
        p.error(str(e))
    if args.loss_only and not args.loss_steps:
        p.error("--loss-only needs --loss-steps")
    if args.rounds < 1 or args.steps < 1 or args.warmup < 0:
        p.error("--rounds and --steps must be at least 1, --warmup at least 0")
    unknown = [n for n in args.configs.split(",") if n.strip() and n.strip() not in CONFIGS]
    if unknown:
        p.error(f"--configs: unknown {', '.join(unknown)} (known: {', '.join(CONFIGS)})")
    return args


CONFIGS = ("nccl", "nccl-noreshard", "nccl-2comm", "zpccl-hpz", "zpccl-reshard", "zero3")


LOSS_CONFIGS = ("nccl", "nccl-noreshard", "nccl-fp32")


def parse_loss_spec(text: str) -> dict[str, Any]:
    """One ``--loss-runs`` entry: ``{"spec", "comm", "config", "weight_bits", "grad_bits"}``. ``config`` is the
    timed configuration whose sharding the run uses; bits are None for NCCL (and for a bare ``zpccl``: the
    ``--weight-bits``/``--grad-bits`` defaults), 0 for a collective left on FSDP's own."""
    spec = text.strip()
    if spec in LOSS_CONFIGS:
        return dict(spec=spec, comm="nccl", config=spec, weight_bits=None, grad_bits=None)
    comm, *bits = spec.split(":")
    if comm != "zpccl" or len(bits) not in (0, 2):
        raise ValueError(f"loss run {spec!r}: not nccl, nccl-noreshard, nccl-fp32, zpccl or zpccl:W:G")
    if not bits:
        return dict(spec=spec, comm="zpccl", config="zpccl-hpz", weight_bits=None, grad_bits=None)
    try:
        w, g = (int(b) for b in bits)
    except ValueError:
        raise ValueError(f"loss run {spec!r}: bits must be integers") from None
    if w not in (0, 4, 8) or g not in (0, 4, 8) or w == g == 0:
        raise ValueError(f"loss run {spec!r}: bits must be 0, 4 or 8, not both 0 (that is nccl-noreshard)")
    return dict(spec=spec, comm="zpccl", config="zpccl-hpz", weight_bits=w, grad_bits=g)


def parse_seeds(text: str | None, default: int) -> list[int]:
    if text is None:
        return [default]
    try:
        seeds = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"--loss-seeds {text!r}: comma-separated integers") from None
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise ValueError(f"--loss-seeds {text!r}: distinct integers >= 0, at least one")
    return seeds


# ---- one configuration -------------------------------------------------------------------------------------------


class Counting:
    """FSDP's own collectives behind hooks that count the bytes each call sends from this rank."""

    @staticmethod
    def attach(torch: Any, model: Any, fsdp: Any, sent: dict[str, int]) -> None:
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

        class AG(DefaultAllGather):
            def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, async_op: bool = False) -> Any:
                sent["all_gather"] = sent.get("all_gather", 0) + (group.size() - 1) * input_tensor.nbytes
                return super().__call__(output_tensor, input_tensor, group, async_op)

        class RS(DefaultReduceScatter):
            def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, op: Any,
                         async_op: bool = False) -> Any:
                sent["reduce_scatter"] = sent.get("reduce_scatter", 0) + (group.size() - 1) * output_tensor.nbytes
                return super().__call__(output_tensor, input_tensor, group, op, async_op)

        for m in model.modules():
            if isinstance(m, fsdp.FSDPModule):
                m.set_custom_all_gather(AG())
                m.set_custom_reduce_scatter(RS())


def reshard_of(name: str, ranks_per_node: int) -> bool | int:
    if name in ("nccl", "zpccl-reshard"):
        return True
    if name in ("nccl-noreshard", "nccl-fp32"):
        return False
    return ranks_per_node if ranks_per_node > 1 else False  # zpccl-hpz, and nccl-2comm as it


def second_group_reduce_scatter(base: type, dist: Any, second: Any) -> Any:
    """An FSDP2 reduce-scatter hook (``FSDPModule.set_custom_reduce_scatter``; ``base`` is this torch's
    ``ReduceScatter``) that runs FSDP's reduce-scatter with torch's own ``reduce_scatter_tensor`` on ``second``, a
    process group of the shard group's ranks other than the one FSDP's all-gathers use, so that the two run on
    separate NCCL communicators, as zpccl's gathers and reduce-scatters do. Same op, same buffers: only the
    communicator changes."""
    ranks = tuple(dist.get_process_group_ranks(second))

    class SecondGroupReduceScatter(base):  # type: ignore[misc, valid-type]
        calls = 0  # reduce-scatters it ran

        def allocate(self, size: Any, *, dtype: Any, device: Any) -> Any:
            import torch

            return torch.empty(*size, dtype=dtype, device=device)

        def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, op: Any,
                     async_op: bool = False) -> Any:
            if tuple(dist.get_process_group_ranks(group)) != ranks:
                raise ValueError(f"fsdp_step: the second process group holds ranks {ranks}, FSDP reduce-scatters "
                                 f"over {tuple(dist.get_process_group_ranks(group))}: make it of the shard group's")
            self.calls += 1
            return dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=second, async_op=async_op)

    return SecondGroupReduceScatter()


def use_second_group(model: Any, fsdp: Any, second: Any) -> Any:
    """Every FSDP module of ``model`` reduce-scatters on ``second``; returns the hook (second_group_reduce_scatter),
    whose ``calls`` counts them."""
    hook = second_group_reduce_scatter(fsdp.ReduceScatter, fsdp.dist, second)
    for m in model.modules():
        if isinstance(m, fsdp.FSDPModule):
            m.set_custom_reduce_scatter(hook)
    return hook


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        self.args, self.torch = args, torch
        self.where = ex.Launch(args.nodes)
        self.mesh = self.where.init()
        self.dist = torch.distributed
        self.zpccl = ex.import_zpccl()
        self.rpn = self.where.ranks_per_node or self._ranks_per_host()
        self.text = ex.corpus()
        self.data = ex.Batches(torch, self.text, args.seq, args.batch, self.where.rank, self.where.device, args.seed)
        self.base = ex.build_gpt(torch, args.layers, args.d_model, args.heads, args.seq, args.seed)
        self.on_device = self._ranks_on_device()
        self._second_group: Any = None  # nccl-2comm's, made on first use (a collective of every rank)

    def _ranks_per_host(self) -> int:
        import socket

        names: list[Any] = [None] * self.where.world
        self.dist.all_gather_object(names, socket.gethostname())
        return names.count(names[self.where.rank])

    def _ranks_on_device(self) -> int:
        devs: list[Any] = [None] * self.where.world
        self.dist.all_gather_object(devs, (os.environ.get("NCCL_HOSTID", ""), self.where.device.index))
        return sum(1 for d in devs if d[1] == self.where.device.index)

    def build(self, reshard: bool | int, base: Any = None, reduce_dtype: Any = None) -> Any:
        import copy

        model = copy.deepcopy(self.base if base is None else base).to(self.where.device)
        return ex.shard_gpt(self.torch, model, self.mesh, reshard, reduce_dtype)

    def enable(self, model: Any, grad_bits: int | None = None, weight_bits: int | None = None) -> tuple[Any, int]:
        """zpccl on the model; also the device memory the enable took on this rank (device-wide free memory
        before and after, between barriers, shared among the ranks on this device)."""
        torch = self.torch
        torch.cuda.synchronize()
        self.dist.barrier()
        free_before = torch.cuda.mem_get_info(self.where.device)[0]
        def bits(given: int | None, default: int) -> int | None:  # 0: that collective stays on FSDP's own
            return default if given is None else given or None

        g = bits(grad_bits, self.args.grad_bits)
        zp = self.zpccl.fsdp.enable(model, weight_bits=bits(weight_bits, self.args.weight_bits), grad_bits=g,
                                    block_size=self.args.block_size,
                                    grad_block_size=self.args.grad_block_size if g is not None else None,
                                    ranks_per_node=self.where.ranks_per_node)
        torch.cuda.synchronize()
        self.dist.barrier()
        free_after = torch.cuda.mem_get_info(self.where.device)[0]
        return zp, (free_before - free_after) // self.on_device

    def step(self, model: Any, opt: Any, step: int) -> float:
        torch = self.torch
        ids, targets = self.data.step(step)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = ex.loss_of(torch, model, ids, targets)
        loss.backward()
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    def nccl_bytes(self, name: str) -> dict[str, int]:
        """Bytes FSDP's own collectives send from this rank in one step (an untimed, counted step)."""
        fsdp = self.zpccl.fsdp._Fsdp.load()
        model = self.build(reshard_of(name, self.rpn))
        opt = self.torch.optim.AdamW(model.parameters(), lr=self.args.lr)
        sent: dict[str, int] = {}
        self.step(model, opt, 0)
        Counting.attach(self.torch, model, fsdp, sent)
        self.step(model, opt, 1)
        return sent

    def second_group(self) -> Any:
        """A second process group of the mesh's ranks, for nccl-2comm's reduce-scatters."""
        if self._second_group is None:
            self._second_group = self.dist.new_group(self.dist.get_process_group_ranks(self.mesh.get_group()))
        return self._second_group

    def run_fsdp(self, name: str, round_index: int) -> dict[str, Any]:
        torch, args = self.torch, self.args
        gc.collect()  # a dropped FSDP2 model is cyclic: without this its memory counts in the next one's peak
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.where.device)
        model = self.build(reshard_of(name, self.rpn))
        second = use_second_group(model, self.zpccl.fsdp._Fsdp.load(), self.second_group()) \
            if name == "nccl-2comm" else None
        zp, enable_bytes = self.enable(model) if name.startswith("zpccl") else (None, 0)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
        times = []
        for s in range(args.warmup + args.steps):
            if s == args.warmup and zp is not None:
                zp.reset_stats()
            if s == args.warmup and second is not None:
                second.calls = 0
            t = self.step(model, opt, round_index * 1000 + s)
            if s >= args.warmup:
                times.append(t)
        row = dict(times=self.every_rank(times), peak=torch.cuda.max_memory_allocated(self.where.device))
        if zp is not None:
            row["sent"] = {k: v["wire_bytes"] // args.steps for k, v in zp.summary().items()}
            row["calls"] = {k: v["calls"] // args.steps for k, v in zp.summary().items()}
            row["enable_bytes"] = enable_bytes
            row["staging_bytes"] = zp.reserved_bytes
            zp.disable()
        if second is not None:  # the reduce-scatters the hook ran: all of FSDP's, or it was not used
            row["calls"] = {"reduce_scatter_second_group": second.calls // args.steps}
        del model, opt
        return row

    def run_zero3(self, round_index: int) -> dict[str, Any]:
        torch, args = self.torch, self.args
        z3 = load_example("zero3_train")
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.where.device)
        zargs = argparse.Namespace(layers=args.layers, d_model=args.d_model, heads=args.heads, seq=args.seq,
                                   batch=args.batch, lr=args.lr, steps=args.warmup + args.steps)
        config = dict(weight_bits=args.weight_bits, grad_bits=args.grad_bits, block_size=args.block_size,
                      ranks_per_node=self.where.ranks_per_node)
        with self.zpccl.Comm.from_torch_group(device=self.where.device, **config) as comm:
            units = [z3.Unit(m, self.where.world, self.where.rank, self.where.device, args.lr, torch)
                     for m in z3.build_units(zargs, torch)]
            data = torch.frombuffer(bytearray(ex.corpus()), dtype=torch.uint8)
            _, times = z3.train(zargs, units, z3.ZeroPlusPlus(comm), data, self.where.rank, self.where.device,
                                torch)
            torch.cuda.synchronize()
        return dict(times=self.every_rank(times[args.warmup:]), peak=torch.cuda.max_memory_allocated(self.where.device))

    def every_rank(self, times: list[float]) -> list[list[float]]:
        """Every rank's step times (seconds), in rank order: gathered after the timed steps, outside them."""
        everyone: list[Any] = [None] * self.where.world
        self.dist.all_gather_object(everyone, [float(t) for t in times])
        return everyone

    def loss_run(self, run: dict[str, Any], seed: int) -> dict[str, Any]:
        """Trains a fresh model ``--loss-steps`` steps (a run of :func:`parse_loss_spec`), initialized and fed
        batches by ``seed``, with the example's warmup and gradient clipping (make_optimizer, optimizer_step)."""
        torch, args = self.torch, self.args
        weight_bits, grad_bits = run["weight_bits"], run["grad_bits"]
        base = ex.build_gpt(torch, args.layers, args.d_model, args.heads, args.seq, seed)
        data = ex.Batches(torch, self.text, args.seq, args.batch, self.where.rank, self.where.device, seed)
        reshard = reshard_of(run["config"], self.rpn)
        model = self.build(reshard, base, torch.float32 if run["config"] == "nccl-fp32" else None)
        del base
        zp = None
        if run["comm"] == "zpccl":
            zp = self.enable(model, grad_bits, weight_bits)[0]
        opt, schedule = ex.make_optimizer(torch, model, args.lr, args.loss_steps, final=args.lr_final)
        curve = []
        tail_from = max(0, args.loss_steps - TRAIN_TAIL)
        tail = torch.zeros((), device=self.where.device)
        for s in range(args.loss_steps):
            ids, targets = data.step(s)
            loss = ex.loss_of(torch, model, ids, targets)
            loss.backward()
            ex.optimizer_step(torch, model, opt, schedule)
            if s >= tail_from:
                tail += loss.detach()
            if s % 10 == 0 or s == args.loss_steps - 1:
                mean = loss.detach().clone()
                self.dist.all_reduce(mean, op=self.dist.ReduceOp.AVG)
                curve.append((s, float(mean)))
        self.dist.all_reduce(tail, op=self.dist.ReduceOp.AVG)
        valid = ex.validation_loss(torch, model, data.validation())
        calls = None
        if zp is not None:
            calls = {k: v["calls"] for k, v in zp.summary().items()}
            zp.disable()
        del model, opt
        torch.cuda.empty_cache()
        return dict(spec=run["spec"], comm=run["comm"], seed=seed, reshard=str(reshard), weight_bits=weight_bits,
                    grad_bits=grad_bits, steps=args.loss_steps, valid=valid,
                    train_tail=float(tail) / max(1, args.loss_steps - tail_from),
                    train_tail_steps=args.loss_steps - tail_from, zpccl_calls=calls, curve=curve)


TRAIN_TAIL = 20  # the steps whose mean training loss a loss run reports


# ---- the run -------------------------------------------------------------------------------------------------


def main(args: argparse.Namespace) -> None:
    bench = Bench(args)
    torch, where = bench.torch, bench.where
    names = [] if args.loss_only else [n.strip() for n in args.configs.split(",") if n.strip()]
    label = args.label or (f"net-on{torch.cuda.device_count()}gpu" if args.nodes else "local")
    say = print if where.rank == 0 else (lambda *a, **k: None)
    n_params = sum(p.numel() for p in bench.base.parameters())
    timed = ("no timed rounds" if args.loss_only else
             f"{args.rounds} rounds of {args.warmup}+{args.steps} steps")
    say(f"# FSDP2 step: {where.world} ranks ({f'{args.nodes} nodes over sockets, ' if args.nodes else ''}"
        f"{bench.rpn} a node, {bench.on_device} a GPU), {n_params / 1e6:.1f}M parameters, "
        f"{args.layers} layers d {args.d_model}, {args.batch} x {args.seq} tokens per rank; {timed}; zpccl "
        f"int{args.weight_bits} weights, int{args.grad_bits} gradients, blocks of {args.block_size}"
        + (f" (gradients' {args.grad_block_size})" if args.grad_block_size else ""), flush=True)
    out = timed_rows(bench, args, names, label, n_params, say) if names else []
    losses: list[dict[str, Any]] = []

    record = provenance(label) if where.rank == 0 else None

    def save() -> None:
        if where.rank == 0 and args.json:
            write_json(pathlib.Path(args.json), dict(
                provenance=record, rows=out, losses=losses, loss_summary=loss_summary(losses), loss_seeds=args.seeds,
                loss_runs=[r["spec"] for r in args.loss_specs], regime=label, ranks=where.world,
                nodes=args.nodes or None, ranks_per_node=bench.rpn, params=n_params, block_size=args.block_size,
                grad_block_size=args.grad_block_size or args.block_size, lr=args.lr))

    save()
    if args.loss_steps:
        t_start = time.perf_counter()
        for seed in args.seeds:
            for run in args.loss_specs:
                x = bench.loss_run(run, seed)
                losses.append(x)
                say(f"#   loss {x['spec']} seed {seed}: validation {x['valid']:.4f}, training (last "
                    f"{x['train_tail_steps']}) {x['train_tail']:.4f} ({time.perf_counter() - t_start:.0f} s)",
                    flush=True)
                save()
    if where.rank == 0:
        report(out, losses)
    torch.distributed.destroy_process_group()


def timed_rows(bench: Bench, args: argparse.Namespace, names: list[str], label: str, n_params: int,
               say: Any) -> list[dict[str, Any]]:
    """The alternating timed rounds: one row per configuration."""
    where = bench.where
    rows: dict[str, dict[str, Any]] = {n: dict(per_rank=[], peak=0) for n in names}
    for n in names:
        if n.startswith("nccl"):
            rows[n]["sent"] = bench.nccl_bytes(n)
    t_start = time.perf_counter()
    for r in range(args.rounds):
        for n in names:
            got = bench.run_zero3(r) if n == "zero3" else bench.run_fsdp(n, r)
            row = rows[n]
            row["per_rank"].append(got.pop("times"))
            row["peak"] = max(row["peak"], got.pop("peak"))
            row.update(got)
        say(f"#   round {r + 1}/{args.rounds} done ({time.perf_counter() - t_start:.0f} s)", flush=True)
    tokens = where.world * args.batch * args.seq
    out = []
    for n in names:
        steps = step_summary([[[1e3 * t for t in rank] for rank in rnd] for rnd in rows[n]["per_rank"]])
        out.append(dict(config=n, regime=label, ranks=where.world, nodes=args.nodes or None,
                        ranks_per_node=bench.rpn, reshard=str(reshard_of(n, bench.rpn)) if n != "zero3" else None,
                        params=n_params, layers=args.layers, d_model=args.d_model, seq=args.seq, batch=args.batch,
                        weight_bits=args.weight_bits, grad_bits=args.grad_bits, block_size=args.block_size,
                        grad_block_size=args.grad_block_size or args.block_size, rounds=args.rounds,
                        warmup=args.warmup, **steps, tokens_per_s=tokens / (steps["median_ms"] / 1e3),
                        peak_mib=rows[n]["peak"] / 2**20,
                        sent_mib={k: v / 2**20 for k, v in rows[n].get("sent", {}).items()},
                        calls=rows[n].get("calls"), enable_mib=rows[n].get("enable_bytes", 0) / 2**20,
                        staging_mib=rows[n].get("staging_bytes", 0) / 2**20))
    return out


def step_summary(per_rank_ms: list[list[list[float]]]) -> dict[str, Any]:
    """Step times of one configuration from every rank's, ``per_rank_ms[round][rank][step]`` (ms): a step takes its
    slowest rank's time. Gives ``step_ms_per_rank`` (the input, kept raw), ``step_ms`` (round, step: the max over
    ranks), ``round_median_ms`` (each round's median), and the median, min and max over every step of every
    round (``median_ms``, ``min_ms``, ``max_ms``; ``steps``: how many)."""
    if not per_rank_ms or any(not rnd or any(len(rank) != len(rnd[0]) or not rank for rank in rnd)
                              for rnd in per_rank_ms):
        raise ValueError("step_summary: every round needs every rank's times of the same, non-zero number of steps")
    step_ms = [[max(rank[i] for rank in rnd) for i in range(len(rnd[0]))] for rnd in per_rank_ms]
    every = [t for rnd in step_ms for t in rnd]
    return dict(steps=len(every), median_ms=statistics.median(every), min_ms=min(every), max_ms=max(every),
                round_median_ms=[statistics.median(rnd) for rnd in step_ms], step_ms=step_ms,
                step_ms_per_rank=per_rank_ms)


def ratio_of(base: dict[str, Any], row: dict[str, Any]) -> tuple[float, float | None, float | None]:
    """``base``'s step time over ``row``'s: the ratio of their medians, and the least and greatest of the rounds'
    own ratios (each round's median of ``base`` over ``row``'s in the same round; None without rounds)."""
    ratio = base["median_ms"] / row["median_ms"]
    a, b = base.get("round_median_ms") or [], row.get("round_median_ms") or []
    if not a or len(a) != len(b):
        return ratio, None, None
    per_round = [x / y for x, y in zip(a, b)]
    return ratio, min(per_round), max(per_round)


def write_json(path: pathlib.Path, doc: dict[str, Any]) -> None:
    """Writes through a temporary file and a rename, so that a run killed mid-write leaves the previous file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


# ---- the report ---------------------------------------------------------------------------------------------


def run_label(x: dict[str, Any]) -> str:
    """A loss run as the report names it: ``nccl``, ``nccl-noreshard``, ``zpccl w8/g4`` (bf16: left on FSDP's)."""
    if x["comm"] != "zpccl":
        return x.get("spec", x["comm"])
    if x["grad_bits"] is None:
        return "zpccl"
    bits = lambda b: "bf16" if b == 0 else str(b)  # noqa: E731
    return f"zpccl w{bits(x['weight_bits'])}/g{bits(x['grad_bits'])}"


def _spread(values: list[float]) -> dict[str, float]:
    return dict(mean=statistics.fmean(values), std=statistics.stdev(values) if len(values) > 1 else 0.0,
                min=min(values), max=max(values))


def loss_summary(losses: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per loss run (in first-seen order): its seeds, the validation and last-steps training loss over them
    (mean, sample standard deviation, min, max), and the paired gap to the reference's validation loss in percent,
    seed by seed (``gap_pct``: mean, min, max over the seeds both ran, and each seed's). The reference is the first
    NCCL run (``nccl`` or ``nccl-noreshard``), else the first run."""
    if not losses:
        return []
    specs = list(dict.fromkeys(x.get("spec", x["comm"]) for x in losses))
    ref = next((x.get("spec", x["comm"]) for x in losses if x["comm"] == "nccl"), specs[0])
    ref_valid = {x.get("seed"): x["valid"] for x in losses if x.get("spec", x["comm"]) == ref}
    out = []
    for spec in specs:
        mine = [x for x in losses if x.get("spec", x["comm"]) == spec]
        gaps = {x.get("seed"): 100 * (x["valid"] - ref_valid[x.get("seed")]) / ref_valid[x.get("seed")]
                for x in mine if x.get("seed") in ref_valid}
        row = dict(spec=spec, label=run_label(mine[0]), reference=ref, seeds=[x.get("seed") for x in mine],
                   valid=_spread([x["valid"] for x in mine]),
                   train_tail=_spread([x["train_tail"] for x in mine]) if all("train_tail" in x for x in mine)
                   else None,
                   gap_pct=dict(_spread(list(gaps.values())), per_seed=gaps) if gaps else None)
        out.append(row)
    return out


def report(rows: list[dict[str, Any]], losses: list[dict[str, Any]]) -> None:
    if rows:
        report_steps(rows)
    if losses:
        report_losses(losses)


def report_steps(rows: list[dict[str, Any]]) -> None:
    """One line per configuration; "vs" columns: the ratio of medians, and in brackets the least and greatest of
    the rounds' own ratios."""
    base = {r["config"]: r for r in rows}

    def vs(name: str, r: dict[str, Any]) -> str:
        if name not in base:
            return "-"
        ratio, lo, hi = ratio_of(base[name], r)
        return f"{ratio:.2f}x" + (f" ({lo:.2f}-{hi:.2f})" if lo is not None else "")

    print(f"\n{'config':>15} {'reshard':>7} {'median ms':>10} {'min-max ms':>15} {'tokens/s':>10} {'peak MiB':>9} "
          f"{'enable MiB':>10} {'sent MiB/step (per rank)':>30} {'vs nccl':>18} {'vs noreshard':>18} "
          f"{'vs 2comm':>18}")
    for r in rows:
        sent = ", ".join(f"{k} {v:.0f}" for k, v in sorted(r["sent_mib"].items()))
        print(f"{r['config']:>15} {str(r['reshard']):>7} {r['median_ms']:10.1f} "
              f"{r['min_ms']:7.1f}-{r['max_ms']:<7.1f} {r['tokens_per_s']:10.0f} {r['peak_mib']:9.0f} "
              f"{r['enable_mib']:10.0f} {sent:>30} {vs('nccl', r):>18} {vs('nccl-noreshard', r):>18} "
              f"{vs('nccl-2comm', r):>18}")
    print("(a step's time is its slowest rank's; ratios: medians, in brackets the rounds' least and greatest)")


def report_losses(losses: list[dict[str, Any]]) -> None:
    """Each seed's line (vs that seed's reference), then, with several seeds, the summary over seeds."""
    summary = loss_summary(losses)
    ref = summary[0]["reference"]
    seeds = list(dict.fromkeys(x.get("seed") for x in losses))
    for seed in seeds:
        mine = [x for x in losses if x.get("seed") == seed]
        base = next((x["valid"] for x in mine if x.get("spec", x["comm"]) == ref), None)
        vs = lambda v: "" if base is None else f" ({100 * (v - base) / base:+.2f}%)"  # noqa: E731
        where = "" if len(seeds) == 1 else f", seed {seed}"
        print(f"\nvalidation loss after {mine[0]['steps']} steps{where} (vs NCCL's): " + "; ".join(
            f"{run_label(x)} {x['valid']:.4f}{vs(x['valid'])}" for x in mine), end="")
    over = ("seeds " + ",".join(str(s) for s in seeds)) if None not in seeds else "the runs"
    print(f"\n\nover {over} (gap: validation loss vs {ref}'s of the same seed)")
    print(f"{'run':>18} {'seeds':>5} {'valid mean':>10} {'std':>7} {'min-max':>15} {'gap mean':>9} "
          f"{'gap min..max':>16} {'train (last steps)':>18}")
    for r in summary:
        v, g, t = r["valid"], r["gap_pct"], r["train_tail"]
        gap = (f"{g['mean']:+8.2f}% {g['min']:+6.2f}..{g['max']:+6.2f}%" if g else f"{'-':>9} {'-':>16}")
        train = f"{t['mean']:.4f} +- {t['std']:.4f}" if t else "-"
        print(f"{r['label']:>18} {len(r['seeds']):5d} {v['mean']:10.4f} {v['std']:7.4f} "
              f"{v['min']:7.4f}-{v['max']:<7.4f} {gap} {train:>18}")


if __name__ == "__main__":
    ex.launch(main, parse_args())
