"""The training-step protocol that perf/fsdp_step.py, perf/deepspeed_step.py and perf/ddp_step.py share: their common
arguments and the grammar of their loss runs, the alternating timed rounds (every rank timed, a step its slowest
rank's, the rounds kept raw), the loss runs (seed by seed, the JSON rewritten after each), and the summaries of both
(step_summary, ratio_of, loss_summary: its paired gaps are tools/loss_stats.py's).

A bench (each script's ``Bench``) gives ``torch``, ``dist`` (torch.distributed) and ``where`` (the example's
``Launch`` or ``CpuLaunch``: ``rank``, ``world``, ``device``); the scripts keep what differs: the configurations, how
one is built and stepped, and what each row says beyond the common fields. On a CPU (``--cpu``: gloo, zpccl's host
backend) the protocol runs as on a GPU, with no device to synchronize and no device memory to count (peaks and
what an enable takes read 0): a smoke test of a script, whose times say nothing about a GPU's.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import os
import pathlib
import statistics
import sys
import time
from typing import Any, Callable

HERE = pathlib.Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "tools" / "python" / "examples"
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
if str(HERE.parent / "tools") not in sys.path:
    sys.path.append(str(HERE.parent / "tools"))
import loss_stats as ls  # noqa: E402  (tools/loss_stats.py: the paired gaps of loss runs)
import step_trace  # noqa: E402  (--trace: torch's profiler around a round of steps, and its summary)
import machine_state as ms  # noqa: E402  (the rounds' machine records; --rank-cpus)
from provenance import provenance  # noqa: E402

SHAPES = {  # name: (layers, d_model, heads, seq, batch)
    "small": (8, 768, 12, 256, 8),
    "large": (8, 768, 12, 512, 32),
}

TRAIN_TAIL = 20  # the steps whose mean training loss a loss run reports


def load_example(name: str) -> Any:
    """An example script as a module (importable by name, so that spawned processes find its functions)."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    return importlib.import_module(name)


# ---- arguments ---------------------------------------------------------------------------------------------------


def add_protocol_args(p: argparse.ArgumentParser, configs: tuple[str, ...], loss_runs: str | None,
                      loss_runs_help: str) -> None:
    """The arguments of the protocol: shape, configurations, rounds, loss runs (``loss_runs``: the default; None:
    those of ``--configs``), JSON and label."""
    p.add_argument("--shape", choices=sorted(SHAPES), default=None, help="preset model and batch shape")
    p.add_argument("--configs", default=",".join(configs), help="the timed configurations, in round order")
    p.add_argument("--rounds", type=int, default=5,
                   help="alternating rounds of every configuration (at least 5 for a comparison: DESIGN.md)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per configuration and round")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--loss-steps", type=int, default=0, help="also train this many steps per loss run")
    p.add_argument("--loss-stop", type=int, default=0,
                   help="loss runs: stop after this many steps of --loss-steps' schedule and record every step's "
                        "loss (how the curves start; the validation loss is then the stopped model's)")
    p.add_argument("--loss-runs", default=loss_runs, help=loss_runs_help)
    p.add_argument("--loss-seeds", default=None,
                   help="comma-separated seeds or ranges FIRST-LAST (model initialization and data order), each "
                        "loss run once per seed, seed-major (default: --seed)")
    p.add_argument("--loss-only", action="store_true", help="skip the timed rounds: only the loss runs")
    p.add_argument("--trace", default="",
                   help="after the timed rounds, one more of every configuration under torch's profiler: each "
                        "rank's Chrome trace and a summary of where the steps' time went in this folder "
                        "(perf/step_trace.py)")
    p.add_argument("--trace-steps", type=int, default=3,
                   help="--trace: the steps traced after the warmup (a trace of the 57M step is about a MB a step)")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("-J", "--json", help="write the rows here")
    p.add_argument("--label", default="", help="regime label for the rows (default: from the layout)")
    p.add_argument("--cpu", action="store_true",
                   help="gloo process groups on CPUs, zpccl's host backend (--nodes tells zpccl the layout): a smoke "
                        "test of the protocol and the JSON, whose times say nothing about a GPU's")
    p.add_argument("--rank-cpus", default="",
                   help="each rank's CPUs, ranks separated by '/', each in taskset's list syntax (0-3/8-11: rank 0 on "
                        "CPUs 0 - 3, rank 1 on 8 - 11): a rank process, and the threads it starts (NCCL's proxy, "
                        "torch's), runs there from before its first CUDA or NCCL call; default: where the kernel "
                        "puts them. The rounds' machine records say where each rank's main thread ran")


