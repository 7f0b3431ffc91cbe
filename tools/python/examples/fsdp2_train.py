#!/usr/bin/env python3
"""Train a byte-level GPT on real text with PyTorch FSDP2, on NCCL or on zpccl's ZeRO++ collectives.

    torchrun --nproc_per_node 2 tools/python/examples/fsdp2_train.py --comm zpccl --steps 200
    python tools/python/examples/fsdp2_train.py --nproc 2 --comm nccl      # spawns the processes itself
    python tools/python/examples/fsdp2_train.py --nproc 2 --nodes 2        # 2 processes sharing GPUs as 2
                                                                           # nodes over sockets (NCCL_HOSTID)

With ``--comm zpccl`` the only change to an FSDP2 script is one line after ``fully_shard``::

    zp = zpccl.fsdp.enable(model, weight_bits=8, grad_bits=4, block_size=256)

Forward weight gathers then travel as int8 blocks (qwZ), gradient reduce-scatters as int4 blocks (qgZ), and with
``--reshard k`` (k ranks of a node) the backward gathers stay inside the node, exact (hpZ). The text is Python's
standard library sources (always present, real text: code, docstrings and comments), split into training and
validation bytes. Prints the loss, step time and peak memory every ``--log-every`` steps and a validation loss
at the end. ``perf/fsdp_step.py`` times this model under both stacks in alternating rounds.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import pathlib
import sys
import sysconfig
import threading
import time
from typing import Any


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument("--comm", choices=("nccl", "zpccl"), default="zpccl")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--reshard", default="true",
                   help="reshard_after_forward: true, false, or k (keep a 1/k slice: hpZ groups of k with zpccl)")
    add_quant_args(p)
    p.add_argument("--log-every", type=int, default=20)
    add_launch_args(p)
    return p.parse_args(argv)


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank and step")
    p.add_argument("--seed", type=int, default=0, help="model initialization and training data order")


def add_launch_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc", type=int, default=2, help="processes to spawn when not started by torchrun")
    p.add_argument("--nodes", type=int, default=0,
                   help="emulate this many nodes over sockets (processes get distinct NCCL_HOSTIDs, NCCL's P2P "
                        "and shared memory off; zpccl is told the layout): the way one GPU can stand for a "
                        "cluster whose network is slow. 0: the real layout")


#: zpccl's policy fields that the scripts take as options (``--weight-bits`` ...), in the order they list them.
QUANT_FIELDS = ("weight_bits", "grad_bits", "block_size", "grad_block_size")
_QUANT_HELP = {
    "weight_bits": "zpccl: qwZ's code bits, 4 or 8 (the weights' all-gathers)",
    "grad_bits": "zpccl: qgZ's code bits, 4 or 8 (the gradients' reduce-scatters)",
    "block_size": "zpccl: elements per quantization block",
    "grad_block_size": "zpccl: the gradients' own quantization blocks (default: --block-size); smaller ones cost "
                       "int4 gradients less loss for a few more bytes",
}


def add_quant_args(p: argparse.ArgumentParser, fields: tuple[str, ...] = QUANT_FIELDS,
                   helps: dict[str, str] | None = None) -> None:
    """The options of ``fields`` (of QUANT_FIELDS), each defaulting to the default of zpccl.ZeroPlusPlusPolicy's field
    of that name, so that a script without options runs what ``zpccl.fsdp.enable(model)`` would; ``helps`` gives a
    field a script's own help text."""
    defaults = {f.name: f.default for f in dataclasses.fields(import_zpccl().ZeroPlusPlusPolicy)}
    unknown = sorted(set(fields) - set(QUANT_FIELDS)) + sorted(set(helps or ()) - set(fields))
    if unknown:
        raise ValueError(f"add_quant_args: {', '.join(unknown)} not among fields {fields}")
    for name in fields:
        p.add_argument("--" + name.replace("_", "-"), type=int, default=defaults[name],
                       help=(helps or {}).get(name, _QUANT_HELP[name]))


def parse_reshard(text: str) -> bool | int:
    low = str(text).lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    return int(text)


# ---- data: real text from Python's standard library -------------------------------------------------------------


