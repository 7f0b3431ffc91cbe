#!/usr/bin/env python3
"""DeepSpeed training step: DeepSpeed ZeRO-3, DeepSpeed's own ZeRO++ and DeepSpeed ZeRO-3 with zpccl, same model,
same process, alternating rounds; and ZeRO-3 without a network, the floor under all three.

    python perf/deepspeed_step.py --nproc 2 --nodes 2 -J perf/results/deepspeed-step.json     # one GPU: two "nodes"
    python perf/deepspeed_step.py --nproc 4 --nodes 2 --hpz 2                                  # two nodes of two
    python perf/deepspeed_step.py --nproc 2 --nodes 2 --loss-only --loss-steps 400 --loss-seeds 0,1,2 \\
        --grad-block-size 64 --loss-runs deepspeed,zpccl:8:4 -J perf/results/deepspeed-loss.json

The protocol is perf/fsdp_step.py's (perf/step_protocol.py), and so are its summaries: each of
``--rounds`` rounds (default 5) runs every configuration in turn on a freshly built engine (so that each one's peak
memory is its own): ``--warmup`` steps, then ``--steps`` timed ones (CUDA synchronized around each). Every rank
times its own steps; a step's time is its slowest rank's (each rank's times are gathered after the configuration's
run and kept raw in the JSON). Per configuration: step time median and spread and each round's median, tokens per
second (all ranks), peak memory per rank (torch's allocator), the bytes each collective sent from a rank per step,
and for zpccl the device memory its ``enable`` took (communicators and scratch, outside torch's allocator).

Phases: each timed step is also cut into forward (the engine's forward and the loss), backward (``engine.backward``)
and optimizer (``engine.step``), on every rank, twice: on the device, by CUDA events recorded on the current stream
at the boundaries (what the compute stream took for each, its waits for DeepSpeed's gather and reduce streams
included), and on the host, by the clock read at the same points (the time spent in each call: well below the
device's, the host ran ahead and the GPU set the pace; near it, either the host set the pace or it waited for the
GPU where DeepSpeed synchronizes). Neither synchronizes: a step costs four event records and four clock reads
more, and the elapsed times are read after the step's closing synchronization. On a CPU both are the host's
clock. The rows keep every value (``phase_ms_per_rank`` and ``host_phase_ms_per_rank``: phase,
round, rank, step) and their medians over rounds, ranks and steps, printed beside the step time.

Configurations (``--configs``), the model, text and schedule of tools/python/examples/deepspeed_train.py:

===========  =============================================================================================
deepspeed    ZeRO-3 on DeepSpeed's collectives (NCCL), overlap_comm and contiguous gradients
zeropp       the same with DeepSpeed's ZeRO++: zero_quantized_weights, zero_quantized_gradients,
             zero_hpz_partition_size ``--hpz`` (default: the ranks per node), its own CUDA quantizer (DeepSpeed
             compiles it on first use: the machine needs nvcc and ninja)
zpccl        the zeropp config through zpccl.deepspeed (qwZ ``--weight-bits``, qgZ ``--grad-bits`` in blocks of
             ``--block-size`` / ``--grad-block-size``, hpZ over DeepSpeed's hpZ groups, and the persistent
             parameters' gathers after each step in one exact call)
zpccl-exact  the ablation: deepspeed's config with zpccl.deepspeed serving only what it serves exactly
             without hpZ, the persistent parameters' gathers in one call (``weight_bits=None, grad_bits=None``):
             DeepSpeed's bits, so the gap from deepspeed is the calls', and from here to zpccl quantization's
no-comm      deepspeed's config with the collectives zpccl.deepspeed takes over (the parameter all-gathers, the
             gradient reduce-scatters, the persistent parameters' gathers) made locally (:class:`LocalCollectives`):
             the step a perfect network would give. Ranks exchange no data there, so their weights drift apart:
             timing only, refused as a loss run. What zpccl leaves DeepSpeed's (the gradient norm's all-reduce)
             still communicates, and is counted
===========  =============================================================================================

Bytes and calls: DeepSpeed's collectives are counted in an untimed step by wrapping deepspeed.comm's functions
(all-gathers, reduce-scatters, all-to-alls, all-reduces: each call, and (n - 1) / n of what it moves for a ring);
zpccl's come from its counters ((n - 1) copies of a rank's payloads), beside what stays DeepSpeed's in the zpccl
configurations. Over a slow network a small call costs a latency whatever its size, so the calls a step are
reported beside the bytes.

``--loss-steps N`` trains each of ``--loss-runs`` (deepspeed, zeropp, zpccl, or zpccl:W:G with W-bit weights and
G-bit gradients, 0 leaving that collective DeepSpeed's; zpccl:0:0 is zpccl's exact hpZ gathers alone, with hpZ groups
of at least 2; deepspeed-fp32 is deepspeed with its gradients reduced and accumulated in fp32, not bf16
(``communication_data_type`` and ``data_types.grad_accum_dtype``; the first alone changes nothing on two ranks, where
the reduced sum is rounded back to bf16 as NCCL's bf16 sum rounds it): exact collectives that round otherwise, so its
gap to deepspeed is the noise floor the other gaps stand on; list it after deepspeed, the reference) for N steps on a
fresh engine per seed of ``--loss-seeds``, seed-major, and reports the validation loss, the training loss of the last
steps, and the paired gap to the deepspeed run of the same seed with its standard error and 95% interval. ``-J`` is
rewritten after every loss run.

``--cpu`` runs deepspeed and zpccl on DeepSpeed's CPU accelerator over gloo (zpccl's host backend, ranks as
processes; ``--nodes`` tells zpccl the layout; zeropp needs CUDA): a smoke test of the protocol and the JSON, whose
times say nothing about a GPU's.

DeepSpeed on a machine without network: here, ``bash tools/gpu-python-deps.sh make`` puts the DeepSpeed the tests pin
and its dependencies in .whl/; carry .whl there, where ``source tools/gpu-python-deps.sh; use_carried_wheels $PWD``
installs them.
"""
from __future__ import annotations

