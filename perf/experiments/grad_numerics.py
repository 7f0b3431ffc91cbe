#!/usr/bin/env python3
"""Loss runs of qgZ's gradient rounding (issue 33): FSDP2 training of a small byte-level GPT on real text, each
configuration against exact bf16 gradients, through the library.

    python perf/experiments/grad_numerics.py --seeds 0 -J perf/results/grad-numerics-0.json   # one GPU, one seed
    python perf/experiments/grad_numerics.py --cpu --steps 3 -J /tmp/g.json              # the plumbing, on the CPU

GPU: ``--nproc`` processes (default 4) share the GPU, each its own ``NCCL_HOSTID`` with NCCL's P2P and shared
memory off (sockets between them: regime net, ``zpccl.launch.regime_env``), as ``--nodes`` emulated nodes (default
2: two nodes of two, so qgZ takes its two hops and the intermediate hop's residual is exercised); ``--nodes 0``
leaves NCCL its own links (a GPU each). CPU (``--cpu``): the ranks are threads on torch's
threaded process group and zpccl's host backend serves them, to test this script without a GPU.

Configurations (``--configs``), each run with every ``--seeds`` seed (model initialization and data order):

==============  ===============================================================================================
exact           FSDP2's own collectives (bf16 weights and bf16 gradient reduce-scatters, NCCL): the reference
exact-fp32      FSDP2's own collectives, gradients reduced in fp32: a second exact run, whose gap to ``exact`` is
                the comparison's noise floor (any perturbation of the gradients sends a run along another
                trajectory)
int4            zpccl's qgZ, int4 gradients rounded to nearest (today's default); the weights stay on FSDP's
                own bf16 all-gathers unless ``--weight-bits`` says otherwise, so that only the gradients differ
int4-sr         int4 with stochastic rounding (``grad_rounding="stochastic"``)
int4-ef         int4 with error feedback (``error_feedback=True``: bf16 residuals, both hops)
int4-sr-ef      both
int8            int8 gradients rounded to nearest (not run unless asked for): what twice the bits buy
int4-b64        int4 gradients in blocks of 64 (``grad_block_size=64``): a scale per
                64 elements follows the gradients' spread of magnitudes more closely (3.56x fewer bytes than
                bf16, against 3.88x in blocks of 256); not run unless asked for: ``int4-b64-sr`` with stochastic
                rounding, ``int4-b32`` in blocks of 32 (3.2x)
==============  ===============================================================================================

The model, data and batches are ``tools/python/examples/fsdp2_train.py``'s (Python's standard library sources,
95% train / 5% validation). Per run: the mean loss of every step (over ranks), the validation loss at the end,
step times, and zpccl's summary (the residuals' memory). The JSON (``-J``, rewritten after every run) holds the
provenance (perf/provenance.py), every run and, per configuration, the validation loss's gap to ``exact`` of the
same seed in percent (``gap_pct``: the mean and each seed's; the issue's target: within 0.1%).
``tools/plot_grad_numerics.py`` plots it. Four processes over sockets on one H200 took about two minutes a run of
600 steps with ``--per-block`` (~120 ms a step, mostly the latency of each unit's collectives over sockets); the
root alone makes two collectives a step.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time
from typing import Any

PERF = pathlib.Path(__file__).resolve().parents[1]
TOP = PERF.parent
sys.path.insert(0, str(PERF))
sys.path.insert(0, str(TOP / "tools" / "python"))
sys.path.insert(0, str(TOP / "tools" / "python" / "examples"))
sys.path.append(str(TOP / "tools"))

import fsdp2_train as ex  # noqa: E402  (the example's model, data and launch helpers)
import loss_stats as ls  # noqa: E402  (tools/loss_stats.py: the paired gaps)
from provenance import provenance  # noqa: E402  (perf/provenance.py)

CONFIGS = {
    "exact": None,
    "exact-fp32": None,
    "int4": dict(grad_bits=4),
    "int4-sr": dict(grad_bits=4, grad_rounding="stochastic"),
    "int4-ef": dict(grad_bits=4, error_feedback=True),
    "int4-sr-ef": dict(grad_bits=4, grad_rounding="stochastic", error_feedback=True),
    "int8": dict(grad_bits=8),
    "int4-b64": dict(grad_bits=4, grad_block_size=64),
    "int4-b64-sr": dict(grad_bits=4, grad_block_size=64, grad_rounding="stochastic"),
    "int4-b32": dict(grad_bits=4, grad_block_size=32),
}
DEFAULT_CONFIGS = "exact,exact-fp32,int4,int4-sr,int4-ef,int4-sr-ef,int4-b64"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default=DEFAULT_CONFIGS, help="comma-separated, of: " + ", ".join(CONFIGS))
    p.add_argument("--seeds", default="0,1", help="comma-separated seeds")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw",
                   help="sgd: SGD with momentum 0.9 (give it a larger --lr, e.g. 0.1)")
    p.add_argument("--lr-final", type=float, default=0.1,
                   help="the learning rate at the last step, as a fraction of --lr (cosine decay; 1: constant)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank and step")
    p.add_argument("--per-block", action="store_true",
                   help="fully_shard each block too (default: the root only, one all-gather and one reduce-scatter "
                        "a step, whose latency over sockets is most of a step of a model this small)")
    ex.add_quant_args(p, ("block_size",))
    p.add_argument("--weight-bits", type=int, choices=(0, 4, 8), default=0,
                   help="zpccl's weight all-gathers (qwZ) in the zpccl runs; 0 (default): FSDP's own exact bf16 "
                        "ones, so that a run differs from exact only in its gradients")
    p.add_argument("--nproc", type=int, default=4, help="ranks (processes on the GPU, threads with --cpu)")
    p.add_argument("--nodes", type=int, default=2, help="emulated nodes (ranks / nodes a node)")
    p.add_argument("--cpu", action="store_true", help="ranks as threads on the CPU, zpccl's host backend")
    p.add_argument("-J", "--json", default="", help="write the runs here")
    return p.parse_args(argv)


def enable(zpccl: Any, model: Any, config: dict[str, Any], args: argparse.Namespace, rpn: int | None) -> Any:
    return zpccl.fsdp.enable(model, weight_bits=args.weight_bits or None, block_size=args.block_size, ranks_per_node=rpn,
                             seed=args.run_seed, **config)


def train_rank(torch: Any, args: argparse.Namespace, config: dict[str, Any] | None, rank: int, world: int,
               device: Any, mesh: Any, rpn: int | None) -> dict[str, Any]:
    """One rank's run: returns per-step mean losses (all ranks), the validation loss and step times (rank 0's)."""
    import torch.distributed as dist
    zpccl = ex.import_zpccl() if config is not None else None
    base = ex.build_gpt(torch, args.layers, args.d_model, args.heads, args.seq, args.run_seed).to(device)
    model = ex.shard_gpt(torch, base, mesh, True, torch.float32 if args.run_config == "exact-fp32" else None,
                         per_block=args.per_block)
    zp = enable(zpccl, model, config, args, rpn) if zpccl is not None else None
    opt, schedule = ex.make_optimizer(torch, model, args.lr, args.steps, final=args.lr_final,
                                      sgd=args.optimizer == "sgd")
    data = ex.Batches(torch, ex.corpus(), args.seq, args.batch, rank + 1000 * args.run_seed, device)
    losses, times = [], []
    for step in range(args.steps):
        ids, targets = data.step(step)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = ex.loss_of(torch, model, ids, targets)
        loss.backward()
        ex.optimizer_step(torch, model, opt, schedule)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        losses.append(float(mean))
    valid = ex.validation_loss(torch, model, data.validation())
    summary = zp.summary() if zp is not None else {}
    if zp is not None:
        zp.disable()
    return dict(losses=losses, valid=valid, step_ms=1e3 * statistics.median(times), summary=summary,
                parameters=sum(p.numel() for p in model.parameters()) * world)


# ---- GPU: one run = nproc processes spawned afresh (zpccl.launch), so that each run's NCCL is fresh ---------------


def gpu_rank(args: argparse.Namespace) -> dict[str, Any] | None:
    """One rank of a GPU run (zpccl.launch's rendezvous in the environment); rank 0 returns the run's result."""
    import torch

    where = ex.Launch(args.nodes)  # with --nodes, regime net: a host each, over sockets, one GPU shared
    mesh = where.init()
    config = CONFIGS[args.run_config]
    result = train_rank(torch, args, config, where.rank, where.world, where.device, mesh, where.ranks_per_node)
    if where.rank == 0:
        result["peak_mib"] = torch.cuda.max_memory_allocated(where.device) / 2**20
    torch.distributed.destroy_process_group()
    return result if where.rank == 0 else None


def run_gpu(args: argparse.Namespace, config: str, seed: int) -> dict[str, Any]:
    args.run_config, args.run_seed = config, seed
    launch = ex.import_zpccl().launch
    launch.set_default_env()
    return launch.spawn(gpu_rank, args.nproc, args)[0]


# ---- CPU: ranks as threads ---------------------------------------------------------------------------------------


def run_cpu(args: argparse.Namespace, config: str, seed: int) -> dict[str, Any]:
    sys.path.insert(0, str(TOP / "tools" / "python"))
    from tests._threaded import run_threaded, torch_with_fsdp2

    torch = torch_with_fsdp2()
    from torch.distributed.device_mesh import init_device_mesh

    args.run_config, args.run_seed = config, seed
    rpn = args.nproc // args.nodes if args.nodes else None

    def body(rank: int) -> dict[str, Any]:
        mesh = init_device_mesh("cpu", (args.nproc,))
        return train_rank(torch, args, CONFIGS[config], rank, args.nproc, torch.device("cpu"), mesh, rpn)

    return run_threaded(args.nproc, body, timeout=3600)[0]


# ---- main --------------------------------------------------------------------------------------------------------


def main() -> None:
    args = parse_args()
    configs = [c for c in args.configs.split(",") if c]
    for c in configs:
        if c not in CONFIGS:
            raise SystemExit(f"grad_numerics: unknown config {c!r} (known: {', '.join(CONFIGS)})")
    seeds = [int(s) for s in args.seeds.split(",") if s]
    # torch and zpccl imported here too, so that the record names the versions the runs' processes load.
    import torch

    launch = ex.import_zpccl().launch
    record = provenance("cpu-threads" if args.cpu else
                        launch.net_label(torch.cuda.device_count()) if args.nodes else "local")
    runs: list[dict[str, Any]] = []
    for seed in seeds:
        for config in configs:
            t0 = time.time()
            r = run_cpu(args, config, seed) if args.cpu else run_gpu(args, config, seed)
            r.update(config=config, seed=seed, seconds=time.time() - t0)
            runs.append(r)
            print(f"{config:11s} seed {seed}: final loss {r['losses'][-1]:.4f}, validation {r['valid']:.4f}, "
                  f"step {r['step_ms']:.1f} ms, {r['seconds']:.0f} s", flush=True)
            write_json(args, record, runs, gaps_to_exact(runs, configs))  # a run cut short keeps what it has
    for config, gap in gaps_to_exact(runs, configs).items():
        print(f"{config:11s} validation loss vs exact: {gap['mean']:+.3f}% "
              f"({', '.join(f'{g:+.3f}%' for g in gap['per_seed'].values())})")
    if args.json:
        print(f"wrote {args.json}")


def gaps_to_exact(runs: list[dict[str, Any]], configs: list[str]) -> dict[str, Any]:
    """Per configuration (of ``configs``, in order), the validation loss's paired gap to ``exact`` of the same seed in
    percent (loss_stats.gaps_by_config): the mean over seeds and each seed's."""
    gaps = ls.gaps_by_config(runs, "exact")
    return {c: dict(mean=statistics.fmean(gaps[c].values()), per_seed=gaps[c]) for c in configs if c in gaps}


def write_json(args: argparse.Namespace, record: dict[str, Any], runs: list[dict[str, Any]],
               gaps: dict[str, Any]) -> None:
    if args.json:
        meta = {k: v for k, v in vars(args).items() if k not in ("run_config", "run_seed")}
        pathlib.Path(args.json).write_text(json.dumps(dict(provenance=record, args=meta, runs=runs, gap_pct=gaps),
                                                      indent=1))


if __name__ == "__main__":
    main()
