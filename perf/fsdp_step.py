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
``--loss-only`` skips all that. ``--cpu`` runs it on gloo with zpccl's host backend (every configuration but
zero3): a smoke test of the protocol, whose times say nothing about a GPU's.

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
and its paired gap to NCCL's validation loss. ``-J`` is rewritten after every loss run. ``--loss-stop K`` trains only
the first K steps of the N-step schedule and records every step's loss; ``--start-from-bf16`` starts every run from
the weights rounded to bf16, as DeepSpeed's bf16 mode starts its master copy (together: how FSDP2's curve and
DeepSpeed's part, perf/notebook/accuracy.md).

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
no-comm            nccl-noreshard's sharding with FSDP's collectives replaced by local copies (a gather writes the
                   rank's own shard into every slot, a reduce-scatter keeps the rank's own slice): the step without
                   a network, the floor under every configuration; its weights are not the model's (timing only,
                   no loss run)
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
import pathlib
import sys
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
import machine_state  # noqa: E402  (--cuda-waits block)
import step_protocol as sp  # noqa: E402

ex = sp.load_example("fsdp2_train")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ex.add_model_args(p)
    ex.add_launch_args(p)
    sp.add_protocol_args(p, CONFIGS, "nccl,zpccl:8:4,zpccl:8:8",
                         "the loss runs, in order: nccl, nccl-noreshard, nccl-fp32, zpccl, or "
                         "zpccl:WEIGHT_BITS:GRAD_BITS (bits 4 or 8; 0: that collective stays on FSDP's own, exact)")
    ex.add_quant_args(p)
    p.add_argument("--lr-final", type=float, default=0.1,
                   help="loss runs: the learning rate at the last step, as a fraction of --lr (cosine decay after "
                        "the warmup; 1: constant)")
    p.add_argument("--cuda-waits", choices=("spin", "block"), default="spin",
                   help="how a rank waits for its GPU: CUDA's default (it spins while the process has fewer "
                        "contexts than CPUs), or asleep (machine_state.block_in_cuda_waits), so that the rows' "
                        "rank_cpu_s counts the rank's own work only")
    p.add_argument("--start-from-bf16", action="store_true",
                   help="loss runs: start from the model's weights rounded to bf16, the weights DeepSpeed's bf16 "
                        "mode starts its fp32 master copy from (FSDP2 keeps the fp32 initialization)")
    args = p.parse_args(argv)
    sp.check_protocol_args(p, args, CONFIGS, parse_loss_spec,
                           cuda_only={"zero3": "tools/python/examples/zero3_train.py runs on GPUs"})
    if args.cpu and args.cuda_waits != "spin":
        p.error("--cuda-waits block: --cpu waits for no GPU; leave one of them out")
    return args


CONFIGS = ("nccl", "nccl-noreshard", "nccl-2comm", "no-comm", "zpccl-hpz", "zpccl-reshard", "zero3")


LOSS_CONFIGS = ("nccl", "nccl-noreshard", "nccl-fp32")


def parse_loss_spec(text: str) -> dict[str, Any]:
    """One ``--loss-runs`` entry (sp.parse_loss_run): ``config`` is the timed configuration whose sharding the run
    uses; bits are None for NCCL (and for a bare ``zpccl``: the ``--weight-bits``/``--grad-bits`` defaults), 0 for a
    collective left on FSDP's own, never both (zpccl.fsdp would serve nothing)."""
    return sp.parse_loss_run(text, dict.fromkeys(LOSS_CONFIGS, "nccl"), zpccl="zpccl-hpz",
                             both_exact="zpccl.fsdp would serve nothing (that run is nccl-noreshard)")


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
    if name in ("nccl-noreshard", "nccl-fp32", "no-comm"):
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