import argparse
import functools
import gc
import pathlib
import statistics
import sys
import time
import weakref
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
import step_protocol as sp  # noqa: E402
from perf_files import exchanging_calls  # noqa: E402  (tools/, on the path step_protocol set)

ls = sp.ls  # tools/loss_stats.py: the paired gaps' statistics

dt = sp.load_example("deepspeed_train")
ex = dt.ex

CONFIGS = ("deepspeed", "zeropp", "zpccl", "zpccl-exact", "no-comm")
FP32 = "deepspeed-fp32"  # deepspeed with its gradients reduced and kept in fp32: a loss run alone, the noise floor
LOSS_CONFIGS = ("deepspeed", FP32, "zeropp", "zpccl")  # no-comm's ranks exchange nothing: its loss is no model's
EXACT = "zpccl-exact"  # DeepSpeed's bits by construction: timed, not a loss run of its own
PHASES = ("forward", "backward", "optimizer")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ex.add_model_args(p)
    ex.add_launch_args(p)
    dt.add_zero_args(p)
    sp.add_protocol_args(p, CONFIGS, "deepspeed,zeropp,zpccl",
                         "the loss runs, in order: deepspeed, deepspeed-fp32, zeropp, zpccl, or "
                         "zpccl:WEIGHT_BITS:GRAD_BITS (4 or 8; 0: that collective stays DeepSpeed's)")
    args = p.parse_args(argv)
    sp.check_protocol_args(p, args, CONFIGS, parse_loss_spec, cuda_only={"zeropp": "DeepSpeed's ZeRO++ quantizer"})
    return args


