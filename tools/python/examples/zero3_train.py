#!/usr/bin/env python3
"""ZeRO-3 training of a small byte-level transformer LM with zpccl's collectives, next to torch.distributed's.

    torchrun --nproc_per_node 2 tools/python/examples/zero3_train.py --steps 50
    python tools/python/examples/zero3_train.py --steps 50          # spawns one process per GPU itself

Each "unit" (embedding, each transformer block, the head) keeps its parameters as one flat bf16 tensor,
sharded over the ranks: rank r owns elements [r*S, (r+1)*S) in fp32 (master weights, AdamW state) and in bf16
(what travels). Per step and unit:

=========  ==============================================  ==================================================
phase      zpccl (ZeRO++)                                  torch.distributed (ZeRO-3 baseline)
=========  ==============================================  ==================================================
forward    qwZ: ``quant_all_gather`` of the bf16 shard       ``all_gather_into_tensor`` of the bf16 shard
           (int8 blocks), then keep the hpZ secondary shard
           (``hier_secondary_shard``), free the full weights  free the full weights
backward   hpZ: ``hier_all_gather`` rebuilds the weights     ``all_gather_into_tensor`` again
           from secondary shards, inside the node
gradients  qgZ: ``quant_reduce_scatter(op="avg")`` (int4)   ``reduce_scatter_tensor(op=AVG)`` (bf16)
=========  ==============================================  ==================================================

Both runs start from the same weights and see the same batches; the script prints both loss curves and their
step times. The full weights of a unit live only while the unit computes: after its forward their storage is
released (``untyped_storage().resize_(0)``, as FSDP does) and refilled before its backward, so the autograd
graph saved in the forward reads the refilled weights.

Import-light: each rank imports torch, then zpccl (so that zpccl's libnccl.so.2 resolves to the one torch
loaded, and the process holds a single NCCL); ``main`` imports only zpccl's launcher, which loads neither.
"""
from __future__ import annotations

import argparse
import math
import os
import pathlib
import time
from typing import Any


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=16, help="sequences per rank and step")
    p.add_argument("--lr", type=float, default=1e-3)
    _fsdp2_example().add_quant_args(p, ("weight_bits", "grad_bits", "block_size"))
    p.add_argument("--ranks-per-node", type=int, default=None,
                   help="emulate nodes of this many ranks (1: hpZ groups of one, qgZ over 'nodes')")
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--nproc", type=int, default=2, help="processes to spawn when not started by torchrun")
    return p.parse_args(argv)


# ---- data: byte-level text from the source files next to this one ------------------------------------------


def corpus_bytes() -> bytes:
    """The bytes of zpccl's Python sources: a small, always-present, learnable corpus."""
    root = pathlib.Path(__file__).resolve().parents[1]
    files = sorted(root.rglob("*.py")) + sorted(root.rglob("*.md"))
    return b"\n".join(f.read_bytes() for f in files)


# ---- the model, as units whose parameters travel as one flat tensor ----------------------------------------


def _fsdp2_example() -> Any:
    """fsdp2_train.py beside this file, whose transformer block and way of finding zpccl (``import_zpccl``: installed,
    else the source tree's) this script shares."""
    try:
        import fsdp2_train
    except ImportError:
        import sys

        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
        import fsdp2_train
    return fsdp2_train


def build_units(args: argparse.Namespace, torch: Any) -> list[Any]:
    """nn.Modules of the units: embedding, blocks, head (fp32, on the CPU; only used for shapes and init)."""
    nn = torch.nn
    d, h = args.d_model, args.heads

    class Embed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(256, d)
            self.pos = nn.Parameter(torch.randn(args.seq, d) * 0.02)
            nn.init.normal_(self.tok.weight, std=0.02)

        def forward(self, ids: Any) -> Any:
            return self.tok(ids) + self.pos[: ids.shape[1]]

    Block = _fsdp2_example().gpt_block(torch, d, h)

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln, self.out = nn.LayerNorm(d), nn.Linear(d, 256)

        def forward(self, x: Any) -> Any:
            return self.out(self.ln(x))

    torch.manual_seed(0)  # every rank builds the same initial weights
    return [Embed()] + [Block() for _ in range(args.layers)] + [Head()]


