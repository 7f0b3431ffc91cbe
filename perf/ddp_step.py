#!/usr/bin/env python3
"""DDP training step: DDP's own all-reduce, torch's bf16_compress_hook, PowerSGD and zpccl's quantized all-reduce
hook (zpccl.ddp), same model as one replica per rank, same process, alternating rounds.

    python perf/ddp_step.py --nproc 2 --nodes 2 -J perf/results/ddp.json          # one GPU: two "nodes"
    python perf/ddp_step.py --nproc 2 --nodes 2 --loss-only --loss-steps 400 --loss-seeds 0,1,2 -J ...
    python perf/ddp_step.py --cpu --nproc 2 --layers 1 --d-model 32 --heads 2 --seq 16 --batch 2   # smoke test

Configurations (``--configs``, each also a loss run in ``--loss-runs``):

===============  ==============================================================================================
nccl             DDP's own all-reduce (NCCL; gloo with ``--cpu``), fp32 buckets
bf16-compress    torch's ``bf16_compress_hook``: buckets cast to bf16, all-reduced, cast back
powersgd         torch's PowerSGD hook (rank ``--powersgd-rank``, error feedback and warm start, vanilla
                 all-reduce for the first ``--powersgd-start`` steps of a model)
zpccl            ``zpccl.ddp.enable``: zpQuantAllReduce, ``--grad-bits`` codes in blocks of ``--block-size``
                 (``--grad-block-size``), blocks restarting at each parameter
===============  ==============================================================================================

Each of ``--rounds`` rounds (default 5) runs every configuration in turn on a fresh copy of the model: ``--warmup``
steps, then ``--steps`` timed ones (CUDA synchronized around each). Every rank times its own steps; a step takes
its slowest rank's time (perf/step_protocol.py, whose summaries this reuses); the raw times of every rank,
round and step go in the JSON. The report gives each configuration's median step time with its spread, tokens per
second, and its ratio to ``nccl`` and to ``bf16-compress`` (ratios of medians, in brackets the rounds' least and
greatest own ratios). ``--loss-steps N`` trains each loss run N steps per seed (``--loss-seeds``, seed-major) from
the same initialization and batches, with a warmup and cosine learning rate and gradient clipping, and reports the
validation loss and its paired gap to ``nccl``'s. JSON (``-J``): the run's provenance (perf/provenance.py), the
rows, the order the rounds ran in, the loss runs and their summary.

On GPUs, ``--nodes N`` emulates N nodes over sockets (as perf/fsdp_step.py); bf16 autocast computes the forward.
``--cpu``: gloo process groups, fp32, the host backend for zpccl (a smoke test of the protocol; its times say
nothing about a network).
"""
from __future__ import annotations

import argparse
import copy
import importlib
import pathlib
import sys
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
import fsdp_step  # noqa: E402  (the FSDP2 step's loss report)
import step_protocol as sp  # noqa: E402  (the step protocol shared with the FSDP2 and DeepSpeed steps)
from provenance import provenance  # noqa: E402