def parse_loss_spec(text: str) -> dict[str, Any]:
    """One ``--loss-runs`` entry (sp.parse_loss_run, in fsdp_step's shape; bits None: the configuration's own; 0:
    that collective stays DeepSpeed's; ``zpccl:0:0``, zpccl's hpZ gathers alone, exact). no-comm is no loss run."""
    return sp.parse_loss_run(text, {c: "deepspeed" if c == FP32 else c for c in LOSS_CONFIGS}, zpccl="zpccl",
                             refused={"no-comm": "its ranks exchange no data (timing only); its loss is no model's"})


# ---- DeepSpeed's bytes -------------------------------------------------------------------------------------------


class Counting:
    """deepspeed.comm's collectives behind wrappers that count the calls and the bytes each call sends from this rank,
    by kind, while :attr:`on` (they are looked up at call time, and coalesced_collectives' all-to-all under the
    name it imported)."""

    KINDS = {"allgather_fn": "all_gather", "all_gather_into_tensor": "all_gather",
             "reduce_scatter_fn": "reduce_scatter", "all_reduce": "all_reduce", "all_to_all_single": "all_to_all"}

    def __init__(self) -> None:
        import deepspeed.comm as dcomm
        import deepspeed.runtime.comm.coalesced_collectives as cc

        self.sent: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self.on = False
        self.saved: list[tuple[Any, str, Any]] = []
        for module in (dcomm, cc):
            for name, kind in self.KINDS.items():
                fn = getattr(module, name, None)
                if fn is not None:
                    self.saved.append((module, name, fn))
                    setattr(module, name, self._wrap(fn, kind))

    def _wrap(self, fn: Any, kind: str) -> Any:
        import deepspeed.comm as dcomm
        from torch.distributed import ProcessGroup

        def counted(*args: Any, **kwargs: Any) -> Any:
            if self.on:
                tensors = [a for a in list(args) + list(kwargs.values()) if hasattr(a, "nbytes")]
                group = kwargs.get("group", next((a for a in args if isinstance(a, ProcessGroup)), None))
                n = dcomm.get_world_size(group)
                if tensors and n > 1:
                    self.calls[kind] = self.calls.get(kind, 0) + 1
                    if kind == "all_gather":  # (output, input): each rank sends its input to n - 1 others
                        sent = (n - 1) * tensors[1].nbytes
                    elif kind == "reduce_scatter":  # (output, input): a ring sends n - 1 output-sized pieces
                        sent = (n - 1) * tensors[0].nbytes
                    elif kind == "all_to_all":  # (output, input)
                        sent = tensors[1].nbytes * (n - 1) // n
                    else:
                        sent = 2 * tensors[0].nbytes * (n - 1) // n
                    self.sent[kind] = self.sent.get(kind, 0) + sent
            return fn(*args, **kwargs)

        return counted

    def restore(self) -> None:
        for module, name, fn in self.saved:
            setattr(module, name, fn)


# ---- no-comm's collectives ---------------------------------------------------------------------------------------