class Unit:
    """One unit's sharded state: parameter layout, fp32 master shard + AdamW, bf16 shard, and per-step buffers."""

    def __init__(self, module: Any, world: int, rank: int, device: Any, lr: float, torch: Any) -> None:
        self.names = [n for n, _ in module.named_parameters()]
        self.shapes = [p.shape for _, p in module.named_parameters()]
        self.numels = [p.numel() for _, p in module.named_parameters()]
        numel = sum(self.numels)
        self.shard = -(-numel // (world * 16)) * 16  # elements per rank, 16-element aligned
        self.padded = self.shard * world
        flat = torch.zeros(self.padded, dtype=torch.float32, device=device)
        flat[:numel] = torch.cat([p.detach().reshape(-1) for p in module.parameters()]).to(device)
        self.init_shard = flat[rank * self.shard:(rank + 1) * self.shard].clone()
        # The module keeps only its structure: forward gets the gathered weights through functional_call.
        self.module = module.to("meta")
        self.lr, self.torch = lr, torch
        self.reset()

    def reset(self) -> None:
        """Back to the initial weights and a fresh optimizer (so that both runs start alike)."""
        torch = self.torch
        self.master = torch.nn.Parameter(self.init_shard.clone())
        self.opt = torch.optim.AdamW([self.master], lr=self.lr, weight_decay=0.0)
        self.bf16 = self.master.detach().to(torch.bfloat16)
        self.full: Any = None  # the gathered flat bf16 weights while the unit computes
        self.secondary: Any = None  # hpZ secondary shard, kept from forward to backward
        self.grad_shard: Any = None

    def params(self, full: Any) -> dict[str, Any]:
        """Leaf tensors viewing ``full``: the weights the unit computes with."""
        out, offset = {}, 0
        for name, shape, n in zip(self.names, self.shapes, self.numels):
            out[name] = full[offset:offset + n].view(shape).detach().requires_grad_()
            offset += n
        return out

    def flat_grad(self, leaves: dict[str, Any]) -> Any:
        """The unit's gradient as one flat bf16 tensor of ``padded`` elements."""
        torch = self.torch
        flat = torch.zeros(self.padded, dtype=torch.bfloat16, device=self.bf16.device)
        offset = 0
        for name, n in zip(self.names, self.numels):
            g = leaves[name].grad
            if g is not None:
                flat[offset:offset + n].copy_(g.reshape(-1))
            offset += n
        return flat

    def step(self) -> None:
        """AdamW on the master shard with the reduced gradient shard, then the bf16 copy that travels."""
        self.master.grad = self.grad_shard.float()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.bf16.copy_(self.master.detach())


# ---- the two ways to move weights and gradients -------------------------------------------------------------


class ZeroPlusPlus:
    """qwZ forward gather, hpZ backward gather, qgZ gradient reduce-scatter."""

    name = "zpccl qwZ+hpZ+qgZ"

    def __init__(self, comm: Any) -> None:
        self.comm = comm

    def forward_gather(self, unit: Unit) -> Any:
        full = self.comm.quant_all_gather(unit.bf16)
        offset, count = self.comm.hier_secondary_shard(full.numel())
        unit.secondary = full[offset:offset + count].clone()
        return full

    def backward_gather(self, unit: Unit, full: Any) -> None:
        self.comm.hier_all_gather(unit.secondary, full)
        unit.secondary = None

    def reduce_scatter(self, unit: Unit, flat_grad: Any) -> Any:
        return self.comm.quant_reduce_scatter(flat_grad, op="avg")


class TorchBaseline:
    """NCCL through torch.distributed: bf16 all-gathers (forward and backward) and reduce-scatter."""

    name = "torch.distributed bf16"

    def __init__(self, torch: Any) -> None:
        self.torch, self.dist = torch, torch.distributed

    def forward_gather(self, unit: Unit) -> Any:
        full = self.torch.empty(unit.padded, dtype=self.torch.bfloat16, device=unit.bf16.device)
        self.dist.all_gather_into_tensor(full, unit.bf16)
        return full

    def backward_gather(self, unit: Unit, full: Any) -> None:
        self.dist.all_gather_into_tensor(full, unit.bf16)

    def reduce_scatter(self, unit: Unit, flat_grad: Any) -> Any:
        out = self.torch.empty(unit.shard, dtype=flat_grad.dtype, device=flat_grad.device)
        self.dist.reduce_scatter_tensor(out, flat_grad, op=self.dist.ReduceOp.AVG)
        return out


def make_unit_function(torch: Any) -> Any:
    """The autograd.Function that runs one unit ZeRO-3 style (weights gathered in forward, freed, regathered in
    backward; the gradient reduce-scattered to the owner of each shard)."""

    class ShardedUnit(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any, anchor: Any, unit: Unit, comm: Any) -> Any:
            full = comm.forward_gather(unit)
            leaves = unit.params(full)
            x_in = x.detach().requires_grad_() if x.is_floating_point() else x
            with torch.enable_grad():
                out = torch.func.functional_call(unit.module, leaves, (x_in,))
            full.untyped_storage().resize_(0)  # the weights live only while the unit computes
            ctx.unit, ctx.comm, ctx.full, ctx.leaves, ctx.x_in, ctx.out = unit, comm, full, leaves, x_in, out
            return out.detach()

        @staticmethod
        def backward(ctx: Any, grad_out: Any) -> Any:
            unit, full = ctx.unit, ctx.full
            full.untyped_storage().resize_(unit.padded * full.element_size())
            ctx.comm.backward_gather(unit, full)  # the saved graph reads these weights
            torch.autograd.backward(ctx.out, grad_out)
            unit.grad_shard = ctx.comm.reduce_scatter(unit, unit.flat_grad(ctx.leaves))
            full.untyped_storage().resize_(0)
            grad_x = ctx.x_in.grad if ctx.x_in.is_floating_point() else None
            ctx.out = ctx.leaves = ctx.x_in = ctx.full = None
            return grad_x, None, None, None

    return ShardedUnit


# ---- training ---------------------------------------------------------------------------------------------


def train(args: argparse.Namespace, units: list[Unit], comm: Any, data: Any, rank: int, device: Any,
          torch: Any) -> tuple[list[float], list[float]]:
    """Runs ``args.steps`` steps; returns the global mean loss and the wall time of each step."""
    F = torch.nn.functional
    fn = make_unit_function(torch)
    for unit in units:
        unit.reset()
    anchor = torch.zeros(1, device=device, requires_grad=True)  # connects the first unit to the graph
    losses, times = [], []
    for step in range(args.steps):
        g = torch.Generator().manual_seed(1000 * step + rank)  # same batches in both runs
        starts = torch.randint(0, data.numel() - args.seq - 1, (args.batch,), generator=g)
        batch = torch.stack([data[s:s + args.seq + 1] for s in starts.tolist()]).to(device, non_blocking=True)
        ids, targets = batch[:, :-1].long(), batch[:, 1:].long()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        h = ids
        for unit in units:
            h = fn.apply(h, anchor, unit, comm)
        loss = F.cross_entropy(h.float().reshape(-1, 256), targets.reshape(-1))
        loss.backward()
        for unit in units:
            unit.step()
        mean = loss.detach().clone()
        torch.distributed.all_reduce(mean, op=torch.distributed.ReduceOp.AVG)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(float(mean))
    return losses, times


def run(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    zpccl = _fsdp2_example().import_zpccl()  # after torch: one libnccl.so.2 in the process

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    dist.init_process_group("nccl")
    try:
        config = {"weight_bits": args.weight_bits, "grad_bits": args.grad_bits, "block_size": args.block_size,
                  "ranks_per_node": args.ranks_per_node}
        with zpccl.Comm.from_torch_group(**config) as comm:
            if rank == 0:
                print(f"zpccl {zpccl.library_path()}: {world} ranks, {comm.node_count} node(s), hpZ groups of "
                      f"{comm.hpz_size}; weights int{args.weight_bits}, gradients int{args.grad_bits}, blocks of "
                      f"{args.block_size}")
            units = [Unit(m, world, rank, device, args.lr, torch) for m in build_units(args, torch)]
            if rank == 0:
                n = sum(sum(u.numels) for u in units)
                print(f"model: {args.layers} layers, d={args.d_model}, {n / 1e6:.2f} M parameters in {len(units)} "
                      f"units; {args.batch} x {args.seq} bytes per rank and step")
            data = torch.frombuffer(bytearray(corpus_bytes()), dtype=torch.uint8)
            results = {}
            for method in (ZeroPlusPlus(comm), TorchBaseline(torch)):
                results[method.name] = train(args, units, method, data, rank, device, torch)
        if rank == 0:
            report(args, results)
    finally:
        dist.destroy_process_group()


def report(args: argparse.Namespace, results: dict[str, tuple[list[float], list[float]]]) -> None:
    names = list(results)
    print("\nstep  " + "  ".join(f"{n:>24}" for n in names))
    for step in range(args.steps):
        if step % args.log_every == 0 or step == args.steps - 1:
            print(f"{step:4d}  " + "  ".join(f"{results[n][0][step]:24.4f}" for n in names))
    warm = min(3, max(0, args.steps - 1))  # the first steps include allocation and NCCL setup
    print()
    for n in names:
        losses, times = results[n]
        t = sorted(times[warm:])
        print(f"{n:>24}: final loss {losses[-1]:.4f}, step time median {1e3 * t[len(t) // 2]:.2f} ms, "
              f"mean {1e3 * sum(t) / len(t):.2f} ms (steps {warm}..{args.steps - 1})")
    a, b = (results[n][0] for n in names)
    gap = max(abs(x - y) for x, y in zip(a, b))
    print(f"largest loss gap between the two runs: {gap:.4f} ({100 * gap / max(b[-1], 1e-9):.2f}% of the final "
          f"baseline loss; random guessing is {math.log(256):.2f})")


def main() -> None:
    args = parse_args()
    zpccl = _fsdp2_example().import_zpccl()
    zpccl.launch.set_default_env()  # NVLink multicast stays off on shared machines
    zpccl.launch.run(run, args.nproc, args)  # here under torchrun, else spawned


if __name__ == "__main__":
    main()
