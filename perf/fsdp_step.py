#!/usr/bin/env python3
"""FSDP2 training step: FSDP2 with NCCL against FSDP2 with zpccl (and the hand-rolled ZeRO-3 example), same model,
same process, alternating rounds.

    python perf/fsdp_step.py --nproc 2 --nodes 2 -J perf/results/fsdp.json       # one GPU: two "nodes"
    python perf/fsdp_step.py --nproc 4 --nodes 2 --configs nccl,zpccl-hpz        # two nodes of two

Each round runs every configuration in turn on a freshly built and sharded model (so that each one's peak memory
is its own): ``--warmup`` steps, then ``--steps`` timed ones (CUDA synchronized around each). Per configuration:
step time median and spread (min/max over all rounds' steps), tokens per second (all ranks), peak memory per rank
(torch's allocator), the bytes each collective sent from a rank per step, and for zpccl the device memory its
``enable`` took (communicators and scratch, outside torch's allocator). ``--loss-steps N`` then trains NCCL and
zpccl (int8 weights with int4 and with int8 gradients) for N steps each and reports the validation loss.
Configurations:

=================  ==========================================================================================
nccl               FSDP2's own collectives, ``reshard_after_forward=True`` (backward regathers over the shard
                   group)
nccl-noreshard     FSDP2's own collectives, ``reshard_after_forward=False`` (full weights kept to backward)
zpccl-hpz          zpccl, ``reshard_after_forward=k`` with k the ranks per node (hpZ); with one rank per node,
                   ``False`` (the hpZ group is the rank itself: same memory as nccl-noreshard)
zpccl-reshard      zpccl, ``reshard_after_forward=True`` (qwZ in backward too: nccl's memory)
zero3              ``tools/python/examples/zero3_train.py``'s hand-rolled ZeRO-3 loop on zpccl (same shape)
=================  ==========================================================================================

Bytes: NCCL's are counted in a short untimed pass whose hooks count and then call FSDP's own collectives;
zpccl's come from its counters (``(n - 1)`` copies of a rank's payloads). JSON (``-J``): one row per configuration
with every figure, and the loss runs.
"""
from __future__ import annotations