class LocalCollectives:
    """The no-comm configuration: the two functions of zpccl.deepspeed's seams that plain ZeRO-3 calls (its
    ``REPLACED``: the parameter all-gather, the gradient reduce-scatter), found and checked by its
    ``DeepSpeed.load`` and replaced through it, and the persistent parameters' gather after each step (each
    parameter's ``all_gather``, wrapped as zpccl.deepspeed wraps it), run locally until :meth:`disable`. A gather
    writes the rank's own partition into every rank's slot of the output; a reduce-scatter returns the rank's own
    chunk of each gradient, the average DeepSpeed's would return were every rank's gradient this rank's. The same
    shapes and the same handles as DeepSpeed's, not a byte between ranks: a benchmark aid, whose weights are no
    model's. What
    DeepSpeed's reduce-scatter does around the wire (its interleaving copy of the whole gradients, its pre-division)
    goes with it, as it does under zpccl: the floor is that of the step zpccl serves.
    ``all_to_all_quant_reduce`` (DeepSpeed's qgZ) is left as it is: no-comm's config never calls it. It counts as
    zpccl.deepspeed's handle does (``summary``, ``reset_stats``, ``disable``), so that the bench reports its calls
    and the bytes they send (none) as it reports zpccl's."""

    GATHER, REDUCE_SCATTER = 0, 1  # indices into zpccl.deepspeed's REPLACED

    def __init__(self, engine: Any = None) -> None:
        import torch
        from zpccl.deepspeed._collectives import Done, all_persistent, pending
        from zpccl.deepspeed._deepspeed import DeepSpeed

        self.torch, self.dist, self.done = torch, torch.distributed, Done
        self.pending, self.all_persistent = pending, all_persistent  # zpccl.deepspeed's reading of a call
        self.ds = DeepSpeed.load("perf/deepspeed_step.py no-comm")
        self.calls = {"local_all_gather": 0, "local_reduce_scatter": 0, "local_persistent_gather": 0}
        self.saved = {i: self.ds.function(i) for i in (self.GATHER, self.REDUCE_SCATTER)}
        self.ds.set_function(self.GATHER, self.all_gather)
        self.ds.set_function(self.REDUCE_SCATTER, self.reduce_scatter)
        self.wrapped = [(p, p.all_gather) for p in engine.module.parameters() if hasattr(p, "ds_id")] \
            if engine is not None else []
        for p, theirs in self.wrapped:
            p.all_gather = functools.partial(self.exact_gather, theirs)

    def exact_gather(self, theirs: Any, param_list: Any = None, async_op: bool = False, *args: Any) -> Any:
        """A parameter's ``all_gather``: the persistent parameters' regather after a step made locally, as
        zpccl.deepspeed serves it (a blocking gather of persistent parameters only); any other DeepSpeed's own."""
        todo = self.pending(param_list or ())
        if param_list is None or async_op or not self.all_persistent(todo):
            return theirs(param_list, async_op, *args)
        self.calls["local_persistent_gather"] += 1
        for p in todo:
            n = self.dist.get_world_size(p.ds_process_group)
            p.data = p.ds_tensor.reshape(-1).repeat(n).narrow(0, 0, p.ds_numel).view(p.ds_shape)
            p.ds_status = type(p.ds_status).AVAILABLE
        return None

    def all_gather(self, input_tensor: Any, output_tensor: Any, group: Any = None) -> Any:
        self.calls["local_all_gather"] += 1
        torch, n = self.torch, self.dist.get_world_size(group)
        for row in output_tensor.view(n, -1):
            if row.data_ptr() != input_tensor.data_ptr():  # DeepSpeed's input is its own slot of the output
                row.copy_(input_tensor.view(-1))
        event = None
        if output_tensor.is_cuda:  # ordered as zpccl's gathers are: DeepSpeed waits on the handle's event
            event = torch.cuda.Event()
            event.record()
        return self.done(torch, event)

    def reduce_scatter(self, tensors: Any, group: Any = None) -> list[Any]:
        self.calls["local_reduce_scatter"] += 1
        n, r = self.dist.get_world_size(group), self.dist.get_rank(group)
        mine = []
        for t in tensors:  # DeepSpeed's chunks: ceil(numel / n) elements a rank, the last ones short or empty
            flat = t.reshape(-1)
            chunk = -(-flat.numel() // n)
            start = min(r * chunk, flat.numel())
            mine.append(flat.narrow(0, start, min(chunk, flat.numel() - start)))
        return list(self.torch.cat(mine).split([m.numel() for m in mine]))  # copies: the buckets are reused

    def summary(self) -> dict[str, dict[str, int]]:
        return {k: dict(calls=v, wire_bytes=0) for k, v in self.calls.items()}

    def reset_stats(self) -> None:
        self.calls = dict.fromkeys(self.calls, 0)

    def disable(self) -> None:
        for i, fn in self.saved.items():
            self.ds.set_function(i, fn)
        for p, theirs in self.wrapped:
            p.all_gather = theirs


class Phases:
    """The boundaries of one step's phases (PHASES): the host's clock and, on CUDA, an event on the current stream,
    each :meth:`mark` (the clock first, so that the first event cannot precede the step's start)."""

    def __init__(self, torch: Any, cuda: bool) -> None:
        self.torch, self.cuda = torch, cuda
        self.host: list[float] = []
        self.events: list[Any] = []

    def mark(self) -> None:
        self.host.append(time.perf_counter())
        if self.cuda:
            self.events.append(self.torch.cuda.Event(enable_timing=True))
            self.events[-1].record()

    def ms(self) -> tuple[list[float], list[float]]:
        """(device, host) milliseconds of each phase, once the step's work is synchronized (device: the host's
        clock on a CPU)."""
        host = [1e3 * (b - a) for a, b in zip(self.host, self.host[1:])]
        device = [a.elapsed_time(b) for a, b in zip(self.events, self.events[1:])] if self.cuda else host
        return device, host


# ---- one configuration -------------------------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        self.args, self.torch = args, torch
        sp.pin_rank(args.rank_cpu_lists)
        self.where = dt.where_am_i(args)
        self.dist = torch.distributed
        ex.import_zpccl()  # zpccl on sys.path, installed or from this tree

        self.rpn = self.where.ranks_per_node or sp.ranks_per_host(self)
        self.hpz = args.hpz or self.rpn
        self.text = ex.corpus()
        self.data = ex.Batches(torch, self.text, args.seq, args.batch, self.where.rank, self.where.device, args.seed)
        self.on_device = sp.ranks_on_device(self)
        self.phases: list[tuple[list[float], list[float]]] = []  # (device, host) ms of each step since cleared
        self.phase_rounds: dict[str, list[Any]] = {}  # configuration: every rank's phases, a list a round
        self.released: list[Any] = []  # weak references to the optimizers of the engines released
        reuse_hpz_groups()

    def engine(self, comm: str, seed: int, steps: int, weight_bits: int | None = None,
               grad_bits: int | None = None) -> tuple[Any, Any, int]:
        """(engine, the handle zpccl.deepspeed.enable returned (no-comm: its LocalCollectives) or None, the device
        memory zpccl's enable took on this rank) of a fresh model."""
        import deepspeed
        import zpccl.deepspeed

        gc.collect()
        kept = sum(ref() is not None for ref in self.released)
        if kept:  # their memory would count in this engine's peak
            raise RuntimeError(f"DeepSpeed {deepspeed.__version__} still holds the optimizer of {kept} of the engines "
                               "released before: find what keeps it (forget_engine lets go of what 0.19 keeps)")
        torch, args = self.torch, self.args
        wargs = argparse.Namespace(**vars(args))
        if weight_bits is not None:
            wargs.weight_bits = weight_bits or None
        if grad_bits is not None:
            wargs.grad_bits = grad_bits or None
        if comm == EXACT:
            wargs.weight_bits = wargs.grad_bits = None
        config = dt.zero_config(wargs, {"no-comm": "deepspeed", FP32: "deepspeed", EXACT: "zpccl"}.get(comm, comm),
                                self.where.ranks_per_node, 1 if comm == EXACT else self.hpz)
        if comm == FP32:  # both settings: see deepspeed-fp32 in the module's docstring
            config["communication_data_type"] = "fp32"
            config["data_types"] = {"grad_accum_dtype": "fp32"}
        if comm in ("zpccl", EXACT):
            section = config["zpccl"]
            if section["grad_bits"] is None:
                section.pop("grad_block_size", None)
            config["zero_optimization"]["zero_quantized_weights"] = section["weight_bits"] is not None
            config["zero_optimization"]["zero_quantized_gradients"] = section["grad_bits"] is not None
            ds_config, policy = zpccl.deepspeed.split_config(config)
        else:
            ds_config, policy = config, None
        model = ex.build_gpt(torch, args.layers, args.d_model, args.heads, args.seq, seed)
        opt, schedule = ex.make_optimizer(torch, model, args.lr, steps)
        engine, *_ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=schedule, config=ds_config)
        zp, took = None, 0
        if policy is not None:  # enable apart from initialize, to measure what it takes
            zp, took = sp.memory_taken(self, self.on_device, lambda: zpccl.deepspeed.enable(engine, policy))
        if comm == "no-comm":
            zp = LocalCollectives(engine)
        return engine, zp, took

    def step(self, engine: Any, step: int) -> float:
        """One step's seconds, its phases appended to ``self.phases``."""
        torch = self.torch
        ids, targets = self.data.step(step)
        marks = Phases(torch, sp.on_cuda(self))
        sp.synchronize(self)
        marks.mark()
        loss = dt.loss_of(torch, engine, ids, targets)
        marks.mark()
        engine.backward(loss)
        marks.mark()
        engine.step()
        marks.mark()
        sp.synchronize(self)
        seconds = time.perf_counter() - marks.host[0]
        self.phases.append(marks.ms())
        return seconds

    def release(self, engine: Any, zp: Any) -> None:
        if zp is not None:
            zp.disable()
        engine.destroy()
        forget_engine(engine)
        self.released.append(weakref.ref(engine.optimizer))
        gc.collect()
        if sp.on_cuda(self):
            self.torch.cuda.empty_cache()

    def run(self, name: str, round_index: int) -> dict[str, Any]:
        args = self.args
        sp.fresh_peak(self)
        engine, zp, took = self.engine(name, args.seed, args.warmup + args.steps + 1)

        def warmed() -> None:
            self.phases.clear()
            if zp is not None:
                zp.reset_stats()

        row = sp.timed_steps(self, args, round_index, lambda s: self.step(engine, s), warmed)
        everyone: list[Any] = [None] * self.where.world
        self.dist.all_gather_object(everyone, self.phases)
        self.phase_rounds.setdefault(name, []).append(everyone)
        if zp is not None:
            row["calls"], row["zpccl_sent"] = sp.zpccl_per_step(zp, args.steps)
            row["enable_bytes"] = took
        if round_index == 0:  # one untimed, counted step: what DeepSpeed's own collectives send
            counting = Counting()
            counting.on = True
            try:
                self.step(engine, 999_999)
            finally:
                counting.restore()
            row["deepspeed_sent"], row["deepspeed_calls"] = counting.sent, counting.calls
        self.release(engine, zp)
        return row

    def loss_run(self, run: dict[str, Any], seed: int) -> dict[str, Any]:
        """Trains a fresh engine ``--loss-steps`` steps, initialized and fed batches by ``seed``."""
        torch, args = self.torch, self.args
        engine, zp, _ = self.engine(run["config"], seed, args.loss_steps, run["weight_bits"], run["grad_bits"])
        data = ex.Batches(torch, self.text, args.seq, args.batch, self.where.rank, self.where.device, seed)

        def train_step(s: int) -> Any:
            ids, targets = data.step(s)
            loss = dt.loss_of(torch, engine, ids, targets)
            engine.backward(loss)
            engine.step()
            return loss

        trained = sp.train_for_loss(self, args.loss_steps, train_step, args.loss_stop)
        valid = dt.validation_loss(torch, engine, data.validation())
        calls = {k: v["calls"] for k, v in zp.summary().items()} if zp is not None else None
        self.release(engine, zp)
        bits = (lambda b, d: d if b is None else b)  # noqa: E731
        return dict(spec=run["spec"], comm=run["comm"], seed=seed, hpz=self.hpz,
                    weight_bits=bits(run["weight_bits"], args.weight_bits) if run["comm"] == "zpccl" else None,
                    grad_bits=bits(run["grad_bits"], args.grad_bits) if run["comm"] == "zpccl" else None,
                    steps=args.loss_steps, valid=valid, zpccl_calls=calls, **trained)


