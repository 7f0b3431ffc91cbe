#!/usr/bin/env python3
"""Train a byte-level GPT on real text with DeepSpeed ZeRO-3: DeepSpeed's own collectives, DeepSpeed's ZeRO++, or
zpccl's ZeRO++ collectives inside DeepSpeed.

    deepspeed --num_gpus 2 tools/python/examples/deepspeed_train.py --comm zpccl --steps 200
    python tools/python/examples/deepspeed_train.py --nproc 2 --comm zpccl      # spawns the processes itself
    python tools/python/examples/deepspeed_train.py --nproc 4 --nodes 2 --hpz 2  # 4 processes sharing GPUs as 2
                                                                                 # nodes over sockets
    python tools/python/examples/deepspeed_train.py --cpu --nproc 2 --hpz 2 --layers 2 --d-model 192 --seq 64

With ``--comm zpccl`` the only change to a DeepSpeed script is the initialize call, with the ZeRO++ switches in the
config as DeepSpeed's ZeRO++ takes them::

    config["zero_optimization"].update(zero_quantized_weights=True, zero_quantized_gradients=True,
                                       zero_hpz_partition_size=2)
    engine, optimizer, _, scheduler = zpccl.deepspeed.initialize(model=model, optimizer=optimizer,
                                                                 lr_scheduler=scheduler, config=config)

Forward weight gathers then travel as int8 blocks (qwZ), gradient reduce-scatters as int4 blocks (qgZ), and the
backward gathers over DeepSpeed's hpZ groups stay inside the node, exact (hpZ); the config's ``"zpccl"`` section
holds the rest of zpccl's policy (block sizes, the node layout). ``--comm zeropp`` runs the same config on
DeepSpeed's own ZeRO++ (its CUDA quantizer, compiled on first use); ``--comm deepspeed`` plain ZeRO-3.
``--cpu`` runs DeepSpeed's CPU accelerator over gloo (zpccl's host backend, ranks as processes): slow, for trying
it without a GPU. DeepSpeed keeps parameters smaller than stage3_param_persistence_threshold (1e5 elements) whole
on every rank, gathered exactly: a model that small would show no qwZ. The model, text and schedule are fsdp2_train.py's; ``perf/deepspeed_step.py`` times the three
under alternating rounds.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import sys
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import fsdp2_train as ex  # noqa: E402

COMMS = ("deepspeed", "zeropp", "zpccl")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ex.add_model_args(p)
    p.add_argument("--comm", choices=COMMS, default="zpccl")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--log-every", type=int, default=20)
    add_zero_args(p)
    ex.add_launch_args(p)
    p.add_argument("--cpu", action="store_true", help="DeepSpeed's CPU accelerator over gloo (no GPU needed)")
    return p.parse_args(argv)


def require_deepspeed() -> None:
    """Stops this script, saying what to install, where DeepSpeed is not importable: before any rank starts, since
    each rank would fail on its own import, and a launcher of many runs would start every one only to see it fail."""
    if importlib.util.find_spec("deepspeed") is None:
        ex.import_zpccl()  # the installed package, or the source tree's
        need = ".".join(map(str, importlib.import_module("zpccl.deepspeed").MIN_DEEPSPEED))
        sys.exit(f"{pathlib.Path(sys.argv[0]).name}: DeepSpeed is not importable: pip install 'deepspeed>={need}' (on "
                 "a GPU machine without network: carry the wheels of `bash tools/gpu-python-deps.sh make` in .whl/, "
                 "then `source tools/gpu-python-deps.sh; use_carried_wheels $PWD`)")


def add_zero_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hpz", type=int, default=None,
                   help="zero_hpz_partition_size for zeropp and zpccl (default: the ranks per node; 1: no hpZ)")
    ex.add_quant_args(p, helps={"weight_bits": "zpccl: qwZ's bits (DeepSpeed's ZeRO++: 8)",
                                "grad_bits": "zpccl: qgZ's bits (DeepSpeed's ZeRO++: 4)"})


def zero_config(args: argparse.Namespace, comm: str, ranks_per_node: int | None, hpz: int) -> dict[str, Any]:
    """The DeepSpeed config of one run: ZeRO-3 with overlapped communication and contiguous gradients, bf16,
    gradient clipping at 1; for zeropp and zpccl DeepSpeed's ZeRO++ switches (qwZ, qgZ, hpZ groups of ``hpz``),
    and for zpccl its section (widths, blocks, the emulated node layout)."""
    zero: dict[str, Any] = {"stage": 3, "overlap_comm": True, "contiguous_gradients": True}
    cfg: dict[str, Any] = {"train_micro_batch_size_per_gpu": args.batch, "gradient_clipping": 1.0,
                           "zero_optimization": zero, "bf16": {"enabled": True}, "steps_per_print": 1 << 30}
    if comm in ("zeropp", "zpccl"):
        zero.update(zero_quantized_weights=True, zero_quantized_gradients=True, zero_hpz_partition_size=hpz)
    if comm == "zpccl":
        section: dict[str, Any] = dict(weight_bits=args.weight_bits, grad_bits=args.grad_bits,
                                       block_size=args.block_size)
        if args.grad_block_size:
            section["grad_block_size"] = args.grad_block_size
        if ranks_per_node:
            section["ranks_per_node"] = ranks_per_node
        cfg["zpccl"] = section
    return cfg


class CpuLaunch(ex.CpuLaunch):
    """This process's place on DeepSpeed's CPU accelerator: gloo, ranks as processes."""

    def init(self) -> Any:
        import deepspeed

        # DeepSpeed's CPU backend JIT-compiles a shared-memory all-reduce when it starts (minutes, once per
        # machine); nothing here uses it.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        return super().init()


def where_am_i(args: argparse.Namespace) -> Any:
    """The launch (GPU: fsdp2_train's, with DeepSpeed told the device by LOCAL_RANK; CPU: gloo), initialized."""
    if args.cpu:
        where = CpuLaunch(args.nodes)
    else:
        where = ex.Launch(args.nodes)
        os.environ["LOCAL_RANK"] = str(where.device.index)  # DeepSpeed places itself on LOCAL_RANK's device
    where.init()
    return where


def make_engine(torch: Any, args: argparse.Namespace, comm: str, where: Any, seed: int,
                steps: int) -> tuple[Any, Any]:
    """(engine, zpccl.deepspeed's handle or None) of a fresh model under ``comm``, with fsdp2_train's optimizer and
    schedule (AdamW, warmup then cosine)."""
    import deepspeed

    zpccl = ex.import_zpccl()
    import zpccl.deepspeed

    model = ex.build_gpt(torch, args.layers, args.d_model, args.heads, args.seq, seed)
    opt, schedule = ex.make_optimizer(torch, model, args.lr, steps)
    hpz = args.hpz or where.ranks_per_node or 1
    config = zero_config(args, comm, where.ranks_per_node, hpz)
    init = zpccl.deepspeed.initialize if comm == "zpccl" else deepspeed.initialize
    engine, *_ = init(model=model, optimizer=opt, lr_scheduler=schedule, config=config)
    return engine, zpccl.deepspeed.session_of(engine)


def loss_of(torch: Any, engine: Any, ids: Any, targets: Any) -> Any:
    logits = engine(ids)
    return torch.nn.functional.cross_entropy(logits.float().reshape(-1, 256), targets.reshape(-1))


def validation_loss(torch: Any, engine: Any, batches: list[tuple[Any, Any]]) -> float:
    """Mean loss over the validation batches in eval mode, averaged over the ranks."""
    engine.eval()
    with torch.no_grad():
        total = sum(loss_of(torch, engine, ids, t).detach() for ids, t in batches) / len(batches)
    engine.train()
    torch.distributed.all_reduce(total, op=torch.distributed.ReduceOp.AVG)
    return float(total)


def train(args: argparse.Namespace) -> None:
    import torch

    where = where_am_i(args)
    engine, zp = make_engine(torch, args, args.comm, where, args.seed, args.steps)
    data = ex.Batches(torch, ex.corpus(), args.seq, args.batch, where.rank, where.device, args.seed)
    if where.rank == 0:
        n = sum(p.ds_numel for p in engine.module.parameters())
        what = {"deepspeed": "DeepSpeed's collectives", "zeropp": "DeepSpeed's ZeRO++",
                "zpccl": f"zpccl qwZ int{args.weight_bits} / qgZ int{args.grad_bits}"}[args.comm]
        print(f"DeepSpeed ZeRO-3 on {what}: {where.world} ranks"
              f"{f' as {args.nodes} nodes' if args.nodes else ''}{' over sockets' if args.nodes and not args.cpu else ''}"
              f"{' (CPU)' if args.cpu else ''}"
              f"{f', hpZ groups of {zp.hpz_size}' if zp is not None and zp.hpz_size else ''}; {n / 1e6:.1f}M "
              f"parameters, {args.batch} x {args.seq} bytes per rank and step", flush=True)

    def step(ids: Any, targets: Any) -> Any:
        loss = loss_of(torch, engine, ids, targets)
        engine.backward(loss)
        engine.step()
        return loss

    ex.train_loop(torch, args, where, data, step)
    ex.finish(torch, where, validation_loss(torch, engine, data.validation()), zp)


if __name__ == "__main__":
    arguments = parse_args()
    require_deepspeed()
    if arguments.cpu:
        os.environ["DS_ACCELERATOR"] = "cpu"  # before any rank imports DeepSpeed
    ex.launch(train, arguments)