ex = sp.load_example("fsdp2_train")
CONFIGS = ("nccl", "bf16-compress", "powersgd", "zpccl")
TRAIN_TAIL = sp.TRAIN_TAIL


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ex.add_model_args(p)
    ex.add_launch_args(p)
    p.add_argument("--cpu", action="store_true", help="gloo process groups on CPUs (zpccl: the host backend)")
    p.add_argument("--configs", default=",".join(CONFIGS), help="the timed configurations, in round order")
    p.add_argument("--rounds", type=int, default=5,
                   help="alternating rounds of every configuration (at least 5 for a comparison: DESIGN.md)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per configuration and round")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--loss-steps", type=int, default=0, help="also train this many steps per loss run")
    p.add_argument("--loss-runs", default=None, help="the loss runs, configurations by name (default: --configs)")
    p.add_argument("--loss-seeds", default=None, help="comma-separated seeds, each loss run once per seed")
    p.add_argument("--loss-only", action="store_true", help="skip the timed rounds: only the loss runs")
    p.add_argument("--grad-bits", type=int, default=4)
    p.add_argument("--block-size", type=int, default=256)
    p.add_argument("--grad-block-size", type=int, default=None)
    p.add_argument("--powersgd-rank", type=int, default=1, help="PowerSGD's matrix approximation rank")
    p.add_argument("--powersgd-start", type=int, default=2,
                   help="PowerSGD's start_powerSGD_iter: vanilla all-reduce before it (at least 2: warm start)")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--lr-final", type=float, default=0.1, help="loss runs: the last step's learning rate / --lr")
    p.add_argument("-J", "--json", help="write the rows here")
    p.add_argument("--label", default="", help="regime label (default: from the layout)")
    args = p.parse_args(argv)
    args.config_list = _names(p, args.configs, "--configs")
    args.loss_list = _names(p, args.loss_runs, "--loss-runs") if args.loss_runs else args.config_list
    try:
        args.seeds = sp.parse_seeds(args.loss_seeds, args.seed)
    except ValueError as e:
        p.error(str(e))
    if args.loss_only and not args.loss_steps:
        p.error("--loss-only needs --loss-steps")
    if args.rounds < 1 or args.steps < 1 or args.warmup < 0 or args.loss_steps < 0:
        p.error("--rounds and --steps must be at least 1, --warmup and --loss-steps at least 0")
    if args.powersgd_start < 2 or args.powersgd_rank < 1:
        p.error("--powersgd-start must be at least 2 (PowerSGD's warm start), --powersgd-rank at least 1")
    if "powersgd" in args.config_list and not args.loss_only and args.warmup < args.powersgd_start:
        p.error(f"--warmup {args.warmup} < --powersgd-start {args.powersgd_start}: PowerSGD's timed steps would "
                "include its vanilla all-reduces")
    if args.nodes and args.nproc % args.nodes:
        p.error(f"--nodes {args.nodes} does not divide --nproc {args.nproc}")
    return args