def reuse_hpz_groups() -> None:
    """DeepSpeed makes its hpZ group once per process and asserts it is made once: every engine of one size gets
    the group the first made (a new one per engine would leave a communicator behind each round)."""
    from deepspeed.utils import groups

    made: dict[int, Any] = {}
    create = groups._create_zero_param_parallel_group

    def once(size: int) -> None:
        if size not in made:
            groups._ZERO_PARAM_INTRA_PARALLEL_GROUP = None
            create(size)
            made[size] = groups._ZERO_PARAM_INTRA_PARALLEL_GROUP
        groups._ZERO_PARAM_INTRA_PARALLEL_GROUP = made[size]

    groups._create_zero_param_parallel_group = once


def forget_engine(engine: Any) -> None:
    """Lets go of what DeepSpeed keeps of an engine after ``destroy()``: ZeRO-3's forward module stack (a module-level
    list that every engine's module joins and none leaves) and the parameter coordinator's memo of the parameters to
    release (a cache on its class, keyed by coordinator and module). Through the module's parameters both hold the
    ZeRO-3 optimizer and its partitions (fp32 weights, Adam's moments, 16-bit weights and gradients), which would stay
    allocated through every later configuration's run and count in its peak."""
    from deepspeed.runtime.zero import parameter_offload
    from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator

    stack = parameter_offload.FWD_MODULE_STACK
    stack[:] = [m for m in stack if m is not engine.module]
    for fn in vars(PartitionedParameterCoordinator).values():
        for cell in getattr(fn, "__closure__", None) or ():  # the memo sits inside DeepSpeed's nvtx wrapper
            try:
                memo = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if callable(getattr(memo, "cache_clear", None)):
                memo.cache_clear()