def corpus(max_bytes: int = 24 << 20) -> bytes:
    """Python's standard library sources, in a fixed order, up to ``max_bytes``."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    out, size = [], 0
    for f in sorted(root.rglob("*.py")):
        if "test" in f.parts or "site-packages" in f.parts:
            continue
        try:
            data = f.read_bytes()
        except OSError:
            continue
        out.append(data)
        size += len(data)
        if size >= max_bytes:
            break
    return b"\n".join(out)


class Batches:
    """Training batches (different per rank and step, the same in every run with the same ``seed``) and fixed
    validation batches (the same for every seed, so that runs of different seeds are measured on the same text)."""

    def __init__(self, torch: Any, text: bytes, seq: int, batch: int, rank: int, device: Any, seed: int = 0) -> None:
        data = torch.frombuffer(bytearray(text), dtype=torch.uint8)
        cut = int(data.numel() * 0.95)
        self.train, self.valid = data[:cut], data[cut:]
        if seed < 0:
            raise ValueError(f"Batches: seed {seed} must be >= 0")
        self.torch, self.seq, self.batch, self.rank, self.device = torch, seq, batch, rank, device
        self.seed = seed

    def _take(self, data: Any, starts: Any) -> tuple[Any, Any]:
        rows = self.torch.stack([data[s:s + self.seq + 1] for s in starts.tolist()]).to(self.device).long()
        return rows[:, :-1], rows[:, 1:]

    def step(self, step: int) -> tuple[Any, Any]:
        # Seed k takes the k-th batch of the (step, rank) stream: seeds never share a draw and seed 0's batches are
        # the same as without seeds (torch's CPU generator keeps only 32 bits of a seed, so offsetting it would not
        # separate them).
        g = self.torch.Generator().manual_seed(1_000_003 * step + self.rank)
        starts = self.torch.randint(0, self.train.numel() - self.seq - 1, ((self.seed + 1) * self.batch,), generator=g)
        return self._take(self.train, starts[self.seed * self.batch:])

    def validation(self, count: int = 8) -> list[tuple[Any, Any]]:
        g = self.torch.Generator().manual_seed(7 + self.rank)
        return [self._take(self.valid, self.torch.randint(0, self.valid.numel() - self.seq - 1, (self.batch,),
                                                          generator=g)) for _ in range(count)]


# ---- the model ------------------------------------------------------------------------------------------------


def gpt_block(torch: Any, d: int, heads: int) -> Any:
    """The transformer block class (pre-LayerNorm, causal attention, GELU MLP) of width d; zero3_train's model
    uses it too."""
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x: Any) -> Any:
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
            x = x + self.proj(a)
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    return Block


_BUILD_LOCK = threading.Lock()


def build_gpt(torch: Any, layers: int, d: int, heads: int, seq: int, seed: int = 0) -> Any:
    """A byte-level GPT (pre-LayerNorm blocks, causal attention, GELU MLP), fp32, identical on every rank."""
    nn = torch.nn
    Block = gpt_block(torch, d, heads)

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(256, d)
            self.pos = nn.Parameter(torch.zeros(seq, d))
            self.blocks = nn.ModuleList([Block() for _ in range(layers)])
            self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, 256)
            for name, p in self.named_parameters():
                if p.dim() > 1:
                    nn.init.normal_(p, std=0.02)
                elif name.endswith("bias"):
                    nn.init.zeros_(p)

        def forward(self, ids: Any) -> Any:
            x = self.tok(ids) + self.pos[: ids.shape[1]]
            for b in self.blocks:
                x = b(x)
            return self.head(self.ln(x))

    with _BUILD_LOCK:  # torch's global generator is the process's: ranks as threads must not interleave their draws
        torch.manual_seed(seed)
        return GPT()


def shard_gpt(torch: Any, model: Any, mesh: Any, reshard: bool | int, reduce_dtype: Any = None,
              per_block: bool = True) -> Any:
    """FSDP2 over each block (unless not ``per_block``) and the root, bf16 compute and communication, fp32 gradients
    reduced in bf16 (or in ``reduce_dtype``)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype or torch.bfloat16)
    for block in model.blocks if per_block else ():
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
    return model