def check_protocol_args(p: argparse.ArgumentParser, args: argparse.Namespace, configs: tuple[str, ...],
                        parse_loss_spec: Callable[[str], dict[str, Any]],
                        cuda_only: dict[str, str] | None = None) -> None:
    """Applies ``--shape``, parses the timed configurations (``args.config_list``), the loss runs
    (``args.loss_specs``; without ``--loss-runs``, those of ``--configs``) and seeds (``args.seeds``), and refuses
    what the protocol cannot run through ``p.error``: a configuration or loss run named twice among others; with
    ``--cpu``, also the configurations of ``cuda_only`` (name: why), timed or trained."""
    if args.shape:
        args.layers, args.d_model, args.heads, args.seq, args.batch = SHAPES[args.shape]
    args.config_list = [n.strip() for n in args.configs.split(",") if n.strip()]
    unknown = [n for n in args.config_list if n not in configs]
    if unknown:
        p.error(f"--configs: unknown {', '.join(unknown)} (known: {', '.join(configs)})")
    loss_runs = args.configs if args.loss_runs is None else args.loss_runs
    try:
        args.loss_specs = [parse_loss_spec(t) for t in loss_runs.split(",") if t.strip()]
        args.seeds = parse_seeds(args.loss_seeds, args.seed)
    except ValueError as e:
        p.error(str(e))
    for flag, names in (("--configs", args.config_list), ("--loss-runs", [r["spec"] for r in args.loss_specs])):
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            p.error(f"{flag}: {', '.join(twice)} named twice (each configuration or loss run once)")
    if args.loss_only and not args.loss_steps:
        p.error("--loss-only needs --loss-steps")
    if args.loss_only and args.trace:
        p.error("--trace traces the timed configurations: leave out --loss-only")
    if args.trace_steps < 1:
        p.error("--trace-steps must be at least 1")
    if args.rounds < 1 or args.steps < 1 or args.warmup < 0 or args.loss_steps < 0:
        p.error("--rounds and --steps must be at least 1, --warmup and --loss-steps at least 0")
    if not 0 <= args.loss_stop <= args.loss_steps:
        p.error(f"--loss-stop {args.loss_stop}: from 0 (train every step of --loss-steps) to --loss-steps "
                f"({args.loss_steps})")
    if args.nodes and args.nproc % args.nodes:
        p.error(f"--nodes {args.nodes} does not divide --nproc {args.nproc}")
    try:
        args.rank_cpu_lists = [ms.parse_cpu_list(t) for t in args.rank_cpus.split("/")] if args.rank_cpus else None
    except ValueError as e:
        p.error(f"--rank-cpus: {e}")
    if args.cpu:
        trained = [r["config"] for r in args.loss_specs] if args.loss_steps else []
        wanted = ([] if args.loss_only else args.config_list) + trained
        for name, why in (cuda_only or {}).items():
            if name in wanted:
                p.error(f"--cpu: {name} needs CUDA ({why}); leave it out of --configs and --loss-runs")


BITS = (0, 4, 8)  # a zpccl loss run's bits of either side; 0: that collective stays the framework's own