def _names(p: argparse.ArgumentParser, text: str, flag: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown or not names or len(set(names)) != len(names):
        p.error(f"{flag} {text!r}: distinct names of {', '.join(CONFIGS)}")
    return names


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        self.args, self.torch = args, torch
        if args.cpu:
            self.where: Any = ex.CpuLaunch(args.nodes)
        else:
            self.where = ex.Launch(args.nodes)
        self.where.init()
        self.dist = torch.distributed
        ex.import_zpccl()  # the installed package, or the source tree's
        self.zpccl_ddp = importlib.import_module("zpccl.ddp")

        self.text = ex.corpus()
        self.base = ex.build_gpt(torch, args.layers, args.d_model, args.heads, args.seq, args.seed)
        self.data = ex.Batches(torch, self.text, args.seq, args.batch, self.where.rank, self.where.device, args.seed)

    def build(self, config: str, base: Any = None) -> tuple[Any, Any]:
        """A fresh DDP model of ``base`` (default: the benchmark's) with ``config``'s hook; and zpccl's state."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
        from torch.nn.parallel import DistributedDataParallel as DDP

        args = self.args
        module = copy.deepcopy(self.base if base is None else base).to(self.where.device)
        model = DDP(module, device_ids=[self.where.device] if sp.on_cuda(self) else None)
        zp = None
        if config == "bf16-compress":
            model.register_comm_hook(None, default_hooks.bf16_compress_hook)
        elif config == "powersgd":
            state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=args.powersgd_rank,
                                                start_powerSGD_iter=args.powersgd_start)
            model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        elif config == "zpccl":
            zp = self.zpccl_ddp.enable(model, grad_bits=args.grad_bits, block_size=args.block_size,
                                       grad_block_size=args.grad_block_size,
                                       ranks_per_node=self.where.ranks_per_node)
        return model, zp

    def forward_loss(self, model: Any, ids: Any, targets: Any) -> Any:
        if sp.on_cuda(self):
            with self.torch.autocast("cuda", dtype=self.torch.bfloat16):
                return ex.loss_of(self.torch, model, ids, targets)
        return ex.loss_of(self.torch, model, ids, targets)

    def step(self, model: Any, opt: Any, step: int) -> float:
        ids, targets = self.data.step(step)
        sp.synchronize(self)
        t0 = time.perf_counter()
        loss = self.forward_loss(model, ids, targets)
        loss.backward()
        opt.step()
        opt.zero_grad()
        sp.synchronize(self)
        return time.perf_counter() - t0

    def run(self, config: str, round_index: int) -> dict[str, Any]:
        torch, args = self.torch, self.args
        sp.fresh_peak(self)
        model, zp = self.build(config)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
        times = []
        for s in range(args.warmup + args.steps):
            if s == args.warmup and zp is not None:
                zp.report.stats.clear()
            t = self.step(model, opt, round_index * 1000 + s)
            if s >= args.warmup:
                times.append(t)
        row: dict[str, Any] = dict(times=sp.every_rank(self, times), peak=sp.peak_memory(self))
        if zp is not None:
            summary = zp.summary().get("quant_all_reduce", dict(calls=0, wire_bytes=0))
            row["calls"] = summary["calls"] // args.steps
            row["sent"] = summary["wire_bytes"] // args.steps
            row["staging_bytes"] = zp.staging_bytes
            zp.close()
        del model, opt
        return row

    def mean_over_ranks(self, value: Any) -> float:
        total = value.detach().clone().float()
        self.dist.all_reduce(total)  # gloo has no AVG
        return float(total) / self.where.world

    def loss_run(self, config: str, seed: int) -> dict[str, Any]:
        """Trains a fresh model ``--loss-steps`` steps with ``config``'s all-reduce, initialized and fed by
        ``seed``."""
        torch, args = self.torch, self.args
        base = ex.build_gpt(torch, args.layers, args.d_model, args.heads, args.seq, seed)
        data = ex.Batches(torch, self.text, args.seq, args.batch, self.where.rank, self.where.device, seed)
        model, zp = self.build(config, base)
        opt, schedule = ex.make_optimizer(torch, model, args.lr, args.loss_steps, final=args.lr_final)
        tail_from = max(0, args.loss_steps - TRAIN_TAIL)
        tail = torch.zeros((), device=self.where.device)
        curve = []
        for s in range(args.loss_steps):
            ids, targets = data.step(s)
            loss = self.forward_loss(model, ids, targets)
            loss.backward()
            ex.optimizer_step(torch, model, opt, schedule)
            if s >= tail_from:
                tail += loss.detach().float()
            if s % 10 == 0 or s == args.loss_steps - 1:
                curve.append((s, self.mean_over_ranks(loss)))
        with torch.no_grad():
            batches = data.validation()
            valid = sum(self.forward_loss(model, i, t).detach().float() for i, t in batches) / len(batches)
        calls = None
        if zp is not None:
            calls = zp.summary().get("quant_all_reduce", {}).get("calls", 0)
            zp.close()
        # comm: what step_protocol.loss_summary reads ("nccl" is the reference; zpccl.fsdp's label is "zpccl").
        comm = "zpccl-ddp" if config == "zpccl" else config
        return dict(spec=config, comm=comm, seed=seed, steps=args.loss_steps, valid=self.mean_over_ranks(valid),
                    train_tail=self.mean_over_ranks(tail) / max(1, args.loss_steps - tail_from),
                    train_tail_steps=args.loss_steps - tail_from, zpccl_calls=calls, curve=curve)


def main(args: argparse.Namespace) -> None:
    bench = Bench(args)
    torch, where = bench.torch, bench.where
    names, label, say = sp.run_setup(bench, args)
    n_params = sum(p.numel() for p in bench.base.parameters())
    say(f"# DDP step: {where.world} ranks ({f'{args.nodes} nodes, ' if args.nodes else ''}"
        f"{'CPU, gloo' if args.cpu else 'CUDA'}), {n_params / 1e6:.2f}M parameters, {args.layers} layers d "
        f"{args.d_model}, {args.batch} x {args.seq} tokens per rank; configs {','.join(names) or '-'}; zpccl "
        f"int{args.grad_bits} in blocks of {args.grad_block_size or args.block_size}", flush=True)
    record = provenance(label) if where.rank == 0 else None
    rows: list[dict[str, Any]] = []
    order: list[list[Any]] = []
    losses: list[dict[str, Any]] = []

    def save() -> None:
        if where.rank == 0 and args.json:
            sp.write_json(pathlib.Path(args.json), dict(
                provenance=record, rows=rows, order=order, losses=losses,
                loss_summary=sp.loss_summary(losses), loss_seeds=args.seeds, loss_runs=args.loss_list,
                regime=label, ranks=where.world, nodes=args.nodes or None, params=n_params, grad_bits=args.grad_bits,
                block_size=args.block_size, grad_block_size=args.grad_block_size or args.block_size, lr=args.lr))

    if names:
        raw: dict[str, dict[str, Any]] = {n: dict(per_rank=[], peak=0) for n in names}
        t_start = time.perf_counter()
        for r in range(args.rounds):
            for n in names:
                got = bench.run(n, r)
                order.append([r, n])
                raw[n]["per_rank"].append(got.pop("times"))
                raw[n]["peak"] = max(raw[n]["peak"], got.pop("peak"))
                raw[n].update(got)
            say(f"#   round {r + 1}/{args.rounds} done ({time.perf_counter() - t_start:.0f} s)", flush=True)
        tokens = where.world * args.batch * args.seq
        for n in names:
            steps = sp.step_summary([[[1e3 * t for t in rank] for rank in rnd] for rnd in raw[n]["per_rank"]])
            rows.append(dict(config=n, regime=label, ranks=where.world, nodes=args.nodes or None, params=n_params,
                             layers=args.layers, d_model=args.d_model, seq=args.seq, batch=args.batch,
                             grad_bits=args.grad_bits if n == "zpccl" else None, rounds=args.rounds,
                             warmup=args.warmup, **steps, tokens_per_s=tokens / (steps["median_ms"] / 1e3),
                             peak_mib=raw[n]["peak"] / 2**20, zpccl_calls=raw[n].get("calls"),
                             zpccl_sent_mib=raw[n]["sent"] / 2**20 if "sent" in raw[n] else None,
                             staging_mib=raw[n].get("staging_bytes", 0) / 2**20,
                             grad_mib=4 * n_params / 2**20))
        save()
    for seed in args.seeds if args.loss_steps else []:
        for n in args.loss_list:
            x = bench.loss_run(n, seed)
            losses.append(x)
            say(f"#   loss {n} seed {seed}: validation {x['valid']:.4f}, training (last {x['train_tail_steps']}) "
                f"{x['train_tail']:.4f}", flush=True)
            save()
    save()
    if where.rank == 0:
        report(rows)
        if losses:
            fsdp_step.report_losses(losses)
    torch.distributed.destroy_process_group()


def report(rows: list[dict[str, Any]]) -> None:
    """One line per configuration: median step and spread, tokens/s, and the ratios to nccl and bf16-compress."""
    if not rows:
        return
    base = {r["config"]: r for r in rows}

    def vs(name: str, r: dict[str, Any]) -> str:
        if name not in base:
            return "-"
        ratio, lo, hi = sp.ratio_of(base[name], r)
        return f"{ratio:.2f}x" + (f" ({lo:.2f}-{hi:.2f})" if lo is not None else "")

    print(f"\n{'config':>14} {'median ms':>10} {'min-max ms':>17} {'tokens/s':>10} {'peak MiB':>9} "
          f"{'zpccl sent MiB':>14} {'vs nccl':>18} {'vs bf16-compress':>18}")
    for r in rows:
        sent = "-" if r["zpccl_sent_mib"] is None else f"{r['zpccl_sent_mib']:.1f}"
        print(f"{r['config']:>14} {r['median_ms']:10.1f} {r['min_ms']:8.1f}-{r['max_ms']:<8.1f} "
              f"{r['tokens_per_s']:10.0f} {r['peak_mib']:9.0f} {sent:>14} {vs('nccl', r):>18} "
              f"{vs('bf16-compress', r):>18}")
    print("(a step's time is its slowest rank's; ratios: medians, in brackets the rounds' least and greatest)")


if __name__ == "__main__":
    ex.launch(main, parse_args())