# ---- the run -------------------------------------------------------------------------------------------------


def main(args: argparse.Namespace) -> None:
    import deepspeed

    bench = Bench(args)
    names, label, say = sp.run_setup(bench, args)
    model = ex.build_gpt(bench.torch, args.layers, args.d_model, args.heads, args.seq)
    n_params = sum(p.numel() for p in model.parameters())
    del model
    sp.say_layout(say, "DeepSpeed ZeRO-3 step", bench, args, n_params, f", hpZ groups of {bench.hpz}")
    out = timed_rows(bench, args, names, label, n_params, say) if names else []
    sp.finish(bench, args, label, say, out, bench.loss_run, report, deepspeed=deepspeed.__version__,
              ranks_per_node=bench.rpn, hpz=bench.hpz, params=n_params)


def timed_rows(bench: Bench, args: argparse.Namespace, names: list[str], label: str, n_params: int,
               say: Any) -> list[dict[str, Any]]:
    """The alternating timed rounds: one row per configuration."""
    rows: dict[str, dict[str, Any]] = {n: {} for n in names}
    sp.alternate_rounds(rows, args.rounds, bench.run, say)
    out = []
    for n in names:
        sent = {f"deepspeed {k}": v for k, v in rows[n].get("deepspeed_sent", {}).items()}
        sent.update(rows[n].get("zpccl_sent", {}))
        calls = {f"deepspeed {k}": v for k, v in rows[n].get("deepspeed_calls", {}).items()}
        calls.update({k: v for k, v in (rows[n].get("calls") or {}).items() if not k.startswith("deepspeed_")})
        out.append(dict(sp.timed_row(n, rows[n], args, bench.where, label, bench.rpn, n_params),
                        hpz=bench.hpz if n in ("zeropp", "zpccl") else None, calls_per_step=calls,
                        sent_mib={k: v / 2**20 for k, v in sent.items()}, **phase_fields(bench.phase_rounds[n]),
                        exchanges_data=n != "no-comm"))
    sp.trace_round(bench, args, names, bench.run, label, say)  # after the rows: its round appends phases too
    return out