def parse_loss_run(text: str, runs: dict[str, str], zpccl: str | None = None, both_exact: str | None = None,
                   refused: dict[str, str] | None = None) -> dict[str, Any]:
    """One ``--loss-runs`` entry: ``{"spec", "comm", "config", "weight_bits", "grad_bits"}``. ``spec`` is the text;
    ``config`` the timed configuration whose set-up the run takes; ``comm`` what loss_summary reads (its reference:
    ``nccl`` or ``deepspeed``, the exact collectives).

    ``runs``: the runs named by a configuration alone, each with its ``comm`` (bits None: the configuration's own).
    ``zpccl``: the configuration that ``zpccl`` (bits None: the script's ``--weight-bits`` and ``--grad-bits``) and
    ``zpccl:W:G`` run, W-bit weights and G-bit gradients, each of BITS (None: no such runs; a name in ``runs`` comes
    first). ``both_exact``: why ``zpccl:0:0`` is refused (None: it is a run). ``refused``: names that are no loss
    run, each with why. A bad entry raises ValueError naming it and what is accepted."""
    spec = text.strip()
    why = (refused or {}).get(spec)
    if why is not None:
        raise ValueError(f"loss run {spec!r}: {why}")
    if spec in runs:
        return dict(spec=spec, comm=runs[spec], config=spec, weight_bits=None, grad_bits=None)
    comm, *bits = spec.split(":")
    if zpccl is None or comm != "zpccl" or len(bits) not in (0, 2):
        known = list(runs) + ([] if zpccl is None else [n for n in ("zpccl", "zpccl:W:G") if n not in runs])
        raise ValueError(f"loss run {spec!r}: not {', '.join(known[:-1])} or {known[-1]}")
    if not bits:
        return dict(spec=spec, comm="zpccl", config=zpccl, weight_bits=None, grad_bits=None)
    try:
        w, g = (int(b) for b in bits)
    except ValueError:
        raise ValueError(f"loss run {spec!r}: bits must be integers") from None
    if w not in BITS or g not in BITS:
        raise ValueError(f"loss run {spec!r}: bits must be {', '.join(map(str, BITS[:-1]))} or {BITS[-1]}")
    if w == g == 0 and both_exact is not None:
        raise ValueError(f"loss run {spec!r}: both bits 0: {both_exact}")
    return dict(spec=spec, comm="zpccl", config=zpccl, weight_bits=w, grad_bits=g)


def parse_seeds(text: str | None, default: int) -> list[int]:
    if text is None:
        return [default]
    try:
        return ls.parse_seeds(text)
    except ValueError as e:
        raise ValueError(f"--loss-seeds {text!r}: {e}") from None


def run_setup(bench: Any, args: argparse.Namespace) -> tuple[list[str], str, Any]:
    """The configurations to time (none with ``--loss-only``), the regime label of the rows, and ``say``: print on
    rank 0, nothing elsewhere."""
    names = [] if args.loss_only else args.config_list
    if not on_cuda(bench):
        label = args.label or "cpu"
    else:
        launch = load_example("fsdp2_train").import_zpccl().launch
        label = args.label or (launch.net_label(bench.torch.cuda.device_count()) if args.nodes else "local")
    say = print if bench.where.rank == 0 else (lambda *a, **k: None)
    return names, label, say


def say_layout(say: Any, title: str, bench: Any, args: argparse.Namespace, n_params: int, groups: str = "",
               weights: bool = True) -> None:
    """The run's first line: the layout, the model, the timed rounds and zpccl's formats (``groups``: more about
    the layout, after the ranks; ``weights``: whether zpccl's formats include the weights', ``--weight-bits``)."""
    where = bench.where
    timed = "no timed rounds" if args.loss_only else f"{args.rounds} rounds of {args.warmup}+{args.steps} steps"
    cuda = on_cuda(bench)
    nodes = f"{args.nodes} nodes{' over sockets' if cuda else ''}, " if args.nodes else ""
    shared = f"{bench.on_device} a GPU" if cuda else "CPU, gloo"
    say(f"# {title}: {where.world} ranks ({nodes}"
        f"{bench.rpn} a node, {shared}){groups}, {n_params / 1e6:.1f}M parameters, "
        f"{args.layers} layers d {args.d_model}, {args.batch} x {args.seq} tokens per rank; {timed}; zpccl "
        + (f"int{args.weight_bits} weights, " if weights else "")
        + f"int{args.grad_bits} gradients, blocks of {args.block_size}"
        + (f" (gradients' {args.grad_block_size})" if args.grad_block_size else ""), flush=True)


# ---- the ranks ---------------------------------------------------------------------------------------------------


def on_cuda(bench: Any) -> bool:
    """Whether the bench's ranks run on GPUs (else on CPUs: ``--cpu``)."""
    return bench.where.device.type == "cuda"


def synchronize(bench: Any) -> None:
    """Waits for the rank's GPU work (nothing to wait for on a CPU), around a timed step."""
    if on_cuda(bench):
        bench.torch.cuda.synchronize()


def peak_memory(bench: Any) -> int:
    """The rank's peak device memory in torch's allocator since :func:`fresh_peak` (0 on a CPU)."""
    return bench.torch.cuda.max_memory_allocated(bench.where.device) if on_cuda(bench) else 0