import argparse
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
    p.add_argument("--configs", default="nccl,nccl-noreshard,zpccl-hpz,zpccl-reshard,zero3")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=10, help="timed steps per configuration and round")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--loss-steps", type=int, default=0, help="also train this many steps per loss run")
    p.add_argument("--loss-runs", default="nccl,zpccl:8:4,zpccl:8:8",
                   help="the loss runs, in order: nccl, or zpccl:WEIGHT_BITS:GRAD_BITS")
    p.add_argument("--weight-bits", type=int, default=8)
    p.add_argument("--grad-bits", type=int, default=4)
    p.add_argument("--block-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("-J", "--json", help="write the rows here")
    p.add_argument("--label", default="", help="regime label for the rows (default: from the layout)")
    args = p.parse_args(argv)
    if args.shape:
        args.layers, args.d_model, args.heads, args.seq, args.batch = SHAPES[args.shape]
    return args


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
    if name == "nccl-noreshard":
        return False
    return ranks_per_node if ranks_per_node > 1 else False


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        self.args, self.torch = args, torch
        self.where = ex.Launch(args.nodes)
        self.mesh = self.where.init()
        self.dist = torch.distributed
        self.zpccl = ex.import_zpccl()
        self.rpn = self.where.ranks_per_node or self._ranks_per_host()
        self.data = ex.Batches(torch, ex.corpus(), args.seq, args.batch, self.where.rank, self.where.device)
        self.base = ex.build_gpt(torch, args.layers, args.d_model, args.heads, args.seq, args.seed)
        self.on_device = self._ranks_on_device()

    def _ranks_per_host(self) -> int:
        import socket

        names: list[Any] = [None] * self.where.world
        self.dist.all_gather_object(names, socket.gethostname())
        return names.count(names[self.where.rank])

    def _ranks_on_device(self) -> int:
        devs: list[Any] = [None] * self.where.world
        self.dist.all_gather_object(devs, (os.environ.get("NCCL_HOSTID", ""), self.where.device.index))
        return sum(1 for d in devs if d[1] == self.where.device.index)

    def build(self, reshard: bool | int) -> Any:
        import copy

        model = copy.deepcopy(self.base).to(self.where.device)
        return ex.shard_gpt(self.torch, model, self.mesh, reshard)

    def enable(self, model: Any, grad_bits: int | None = None, weight_bits: int | None = None) -> tuple[Any, int]:
        """zpccl on the model; also the device memory the enable took on this rank (device-wide free memory
        before and after, between barriers, shared among the ranks on this device)."""
        torch = self.torch
        torch.cuda.synchronize()
        self.dist.barrier()
        free_before = torch.cuda.mem_get_info(self.where.device)[0]
        zp = self.zpccl.fsdp.enable(model, weight_bits=weight_bits or self.args.weight_bits,
                                    grad_bits=grad_bits or self.args.grad_bits, block_size=self.args.block_size,
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

    def run_fsdp(self, name: str, round_index: int) -> dict[str, Any]:
        torch, args = self.torch, self.args
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.where.device)
        model = self.build(reshard_of(name, self.rpn))
        zp, enable_bytes = self.enable(model) if name.startswith("zpccl") else (None, 0)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
        times = []
        for s in range(args.warmup + args.steps):
            if s == args.warmup and zp is not None:
                zp.reset_stats()
            t = self.step(model, opt, round_index * 1000 + s)
            if s >= args.warmup:
                times.append(t)
        row = dict(times=times, peak=torch.cuda.max_memory_allocated(self.where.device))
        if zp is not None:
            row["sent"] = {k: v["wire_bytes"] // args.steps for k, v in zp.summary().items()}
            row["calls"] = {k: v["calls"] // args.steps for k, v in zp.summary().items()}
            row["enable_bytes"] = enable_bytes
            row["staging_bytes"] = zp.reserved_bytes
            zp.disable()
        del model, opt
        return row

    def run_zero3(self, round_index: int) -> dict[str, Any]:
        torch, args = self.torch, self.args
        z3 = load_example("zero3_train")
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
        return dict(times=times[args.warmup:], peak=torch.cuda.max_memory_allocated(self.where.device))

    def loss_run(self, spec: str) -> dict[str, Any]:
        """Trains a fresh model ``--loss-steps`` steps: ``nccl``, or ``zpccl:W:G`` (weight and gradient bits),
        with the example's warmup and gradient clipping (make_optimizer, optimizer_step)."""
        torch, args = self.torch, self.args
        comm, *bits = spec.split(":")
        weight_bits, grad_bits = (int(b) for b in bits) if bits else (None, None)
        model = self.build(reshard_of("zpccl-hpz" if comm == "zpccl" else "nccl", self.rpn))
        zp = self.enable(model, grad_bits, weight_bits)[0] if comm == "zpccl" else None
        opt, schedule = ex.make_optimizer(torch, model, args.lr, args.loss_steps)
        curve = []
        for s in range(args.loss_steps):
            ids, targets = self.data.step(s)
            loss = ex.loss_of(torch, model, ids, targets)
            loss.backward()
            ex.optimizer_step(torch, model, opt, schedule)
            if s % 10 == 0 or s == args.loss_steps - 1:
                mean = loss.detach().clone()
                self.dist.all_reduce(mean, op=self.dist.ReduceOp.AVG)
                curve.append((s, float(mean)))
        valid = ex.validation_loss(torch, model, self.data.validation())
        if zp is not None:
            zp.disable()
        return dict(comm=comm, weight_bits=weight_bits, grad_bits=grad_bits, steps=args.loss_steps, valid=valid,
                    curve=curve)


# ---- the run -------------------------------------------------------------------------------------------------


def main(args: argparse.Namespace) -> None:
    bench = Bench(args)
    torch, where = bench.torch, bench.where
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    label = args.label or (f"net-on{torch.cuda.device_count()}gpu" if args.nodes else "local")
    say = print if where.rank == 0 else (lambda *a, **k: None)
    n_params = sum(p.numel() for p in bench.base.parameters())
    say(f"# FSDP2 step: {where.world} ranks ({f'{args.nodes} nodes over sockets, ' if args.nodes else ''}"
        f"{bench.rpn} a node, {bench.on_device} a GPU), {n_params / 1e6:.1f}M parameters, "
        f"{args.layers} layers d {args.d_model}, {args.batch} x {args.seq} tokens per rank; {args.rounds} rounds of "
        f"{args.warmup}+{args.steps} steps; zpccl int{args.weight_bits} weights, int{args.grad_bits} gradients, "
        f"blocks of {args.block_size}", flush=True)
    rows: dict[str, dict[str, Any]] = {n: dict(times=[], peak=0) for n in names}
    for n in names:
        if n.startswith("nccl"):
            rows[n]["sent"] = bench.nccl_bytes(n)
    t_start = time.perf_counter()
    for r in range(args.rounds):
        for n in names:
            got = bench.run_zero3(r) if n == "zero3" else bench.run_fsdp(n, r)
            row = rows[n]
            row["times"] += got.pop("times")
            row["peak"] = max(row["peak"], got.pop("peak"))
            row.update(got)
        say(f"#   round {r + 1}/{args.rounds} done ({time.perf_counter() - t_start:.0f} s)", flush=True)
    tokens = where.world * args.batch * args.seq
    out = []
    for n in names:
        t = rows[n]["times"]
        med = statistics.median(t)
        out.append(dict(config=n, regime=label, ranks=where.world, nodes=args.nodes or None,
                        ranks_per_node=bench.rpn, reshard=str(reshard_of(n, bench.rpn)) if n != "zero3" else None,
                        params=n_params, layers=args.layers, d_model=args.d_model, seq=args.seq, batch=args.batch,
                        weight_bits=args.weight_bits, grad_bits=args.grad_bits, block_size=args.block_size,
                        steps=len(t), median_ms=1e3 * med, min_ms=1e3 * min(t), max_ms=1e3 * max(t),
                        tokens_per_s=tokens / med, peak_mib=rows[n]["peak"] / 2**20,
                        sent_mib={k: v / 2**20 for k, v in rows[n].get("sent", {}).items()},
                        calls=rows[n].get("calls"), enable_mib=rows[n].get("enable_bytes", 0) / 2**20,
                        staging_mib=rows[n].get("staging_bytes", 0) / 2**20))
    losses = [bench.loss_run(spec.strip()) for spec in args.loss_runs.split(",")] if args.loss_steps else []
    if where.rank == 0:
        report(out, losses)
        if args.json:
            path = pathlib.Path(args.json)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(dict(rows=out, losses=losses, torch=torch.__version__,
                                            zpccl=bench.zpccl.library_path()), indent=1) + "\n")
    torch.distributed.destroy_process_group()


def report(rows: list[dict[str, Any]], losses: list[dict[str, Any]]) -> None:
    base = {r["config"]: r["median_ms"] for r in rows}
    print(f"\n{'config':>15} {'reshard':>7} {'median ms':>10} {'min-max ms':>15} {'tokens/s':>10} {'peak MiB':>9} "
          f"{'enable MiB':>10} {'sent MiB/step (per rank)':>30} {'vs nccl':>8} {'vs noreshard':>12}")
    for r in rows:
        sent = ", ".join(f"{k} {v:.0f}" for k, v in sorted(r["sent_mib"].items()))
        vs = lambda b: f"{base[b] / r['median_ms']:.2f}x" if b in base else "-"  # noqa: E731
        print(f"{r['config']:>15} {str(r['reshard']):>7} {r['median_ms']:10.1f} "
              f"{r['min_ms']:7.1f}-{r['max_ms']:<7.1f} {r['tokens_per_s']:10.0f} {r['peak_mib']:9.0f} "
              f"{r['enable_mib']:10.0f} {sent:>30} {vs('nccl'):>8} {vs('nccl-noreshard'):>12}")
    if losses:
        ref = next((x["valid"] for x in losses if x["comm"] == "nccl"), losses[0]["valid"])
        print("\nvalidation loss after %d steps (vs NCCL's): " % losses[0]["steps"] + "; ".join(
            f"{x['comm']}{'' if x['grad_bits'] is None else ' w%d/g%d' % (x['weight_bits'], x['grad_bits'])} "
            f"{x['valid']:.4f} ({100 * (x['valid'] - ref) / ref:+.2f}%)" for x in losses))


if __name__ == "__main__":
    ex.launch(main, parse_args())