def loss_of(torch: Any, model: Any, ids: Any, targets: Any) -> Any:
    logits = model(ids)
    return torch.nn.functional.cross_entropy(logits.float().reshape(-1, 256), targets.reshape(-1))


def make_optimizer(torch: Any, model: Any, lr: float, steps: int, warmup: int | None = None,
                   final: float = 0.1, sgd: bool = False) -> tuple[Any, Any]:
    """AdamW (or, with ``sgd``, SGD with momentum 0.9) with the learning rate ramped up linearly over ``warmup``
    steps (default: a tenth of the run), then decayed along a cosine to ``final`` of it at the last step
    (``final=1``: constant), as language models are trained. Without the ramp a transformer at these rates is
    unstable in its first steps: whether and when it spikes depends on perturbations as small as 0.1% of the
    gradients, so two runs that differ only in their collectives could not be compared by their loss. The decay
    matters for the same comparison: at a constant rate the last steps' noise moves the final loss by more than
    the collectives' rounding does."""
    opt = (torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9) if sgd else
           torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0))
    ramp = max(1, steps // 10 if warmup is None else warmup)

    def factor(s: int) -> float:
        if s < ramp:
            return (s + 1) / ramp
        done = min(1.0, (s - ramp) / max(1, steps - 1 - ramp))
        return final + (1 - final) * 0.5 * (1 + math.cos(math.pi * done))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def optimizer_step(torch: Any, model: Any, opt: Any, schedule: Any, clip: float = 1.0) -> None:
    """Clips the gradients' global norm (a collective over the model's mesh), steps and clears them."""
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    schedule.step()
    opt.zero_grad()


def validation_loss(torch: Any, model: Any, batches: list[tuple[Any, Any]]) -> float:
    """Mean loss over the validation batches, averaged over the ranks."""
    with torch.no_grad():
        total = sum(loss_of(torch, model, ids, t).detach() for ids, t in batches) / len(batches)
    torch.distributed.all_reduce(total, op=torch.distributed.ReduceOp.AVG)
    return float(total)


# ---- launching: torchrun, or processes spawned here -------------------------------------------------------------


class Launch:
    """This process's place: rank, world, device, and the emulated node layout."""

    def __init__(self, nodes: int) -> None:
        import torch

        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        self.local = int(os.environ.get("LOCAL_RANK", self.rank))
        gpus = torch.cuda.device_count()
        if gpus == 0:
            raise SystemExit("fsdp2_train: needs a CUDA GPU")
        self.device = torch.device("cuda", self.local % gpus)
        self.nodes = nodes
        if nodes:
            if self.world % nodes:
                raise SystemExit(f"fsdp2_train: --nodes {nodes} does not divide {self.world} processes")
            self.ranks_per_node = self.world // nodes
            # Set before NCCL's first call: each process is a host of its own for NCCL (processes sharing a GPU
            # must not look like one host to it), its traffic goes over sockets (regime net), and zpccl is told the
            # layout.
            os.environ.update(import_zpccl().launch.regime_env("net", self.rank))
        else:
            self.ranks_per_node = None
        torch.cuda.set_device(self.device)

    def init(self) -> Any:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        dist.init_process_group("nccl", device_id=self.device)
        return init_device_mesh("cuda", (self.world,))


class CpuLaunch:
    """This process's place on CPUs: gloo, ranks as processes, one thread each; ``nodes`` only tells zpccl the
    layout (gloo has no links to emulate), so that its host backend plans the hops a cluster of that many nodes
    would take."""

    def __init__(self, nodes: int) -> None:
        import torch

        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        self.device = torch.device("cpu")
        if nodes and self.world % nodes:
            raise SystemExit(f"--nodes {nodes} does not divide {self.world} processes")
        self.nodes = nodes
        self.ranks_per_node = self.world // nodes if nodes else None
        torch.set_num_threads(1)

    def init(self) -> Any:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        dist.init_process_group("gloo")
        return init_device_mesh("cpu", (self.world,))


def import_zpccl() -> Any:
    """zpccl, installed or from the source tree this script sits in (tools/python). Importing it loads neither
    torch nor the library."""
    try:
        import zpccl.fsdp
        import zpccl.launch
    except ImportError:
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
        import zpccl.fsdp
        import zpccl.launch
    return zpccl


def launch(main: Any, args: argparse.Namespace) -> None:
    """Runs ``main(args)`` in this process when started by torchrun, else in ``args.nproc`` spawned ones."""
    zpccl = import_zpccl()
    zpccl.launch.set_default_env()  # NVLink multicast stays off on shared machines
    zpccl.launch.run(main, args.nproc, args)


# ---- training ---------------------------------------------------------------------------------------------------


def train(args: argparse.Namespace) -> None:
    import torch

    where = Launch(args.nodes)
    mesh = where.init()
    zpccl = import_zpccl() if args.comm == "zpccl" else None
    reshard = parse_reshard(args.reshard)
    model = shard_gpt(torch, build_gpt(torch, args.layers, args.d_model, args.heads, args.seq, args.seed)
                      .to(where.device), mesh, reshard)
    zp = None
    if zpccl is not None:
        zp = zpccl.fsdp.enable(model, weight_bits=args.weight_bits, grad_bits=args.grad_bits,
                               block_size=args.block_size, grad_block_size=args.grad_block_size,
                               ranks_per_node=where.ranks_per_node)
    opt, schedule = make_optimizer(torch, model, args.lr, args.steps)
    data = Batches(torch, corpus(), args.seq, args.batch, where.rank, where.device, args.seed)
    if where.rank == 0:
        n = sum(p.numel() for p in model.parameters())
        what = (f"zpccl qwZ int{args.weight_bits} / qgZ int{args.grad_bits}" if zp else "NCCL")
        print(f"FSDP2 on {what}: {where.world} ranks{f' as {args.nodes} nodes over sockets' if args.nodes else ''}"
              f", reshard_after_forward={reshard}; {n / 1e6:.1f}M parameters, {args.batch} x {args.seq} bytes "
              "per rank and step", flush=True)

    def step(ids: Any, targets: Any) -> Any:
        loss = loss_of(torch, model, ids, targets)
        loss.backward()
        optimizer_step(torch, model, opt, schedule)
        return loss

    train_loop(torch, args, where, data, step)
    finish(torch, where, validation_loss(torch, model, data.validation()), zp)


def train_loop(torch: Any, args: argparse.Namespace, where: Any, data: Any, step: Any) -> None:
    """``args.steps`` training steps, ``step(ids, targets)`` each (it returns the loss), timed on this rank; every
    ``--log-every``-th step, rank 0 prints the loss averaged over the ranks, the median step time of the last
    ones and, on a GPU, the peak memory."""
    dist = torch.distributed
    sync = torch.cuda.synchronize if where.device.type == "cuda" else (lambda: None)
    times = []
    for s in range(args.steps):
        ids, targets = data.step(s)
        sync()
        t0 = time.perf_counter()
        loss = step(ids, targets)
        sync()
        times.append(time.perf_counter() - t0)
        if s % args.log_every == 0 or s == args.steps - 1:
            mean = loss.detach().float().clone()
            dist.all_reduce(mean, op=dist.ReduceOp.AVG)
            if where.rank == 0:
                recent = sorted(times[-args.log_every:])
                peak = (f"  peak {torch.cuda.max_memory_allocated(where.device) / 2**20:7.0f} MiB"
                        if where.device.type == "cuda" else "")
                print(f"step {s:5d}  loss {float(mean):.4f}  step {1e3 * recent[len(recent) // 2]:7.1f} ms{peak}",
                      flush=True)


def finish(torch: Any, where: Any, valid: float, zp: Any) -> None:
    """Rank 0 prints the validation loss and zpccl's counters; zpccl goes, then the process group."""
    if where.rank == 0:
        print(f"validation loss {valid:.4f} (random guessing: {math.log(256):.4f})")
        if zp is not None:
            for path, s in zp.summary().items():
                print(f"  {path}: {s['calls']} calls, {s['logical_bytes'] / 2**20:.1f} MiB logical, "
                      f"{s['wire_bytes'] / 2**20:.1f} MiB on the wire from this rank")
    if zp is not None:
        zp.disable()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    launch(train, parse_args())