def ranks_per_host(bench: Any) -> int:
    """How many ranks share this rank's host (by host name)."""
    import socket

    names: list[Any] = [None] * bench.where.world
    bench.dist.all_gather_object(names, socket.gethostname())
    return names.count(names[bench.where.rank])


def ranks_on_device(bench: Any) -> int:
    """How many ranks share this rank's GPU."""
    devs: list[Any] = [None] * bench.where.world
    bench.dist.all_gather_object(devs, (os.environ.get("NCCL_HOSTID", ""), bench.where.device.index))
    return sum(1 for d in devs if d[1] == bench.where.device.index)


def every_rank_object(bench: Any, value: Any) -> list[Any]:
    """Every rank's ``value``, in rank order: gathered after the timed steps, outside them."""
    everyone: list[Any] = [None] * bench.where.world
    bench.dist.all_gather_object(everyone, value)
    return everyone


def every_rank(bench: Any, times: list[float]) -> list[list[float]]:
    """Every rank's step times (seconds), in rank order."""
    return every_rank_object(bench, [float(t) for t in times])


def memory_taken(bench: Any, on_device: int, make: Callable[[], Any]) -> tuple[Any, int]:
    """``make()``'s result and the device memory it took on this rank: device-wide free memory before and after,
    between barriers, shared among the ``on_device`` ranks of this GPU (what zpccl's enable takes lies outside
    torch's allocator); 0 on a CPU."""
    torch = bench.torch
    if not on_cuda(bench):
        return make(), 0
    torch.cuda.synchronize()
    bench.dist.barrier()
    free_before = torch.cuda.mem_get_info(bench.where.device)[0]
    made = make()
    torch.cuda.synchronize()
    bench.dist.barrier()
    return made, (free_before - torch.cuda.mem_get_info(bench.where.device)[0]) // on_device


# ---- the timed rounds --------------------------------------------------------------------------------------------


def pin_rank(cpu_lists: list[list[int]] | None) -> None:
    """``--rank-cpus`` (``args.rank_cpu_lists``): this rank process (RANK in the environment, as the launchers set
    it) onto its CPUs, before its first CUDA or NCCL call so that the threads those start run there too; nothing
    without the option."""
    if not cpu_lists:
        return
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if len(cpu_lists) != world:
        raise SystemExit(f"--rank-cpus gives {len(cpu_lists)} CPU lists for {world} ranks: give one list per rank, "
                         "separated by '/'")
    try:
        ms.pin_to_cpus(cpu_lists[rank])
    except RuntimeError as e:
        raise SystemExit(f"--rank-cpus, rank {rank}: {e}") from None


def fresh_peak(bench: Any) -> None:
    """Frees what the configuration before left and restarts torch's peak count, so that each one's peak memory is
    its own (a dropped FSDP2 model is cyclic: without the collection its memory counts in the next one's peak)."""
    gc.collect()
    if on_cuda(bench):
        bench.torch.cuda.empty_cache()
        bench.torch.cuda.reset_peak_memory_stats(bench.where.device)