def use_local_collectives(model: Any, fsdp: Any) -> Any:
    """Every FSDP module of ``model`` gathers and reduce-scatters locally (the no-comm configuration): the same
    buffers written as FSDP's collectives write them, nothing sent. Returns an object whose ``calls`` counts the
    calls of both kinds."""
    import types

    import torch

    counter = types.SimpleNamespace(calls=0)

    class LocalAllGather(fsdp.AllGather):  # type: ignore[misc, valid-type]
        def allocate(self, size: Any, *, dtype: Any, device: Any) -> Any:
            return torch.empty(*size, dtype=dtype, device=device)

        def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, async_op: bool = False) -> Any:
            counter.calls += 1
            n = group.size()
            output_tensor.view(n, -1).copy_(input_tensor.reshape(1, -1).expand(n, -1))
            return None

    class LocalReduceScatter(fsdp.ReduceScatter):  # type: ignore[misc, valid-type]
        def allocate(self, size: Any, *, dtype: Any, device: Any) -> Any:
            return torch.empty(*size, dtype=dtype, device=device)

        def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, op: Any,
                     async_op: bool = False) -> Any:
            counter.calls += 1
            output_tensor.copy_(input_tensor.view(group.size(), -1)[group.rank()].view_as(output_tensor))
            return None

    gather, scatter = LocalAllGather(), LocalReduceScatter()
    for m in model.modules():
        if isinstance(m, fsdp.FSDPModule):
            m.set_custom_all_gather(gather)
            m.set_custom_reduce_scatter(scatter)
    return counter


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        self.args, self.torch = args, torch
        sp.pin_rank(args.rank_cpu_lists)
        if args.cuda_waits == "block":
            machine_state.block_in_cuda_waits()  # before the rank's first CUDA call
        self.where = ex.CpuLaunch(args.nodes) if args.cpu else ex.Launch(args.nodes)
        self.mesh = self.where.init()
        self.dist = torch.distributed
        self.zpccl = ex.import_zpccl()
        self.rpn = self.where.ranks_per_node or sp.ranks_per_host(self)
        self.text = ex.corpus()
        self.data = ex.Batches(torch, self.text, args.seq, args.batch, self.where.rank, self.where.device, args.seed)
        self.base = ex.build_gpt(torch, args.layers, args.d_model, args.heads, args.seq, args.seed)
        self.on_device = sp.ranks_on_device(self)
        self._second_group: Any = None  # nccl-2comm's, made on first use (a collective of every rank)

    def build(self, reshard: bool | int, base: Any = None, reduce_dtype: Any = None) -> Any:
        import copy

        model = copy.deepcopy(self.base if base is None else base).to(self.where.device)
        return ex.shard_gpt(self.torch, model, self.mesh, reshard, reduce_dtype)

    def enable(self, model: Any, grad_bits: int | None = None, weight_bits: int | None = None) -> tuple[Any, int]:
        """zpccl on the model; also the device memory the enable took on this rank (sp.memory_taken)."""
        def bits(given: int | None, default: int) -> int | None:  # 0: that collective stays on FSDP's own
            return default if given is None else given or None

        g = bits(grad_bits, self.args.grad_bits)
        return sp.memory_taken(self, self.on_device, lambda: self.zpccl.fsdp.enable(
            model, weight_bits=bits(weight_bits, self.args.weight_bits), grad_bits=g, block_size=self.args.block_size,
            grad_block_size=self.args.grad_block_size if g is not None else None,
            ranks_per_node=self.where.ranks_per_node))

    def step(self, model: Any, opt: Any, step: int) -> float:
        torch = self.torch
        ids, targets = self.data.step(step)
        sp.synchronize(self)
        t0 = time.perf_counter()
        loss = ex.loss_of(torch, model, ids, targets)
        loss.backward()
        opt.step()
        opt.zero_grad()
        sp.synchronize(self)
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
        sp.fresh_peak(self)
        model = self.build(reshard_of(name, self.rpn))
        second = use_second_group(model, self.zpccl.fsdp._Fsdp.load(), self.second_group()) \
            if name == "nccl-2comm" else None
        local = use_local_collectives(model, self.zpccl.fsdp._Fsdp.load()) if name == "no-comm" else None
        zp, enable_bytes = self.enable(model) if name.startswith("zpccl") else (None, 0)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr)

        def warmed() -> None:
            if zp is not None:
                zp.reset_stats()
            for counter in (second, local):
                if counter is not None:
                    counter.calls = 0

        row = sp.timed_steps(self, args, round_index, lambda s: self.step(model, opt, s), warmed)
        if zp is not None:
            row["calls"], row["sent"] = sp.zpccl_per_step(zp, args.steps)
            row["enable_bytes"] = enable_bytes
            row["staging_bytes"] = zp.reserved_bytes
            zp.disable()
        if second is not None:  # the reduce-scatters the hook ran: all of FSDP's, or it was not used
            row["calls"] = {"reduce_scatter_second_group": second.calls // args.steps}
        if local is not None:  # gathers and reduce-scatters made locally: all of FSDP's
            row["calls"] = {"local": local.calls // args.steps}
        return row

    def run_zero3(self, round_index: int) -> dict[str, Any]:
        torch, args = self.torch, self.args
        z3 = sp.load_example("zero3_train")
        sp.fresh_peak(self)
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
        return dict(times=sp.every_rank(self, times[args.warmup:]),
                    peak=torch.cuda.max_memory_allocated(self.where.device))

    def loss_run(self, run: dict[str, Any], seed: int) -> dict[str, Any]:
        """Trains a fresh model ``--loss-steps`` steps (a run of :func:`parse_loss_spec`), initialized and fed
        batches by ``seed``, with the example's warmup and gradient clipping (make_optimizer, optimizer_step)."""
        row = self._train(run, seed)
        if sp.on_cuda(self):
            self.torch.cuda.empty_cache()  # the model and its optimizer went with _train's frame
        return row

    def _train(self, run: dict[str, Any], seed: int) -> dict[str, Any]:
        torch, args = self.torch, self.args
        weight_bits, grad_bits = run["weight_bits"], run["grad_bits"]
        base = ex.build_gpt(torch, args.layers, args.d_model, args.heads, args.seq, seed)
        if args.start_from_bf16:
            with torch.no_grad():
                for p in base.parameters():
                    p.copy_(p.to(torch.bfloat16))
        data = ex.Batches(torch, self.text, args.seq, args.batch, self.where.rank, self.where.device, seed)
        reshard = reshard_of(run["config"], self.rpn)
        model = self.build(reshard, base, torch.float32 if run["config"] == "nccl-fp32" else None)
        del base
        zp = None
        if run["comm"] == "zpccl":
            zp = self.enable(model, grad_bits, weight_bits)[0]
        opt, schedule = ex.make_optimizer(torch, model, args.lr, args.loss_steps, final=args.lr_final)

        def train_step(s: int) -> Any:
            ids, targets = data.step(s)
            loss = ex.loss_of(torch, model, ids, targets)
            loss.backward()
            ex.optimizer_step(torch, model, opt, schedule)
            return loss

        trained = sp.train_for_loss(self, args.loss_steps, train_step, args.loss_stop)
        valid = ex.validation_loss(torch, model, data.validation())
        calls = None
        if zp is not None:
            calls = {k: v["calls"] for k, v in zp.summary().items()}
            zp.disable()
        return dict(spec=run["spec"], comm=run["comm"], seed=seed, reshard=str(reshard), weight_bits=weight_bits,
                    grad_bits=grad_bits, steps=args.loss_steps, valid=valid, zpccl_calls=calls, **trained)


# ---- the run -------------------------------------------------------------------------------------------------


def main(args: argparse.Namespace) -> None:
    bench = Bench(args)
    names, label, say = sp.run_setup(bench, args)
    n_params = sum(p.numel() for p in bench.base.parameters())
    sp.say_layout(say, "FSDP2 step", bench, args, n_params)
    out = timed_rows(bench, args, names, label, n_params, say) if names else []
    sp.finish(bench, args, label, say, out, bench.loss_run, report, ranks_per_node=bench.rpn, params=n_params,
              start_from_bf16=args.start_from_bf16)


def timed_rows(bench: Bench, args: argparse.Namespace, names: list[str], label: str, n_params: int,
               say: Any) -> list[dict[str, Any]]:
    """The alternating timed rounds: one row per configuration."""
    rows: dict[str, dict[str, Any]] = {n: {} for n in names}
    for n in names:
        if n.startswith("nccl"):
            rows[n]["sent"] = bench.nccl_bytes(n)
    def run(n: str, r: int) -> dict[str, Any]:
        return bench.run_zero3(r) if n == "zero3" else bench.run_fsdp(n, r)

    sp.alternate_rounds(rows, args.rounds, run, say)
    sp.trace_round(bench, args, names, run, label, say)
    return [dict(sp.timed_row(n, rows[n], args, bench.where, label, bench.rpn, n_params),
                 reshard=str(reshard_of(n, bench.rpn)) if n != "zero3" else None,
                 sent_mib={k: v / 2**20 for k, v in rows[n].get("sent", {}).items()},
                 staging_mib=rows[n].get("staging_bytes", 0) / 2**20) for n in names]


# ---- the report ---------------------------------------------------------------------------------------------


def report(rows: list[dict[str, Any]], losses: list[dict[str, Any]]) -> None:
    if rows:
        report_steps(rows)
    if losses:
        report_losses(losses)


def report_steps(rows: list[dict[str, Any]]) -> None:
    """One line per configuration; "vs" columns: the ratio of medians, and in brackets the least and greatest of
    the rounds' own ratios."""
    def vs(name: str, r: dict[str, Any]) -> str:
        return sp.vs_cell(rows, name, r)

    print(f"\n{'config':>15} {'reshard':>7} {'median ms':>10} {'min-max ms':>15} {'tokens/s':>10} {'peak MiB':>9} "
          f"{'enable MiB':>10} {'sent MiB/step (per rank)':>30} {'vs nccl':>18} {'vs noreshard':>18} "
          f"{'vs 2comm':>18}")
    for r in rows:
        sent = ", ".join(f"{k} {v:.0f}" for k, v in sorted(r["sent_mib"].items()))
        print(f"{r['config']:>15} {str(r['reshard']):>7} {r['median_ms']:10.1f} "
              f"{r['min_ms']:7.1f}-{r['max_ms']:<7.1f} {r['tokens_per_s']:10.0f} {r['peak_mib']:9.0f} "
              f"{r['enable_mib']:10.0f} {sent:>30} {vs('nccl', r):>18} {vs('nccl-noreshard', r):>18} "
              f"{vs('nccl-2comm', r):>18}")
    print(sp.STEP_NOTE)


def report_losses(losses: list[dict[str, Any]]) -> None:
    """Each seed's line (vs that seed's reference), then, with several seeds, the summary over seeds."""
    summary = sp.loss_summary(losses)
    ref = summary[0]["reference"]
    gaps = {r["spec"]: r["gap_pct"]["per_seed"] if r["gap_pct"] else {} for r in summary}
    seeds = list(dict.fromkeys(x.get("seed") for x in losses))
    for seed in seeds:
        mine = [x for x in losses if x.get("seed") == seed]

        def vs(x: dict[str, Any]) -> str:
            gap = gaps[x.get("spec", x["comm"])].get(seed)
            return "" if gap is None else f" ({gap:+.2f}%)"

        where = "" if len(seeds) == 1 else f", seed {seed}"
        print(f"\nvalidation loss after {mine[0]['steps']} steps{where} (vs NCCL's): " + "; ".join(
            f"{sp.run_label(x)} {x['valid']:.4f}{vs(x)}" for x in mine), end="")
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