def phase_fields(rounds: list[list[list[tuple[list[float], list[float]]]]]) -> dict[str, Any]:
    """A row's phases from ``rounds[round][rank][step]`` = (device ms, host ms) of each of PHASES:
    ``phase_ms_per_rank`` and ``host_phase_ms_per_rank`` (phase: [round][rank][step], raw) and their medians over
    every round, rank and step (``phase_median_ms``, ``host_phase_median_ms``)."""
    out: dict[str, Any] = {}
    for side, key in enumerate(("phase", "host_phase")):
        raw = {name: [[[step[side][i] for step in rank] for rank in rnd] for rnd in rounds]
               for i, name in enumerate(PHASES)}
        out[f"{key}_ms_per_rank"] = raw
        out[f"{key}_median_ms"] = {name: statistics.median(t for rnd in v for rank in rnd for t in rank)
                                   for name, v in raw.items()}
    return out


def report(rows: list[dict[str, Any]], losses: list[dict[str, Any]]) -> None:
    if rows:
        def vs(name: str, r: dict[str, Any]) -> str:
            return sp.vs_cell(rows, name, r)

        print(f"\n{'config':>11} {'median ms':>10} {'min-max ms':>15} {'tokens/s':>10} {'peak MiB':>9} "
              f"{'enable MiB':>10} {'vs deepspeed':>18} {'vs zeropp':>18} {'calls':>6}  sent MiB/step (per rank)")
        for r in rows:
            sent = ", ".join(f"{k} {v:.1f}" for k, v in sorted(r["sent_mib"].items()))
            print(f"{r['config']:>11} {r['median_ms']:10.1f} {r['min_ms']:7.1f}-{r['max_ms']:<7.1f} "
                  f"{r['tokens_per_s']:10.0f} {r['peak_mib']:9.0f} {r['enable_mib']:10.0f} "
                  f"{vs('deepspeed', r):>18} {vs('zeropp', r):>18} {exchanging_calls(r['calls_per_step']):>6}  {sent}")
        print(sp.STEP_NOTE + "; calls: the collectives a step that exchange data, DeepSpeed's and zpccl's")
        print(f"\n{'config':>11} {'median ms':>10}  {'forward':>8} {'backward':>8} {'optimizer':>9}  "
              f"{'host: fwd':>9} {'bwd':>8} {'opt':>8}")
        for r in rows:
            device, host = r["phase_median_ms"], r["host_phase_median_ms"]
            print(f"{r['config']:>11} {r['median_ms']:10.1f}  {device['forward']:8.1f} {device['backward']:8.1f} "
                  f"{device['optimizer']:9.1f}  {host['forward']:9.1f} {host['backward']:8.1f} "
                  f"{host['optimizer']:8.1f}")
        print("(phases: medians over rounds, ranks and steps, by CUDA events on the compute stream (on a CPU, the "
              "host's clock); host: the time in each call)")
        if any(not r["exchanges_data"] for r in rows):
            print("(no-comm: DeepSpeed's parameter gathers and gradient reduce-scatters made locally; its ranks "
                  "exchange no data, so its weights, and any loss, are no model's: timing only)")
    if losses:
        report_losses(losses)


def report_losses(losses: list[dict[str, Any]]) -> None:
    """Per loss run: its validation loss over the seeds, and its paired gap to the reference run (the first
    deepspeed one, sp.loss_summary's choice) of the same seed: mean, standard error, 95% interval, per seed."""
    summary = sp.loss_summary(losses)
    reference = summary[0]["reference"]
    print(f"\nvalidation loss after {losses[0]['steps']} steps; gap: vs {reference}'s of the same seed")
    print(f"{'run':>18} {'valid mean':>10} {'std':>7} {'seeds':>8} {'gap mean':>9} {'std err':>7} "
          f"{'95% interval':>18}  per seed, %")
    for row in summary:
        gaps = row["gap_pct"]
        seeds, mean, se, interval, per_seed = ls.gap_cells(ls.gap_stats(gaps["per_seed"])) if gaps else ("-",) * 5
        print(f"{row['label']:>18} {row['valid']['mean']:10.4f} {row['valid']['std']:7.4f} {seeds:>8} {mean:>9} "
              f"{se:>7} {interval:>18}  {per_seed}")


if __name__ == "__main__":
    arguments = parse_args()
    dt.require_deepspeed()
    ex.launch(main, arguments)