def machine_state(bench: Any) -> ms.MachineState:
    """The rank's :class:`machine_state.MachineState`, made on first use (its GPU found in NVML by PCI bus id)."""
    state = getattr(bench, "_machine_state", None)
    if state is None:
        index, bus = None, None
        if on_cuda(bench):
            index = bench.where.device.index or 0
            p = bench.torch.cuda.get_device_properties(index)
            if all(hasattr(p, a) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
                bus = f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
        state = bench._machine_state = ms.MachineState(index, bus)
    return state


def timed_steps(bench: Any, args: argparse.Namespace, round_index: int, step: Callable[[int], float],
                warmed: Callable[[], None]) -> dict[str, Any]:
    """``--warmup`` steps, ``warmed()``, then ``--steps`` timed ones (``step(s)`` gives its seconds; ``s`` picks the
    batch, distinct per round): every rank's times of the timed steps (``times``), what every rank's machine did
    meanwhile (``machine``: machine_state.py) and the peak memory (``peak``). In trace_round's round the timed steps
    run under torch's profiler, and ``trace`` holds every rank's summary."""
    times = []
    state, mark = machine_state(bench), None
    tracing: pathlib.Path | None = getattr(bench, "tracing", None)
    tracer = step_trace.Tracer(bench.torch, on_cuda(bench), tracing, args.steps) if tracing else None
    with contextlib.ExitStack() as traced:
        for s in range(args.warmup + args.steps):
            if s == args.warmup:
                warmed()
                mark = state.mark()
                if tracer is not None:
                    traced.enter_context(tracer)
            t = step(round_index * 1000 + s)
            if s >= args.warmup:
                times.append(t)
    machine = state.since(mark) if mark is not None else None
    summary = tracer.summary if tracer is not None else None
    gathered = every_rank_object(bench, ([float(t) for t in times], machine, summary))
    out = dict(times=[t for t, _, _ in gathered], machine=[m for _, m, _ in gathered], peak=peak_memory(bench))
    if tracer is not None:
        out["trace"] = [x for _, _, x in gathered]
    return out


def trace_round(bench: Any, args: argparse.Namespace, names: list[str], run: Callable[[str, int], dict[str, Any]],
                label: str, say: Any) -> None:
    """``--trace DIR``: one more round of every configuration of ``names`` (``run(name, round)``, as
    alternate_rounds calls it), ``--trace-steps`` steps after the warmup under torch's profiler; its times go in no
    row. Each rank writes its Chrome trace, rank 0 ``DIR/trace-summary.json`` and a table (perf/step_trace.py)."""
    if not args.trace:
        return
    folder = pathlib.Path(args.trace)
    summaries: dict[str, list[dict[str, Any]]] = {}
    timed_steps_per_round = args.steps
    for name in names:
        bench.tracing = folder / f"{name}-rank{bench.where.rank}.json.gz"
        args.steps = args.trace_steps  # what timed_steps and the scripts' per-step counters read, for this round
        try:
            got = run(name, args.rounds)
        finally:
            bench.tracing, args.steps = None, timed_steps_per_round
        if "trace" not in got:  # fsdp_step's zero3 times its own loop
            say(f"# --trace: {name} runs its own loop, not the protocol's timed steps: not traced", flush=True)
            continue
        summaries[name] = got["trace"]
        times = [max(t) for t in zip(*got["times"])]
        for rank_summary in summaries[name]:
            rank_summary["traced_step_ms"] = 1e3 * statistics.median(times)
    if bench.where.rank == 0:
        write_json(folder / "trace-summary.json", dict(
            provenance=provenance(label), regime=label, ranks=bench.where.world, nodes=args.nodes or None,
            steps=args.trace_steps, warmup=args.warmup, configs=summaries))
        say("\n".join(step_trace.table(summaries)), flush=True)


def zpccl_per_step(zp: Any, steps: int) -> tuple[dict[str, int], dict[str, int]]:
    """zpccl's calls and bytes sent from this rank per step, by path, from its counters over ``steps`` steps."""
    summary = zp.summary()
    return ({k: v["calls"] // steps for k, v in summary.items()},
            {k: v["wire_bytes"] // steps for k, v in summary.items()})


def alternate_rounds(rows: dict[str, dict[str, Any]], rounds: int, run: Callable[[str, int], dict[str, Any]],
                     say: Any) -> list[list[Any]]:
    """``rounds`` rounds of every configuration of ``rows`` in turn: ``run(name, round)`` gives ``times`` (every
    rank's), ``peak`` and maybe ``machine`` (every rank's), collected into the row's ``per_rank``, ``peak`` and
    ``machine`` (a round without it: None); the rest updates the row. Gives the order they ran in, ``[round, name]``
    each."""
    for row in rows.values():
        row.setdefault("per_rank", [])
        row.setdefault("machine", [])
        row.setdefault("peak", 0)
    order: list[list[Any]] = []
    t_start = time.perf_counter()
    for r in range(rounds):
        briefs = []
        for name, row in rows.items():
            got = run(name, r)
            order.append([r, name])
            times = got.pop("times")
            row["per_rank"].append(times)
            machine = got.pop("machine", None)
            row["machine"].append(machine)
            row["peak"] = max(row["peak"], got.pop("peak"))
            row.update(got)
            steps = [max(t) for t in zip(*times)] if times and times[0] else []
            if steps and machine:
                briefs.append(f"{name} {1e3 * statistics.median(steps):.1f} ms ({machine_brief(machine)})")
        say(f"#   round {r + 1}/{rounds} done ({time.perf_counter() - t_start:.0f} s)"
            + "".join(f"\n#     {b}" for b in briefs), flush=True)
    return order


def machine_brief(machine: list[dict[str, Any] | None]) -> str:
    """One round's machine_state figures, every rank's, in a few words: the host's busiest and most stolen share,
    the most preemptions and CPU migrations of a rank, the GPU's lowest SM clock and its longest time held back
    (what a call's printed output shows; the JSON keeps them all)."""
    ranks = [m for m in machine if m]

    def most(key: str) -> Any:
        values = [m[key] for m in ranks if m.get(key) is not None]
        return max(values) if values else None

    words = []
    busy, steal, preempted = most("host_busy"), most("host_steal"), most("rank_preempted")
    if busy is not None:
        words.append(f"host busy {100 * busy:.0f}%, steal {100 * steal:.1f}%")
    if preempted is not None:
        words.append(f"preempted {preempted}")
    migrations = most("rank_migrations")
    if migrations is not None:
        words.append(f"migrated {migrations}")
    clocks = [m["gpu_sm_mhz"] for m in ranks if m.get("gpu_sm_mhz") is not None]
    if clocks:
        words.append(f"SM {min(clocks)} MHz")
    held = [sum(m["gpu_held_back_ms"].values()) for m in ranks if m.get("gpu_held_back_ms")]
    if held:
        words.append(f"held back {max(held):.0f} ms")
    return ", ".join(words) or "no machine figures"


def timed_fields(name: str, row: dict[str, Any], args: argparse.Namespace, where: Any, label: str,
                 n_params: int) -> dict[str, Any]:
    """The fields every timed row has, from one configuration's collected rounds (alternate_rounds): the layout,
    the model, the step times (step_summary), tokens per second, the peak memory and what the machine did in each
    round (``machine[round][rank]``: machine_state.py; None where a round did not say)."""
    steps = step_summary([[[1e3 * t for t in rank] for rank in rnd] for rnd in row["per_rank"]])
    tokens = where.world * args.batch * args.seq
    return dict(config=name, regime=label, ranks=where.world, nodes=args.nodes or None, params=n_params,
                layers=args.layers, d_model=args.d_model, seq=args.seq, batch=args.batch, rounds=args.rounds,
                warmup=args.warmup, **steps, tokens_per_s=tokens / (steps["median_ms"] / 1e3),
                peak_mib=row["peak"] / 2**20, machine=row.get("machine"))


def timed_row(name: str, row: dict[str, Any], args: argparse.Namespace, where: Any, label: str, ranks_per_node: int,
              n_params: int) -> dict[str, Any]:
    """A timed row of the sharded steps (FSDP2's, DeepSpeed's): timed_fields, and zpccl's formats (the same in every
    row), its calls per step and the device memory its enable took."""
    return dict(timed_fields(name, row, args, where, label, n_params), ranks_per_node=ranks_per_node,
                weight_bits=args.weight_bits, grad_bits=args.grad_bits, block_size=args.block_size,
                grad_block_size=args.grad_block_size or args.block_size, calls=row.get("calls"),
                enable_mib=row.get("enable_bytes", 0) / 2**20)


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


def vs_cell(rows: list[dict[str, Any]], name: str, row: dict[str, Any]) -> str:
    """A report's "vs NAME" cell: ratio_of the row of configuration ``name`` over ``row``, "-" without one."""
    base = next((r for r in rows if r["config"] == name), None)
    if base is None:
        return "-"
    ratio, lo, hi = ratio_of(base, row)
    return f"{ratio:.2f}x" + (f" ({lo:.2f}-{hi:.2f})" if lo is not None else "")


STEP_NOTE = "(a step's time is its slowest rank's; ratios: medians, in brackets the rounds' least and greatest)"


# ---- the loss runs -----------------------------------------------------------------------------------------------


def mean_over_ranks(bench: Any, value: Any) -> float:
    """A float tensor of this rank (one element), averaged over the ranks: ReduceOp.AVG, which NCCL and gloo both
    reduce in every torch these scripts run on (2.9 or later; gloo reduces it since before 2.9), so that the GPU and
    the ``--cpu`` runs average alike, in the tensor's float32."""
    mean = value.detach().float().clone()
    bench.dist.all_reduce(mean, op=bench.dist.ReduceOp.AVG)
    return float(mean)


def train_for_loss(bench: Any, steps: int, train_step: Callable[[int], Any], stop: int = 0) -> dict[str, Any]:
    """Runs ``train_step(s)`` (one optimizer step on step ``s``'s batch, returning its loss) ``steps`` times, or
    ``stop`` times where that is set (``--loss-stop``: the schedule stays that of ``steps``); gives the training
    curve (every tenth step's loss, averaged over ranks; with ``stop``, every step's) and the mean training loss
    over the last TRAIN_TAIL steps (``train_tail``, over ``train_tail_steps``)."""
    every = 1 if stop else 10
    steps = stop or steps
    curve = []
    tail_from = max(0, steps - TRAIN_TAIL)
    tail = bench.torch.zeros((), device=bench.where.device)
    for s in range(steps):
        loss = train_step(s).detach().float()
        if s >= tail_from:
            tail += loss
        if s % every == 0 or s == steps - 1:
            curve.append((s, mean_over_ranks(bench, loss)))
    return dict(train_tail=mean_over_ranks(bench, tail) / max(1, steps - tail_from), train_tail_steps=steps - tail_from,
                curve=curve)


def finish(bench: Any, args: argparse.Namespace, label: str, say: Any, rows: list[dict[str, Any]],
           loss_run: Callable[[dict[str, Any], int], dict[str, Any]],
           report: Callable[[list[dict[str, Any]], list[dict[str, Any]]], None], **doc: Any) -> None:
    """The loss runs (seed-major: every run of one seed, then the next, so that runs cut short leave whole seeds),
    the JSON (``-J``: provenance, the timed rows, the loss runs and their summary, and ``doc``'s fields), rewritten
    after every loss run, and the report on rank 0; then the process group goes."""
    where = bench.where
    losses: list[dict[str, Any]] = []
    record, host = (provenance(label), ms.host_cpus()) if where.rank == 0 else (None, None)

    def save() -> None:
        if where.rank == 0 and args.json:
            write_json(pathlib.Path(args.json), dict(
                provenance=record, rows=rows, losses=losses, loss_summary=loss_summary(losses), loss_seeds=args.seeds,
                loss_runs=[r["spec"] for r in args.loss_specs], regime=label, ranks=where.world,
                nodes=args.nodes or None, host_cpus=host, rank_cpus=args.rank_cpu_lists, **doc,
                block_size=args.block_size,
                grad_block_size=args.grad_block_size or args.block_size, lr=args.lr, loss_stop=args.loss_stop or None))

    save()
    if args.loss_steps:
        t_start = time.perf_counter()
        for seed in args.seeds:
            for run in args.loss_specs:
                x = loss_run(run, seed)
                losses.append(x)
                say(f"#   loss {x['spec']} seed {seed}: validation {x['valid']:.4f}, training (last "
                    f"{x['train_tail_steps']}) {x['train_tail']:.4f} ({time.perf_counter() - t_start:.0f} s)",
                    flush=True)
                save()
    if where.rank == 0:
        report(rows, losses)
    bench.dist.destroy_process_group()


def write_json(path: pathlib.Path, doc: dict[str, Any]) -> None:
    """Writes through a temporary file and a rename, so that a run killed mid-write leaves the previous file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


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
    seed by seed (``gap_pct``: mean, min, max over the seeds both ran, and each seed's: tools/loss_stats.py's
    gaps_by_config). The reference is the first run whose ``comm`` is ``nccl`` or ``deepspeed`` (the exact
    collectives), else the first run."""
    if not losses:
        return []
    named = [dict(x, spec=x.get("spec", x["comm"]), seed=x.get("seed")) for x in losses]
    specs = list(dict.fromkeys(x["spec"] for x in named))
    ref = next((x["spec"] for x in named if x["comm"] in ("nccl", "deepspeed")), specs[0])
    gaps = ls.gaps_by_config(named, ref, name="spec")
    out = []
    for spec in specs:
        mine = [x for x in named if x["spec"] == spec]
        g = gaps.get(spec)
        row = dict(spec=spec, label=run_label(mine[0]), reference=ref, seeds=[x["seed"] for x in mine],
                   valid=_spread([x["valid"] for x in mine]),
                   train_tail=_spread([x["train_tail"] for x in mine]) if all("train_tail" in x for x in mine)
                   else None,
                   gap_pct=dict(_spread(list(g.values())), per_seed=g) if g else None)
        out.append(row)
    return out
