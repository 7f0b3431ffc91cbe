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
its slowest rank's time (perf/step_protocol.py: the protocol, arguments and summaries of perf/fsdp_step.py's);
the raw times of every rank, round and step go in the JSON. The report gives each configuration's median step time
with its spread, tokens per second, and its ratio to ``nccl`` and to ``bf16-compress`` (ratios of medians, in
brackets the rounds' least and greatest own ratios). ``--loss-steps N`` trains each loss run N steps per seed
(``--loss-seeds``, seed-major) from the same initialization and batches, with a warmup and cosine learning rate and
gradient clipping, and reports the validation loss and its paired gap to ``nccl``'s. JSON (``-J``, rewritten after
every loss run): the run's provenance (perf/provenance.py), the rows, the order the rounds ran in, the loss runs and
their summary.

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

ex = sp.load_example("fsdp2_train")
CONFIGS = ("nccl", "bf16-compress", "powersgd", "zpccl")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ex.add_model_args(p)
    ex.add_launch_args(p)
    sp.add_protocol_args(p, CONFIGS, None, "the loss runs, configurations by name (default: --configs)")
    ex.add_quant_args(p, ("grad_bits", "block_size", "grad_block_size"),
                      helps={"grad_bits": "zpccl: zpQuantAllReduce's code bits, 4 or 8"})
    p.add_argument("--powersgd-rank", type=int, default=1, help="PowerSGD's matrix approximation rank")
    p.add_argument("--powersgd-start", type=int, default=2,
                   help="PowerSGD's start_powerSGD_iter: vanilla all-reduce before it (at least 2: warm start)")
    p.add_argument("--lr-final", type=float, default=0.1, help="loss runs: the last step's learning rate / --lr")
    args = p.parse_args(argv)
    sp.check_protocol_args(p, args, CONFIGS, parse_loss_spec)
    if args.powersgd_start < 2 or args.powersgd_rank < 1:
        p.error("--powersgd-start must be at least 2 (PowerSGD's warm start), --powersgd-rank at least 1")
    if "powersgd" in args.config_list and not args.loss_only and args.warmup < args.powersgd_start:
        p.error(f"--warmup {args.warmup} < --powersgd-start {args.powersgd_start}: PowerSGD's timed steps would "
                "include its vanilla all-reduces")
    return args


def parse_loss_spec(text: str) -> dict[str, Any]:
    """One ``--loss-runs`` entry, a configuration by name (sp.parse_loss_run). ``comm`` is what
    sp.loss_summary reads: ``nccl`` is the reference; zpccl's hook is ``zpccl-ddp`` (zpccl.fsdp's runs are
    ``zpccl``)."""
    return sp.parse_loss_run(text, {c: "zpccl-ddp" if c == "zpccl" else c for c in CONFIGS})


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        self.args, self.torch = args, torch
        sp.pin_rank(args.rank_cpu_lists)
        if args.cpu:
            self.where: Any = ex.CpuLaunch(args.nodes)
        else:
            self.where = ex.Launch(args.nodes)
        self.where.init()
        self.dist = torch.distributed
        ex.import_zpccl()  # the installed package, or the source tree's
        self.zpccl_ddp = importlib.import_module("zpccl.ddp")
        self.rpn = self.where.ranks_per_node or sp.ranks_per_host(self)
        self.on_device = sp.ranks_on_device(self)

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

        def warmed() -> None:
            if zp is not None:
                zp.report.stats.clear()

        row = sp.timed_steps(self, args, round_index, lambda s: self.step(model, opt, s), warmed)
        if zp is not None:
            calls, sent = sp.zpccl_per_step(zp, args.steps)
            row["calls"], row["sent"] = calls.get("quant_all_reduce", 0), sent.get("quant_all_reduce", 0)
            row["staging_bytes"] = zp.staging_bytes
            zp.close()
        return row

    def loss_run(self, run: dict[str, Any], seed: int) -> dict[str, Any]:
        """Trains a fresh model ``--loss-steps`` steps with the all-reduce of ``run`` (parse_loss_spec), initialized
        and fed by ``seed``."""
        torch, args = self.torch, self.args
        base = ex.build_gpt(torch, args.layers, args.d_model, args.heads, args.seq, seed)
        data = ex.Batches(torch, self.text, args.seq, args.batch, self.where.rank, self.where.device, seed)
        model, zp = self.build(run["config"], base)
        opt, schedule = ex.make_optimizer(torch, model, args.lr, args.loss_steps, final=args.lr_final)

        def train_step(s: int) -> Any:
            ids, targets = data.step(s)
            loss = self.forward_loss(model, ids, targets)
            loss.backward()
            ex.optimizer_step(torch, model, opt, schedule)
            return loss

        trained = sp.train_for_loss(self, args.loss_steps, train_step, args.loss_stop)
        with torch.no_grad():
            batches = data.validation()
            valid = sum(self.forward_loss(model, i, t).detach().float() for i, t in batches) / len(batches)
        calls = None
        if zp is not None:
            calls = zp.summary().get("quant_all_reduce", {}).get("calls", 0)
            zp.close()
        return dict(spec=run["spec"], comm=run["comm"], seed=seed, steps=args.loss_steps,
                    valid=sp.mean_over_ranks(self, valid), zpccl_calls=calls, **trained)


def main(args: argparse.Namespace) -> None:
    bench = Bench(args)
    names, label, say = sp.run_setup(bench, args)
    n_params = sum(p.numel() for p in bench.base.parameters())
    sp.say_layout(say, "DDP step", bench, args, n_params, weights=False)
    rows: list[dict[str, Any]] = []
    order: list[list[Any]] = []
    if names:
        raw: dict[str, dict[str, Any]] = {n: {} for n in names}
        order = sp.alternate_rounds(raw, args.rounds, bench.run, say)
        sp.trace_round(bench, args, names, bench.run, label, say)
        rows = [dict(sp.timed_fields(n, raw[n], args, bench.where, label, n_params),
                     grad_bits=args.grad_bits if n == "zpccl" else None, zpccl_calls=raw[n].get("calls"),
                     zpccl_sent_mib=raw[n]["sent"] / 2**20 if "sent" in raw[n] else None,
                     staging_mib=raw[n].get("staging_bytes", 0) / 2**20, grad_mib=4 * n_params / 2**20)
                for n in names]
    sp.finish(bench, args, label, say, rows, bench.loss_run, report, order=order, params=n_params,
              grad_bits=args.grad_bits)


def report(rows: list[dict[str, Any]], losses: list[dict[str, Any]]) -> None:
    """One line per configuration: median step and spread, tokens/s, and the ratios to nccl and bf16-compress; then
    the loss runs (fsdp_step's report)."""
    if rows:
        print(f"\n{'config':>14} {'median ms':>10} {'min-max ms':>17} {'tokens/s':>10} {'peak MiB':>9} "
              f"{'zpccl sent MiB':>14} {'vs nccl':>18} {'vs bf16-compress':>18}")
        for r in rows:
            sent = "-" if r["zpccl_sent_mib"] is None else f"{r['zpccl_sent_mib']:.1f}"
            print(f"{r['config']:>14} {r['median_ms']:10.1f} {r['min_ms']:8.1f}-{r['max_ms']:<8.1f} "
                  f"{r['tokens_per_s']:10.0f} {r['peak_mib']:9.0f} {sent:>14} {sp.vs_cell(rows, 'nccl', r):>18} "
                  f"{sp.vs_cell(rows, 'bf16-compress', r):>18}")
        print(sp.STEP_NOTE)
    if losses:
        fsdp_step.report_losses(losses)


if __name__ == "__main__":
    ex.launch(main, parse_args())
