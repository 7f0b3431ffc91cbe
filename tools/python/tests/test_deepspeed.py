"""zpccl.deepspeed on DeepSpeed's CPU accelerator: ranks as processes over gloo (the host backend across processes),
covering the ground DeepSpeed's own ZeRO++ tests cover, in tests of our own.

* The config: split_config's mapping of DeepSpeed's ZeRO++ keys and the "zpccl" section, its refusals, and the
  refusal of a DeepSpeed too old or without the functions zpccl replaces (a stand-in module, no DeepSpeed needed).
* One node of four ranks: the sweep over hpZ sizes 1, 2 and 4 with overlap_comm and contiguous gradients in bf16,
  and a variant without either; every qwZ and qgZ call checked bit for bit against the NumPy model of the format
  (tests/_reference.py), blocks restarting at parameters; training steps against unpatched ZeRO-3 within the
  quantization's reach; hpZ alone bit-identical to DeepSpeed's own hpZ; gradient accumulation and eval with the
  secondary partitions where DeepSpeed keeps them; padding deliberately filled with NaN (partition tails and the
  staging buffers) changing no bit; each call allocating its staging, sized to it, and nothing else, and keeping
  nothing after the steps (every allocation, as torch's profiler records it); checkpoint save, load and resume to
  the same losses; GatheredParameters exact; disable() giving DeepSpeed its functions back; each path counted in
  summary(); the refusals.
* One node of four ranks, configs as HF Trainer and Accelerate write them (gradient accumulation, clipping, buckets
  of 5e8): fp16 with dynamic loss scaling and a step the scaler skips, with and without NaN in the padding, and its
  checkpoint resumed to the same losses; hpZ 1/2/4 with overlap_comm and contiguous gradients each on and off;
  reduce and prefetch buckets smaller than a parameter with a frozen parameter, and eval forwards between its steps
  changing no training bit; every parameter persistent; disable(), then enable() again on the same engine; a
  second engine in the process that zpccl does not serve keeping DeepSpeed's collectives bit for bit;
  tensor-parallel pairs (an mpu).
* One node of two ranks, hpZ groups of two, features users reach for beside DeepSpeed's own engine: the 16-bit model
  and zero_to_fp32's consolidation holding the trained weights bit for bit, ZeRO checkpoints loaded across DeepSpeed
  and zpccl; GatheredParameters with a modifier rank (read back exact, the next fetch hpZ from the rebuilt secondary
  partitions); a model built under zero.Init with its weights loaded as from_pretrained does; tied weights, a block
  used twice, activation checkpointing (reentrant or not) and a frozen layer with an adapter, every call checked.
* One node of two ranks, engines beside a training engine: one made without an optimizer (inference) from the
  training config, its forward's qwZ gathers checked bit for bit and no reduction communicator made; a served
  engine destroyed (DeepSpeed's own functions in place, no live session), then two more served in turn, bit for bit alike.
* Three nodes of two ranks (LOCAL_WORLD_SIZE=2): fp32 training with two-hop qgZ checked bit for bit, deterministic;
  the replaced functions called as DeepSpeed calls them, in bf16, fp16 and fp32, on tiny, 1-D and odd parameters
  and gradients (smaller than the world included), bit for bit, with DeepSpeed's output shapes; every parameter
  gather of two steps and two eval forwards with hpZ, phase by phase (the first forward's from the secondary
  partitions included), served or counted in summary(), against what DeepSpeed's own engine gathers and what its
  communication backend runs, with stage3_use_all_reduce_for_fetch_params, persistent parameters and a parameter
  used outside its module's forward.

Each world is one spawn of processes (importing DeepSpeed costs each process seconds); its scenarios run in turn
and the test methods check what they returned. Skipped without DeepSpeed or without torch's gloo.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import types
import unittest
from typing import Any

import numpy as np

import zpccl

from . import SOURCE_TREE, pinned
from . import _reference as ref
from ._procs import run_procs, torch_for_procs
from .test_fsdp import bits_of, ref_dtype, staged

BLOCK = 64  # small blocks, so that the tiny model's parameters span several
STEPS = 3
# How far (relative) a quantized run's loss may stray from unpatched ZeRO-3's at any step of these runs. The
# quantization's error sets the scale: int4 gradients steer AdamW's first steps visibly, int8 (weights, or weights
# and gradients) barely. Each bound is one and a half times the largest gap any step of the test's scenarios shows
# over three model seeds (perf/experiments/deepspeed_loss_gaps.py measures them): the test runs one seed, bit for
# bit the same on a machine, and the spread over seeds stands for what another CPU's float order or another torch
# does to its trajectory; more than that would be an error of the plumbing, not of the format.
GAP_INT4 = 0.05  # int4 gradients, int8 weights or not
GAP_INT8 = 0.02  # int8 weights alone, or int8 weights and gradients
# DeepSpeed's CPU accelerator: LOCAL_SIZE is its device count (the node size it assumes).
ENV = {"DS_ACCELERATOR": "cpu"}


def deepspeed_or_skip() -> None:
    torch_for_procs()
    if importlib.util.find_spec("deepspeed") is None:
        raise unittest.SkipTest("deepspeed is not installed (pip install 'deepspeed>=0.19')")


# ---- in the ranks -------------------------------------------------------------------------------------------------


def _setup() -> tuple[Any, Any, Any]:
    """torch, deepspeed and torch.distributed in a rank, quiet."""
    import deepspeed
    import torch
    import torch.distributed as dist

    # DeepSpeed's CPU communication backend JIT-compiles a shared-memory all-reduce when it starts (minutes of
    # compiling, on every machine whose cache lacks it); nothing here uses it.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    zp_log = logging.getLogger("zpccl.deepspeed")  # kept (LOGGED), not printed: the tests provoke its warnings
    zp_log.propagate = False
    zp_log.setLevel(logging.INFO)  # what stays DeepSpeed's by design is said at INFO
    zp_log.addHandler(_Kept())
    return torch, deepspeed, dist


#: What the zpccl.deepspeed logger said in this rank, in order.
LOGGED: list[str] = []


class _Kept(logging.Handler):
    def emit(self, record: Any) -> None:
        LOGGED.append(record.getMessage())


def build_model(torch: Any, seed: int = 0, external: bool = False) -> Any:
    """A tiny model whose parameters are odd, 1-D, and smaller than the world (LayerNorm of 37, a bias of 5, a
    1-element scale), as ZeRO-3 partitions them: every partition ends in padding somewhere. ``external``: the
    model's own forward applies the head's parameters (a parameter used outside its module's forward, which
    DeepSpeed gathers by itself the first time), the same function."""
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = nn.Linear(12, 37)
            self.norm = nn.LayerNorm(37)
            self.out = nn.Linear(37, 5)
            self.scale = nn.Parameter(torch.ones(1))

        def forward(self, x: Any) -> Any:
            h = torch.relu(self.norm(self.inp(x)))
            head = nn.functional.linear(h, self.out.weight, self.out.bias) if external else self.out(h)
            return head * self.scale

    torch.manual_seed(seed)
    return Net()


def ds_config(hpz: int = 1, quantized: bool = False, bf16: bool = True, **zero: Any) -> dict[str, Any]:
    """A ZeRO-3 config in DeepSpeed's test sweep's shape: every parameter fetched per module (no persistence, no
    reuse), so that the backward gathers again (over the hpZ group when hpz > 1)."""
    z = {"stage": 3, "zero_hpz_partition_size": hpz, "overlap_comm": True, "contiguous_gradients": True,
         "stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0}
    if quantized:
        z.update(zero_quantized_weights=True, zero_quantized_gradients=True)
    z.update(zero)
    cfg: dict[str, Any] = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": z, "zpccl": {}}
    if bf16:
        cfg["bf16"] = {"enabled": True}
    if quantized:
        cfg["zpccl"] = {"block_size": BLOCK}
    else:
        del cfg["zpccl"]
    return cfg


def make_engine(torch: Any, deepspeed: Any, config: dict[str, Any], zp: bool, seed: int = 0,
                external: bool = False, frozen: bool = False, mpu: Any = None) -> Any:
    """An engine of build_model over DeepSpeed (zp False) or zpccl.deepspeed.initialize (zp True); DeepSpeed's
    hpZ group, one per process in DeepSpeed, remade for each engine's size. ``frozen``: the LayerNorm's weight does
    not train (requires_grad False): gathered, never reduced."""
    from deepspeed.utils import groups

    groups._ZERO_PARAM_INTRA_PARALLEL_GROUP = None
    model = build_model(torch, seed, external)
    if frozen:
        model.norm.weight.requires_grad_(False)
    return engine_of(torch, deepspeed, model, config, zp, mpu)


def engine_of(torch: Any, deepspeed: Any, model: Any, config: dict[str, Any], zp: bool, mpu: Any = None) -> Any:
    """DeepSpeed's engine (zp False) or zpccl.deepspeed.initialize's (zp True) over ``model``, AdamW over its
    trainable parameters."""
    import zpccl.deepspeed

    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    init = zpccl.deepspeed.initialize if zp else deepspeed.initialize
    engine, *_ = init(model=model, optimizer=opt, config=config, mpu=mpu)
    return engine


def exact_weights(torch: Any, engine: Any) -> dict[str, Any]:
    """Every parameter of the engine's module whole, gathered from its partitions with torch.distributed itself (no
    path of DeepSpeed's or zpccl's in between)."""
    out = {}
    dist = torch.distributed
    for name, p in engine.module.named_parameters():
        parts = [torch.empty_like(p.ds_tensor) for _ in range(dist.get_world_size(p.ds_process_group))]
        dist.all_gather(parts, p.ds_tensor, group=p.ds_process_group)
        out[name] = torch.cat(parts)[:p.ds_numel].view(p.ds_shape)
    return out


def batch(torch: Any, rank: int, step: int, dtype: Any) -> tuple[Any, Any]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(4, 12, generator=g).to(dtype), torch.randn(4, 5, generator=g)


def train(torch: Any, engine: Any, rank: int, steps: int, first: int = 0, poison: bool = False,
          check: Any = None, overflow_at: int | None = None) -> list[float]:
    """Losses of ``steps`` micro-steps (data by rank and step number); ``poison``: NaN in every padding zpccl
    must not read before each one; ``check(step)`` after each forward; ``overflow_at``: at that micro-step rank 1
    scales its loss by 1e30 before the backward (fp16 gradients overflow there, and the loss scaler skips the step
    on every rank)."""
    dtype = next(engine.module.parameters()).dtype
    losses = []
    for step in range(first, first + steps):
        if poison:
            poison_padding(torch, engine)
        x, y = batch(torch, rank, step, dtype)
        loss = (engine(x).float() - y).pow(2).mean()
        if check is not None:
            check(step)
        engine.backward(loss * 1e30 if step == overflow_at and rank == 1 else loss)
        engine.step()
        losses.append(loss.item())
    return losses


def evaluate(torch: Any, engine: Any, rank: int) -> float:
    """The loss of one forward in eval mode without gradients (a batch no step trained on)."""
    engine.eval()
    with torch.no_grad():
        x, y = batch(torch, rank, 99, next(engine.module.parameters()).dtype)
        loss = (engine(x).float() - y).pow(2).mean().item()
    engine.train()
    return loss


def served(torch: Any, engine: Any, rank: int) -> dict[str, Any]:
    """The losses of STEPS steps of a served engine, and its counters after them."""
    import zpccl.deepspeed

    losses = train(torch, engine, rank, STEPS)
    return dict(losses=losses, summary=zpccl.deepspeed.session_of(engine).summary())


def poison_padding(torch: Any, engine: Any) -> int:
    """NaN in what DeepSpeed leaves uninitialized and zpccl must never quantize: each partition's tail beyond the
    parameter's data, and every staging buffer a zpccl call makes from then on (:class:`PoisonedStaging`). Returns
    the partition elements poisoned here."""
    import zpccl.deepspeed

    poisoned = 0
    for p in engine.module.parameters():
        t = p.ds_tensor
        data = max(0, min(p.ds_numel - torch.distributed.get_rank(p.ds_process_group) * t.ds_numel, t.ds_numel))
        if data < t.ds_numel:
            t.data.narrow(0, data, t.ds_numel - data).fill_(float("nan"))
            poisoned += t.ds_numel - data
    zp = zpccl.deepspeed.session_of(engine)
    if zp is not None and not isinstance(zp.collectives.staging, PoisonedStaging):
        zp.collectives.staging = PoisonedStaging(torch, zp.collectives.staging)
    return poisoned


def _marked(record_function: Any, name: str, fn: Any) -> Any:
    def marked(*args: Any, **kwargs: Any) -> Any:
        with record_function(name):
            return fn(*args, **kwargs)

    return marked


class PoisonedStaging:
    """zpccl.deepspeed's staging allocator (``Collectives.staging``), filling each buffer it hands out with NaN (in
    every float type) first: what torch's allocator returns may hold anything, and only data and zeros may reach a
    block."""

    def __init__(self, torch: Any, staging: Any) -> None:
        self.torch, self.staging, self.made = torch, staging, 0

    def __call__(self, count: int, dtype: Any) -> Any:
        buffer = self.staging(count, dtype)
        buffer.view(self.torch.uint8).fill_(0xFF)
        self.made += 1
        return buffer


def call_memory(torch: Any, zp: Any, run: Any) -> list[dict[str, Any]]:
    """Runs ``run()`` under torch's profiler, which records every CPU tensor allocation and free with its address,
    each of zpccl's qwZ and qgZ calls marked, and the collective inside it. Per call, in order: its ``kind``;
    ``staging``, the bytes zpccl.deepspeed states for its staging (a gather: n x its staged partition, 0 where every
    part is whole data on its block boundary; a reduce-scatter: n x its staged chunks); ``peak``, the most it had
    allocated at once outside the collective (whose transfers, on the host backend across processes, go through
    torch.distributed's buffers: the communicator's, as its scratch is on CUDA); ``kept``, what it allocated, the
    collective's included, that is still allocated when run() returns (its zeros, which grow for a gap longer than
    any before, left out)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    # Kineto (the profiler's library) logs an error when it finds no GPU, which here is the expected case: keep only
    # its fatal messages.
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    calls = zp.collectives
    qwz, qgz = calls.qwz, calls.qgz
    stated: list[tuple[str, int]] = []
    for comm, name in ((calls.gather, "quant_all_gather"), (calls.reduce, "quant_reduce_scatter")):
        setattr(comm, name, _marked(record_function, "zpccl collective", getattr(comm, name)))

    def on_qwz(input: Any, output: Any, parts: list[tuple[int, int]]) -> None:
        layout = calls.layout(tuple(size for size, _ in parts), reduce=False)
        whole = layout.identity and all(size == data for size, data in parts)
        stated.append(("qwz", 0 if whole else calls.gather.nranks * layout.staged_count * input.element_size()))
        with record_function(f"zpccl call {len(stated) - 1}"):
            qwz(input, output, parts)

    def on_qgz(tensors: list[Any]) -> list[Any]:
        n = calls.reduce.nranks
        layout = calls.layout(tuple(-(-t.numel() // n) for t in tensors), reduce=True)
        stated.append(("qgz", n * layout.staged_count * tensors[0].element_size()))
        with record_function(f"zpccl call {len(stated) - 1}"):
            return qgz(tensors)

    calls.qwz, calls.qgz = on_qwz, on_qgz
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            run()
    finally:
        calls.qwz, calls.qgz = qwz, qgz
        for comm, name in ((calls.gather, "quant_all_gather"), (calls.reduce, "quant_reduce_scatter")):
            delattr(comm, name)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as f:
            events = json.load(f)["traceEvents"]
    spans = {int(e["name"].rsplit(" ", 1)[1]): (e["ts"], e["ts"] + e["dur"]) for e in events
             if e.get("ph") == "X" and e.get("name", "").startswith("zpccl call ")}
    inner = [(e["ts"], e["ts"] + e["dur"]) for e in events
             if e.get("ph") == "X" and e.get("name") == "zpccl collective"]
    memory = sorted((e["ts"], e["args"]["Bytes"], e["args"]["Addr"]) for e in events if e.get("name") == "[memory]")
    zeros = {z.data_ptr() for z in calls._zeros.values()}
    out = []
    for i, (kind, staging) in enumerate(stated):
        start, end = spans[i]
        level = peak = 0
        live: dict[int, int] = {}  # what the call allocated and no one has freed yet, by address
        for ts, nbytes, addr in memory:
            if ts < start:
                continue
            if ts <= end and not any(a <= ts <= b for a, b in inner):
                level += nbytes
                peak = max(peak, level)
            if nbytes > 0 and ts <= end:
                live[addr] = nbytes
            elif nbytes < 0:
                live.pop(addr, None)
        out.append(dict(kind=kind, staging=staging, peak=peak,
                        kept=sum(b for a, b in live.items() if a not in zeros)))
    return out


class Exact:
    """Keeps a copy of every qwZ and qgZ call's input and output, then checks each against the NumPy model of the
    format, bit for bit (collective: every rank gathers every call's inputs, in the same order)."""

    def __init__(self, torch: Any, zp: Any, nodes: list[int]) -> None:
        self.torch, self.zp, self.nodes = torch, zp, nodes
        self.calls: list[tuple] = []
        self.active = True  # whether calls are kept now
        calls = zp.collectives
        qwz, qgz = calls.qwz, calls.qgz

        def on_qwz(input: Any, output: Any, parts: list[tuple[int, int]]) -> None:
            x = input.clone() if self.active else None  # before the call: the input may lie in its output
            qwz(input, output, parts)
            if x is not None:
                self.calls.append(("qwz", parts, x, output.clone()))

        def on_qgz(tensors: list[Any]) -> list[Any]:
            out = qgz(tensors)
            if self.active:
                self.calls.append(("qgz", None, [t.detach().clone() for t in tensors], [o.clone() for o in out]))
            return out

        calls.qwz, calls.qgz = on_qwz, on_qgz

    def verify(self) -> dict[str, int]:
        """How many calls of each kind equal the model (a call that differs is not counted: the tests compare the
        counts with summary()'s)."""
        checked = {"qwz": 0, "qgz": 0}
        for kind, parts, x, out in self.calls:
            if kind == "qwz":
                want = expected_qwz(self.everyone((bits_of(x), parts)), ref_dtype(x), self.zp.policy.weight_bits,
                                    self.zp.policy.block_size)
                same = same_bits(bits_of(out), want)
            else:
                sends = self.everyone([bits_of(t).reshape(-1) for t in x])
                want = expected_qgz(sends, ref_dtype(x[0]), self.zp.policy.grad_bits, self.zp.policy.grad_block,
                                    self.nodes, self.torch.distributed.get_rank())
                got = [bits_of(o) for o in out]
                same = len(got) == len(want) and all(same_bits(g, w) for g, w in zip(got, want))
            checked[kind] += int(same)
        self.calls.clear()
        return checked

    def everyone(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.torch.distributed.get_world_size()
        self.torch.distributed.all_gather_object(out, obj)
        return out


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays hold the same bits (bits_of gives fp16 and fp32 as floats, where NaN never equals NaN:
    an overflowed block is all NaN on both sides)."""
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    if a.dtype.itemsize != b.dtype.itemsize or a.shape != b.shape:
        return False
    as_int = {2: np.uint16, 4: np.uint32}
    return bool(np.array_equal(a.view(as_int[a.dtype.itemsize]), b.view(as_int[b.dtype.itemsize])))


def expected_qwz(rows: list[tuple[np.ndarray, list[tuple[int, int]]]], dt: str, bits: int, block: int) -> np.ndarray:
    """What qwZ gathers from each rank's partitions: per parameter, its data and zeros up to its partition size,
    quantized in blocks from the partition's start (blocks restart at parameters), dequantized."""
    out = []
    for x, parts in rows:
        at = 0
        for size, data in parts:
            part = np.concatenate([x[at:at + data], np.zeros(size - data, x.dtype)])
            out.append(ref.round_trip(part, dt, bits, block))
            at += size
    return np.concatenate(out)


def expected_qgz(sends: list[list[np.ndarray]], dt: str, bits: int, block: int, nodes: list[int],
                 rank: int) -> list[np.ndarray]:
    """What qgZ gives ``rank`` for the gradients each rank reduces (sends[q]: its flattened tensors): each
    tensor's ceil(numel / n)-element chunk per rank, zeros after its data, on block boundaries, averaged."""
    n = len(sends)
    chunks = [-(-t.size // n) for t in sends[0]]

    def data(numel: int, c: int, q: int) -> int:
        return max(0, min(numel - q * c, c))

    rows = [np.concatenate([staged([np.concatenate([t[d * c:d * c + data(t.size, c, d)],
                                                     np.zeros(c - data(t.size, c, d), t.dtype)])
                                     for t, c in zip(ts, chunks)], block) for d in range(n)]) for ts in sends]
    mine = ref.quant_reduce_scatter(rows, dt, "avg", bits, block, nodes)[rank]
    out, at = [], 0
    for t, c in zip(sends[0], chunks):
        out.append(mine[at:at + data(t.size, c, rank)])
        at += c if t is sends[0][-1] else -(-c // block) * block
    return out


class Phases:
    """What ran in each phase of :func:`phased_steps`: the collectives DeepSpeed's communication backend ran
    (``"ds.<name>"``: every one DeepSpeed runs goes through it, and zpccl's never do), and either zpccl's summary()
    calls by path (an engine zpccl serves) or, on DeepSpeed's own engine, the calls ZeRO-3 made of the functions
    zpccl replaces: ``gather_dp`` and ``gather_hpz`` (``_dist_allgather_fn`` over the data-parallel group and over
    the hpZ group) and ``reduce`` (``reduce_scatter_coalesced``)."""

    NAMES = ("all_gather", "all_gather_into_tensor", "all_gather_base", "all_gather_coalesced", "all_reduce",
             "all_reduce_coalesced", "reduce_scatter", "reduce_scatter_tensor", "all_to_all_single", "all_to_all",
             "broadcast", "reduce")

    def __init__(self, engine: Any, dist: Any) -> None:
        import deepspeed.comm.comm as comm
        import deepspeed.runtime.zero.partition_parameters as pp
        import deepspeed.runtime.zero.stage3 as stage3

        import zpccl.deepspeed

        self.zp = zpccl.deepspeed.session_of(engine)
        self.phases: dict[str, collections.Counter] = {}
        self.now: collections.Counter | None = None
        self._undo: list[tuple[Any, str, Any]] = []
        self._summary: dict[str, dict[str, int]] = {}
        depth = [0]

        def counted(name: str, fn: Any) -> Any:
            def run(*args: Any, **kwargs: Any) -> Any:
                if depth[0] == 0 and self.now is not None:
                    self.now[name] += 1
                depth[0] += 1
                try:
                    return fn(*args, **kwargs)
                finally:
                    depth[0] -= 1
            return run

        for name in self.NAMES:
            if hasattr(comm.cdb, name):
                self._swap(comm.cdb, name, counted("ds." + name, getattr(comm.cdb, name)))
        if self.zp is None:
            hpz, gather = next(engine.module.parameters()).ds_zero_param_process_group, pp._dist_allgather_fn

            def by_group(input_tensor: Any, output_tensor: Any, group: Any = None) -> Any:
                if self.now is not None:
                    self.now["gather_hpz" if hpz is not None and group is hpz else "gather_dp"] += 1
                return gather(input_tensor, output_tensor, group)

            self._swap(pp, "_dist_allgather_fn", by_group)
            self._swap(stage3, "reduce_scatter_coalesced", counted("reduce", stage3.reduce_scatter_coalesced))

    def _swap(self, owner: Any, name: str, fn: Any) -> None:
        self._undo.append((owner, name, vars(owner).get(name)))
        setattr(owner, name, fn)

    def enter(self, phase: str | None) -> None:
        """Ends the phase in progress (its zpccl calls taken from summary()), and starts ``phase`` (None: none)."""
        if self.zp is not None and self.now is not None:
            summary = self.zp.summary()
            for path, s in summary.items():
                self.now[path] += s["calls"] - self._summary.get(path, {}).get("calls", 0)
            self._summary = summary
        elif self.zp is not None:
            self._summary = self.zp.summary()
        self.now = None
        if phase is not None:
            self.now = self.phases[phase] = collections.Counter()

    def close(self) -> dict[str, dict[str, int]]:
        self.enter(None)
        for owner, name, fn in reversed(self._undo):
            if fn is None:
                delattr(owner, name)  # the class's method again
            else:
                setattr(owner, name, fn)
        return {phase: {k: v for k, v in c.items() if v} for phase, c in self.phases.items()}


def phased_steps(torch: Any, engine: Any, rank: int, phases: Phases, steps: int = 2) -> list[float]:
    """``steps`` training steps, each in three phases (``forward<i>``, ``backward<i>``, ``step<i>``), then two eval
    forwards (``eval0``, ``eval1``) without a step between; the training losses."""
    dtype = next(engine.module.parameters()).dtype
    losses = []
    for step in range(steps):
        x, y = batch(torch, rank, step, dtype)
        phases.enter(f"forward{step}")
        loss = (engine(x).float() - y).pow(2).mean()
        phases.enter(f"backward{step}")
        engine.backward(loss)
        phases.enter(f"step{step}")
        engine.step()
        losses.append(loss.item())
    engine.eval()
    with torch.no_grad():
        for i in range(2):
            phases.enter(f"eval{i}")
            engine(batch(torch, rank, 99, dtype)[0])
    engine.train()
    phases.enter(None)
    return losses


def secondary_sizes(engine: Any) -> list[int | None]:
    """Each parameter's hpZ secondary partition size (None: none)."""
    return [None if p.ds_secondary_tensor is None else p.ds_secondary_tensor.numel()
            for p in engine.module.parameters()]


def persistent_gathers(zp: Any) -> int:
    """The persistent parameters' regathers zpccl.deepspeed's handle ``zp`` served so far."""
    return zp.summary().get("persistent_gather", {"calls": 0})["calls"]


def refusal(call: Any) -> str:
    """The message of the exception ``call()`` raises ("" when it returns)."""
    try:
        call()
    except Exception as e:  # noqa: BLE001 - the test compares messages
        return f"{type(e).__name__}: {e}"
    return ""


def _one_node(rank: int, ckpt: str) -> dict[str, Any]:
    """World A: one node of four ranks."""
    torch, deepspeed, dist = _setup()
    import deepspeed.runtime.zero.partition_parameters as pp
    import deepspeed.runtime.zero.stage3 as stage3

    import zpccl.deepspeed

    nodes = [0] * dist.get_world_size()
    out: dict[str, Any] = {}
    originals = (pp._dist_allgather_fn, stage3.reduce_scatter_coalesced, stage3.all_to_all_quant_reduce)

    # Unpatched ZeRO-3, without and with DeepSpeed's own hpZ (exact), and with gradient accumulation.
    engine = make_engine(torch, deepspeed, ds_config(), zp=False)
    out["ref"] = train(torch, engine, rank, STEPS)
    out["eval_ref"] = evaluate(torch, engine, rank)
    out["ref_hpz2"] = train(torch, make_engine(torch, deepspeed, ds_config(hpz=2), zp=False), rank, STEPS)
    accum = dict(ds_config(), gradient_accumulation_steps=2)
    out["ref_accum"] = train(torch, make_engine(torch, deepspeed, accum, zp=False), rank, 2 * STEPS)

    # The sweep: hpZ 1, 2, 4 with overlap_comm and contiguous gradients; every quantized call checked.
    for hpz in (1, 2, 4):
        engine = make_engine(torch, deepspeed, ds_config(hpz, quantized=True), zp=True)
        zp = zpccl.deepspeed.session_of(engine)
        exact = Exact(torch, zp, nodes)
        before = secondary_sizes(engine)
        out[f"sweep{hpz}"] = dict(losses=train(torch, engine, rank, STEPS), summary=zp.summary(),
                                  checked=exact.verify(), secondary=before, hpz_size=zp.hpz_size,
                                  partitions=[p.ds_tensor.numel() for p in engine.module.parameters()])
        if hpz == 2:  # eval: forward gathers only, the secondary partitions made after it
            calls = zp.summary()
            loss = evaluate(torch, engine, rank)
            out["eval"] = dict(loss=loss, before=calls, after=zp.summary(), secondary=secondary_sizes(engine))
        zp.disable()

    # Neither overlap_comm nor contiguous gradients.
    engine = make_engine(torch, deepspeed, ds_config(2, True, overlap_comm=False, contiguous_gradients=False), True)
    out["plain"] = served(torch, engine, rank)
    zpccl.deepspeed.disable(engine)

    # hpZ alone: zero_hpz_partition_size and no quantization, against DeepSpeed's own hpZ.
    engine = make_engine(torch, deepspeed, dict(ds_config(hpz=2), zpccl={}), zp=True)
    out["hpz_alone"] = served(torch, engine, rank)
    zpccl.deepspeed.disable(engine)

    # qwZ alone and qgZ alone: one ZeRO++ switch each, the other collective left DeepSpeed's.
    for alone in ("zero_quantized_weights", "zero_quantized_gradients"):
        engine = make_engine(torch, deepspeed, dict(ds_config(), zpccl={"block_size": BLOCK},
                                                    zero_optimization=dict(ds_config()["zero_optimization"],
                                                                           **{alone: True})), zp=True)
        exact = Exact(torch, zpccl.deepspeed.session_of(engine), nodes)
        out[alone] = dict(served(torch, engine, rank), checked=exact.verify())
        zpccl.deepspeed.disable(engine)

    # Gradient accumulation: the secondary partitions live through the micro-steps without an update.
    engine = make_engine(torch, deepspeed, dict(ds_config(2, True), gradient_accumulation_steps=2), zp=True)
    kept = []
    losses = train(torch, engine, rank, 2 * STEPS,
                   check=lambda step: kept.append(step % 2 == 0 or all(s is not None for s in secondary_sizes(engine))))
    out["accum"] = dict(losses=losses, kept=kept, summary=zpccl.deepspeed.session_of(engine).summary())
    zpccl.deepspeed.disable(engine)

    # Padding filled with NaN before every step: the same bits as the clean sweep run.
    engine = make_engine(torch, deepspeed, ds_config(2, quantized=True), zp=True)
    out["poisoned"] = dict(count=poison_padding(torch, engine), losses=train(torch, engine, rank, STEPS, poison=True),
                           staged=zpccl.deepspeed.session_of(engine).collectives.staging.made)
    zpccl.deepspeed.disable(engine)

    # Memory: each call allocates its staging and nothing else, and keeps nothing after the steps.
    engine = make_engine(torch, deepspeed, ds_config(2, quantized=True), zp=True)
    zp = zpccl.deepspeed.session_of(engine)
    out["memory"] = call_memory(torch, zp, lambda: train(torch, engine, rank, 2))
    zp.disable()

    # Checkpoint: save after 2 steps, go on 2; a fresh engine loads, finds NaN in its padding, and goes the same 2.
    engine = make_engine(torch, deepspeed, ds_config(2, quantized=True), zp=True)
    train(torch, engine, rank, 2)
    engine.save_checkpoint(ckpt, tag="two")
    went_on = train(torch, engine, rank, 2, first=2)
    zpccl.deepspeed.disable(engine)
    engine = make_engine(torch, deepspeed, ds_config(2, quantized=True), zp=True, seed=7)
    engine.load_checkpoint(ckpt, tag="two")
    out["resume"] = dict(went_on=went_on, resumed=train(torch, engine, rank, 2, first=2, poison=True))

    # GatheredParameters stays DeepSpeed's exact gather; the checkpoint engine is still served.
    zp = zpccl.deepspeed.session_of(engine)
    calls = zp.summary()
    params = list(engine.module.parameters())
    want = list(exact_weights(torch, engine).values())
    with deepspeed.zero.GatheredParameters(params):
        out["gathered"] = dict(exact=[torch.equal(p.data, w) for p, w in zip(params, want)])
    out["gathered"]["calls_before"], out["gathered"]["calls_after"] = calls, zp.summary()

    # disable(): DeepSpeed's functions and fetches back, training goes on DeepSpeed's, counters still.
    replaced = (pp._dist_allgather_fn, stage3.reduce_scatter_coalesced, stage3.all_to_all_quant_reduce)
    zp.disable()
    zp.disable()  # idempotent
    now = (pp._dist_allgather_fn, stage3.reduce_scatter_coalesced, stage3.all_to_all_quant_reduce)
    summary = zp.summary()
    train(torch, engine, rank, 1, first=4)
    out["disable"] = dict(replaced=[a is not b for a, b in zip(replaced, originals)],
                          restored=[a is b for a, b in zip(now, originals)],
                          fetches=[not isinstance(p.all_gather_coalesced, functools.partial)
                                   and not isinstance(p.all_gather, functools.partial)
                                   for p in engine.module.parameters()],
                          counters_unchanged=zp.summary() == summary,
                          unserved=zpccl.deepspeed.session_of(engine) is None)

    # enable on a plain engine, keyword arguments; a second enable refused while it lives.
    engine = make_engine(torch, deepspeed, ds_config(), zp=False)
    zp = zpccl.deepspeed.enable(engine, weight_bits=8, grad_bits=8, block_size=BLOCK)
    exact = Exact(torch, zp, nodes)
    losses = train(torch, engine, rank, STEPS)
    out["enable"] = dict(losses=losses, summary=zp.summary(), checked=exact.verify(),
                         again=refusal(lambda: zpccl.deepspeed.enable(engine)))
    zp.disable()

    out["refused"] = _refusals(torch, deepspeed, zpccl)
    return out


def _refusals(torch: Any, deepspeed: Any, zpccl: Any) -> dict[str, str]:
    """The refusals of enable and initialize, each rank's message."""
    import zpccl.deepspeed

    said = {}
    engine = make_engine(torch, deepspeed, dict(ds_config(), zero_optimization={"stage": 2}), zp=False)
    said["stage2"] = refusal(lambda: zpccl.deepspeed.enable(engine))
    engine = make_engine(torch, deepspeed, ds_config(), zp=False)
    said["hpz_size"] = refusal(lambda: zpccl.deepspeed.enable(engine, hpz_size=2))
    said["error_feedback"] = refusal(lambda: zpccl.deepspeed.enable(engine, error_feedback=True))
    said["no_hpz"] = refusal(lambda: zpccl.deepspeed.enable(engine, weight_bits=None, grad_bits=None))
    # Nodes of 3 consecutive ranks of the world's 4: uneven nodes, {0, 1, 2} and {3}, served.
    zp = zpccl.deepspeed.enable(engine, ranks_per_node=3)
    said["ranks_per_node"] = f"{zp.collectives.reduce.node_count} nodes"
    zp.disable()
    # A DeepSpeed whose ZeRO-3 optimizer runs its gradient reductions elsewhere: qgZ refused, the rest served.
    from zpccl.deepspeed._deepspeed import REDUCER

    setattr(engine.optimizer, REDUCER, None)
    said["reducer"] = refusal(lambda: zpccl.deepspeed.enable(engine))
    zp = zpccl.deepspeed.enable(engine, grad_bits=None)
    said["reducer_weights_only"] = "" if zp.collectives.reduce is None else "qgZ served"
    zp.disable()
    delattr(engine.optimizer, REDUCER)
    said["not_engine"] = refusal(lambda: zpccl.deepspeed.enable(engine.module))
    fake = types.SimpleNamespace(module=engine.module, zero_optimization_stage=lambda: 3, _config=types.SimpleNamespace(
        zero_config=types.SimpleNamespace(zero_quantized_weights=True)))
    said["quantized_weights"] = refusal(lambda: zpccl.deepspeed.enable(fake))
    # DeepSpeed's hpZ groups of 4 span two nodes of two.
    engine = make_engine(torch, deepspeed, ds_config(hpz=4), zp=False)
    said["hpz_nodes"] = refusal(lambda: zpccl.deepspeed.enable(engine, ranks_per_node=2))
    said["handle_after_refusal"] = "" if zpccl.deepspeed.session_of(engine) is None else "a handle left behind"
    said["nothing"] = refusal(lambda: zpccl.deepspeed.initialize(model=build_model(torch), config=ds_config()))
    zp = zpccl.deepspeed.enable(engine, ranks_per_node=2, hpz=False)  # hpz=False: the same engine is served
    train(torch, engine, torch.distributed.get_rank(), 2)  # the first forward gathers the secondary partitions
    paths = zp.summary()
    said["hpz_off"] = "" if zp.hpz_size is None and {"qwz", "qgz", "deepspeed_all_gather_hpz"} <= set(paths) \
        else f"hpz=False served {sorted(paths)}"
    zp.disable()
    # Tensor-parallel pairs (an mpu): data-parallel groups [0, 2] and [1, 3], and DeepSpeed's hpZ groups of two
    # consecutive ranks, [0, 1] and [2, 3], across them. Last: DeepSpeed keeps the mpu for the process.
    engine = make_engine(torch, deepspeed, ds_config(hpz=2), zp=False, mpu=TensorParallelPairs(torch.distributed))
    said["hpz_mpu"] = refusal(lambda: zpccl.deepspeed.enable(engine))
    # ranks_per_node numbers the world's ranks: each data-parallel group holds one rank of each node of two.
    zp = zpccl.deepspeed.enable(engine, hpz=False, ranks_per_node=2)
    said["mpu_nodes"] = f"{zp.collectives.reduce.node_count} nodes"
    zp.disable()
    return said


class TensorParallelPairs:
    """A model-parallel layout as DeepSpeed's ``mpu`` argument describes one: ranks 2i and 2i+1 a tensor-parallel
    pair, ranks of the same parity a data-parallel group (the model itself is not split: DeepSpeed only reads the
    groups)."""

    def __init__(self, dist: Any) -> None:
        rank, world = dist.get_rank(), dist.get_world_size()
        self.rank, self.world = rank, world
        pairs = [dist.new_group([i, i + 1]) for i in range(0, world, 2)]  # every rank makes every group, in order
        parities = [dist.new_group(list(range(j, world, 2))) for j in (0, 1)]
        self.mp, self.dp = pairs[rank // 2], parities[rank % 2]

    def get_model_parallel_rank(self) -> int:
        return self.rank % 2

    def get_model_parallel_group(self) -> Any:
        return self.mp

    def get_model_parallel_world_size(self) -> int:
        return 2

    def get_data_parallel_rank(self) -> int:
        return self.rank // 2

    def get_data_parallel_group(self) -> Any:
        return self.dp

    def get_data_parallel_world_size(self) -> int:
        return self.world // 2


def _three_nodes(rank: int) -> dict[str, Any]:
    """World B: three nodes of two ranks (LOCAL_WORLD_SIZE=2)."""
    torch, deepspeed, dist = _setup()
    import zpccl.deepspeed

    world = dist.get_world_size()
    nodes = [r // 2 for r in range(world)]
    out: dict[str, Any] = {}
    out["ref"] = train(torch, make_engine(torch, deepspeed, ds_config(bf16=False), zp=False), rank, STEPS)
    runs = []
    for _ in range(2):
        engine = make_engine(torch, deepspeed, ds_config(2, quantized=True, bf16=False), zp=True)
        zp = zpccl.deepspeed.session_of(engine)
        exact = Exact(torch, zp, nodes)
        runs.append(dict(losses=train(torch, engine, rank, STEPS), summary=zp.summary(), checked=exact.verify(),
                         layout=(zp.collectives.reduce.node_count, zp.collectives.reduce.local_size, zp.hpz_size)))
        if len(runs) == 2:
            out["direct"] = _direct(torch, deepspeed, dist, zp, nodes)
        zp.disable()
    out["runs"] = runs

    # An engine DeepSpeed built with its own qgZ: its reductions come to all_to_all_quant_reduce (several nodes),
    # which zpccl serves as qgZ.
    engine = make_engine(torch, deepspeed, ds_config(2, bf16=False, zero_quantized_gradients=True), zp=False)
    zp = zpccl.deepspeed.enable(engine, block_size=BLOCK)
    exact = Exact(torch, zp, nodes)
    entered, quant_reduce = [], zp.collectives.quant_reduce
    zp.collectives.quant_reduce = lambda *a: entered.append(1) or quant_reduce(*a)
    out["deepspeed_qgz"] = dict(served(torch, engine, rank), checked=exact.verify(), entered=len(entered))
    zp.disable()
    out["paths"] = _paths(torch, deepspeed, dist, rank)
    # hpZ groups of three over nodes of two, the launcher's layout (LOCAL_WORLD_SIZE): refused once DeepSpeed has
    # made its groups, every rank alike.
    from zpccl.deepspeed._state import LIVE

    out["hpz3"] = refusal(lambda: make_engine(torch, deepspeed, ds_config(3, quantized=True, bf16=False), zp=True))
    out["hpz3_after"] = not LIVE  # no handle left behind
    return out


def _paths(torch: Any, deepspeed: Any, dist: Any, rank: int) -> dict[str, Any]:
    """Every way ZeRO-3 with hpZ gathers parameters, phase by phase, on DeepSpeed's own engine and on the same
    engine served by zpccl: the fetches (from the secondary partitions over the hpZ group wherever they exist,
    from the primary ones over the data-parallel group otherwise), the fetches stage3_use_all_reduce_for_fetch_params
    makes all-reduces, the persistent parameters gathered after each step, and a parameter used outside its
    module's forward (the head, applied by the model's own forward)."""
    import zpccl.deepspeed

    out: dict[str, Any] = {}
    for zp in (False, True):
        said = len(LOGGED)
        config = ds_config(2, quantized=zp, bf16=False, stage3_use_all_reduce_for_fetch_params=True,
                           stage3_param_persistence_threshold=10)  # the bias of 5 and the scale of 1 persist
        engine = make_engine(torch, deepspeed, config, zp=zp, external=True)
        if zp:
            engine_zp = zpccl.deepspeed.session_of(engine)
            owners = engine_zp.facts.fetch_owners
            out["all_reduce_fetch"] = [o.use_all_reduce_for_fetch_params for o in owners]
        phases = Phases(engine, dist)
        losses = phased_steps(torch, engine, rank, phases)
        out["zpccl" if zp else "deepspeed"] = dict(losses=losses, phases=phases.close(), said=LOGGED[said:],
                                                   persistent=sum(getattr(p, "ds_persist", False)
                                                                  for p in engine.module.parameters()))
        if zp:
            engine_zp.disable()
            out["all_reduce_fetch_after"] = [o.use_all_reduce_for_fetch_params for o in owners]
    return out


def _direct(torch: Any, deepspeed: Any, dist: Any, zp: Any, nodes: list[int]) -> dict[str, Any]:
    """The replaced functions called as DeepSpeed calls them, in each type: the reduce-scatter on gradients of
    tiny, 1-D and odd sizes (a tensor smaller than the world among them), beside DeepSpeed's own; the gather on
    parameters zero.Init partitions in that type, through their own all_gather_coalesced."""
    import deepspeed.runtime.zero.stage3 as stage3

    rank, world = dist.get_rank(), dist.get_world_size()
    exact = Exact(torch, zp, nodes)
    theirs = zp._originals[1]
    shapes = [(1,), (5,), (7, 3), (13,), (2, 40)]
    out: dict[str, Any] = {"shapes": [], "close": []}
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        g = torch.Generator().manual_seed(rank)
        tensors = [torch.randn(s, generator=g).to(dtype) for s in shapes]
        with zp.collectives.reducing():  # as the engine's optimizer calls it
            mine = stage3.reduce_scatter_coalesced([t.clone() for t in tensors], None)
        exact_ = theirs([t.float() for t in tensors], None)
        out["shapes"].append([list(a.shape) == list(b.shape) for a, b in zip(mine, exact_)])
        out["close"].append(max(float((a.float() - b).abs().max()) if a.numel() else 0.0 for a, b in zip(mine, exact_)))
    # Over a group other than the data-parallel one: DeepSpeed's own collectives, exact, counted.
    import deepspeed.runtime.zero.partition_parameters as pp

    halves = [dist.new_group(list(range(h, world, 2))) for h in (0, 1)]
    half = halves[rank % 2]
    x = torch.full((4,), float(rank))
    gathered = torch.empty(4 * (world // 2))
    said = len(LOGGED)
    for _ in range(2):  # said once, counted twice
        pp._dist_allgather_fn(x, gathered, half).wait()
        reduced = stage3.reduce_scatter_coalesced([torch.arange(6.0) * rank], half)
    out["other_group"] = dict(
        gathered=gathered.tolist() == [float(r) for r in range(rank % 2, world, 2) for _ in range(4)],
        reduced=reduced[0].tolist(), summary=zp.summary(), said=LOGGED[said:])
    with deepspeed.zero.Init(dtype=torch.float16, config_dict_or_path=ds_config(bf16=False)):
        layer = torch.nn.Linear(9, 3)
    params = list(layer.parameters())
    for p in params:
        p.ds_tensor.data.narrow(0, 0, p.ds_tensor.ds_numel).copy_(torch.randn(p.ds_tensor.ds_numel))
    with zp.collectives.fetching(params):
        params[0].all_gather_coalesced(params).wait()
    out["fp16_gathered"] = [p.data.numel() == p.ds_numel and bool(torch.isfinite(p.data).all()) for p in params]
    for p in params:
        p.partition()
    out["checked"] = exact.verify()
    out["rank_world"] = (rank, world)
    return out


def hf_config(precision: str, hpz: int = 1, quantized: bool = True, **zero: Any) -> dict[str, Any]:
    """A ZeRO-3 config in the shape HF Trainer and Accelerate write out, "auto" resolved: gradient accumulation
    over two micro-steps, gradient clipping, prefetch and reduce buckets of 5e8 elements (floats, as they write
    them: one prefetch gathers many parameters), ``precision`` "fp16" (dynamic loss scaling), "bf16" or "fp32"."""
    z = {"stage": 3, "offload_optimizer": {"device": "none"}, "offload_param": {"device": "none"}, "overlap_comm": True,
         "contiguous_gradients": True, "sub_group_size": 1e9, "reduce_bucket_size": 5e8,
         "stage3_prefetch_bucket_size": 5e8, "stage3_param_persistence_threshold": 0, "stage3_max_live_parameters": 1e9,
         "stage3_max_reuse_distance": 0, "stage3_gather_16bit_weights_on_model_save": True,
         "zero_hpz_partition_size": hpz}
    if quantized:
        z.update(zero_quantized_weights=True, zero_quantized_gradients=True)
    z.update(zero)
    cfg: dict[str, Any] = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
                           "gradient_clipping": 1.0, "steps_per_print": 1000, "wall_clock_breakdown": False,
                           "zero_optimization": z}
    if precision == "fp16":
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
                       "hysteresis": 2, "min_loss_scale": 1}
    elif precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    if quantized:
        cfg["zpccl"] = {"block_size": BLOCK}
    return cfg


def _user_configs(rank: int, ckpt: str) -> dict[str, Any]:
    """World C: one node of four ranks, configs as users ship them (hf_config), each beside unpatched ZeRO-3: fp16
    with a step the loss scaler skips; small reduce and prefetch buckets with a frozen parameter, and eval forwards
    between its steps; disable, then enable again; a second engine zpccl does not serve; an fp16 checkpoint (its
    loss scaler included) resumed to the same losses; tensor-parallel pairs."""
    torch, deepspeed, dist = _setup()
    from deepspeed.accelerator import get_accelerator

    import zpccl.deepspeed

    # DeepSpeed's CPU accelerator reports fp16 only where oneDNN has fp16 kernels; torch's CPU runs fp16 anywhere,
    # and what is under test is the loss scaler around zpccl's collectives, not the kernels' speed.
    get_accelerator().is_fp16_supported = lambda: True
    nodes = [0] * dist.get_world_size()
    out: dict[str, Any] = {}

    def run(config: dict[str, Any], zp: bool, steps: int = 6, **kwargs: Any) -> dict[str, Any]:
        frozen = kwargs.pop("frozen", False)
        engine = make_engine(torch, deepspeed, config, zp=zp, frozen=frozen)
        handle = zpccl.deepspeed.session_of(engine)
        exact = Exact(torch, handle, nodes) if handle is not None else None
        evals: list[float] = []
        every = kwargs.pop("eval_every", 0)
        losses = []
        for step in range(steps):
            losses += train(torch, engine, rank, 1, first=step, **kwargs)
            if every and step % every == every - 1:
                evals.append(evaluate(torch, engine, rank))
        done = dict(losses=losses, evals=evals, skipped=engine.skipped_steps, global_steps=engine.global_steps)
        if handle is not None:
            done.update(summary=handle.summary(), checked=exact.verify())
            handle.disable()
        return done

    # fp16 with dynamic loss scaling, gradient accumulation and clipping; rank 1's gradients overflow at micro-step
    # 2, and DeepSpeed skips that step on every rank.
    out["fp16_ref"] = run(hf_config("fp16", quantized=False), False, overflow_at=2)
    out["fp16"] = run(hf_config("fp16"), True, overflow_at=2)
    # The same with NaN in every padding zpccl must not read (partition tails, staging) before each micro-step, the
    # prefetches gathering several parameters at once: the same bits, the same skipped step.
    out["fp16_poisoned"] = run(hf_config("fp16"), True, overflow_at=2, poison=True)
    # bf16, hpZ 2, buckets smaller than a parameter (the 444-element weight), a frozen parameter; then the same with
    # an eval forward after every optimizer step.
    small = dict(reduce_bucket_size=16, stage3_prefetch_bucket_size=16)
    out["small_ref"] = run(hf_config("bf16", 2, quantized=False, **small), False, frozen=True, eval_every=2)
    out["small"] = run(hf_config("bf16", 2, **small), True, frozen=True)
    out["small_eval"] = run(hf_config("bf16", 2, **small), True, frozen=True, eval_every=2)
    # bf16 with its gradients reduced and accumulated in fp32 (communication_data_type, data_types.grad_accum_dtype),
    # as configs write them that keep bf16's rounding out of the sums: qgZ takes the fp32 gradients DeepSpeed hands it.
    # Four steps, as flags211 below (the same config in bf16) runs.
    wide = dict(communication_data_type="fp32", data_types={"grad_accum_dtype": "fp32"})
    out["wide_ref"] = run(dict(hf_config("bf16", 2, quantized=False), **wide), False, steps=4)
    out["wide"] = run(dict(hf_config("bf16", 2), **wide), True, steps=4)
    # hpZ 1, 2 and 4 with overlap_comm and contiguous gradients each on and off: DeepSpeed's buffers and streams,
    # not the numbers, so each hpZ size's four runs agree bit for bit.
    for hpz in (1, 2, 4):
        for overlap in (True, False):
            for contiguous in (True, False):
                out[f"flags{hpz}{overlap:d}{contiguous:d}"] = run(
                    hf_config("bf16", hpz, overlap_comm=overlap, contiguous_gradients=contiguous), True, steps=4)
    # Every parameter under stage3_param_persistence_threshold: gathered by the first forward's fetch (hpZ, from
    # the secondary partitions), then by DeepSpeed's exact gather after each step, each one counted.
    said = len(LOGGED)
    out["persistent"] = dict(run(hf_config("bf16", 2, stage3_param_persistence_threshold=1e6), True, steps=4),
                             said=LOGGED[said:])
    # Nothing quantized and no hpZ: zpccl serves the persistent parameters' regather alone (the two biases, the
    # LayerNorm's weight and bias and the scale: under 64 elements each), beside unpatched ZeRO-3.
    exact = hf_config("bf16", quantized=False, stage3_param_persistence_threshold=64, stage3_prefetch_bucket_size=16)
    out["persistent_exact_ref"] = run(exact, False)
    exact = dict(exact, zpccl={"weight_bits": None, "grad_bits": None})
    out["persistent_exact"] = run(exact, True)
    # Its checkpoint (DeepSpeed partitions the persistent parameters before saving and loading, and regathers them
    # after): saved after two optimizer steps, then two more; a fresh engine of other weights loads it and goes the
    # same two.
    engine = make_engine(torch, deepspeed, exact, zp=True)
    train(torch, engine, rank, 4)
    handle = zpccl.deepspeed.session_of(engine)
    before = persistent_gathers(handle)
    engine.save_checkpoint(ckpt, tag="persistent")
    saved = persistent_gathers(handle) - before
    went_on = train(torch, engine, rank, 4, first=4)
    handle.disable()
    engine = make_engine(torch, deepspeed, exact, zp=True, seed=5)
    handle = zpccl.deepspeed.session_of(engine)
    before = persistent_gathers(handle)
    engine.load_checkpoint(ckpt, tag="persistent")
    loaded = persistent_gathers(handle) - before
    out["persistent_resume"] = dict(went_on=went_on, resumed=train(torch, engine, rank, 4, first=4), saved=saved,
                                    loaded=loaded)
    handle.disable()

    # disable(), two steps on DeepSpeed's own collectives, then enable() again on the same engine.
    engine = make_engine(torch, deepspeed, hf_config("bf16", 2), zp=True)
    first = zpccl.deepspeed.session_of(engine)
    losses = train(torch, engine, rank, 4)
    first.disable()
    calls = first.summary()
    losses += train(torch, engine, rank, 4, first=4)
    second = zpccl.deepspeed.enable(engine, block_size=BLOCK)
    exact = Exact(torch, second, nodes)
    losses += train(torch, engine, rank, 4, first=8)
    out["again"] = dict(losses=losses, unchanged=first.summary() == calls, summary=second.summary(),
                        checked=exact.verify())
    second.disable()
    out["again_ref"] = train(torch, make_engine(torch, deepspeed, hf_config("bf16", 2, quantized=False), zp=False),
                             rank, 12)

    # Two engines in one process (an actor and a critic, say), zpccl serving the first: the second's collectives
    # stay DeepSpeed's, bit for bit, and the first's counters hold the first's calls only.
    served = make_engine(torch, deepspeed, hf_config("bf16"), zp=True)
    other = make_engine(torch, deepspeed, hf_config("bf16", quantized=False), zp=False, seed=3)
    zp = zpccl.deepspeed.session_of(served)
    mine, theirs = [], []
    for step in range(0, 4, 2):
        mine += train(torch, served, rank, 2, first=step)
        theirs += train(torch, other, rank, 2, first=step)
    out["two"] = dict(served=mine, other=theirs, summary=zp.summary())
    zp.disable()
    out["two_alone"] = dict(served=run(hf_config("bf16"), True, steps=4),
                            other=train(torch, make_engine(torch, deepspeed, hf_config("bf16", quantized=False),
                                                           zp=False, seed=3), rank, 4))

    # fp16 with hpZ and gradient accumulation: a checkpoint after two optimizer steps (the loss scaler's state
    # in it, after a skipped step), then two more; a fresh engine of other weights loads it and goes the same two.
    config = hf_config("fp16", 2)
    engine = make_engine(torch, deepspeed, config, zp=True)
    train(torch, engine, rank, 4, overflow_at=0)
    scale, skipped = engine.optimizer.loss_scale, engine.skipped_steps
    engine.save_checkpoint(ckpt, tag="fp16")
    went_on = train(torch, engine, rank, 4, first=4)
    zpccl.deepspeed.disable(engine)
    engine = make_engine(torch, deepspeed, config, zp=True, seed=5)
    engine.load_checkpoint(ckpt, tag="fp16")
    out["fp16_resume"] = dict(scale=(scale, engine.optimizer.loss_scale), skipped=skipped, went_on=went_on,
                              resumed=train(torch, engine, rank, 4, first=4))
    zpccl.deepspeed.disable(engine)

    # Tensor-parallel pairs (an mpu): zpccl serves each data-parallel group of two, and what runs over the
    # model-parallel pairs (the gradient norm's and the overflow check's all-reduces) stays DeepSpeed's. Both
    # members of a pair see the same batch, as tensor parallelism feeds them. Last: DeepSpeed keeps the mpu.
    mpu = TensorParallelPairs(dist)
    losses = {}
    for zp in (False, True):
        engine = make_engine(torch, deepspeed, hf_config("bf16", quantized=zp), zp=zp, mpu=mpu)
        losses[zp] = train(torch, engine, rank // 2, 6)
    handle = zpccl.deepspeed.session_of(engine)
    out["mpu"] = dict(ref=losses[False], losses=losses[True], summary=handle.summary(),
                      ranks=list(handle.collectives.dp_ranks), nranks=handle.collectives.gather.nranks)
    handle.disable()
    return out


def features_model(torch: Any, reentrant: bool) -> Any:
    """A model with what users' models have and build_model lacks: an embedding tied to the output head (one
    parameter in two modules), a block applied twice in one forward, another under activation checkpointing
    (recomputed in the backward, ``reentrant`` or not), and a LoRA-style adapter beside a frozen base layer. (A block
    applied twice under reentrant checkpointing fails DeepSpeed's own gradient bucket assertion, with or without
    zpccl: each reentrant backward reduces the parameter's gradient once.)"""
    import torch.utils.checkpoint as checkpoint

    nn = torch.nn

    class Adapted(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.base = nn.Linear(16, 16)
            self.base.requires_grad_(False)
            self.down = nn.Linear(16, 4, bias=False)
            self.up = nn.Linear(4, 16, bias=False)

        def forward(self, x: Any) -> Any:
            return self.base(x) + self.up(self.down(x))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(16, 40), nn.Linear(40, 16)

        def forward(self, x: Any) -> Any:
            return x + self.b(torch.relu(self.a(x)))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(50, 16)
            self.block, self.deep = Block(), Block()
            self.adapted = Adapted()
            self.head = nn.Linear(16, 50, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, t: Any) -> Any:
            h = self.block(self.block(self.emb(t)))
            h = checkpoint.checkpoint(self.deep, h, use_reentrant=reentrant)
            return self.head(self.adapted(h))

    torch.manual_seed(0)
    return Net()


def _user_features(rank: int, ckpt: str) -> dict[str, Any]:
    """World D: one node of two ranks, hpZ groups of two, each feature beside DeepSpeed's own engine: the checkpoint
    files (ZeRO's, the 16-bit model, zero_to_fp32's consolidation) and loading them across the two; GatheredParameters
    with a modifier rank; a model built under zero.Init and loaded as from_pretrained does; tied weights, a module
    used twice, activation checkpointing and a frozen base layer with an adapter."""
    torch, deepspeed, dist = _setup()
    from deepspeed.utils import groups
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    import zpccl.deepspeed

    out: dict[str, Any] = {}
    bits = {k: dict(same=[], count=0) for k in ("16bit", "fp32", "zp_to_ds", "ds_to_zp", "modified", "pretrained")}

    def compare(key: str, got: dict[str, Any], want: dict[str, Any]) -> None:
        bits[key]["same"].append(sorted(n for n in want if not (got[n].dtype == want[n].dtype and torch.equal(
            got[n], want[n]))))
        bits[key]["count"] += len(want)

    # Checkpoints: each side saves after two steps (ZeRO's files and the 16-bit model); the 16-bit model and
    # zero_to_fp32's consolidation hold the weights the engine trained to, and each side loads the other's files.
    config = dict(ds_config(2, quantized=True), zero_optimization=dict(
        ds_config(2, quantized=True)["zero_optimization"], stage3_gather_16bit_weights_on_model_save=True))
    saved = {}
    for zp in (True, False):
        tag = "zpccl" if zp else "deepspeed"
        engine = make_engine(torch, deepspeed, config if zp else ds_config(2), zp=zp)
        train(torch, engine, rank, 2)
        saved[tag] = exact_weights(torch, engine)
        engine.save_checkpoint(ckpt, tag=tag)
        if zp:
            engine.save_16bit_model(os.path.join(ckpt, tag), "model16.bin")
            handle = zpccl.deepspeed.session_of(engine)
            out["checkpoint_summary"] = handle.summary()
            handle.disable()
    dist.barrier()
    if rank == 0:
        compare("16bit", torch.load(os.path.join(ckpt, "zpccl", "model16.bin")), saved["zpccl"])
        fp32 = get_fp32_state_dict_from_zero_checkpoint(ckpt, tag="zpccl")
        compare("fp32", {n: t.to(torch.bfloat16) for n, t in fp32.items()}, saved["zpccl"])
    for zp, tag in ((False, "zpccl"), (True, "deepspeed")):
        engine = make_engine(torch, deepspeed, config if zp else ds_config(2), zp=zp, seed=5)
        engine.load_checkpoint(ckpt, tag=tag)
        compare("ds_to_zp" if zp else "zp_to_ds", exact_weights(torch, engine), saved[tag])
        zpccl.deepspeed.disable(engine)

    # GatheredParameters with a modifier rank over a layer's parameters, after two steps: rank 0 writes its weight,
    # every rank reads it back exact, and the layer's next fetch gathers both from the secondary partitions DeepSpeed
    # rebuilt of them (hpZ, exact): the layer computes with the written weight and the bias as it was.
    new = torch.randn(37, 12, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    x = batch(torch, rank, 50, torch.bfloat16)[0]
    engine = make_engine(torch, deepspeed, ds_config(2, quantized=True), zp=True)
    handle = zpccl.deepspeed.session_of(engine)
    train(torch, engine, rank, 2)
    layer = engine.module.inp
    with deepspeed.zero.GatheredParameters(list(layer.parameters()), modifier_rank=0):
        if rank == 0:
            layer.weight.data.copy_(new)
    before = handle.summary()
    with deepspeed.zero.GatheredParameters([layer.weight]):
        compare("modified", {"w": layer.weight.data.clone()}, {"w": new})
    weights = exact_weights(torch, engine)
    compare("modified", weights, {"inp.weight": new})
    with torch.no_grad():
        out["modified_forward"] = bool(torch.equal(layer(x), torch.nn.functional.linear(x, new, weights["inp.bias"])))
    after = handle.summary()
    out["modified_calls"] = (after["hpz"]["calls"] - before["hpz"]["calls"],
                             after["qwz"]["calls"] - before["qwz"]["calls"])
    handle.disable()

    # A model built under zero.Init (split_config's config, which zero.Init reads), its weights loaded module by
    # module with GatheredParameters(modifier_rank=0) as from_pretrained does: the engine holds them exact, and its
    # first step (hpZ, from the secondary partitions the loads rebuilt) is DeepSpeed's bit for bit.
    pretrained = {n: p.detach().to(torch.bfloat16) for n, p in build_model(torch, seed=42).named_parameters()}
    losses = {}
    for zp in (True, False):
        groups._ZERO_PARAM_INTRA_PARALLEL_GROUP = None
        cfg = ds_config(2, quantized=zp)
        with deepspeed.zero.Init(config_dict_or_path=zpccl.deepspeed.split_config(cfg)[0]):
            model = build_model(torch)
        for prefix, module in model.named_modules():
            own = dict(module.named_parameters(recurse=False))
            with deepspeed.zero.GatheredParameters(list(own.values()), modifier_rank=0):
                if rank == 0:
                    for n, p in own.items():
                        p.data.copy_(pretrained[f"{prefix}.{n}" if prefix else n])
        engine = engine_of(torch, deepspeed, model, cfg, zp)
        if zp:
            compare("pretrained", exact_weights(torch, engine), pretrained)
        losses[zp] = train(torch, engine, rank, 3)
        zpccl.deepspeed.disable(engine)
    out["pretrained_losses"] = losses

    # Tied weights, a block used twice, activation checkpointing, a frozen base layer with an adapter: hpZ 1
    # and 2, reentrant checkpointing and not, each beside DeepSpeed's own engine.
    for hpz in (1, 2):
        for reentrant in (True, False):
            runs = {}
            for zp in (True, False):
                groups._ZERO_PARAM_INTRA_PARALLEL_GROUP = None
                model = features_model(torch, reentrant)
                engine = engine_of(torch, deepspeed, model, ds_config(hpz, quantized=zp), zp)
                handle = zpccl.deepspeed.session_of(engine)
                exact = Exact(torch, handle, [0] * dist.get_world_size()) if zp else None
                frozen = exact_weights(torch, engine)["adapted.base.weight"]
                losses = []
                for step in range(3):
                    tokens = torch.randint(0, 50, (4, 6), generator=torch.Generator().manual_seed(10 * step + rank))
                    loss = torch.nn.functional.cross_entropy(engine(tokens).float().reshape(-1, 50), tokens.reshape(-1))
                    engine.backward(loss)
                    engine.step()
                    losses.append(loss.item())
                runs[zp] = dict(losses=losses, frozen=bool(torch.equal(
                    exact_weights(torch, engine)["adapted.base.weight"], frozen)))
                if zp:
                    runs[zp].update(summary=handle.summary(), checked=exact.verify())
                    handle.disable()
            out[f"features{hpz}{reentrant:d}"] = runs
    out["bits"] = bits
    return out


def _engines(rank: int) -> dict[str, Any]:
    """World E: one node of two ranks, engines as users make them beside a training engine: one without an optimizer
    (inference, a reference model) built from the training config, its forward's gathers checked bit for bit; an
    engine destroyed, then others made in the same process."""
    torch, deepspeed, dist = _setup()
    from deepspeed.utils import groups

    import zpccl.deepspeed

    out: dict[str, Any] = {}

    # No optimizer: DeepSpeed holds ZeRO-3's parameter offload in the optimizer's place, which reduces nothing. The
    # training config's ZeRO++ switches still ask for qwZ, which serves the forward's gathers.
    groups._ZERO_PARAM_INTRA_PARALLEL_GROUP = None
    made: list[Any] = []
    out["inference_refused"] = refusal(lambda: made.append(zpccl.deepspeed.initialize(
        model=build_model(torch), config=ds_config(quantized=True))[0]))
    if made:
        engine = made[0]
        zp = zpccl.deepspeed.session_of(engine)
        exact = Exact(torch, zp, [0] * dist.get_world_size())
        losses = [evaluate(torch, engine, rank) for _ in range(2)]
        out["inference"] = dict(losses=losses, summary=zp.summary(), checked=exact.verify(),
                                reduce=zp.collectives.reduce is not None)
        zp.disable()

    # engine.destroy() ends zpccl's service as disable() does: DeepSpeed's own functions in place, no live session,
    # and a later engine of the process (a sweep, a restart) served as a first one is.
    import deepspeed.runtime.zero.partition_parameters as pp
    import deepspeed.runtime.zero.stage3 as stage3

    def functions() -> tuple[Any, ...]:
        return pp._dist_allgather_fn, stage3.reduce_scatter_coalesced, stage3.all_to_all_quant_reduce

    originals = functions()
    config = ds_config(2, quantized=True)
    first = make_engine(torch, deepspeed, config, zp=True)
    train(torch, first, rank, 2)
    first.destroy()
    out["destroyed"] = dict(restored=[a is b for a, b in zip(functions(), originals)],
                            unserved=zpccl.deepspeed.session_of(first) is None,
                            fetches=not any(isinstance(getattr(p, name), functools.partial)
                                            for p in first.module.parameters()
                                            for name in ("all_gather", "all_gather_coalesced")))
    runs = []
    for _ in range(2):
        made = []
        said = refusal(lambda: made.append(make_engine(torch, deepspeed, config, zp=True)))
        if not made:
            runs.append(dict(refused=said))
            break
        losses = train(torch, made[0], rank, STEPS)
        zp = zpccl.deepspeed.session_of(made[0])
        runs.append(dict(refused=said, losses=losses, summary=zp.summary()))
        made[0].destroy()
    out["after_destroy"] = runs
    return out


# ---- the tests ----------------------------------------------------------------------------------------------------


def _spawned(test: unittest.TestCase, outcomes: list[Any]) -> list[dict[str, Any]]:
    for o in outcomes:
        test.assertIsNone(o.error, f"rank {o.rank}: {o.error}")
        test.assertEqual(o.exitcode, 0)
    return [o.value for o in outcomes]


def _close(a: list[float], b: list[float], rel: float) -> bool:
    return all(np.isfinite(x) and abs(x - y) <= rel * abs(y) for x, y in zip(a, b)) and len(a) == len(b)


class ConfigOfDeepSpeed(unittest.TestCase):
    """split_config and the version checks: no DeepSpeed, no processes."""

    def test_ci_installs_the_deepspeed_zpccl_was_read_in(self) -> None:
        from zpccl.deepspeed import CHECKED_DEEPSPEED, MIN_DEEPSPEED
        from zpccl.deepspeed._deepspeed import deepspeed_version

        self.assertEqual(pinned("deepspeed"), CHECKED_DEEPSPEED)  # tests/frameworks.txt, which CI installs
        self.assertGreaterEqual(deepspeed_version(CHECKED_DEEPSPEED), MIN_DEEPSPEED)

    def test_zero_plus_plus_keys_map_to_a_policy(self) -> None:
        from zpccl.deepspeed import split_config

        cfg = {"train_batch_size": 8, "zero_optimization": {"stage": 3, "zero_quantized_weights": True,
                                                            "zero_quantized_gradients": True,
                                                            "zero_hpz_partition_size": 2},
               "zpccl": {"grad_block_size": 64}}
        ds, policy = split_config(cfg)
        self.assertEqual(ds, {"train_batch_size": 8, "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2}})
        self.assertEqual((policy.weight_bits, policy.grad_bits, policy.block_size, policy.grad_block_size, policy.hpz),
                         (8, 4, 256, 64, True))
        self.assertIn("zpccl", cfg)  # the caller's dict is left as it was
        self.assertTrue(cfg["zero_optimization"]["zero_quantized_weights"])
        one = split_config({"zero_optimization": {"stage": 3, "zero_quantized_gradients": True}})[1]
        self.assertEqual((one.weight_bits, one.grad_bits), (None, 4))
        alone = split_config({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 4}})
        self.assertEqual((alone[1].weight_bits, alone[1].grad_bits, alone[1].hpz), (None, None, True))
        self.assertEqual(alone[0]["zero_optimization"]["zero_hpz_partition_size"], 4)
        section = split_config({"zero_optimization": {"stage": 3}, "zpccl": {"weight_bits": 4, "grad_bits": 8}})[1]
        self.assertEqual((section.weight_bits, section.grad_bits), (4, 8))
        # Both off and no hpZ: the persistent parameters' gathers alone (enable refuses a model without any).
        exact = split_config({"zero_optimization": {"stage": 3}, "zpccl": {"grad_bits": None}})[1]
        self.assertEqual((exact.weight_bits, exact.grad_bits), (None, None))
        self.assertEqual(split_config({"zero_optimization": {"stage": 3}}), ({"zero_optimization": {"stage": 3}},
                                                                              None))
        self.assertEqual(split_config({"zero_optimization": {"stage": 2}})[1], None)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "ds.json")
            with open(path, "w") as f:
                json.dump(cfg, f)
            self.assertEqual(split_config(path), (ds, policy))

    def test_refusals_name_what_to_change(self) -> None:
        from zpccl.deepspeed import split_config

        def refused(words: str, cfg: Any) -> None:
            with self.assertRaises(zpccl.ZpcclError) as e:
                split_config(cfg)
            self.assertIn(words, str(e.exception))
            self.assertIn("zpccl.deepspeed.split_config", str(e.exception))

        zero = {"stage": 3, "zero_quantized_weights": True}
        refused("zpccl serves ZeRO stage 3, and zero_optimization.stage is 2",
                {"zero_optimization": dict(zero, stage=2)})
        refused("zero_quantized_weights asks for weight_bits, and the \"zpccl\" section sets weight_bits=None",
                {"zero_optimization": zero, "zpccl": {"weight_bits": None}})
        refused("zero_quantized_nontrainable_weights: zpccl does not serve it",
                {"zero_optimization": dict(zero, zero_quantized_nontrainable_weights=True)})
        refused("unknown argument(s) blocksize", {"zero_optimization": zero, "zpccl": {"blocksize": 64}})
        refused("block_size 100 must be a power of two", {"zero_optimization": zero, "zpccl": {"block_size": 100}})
        refused("\"zpccl\" section must be a dict", {"zero_optimization": zero, "zpccl": 8})
        refused("zero_optimization.zero_hpz_partition_size must be an int (the ranks of DeepSpeed's hpZ groups, 1 for "
                "none), got 'auto'", {"zero_optimization": dict(zero, zero_hpz_partition_size="auto")})
        refused("zero_hpz_partition_size must be an int",
                {"zero_optimization": dict(zero, zero_hpz_partition_size=1.5)})
        refused("config must be a DeepSpeed config dict or the path of its JSON file", "/no/such/file.json")

    def test_switches_and_stage_read_as_deepspeed_reads_them(self) -> None:
        from zpccl.deepspeed import split_config

        # DeepSpeed's ZeRO config (pydantic) reads "false", "off" or 0 as off and "3" or 3.0 as stage 3 (JSON made
        # by templates and command lines holds such strings): zpccl turns on what DeepSpeed would, and no more.
        values = [True, False, "true", "false", "False", "off", "on", "yes", "no", "0", "1", 0, 1, 1.0]
        try:
            from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
        except ImportError:
            DeepSpeedZeroConfig = None
        for value in values:
            with self.subTest(value=value):
                ds, policy = split_config({"zero_optimization": {"stage": "3", "zero_quantized_weights": value,
                                                                 "zero_quantized_gradients": True,
                                                                 "zero_quantized_nontrainable_weights": "false"}})
                on = DeepSpeedZeroConfig(stage=3, zero_quantized_weights=value).zero_quantized_weights \
                    if DeepSpeedZeroConfig is not None else str(value).lower() in ("true", "on", "yes", "1", "1.0")
                self.assertEqual(policy.weight_bits, 8 if on else None)
                self.assertEqual(policy.grad_bits, 4)
                self.assertNotIn("zero_quantized_weights", ds["zero_optimization"])
        self.assertEqual(split_config({"zero_optimization": {"stage": 3.0, "zero_hpz_partition_size": 2}})[1].hpz,
                         True)
        for zero, words in (({"stage": 3, "zero_quantized_weights": "maybe"},
                             "zero_optimization.zero_quantized_weights must be a boolean"),
                            ({"stage": 3, "zero_quantized_gradients": 2},
                             "zero_optimization.zero_quantized_gradients must be a boolean"),
                            ({"stage": "three", "zero_quantized_weights": True},
                             "zero_optimization.stage is 'three'")):
            with self.subTest(zero=zero):
                with self.assertRaises(zpccl.ZpcclError) as e:
                    split_config({"zero_optimization": zero})
                self.assertIn(words, str(e.exception))

    def test_persistent_gathers_in_buckets(self) -> None:
        from zpccl.deepspeed._collectives import _buckets

        def runs(sizes: list[int], most: int) -> list[list[int]]:
            return list(_buckets(sizes, lambda x: x, most))

        self.assertEqual(runs([40, 40, 40, 8, 4], 64), [[40], [40], [40, 8, 4]])
        self.assertEqual(runs([40, 40, 40, 8, 4], 132), [[40, 40, 40, 8, 4]])
        self.assertEqual(runs([100, 1, 1], 64), [[100], [1, 1]])  # one larger than a bucket goes alone
        self.assertEqual(runs([1, 100, 1], 64), [[1], [100], [1]])
        self.assertEqual(runs([], 64), [])

    def test_block_layout_fill_keeps_padding_out(self) -> None:
        torch = torch_for_procs()
        from zpccl._staging import BlockLayout

        layout = BlockLayout((5, 3, 4), 4)
        dst = torch.full((2, layout.staged_count), float("nan"))
        rows = [[torch.full((5,), 1.0), torch.full((3,), 2.0), torch.full((4,), 3.0)],
                [torch.full((2,), 1.0), torch.empty(0), torch.full((1,), 3.0)]]
        layout.fill(torch, rows, dst, torch.zeros(8))
        self.assertEqual(dst.tolist(), [[1, 1, 1, 1, 1, 0, 0, 0, 2, 2, 2, 0, 3, 3, 3, 3],
                                        [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0]])
        with self.assertRaisesRegex(ValueError, "part 0 of 9 elements in a slot of 8"):
            layout.fill(torch, [[torch.zeros(9), torch.zeros(3), torch.zeros(4)]], dst[:1], torch.zeros(8))

    def test_an_older_or_different_deepspeed_is_refused(self) -> None:
        try:
            import torch  # noqa: F401 - DeepSpeed.load imports torch before it reads DeepSpeed's version
        except ImportError:
            self.skipTest("torch is not installed")
        from zpccl.deepspeed._deepspeed import DeepSpeed, fetch_owner, parameter_names

        def fake(version: str, **modules: Any) -> dict[str, Any]:
            mods = {"deepspeed": types.SimpleNamespace(__version__=version)}
            for name, attrs in modules.items():
                mods[name] = types.SimpleNamespace(**attrs)
            return mods

        @contextlib.contextmanager
        def installed(mods: dict[str, Any]) -> Any:
            """The stand-ins in place of every deepspeed module (an imported DeepSpeed included), then back."""
            saved = {k: v for k, v in sys.modules.items() if k == "deepspeed" or k.startswith("deepspeed.")}
            for k in saved:
                del sys.modules[k]
            sys.modules.update(mods)
            try:
                yield
            finally:
                for k in mods:
                    sys.modules.pop(k, None)
                sys.modules.update(saved)

        with installed(fake("0.16.5")):
            with self.assertRaisesRegex(zpccl.ZpcclError, r"needs DeepSpeed 0.19 or later .*this is DeepSpeed 0.16.5"):
                DeepSpeed.load()

        def gather(input_tensor: Any, output_tensor: Any, group: Any = None) -> None: ...

        def renamed(tensors: Any, process_group: Any = None) -> None: ...

        pp, s3 = "deepspeed.runtime.zero.partition_parameters", "deepspeed.runtime.zero.stage3"
        with installed(fake("0.19.9", **{pp: dict(_dist_allgather_fn=gather),
                                         s3: dict(reduce_scatter_coalesced=renamed, all_to_all_quant_reduce=renamed)})):
            with self.assertRaisesRegex(zpccl.ZpcclError, r"replaces deepspeed.runtime.zero.stage3."
                                                          r"reduce_scatter_coalesced\(tensors, group\), .*DeepSpeed "
                                                          rf"{re.escape(pinned('deepspeed'))} has and DeepSpeed "
                                                          r"0\.19\.9 does not"):
                DeepSpeed.load()
        self.assertEqual(parameter_names(gather), ("input_tensor", "output_tensor", "group"))

        # The Init a parameter's fetch reads its settings from: the self its closure holds, through an
        # instrument_w_nvtx-like wrapper; None where there is none.
        def fetch_of(self: Any) -> Any:  # self: the Init, as DeepSpeed's closure names it
            def all_gather_coalesced(params: Any, safe_mode: bool = False, quantize: bool = False) -> Any:
                return self, params

            return all_gather_coalesced

        def nvtx(func: Any) -> Any:
            def wrapped_fn(*args: Any, **kwargs: Any) -> Any:
                return func(*args, **kwargs)
            return wrapped_fn

        owner = types.SimpleNamespace(use_all_reduce_for_fetch_params=True)
        self.assertIs(fetch_owner(nvtx(fetch_of(owner))), owner)
        self.assertIsNone(fetch_owner(nvtx(gather)))


class _OneSpawn(unittest.TestCase):
    """The tests of a subclass read one spawn of ``ranks`` processes, all on one node of ``local`` (or nodes of
    ``local`` ranks), each running ``target``, made once for the class; every rank's outcome is checked before each
    test. ``target`` takes a scratch folder after its rank (checkpoints) where ``scratch`` says so."""

    ranks = 0
    local = 0
    target: Any = None
    scratch = True
    timeout = 400
    out: list[dict[str, Any]]

    @classmethod
    def setUpClass(cls) -> None:
        deepspeed_or_skip()
        cls._dir = tempfile.TemporaryDirectory()
        args = (cls._dir.name,) if cls.scratch else ()
        cls.outcomes = run_procs(cls.ranks, cls.target, *args, local=cls.local,
                                 env=dict(ENV, LOCAL_SIZE=str(cls.local)), timeout=cls.timeout)

    @classmethod
    def tearDownClass(cls) -> None:
        cls._dir.cleanup()

    def setUp(self) -> None:
        self.out = _spawned(self, self.outcomes)


class DeepSpeedOneNode(_OneSpawn):
    """Four ranks on one node: the sweep, exactness, lifecycle and refusals (one spawn)."""

    ranks, local, target = 4, 4, staticmethod(_one_node)

    def test_sweep_over_hpz_sizes_tracks_zero3(self) -> None:
        for r, o in enumerate(self.out):
            for hpz in (1, 2, 4):
                run = o[f"sweep{hpz}"]
                with self.subTest(rank=r, hpz=hpz):
                    self.assertTrue(_close(run["losses"], o["ref"], GAP_INT4), (run["losses"], o["ref"]))
                    s = run["summary"]
                    self.assertGreater(s["qwz"]["calls"], 0)
                    self.assertGreater(s["qgz"]["calls"], 0)
                    self.assertEqual("hpz" in s, hpz > 1, s)
                    self.assertFalse([k for k in s if k.startswith("deepspeed_")], s)
                    self.assertGreater(s["qwz"]["logical_bytes"], s["qwz"]["wire_bytes"] / 3)
                    self.assertEqual(run["checked"], {"qwz": s["qwz"]["calls"], "qgz": s["qgz"]["calls"]})
                    self.assertEqual(run["hpz_size"], hpz if hpz > 1 else None)
                    # The first forward gathers the secondary partitions DeepSpeed made of the model's own weights
                    # where hpZ is on (hpZ, exact), the primary ones (qwZ) where it is not: the first loss is
                    # ZeRO-3's, bit for bit, with hpZ only.
                    self.assertEqual(run["losses"][0] == o["ref"][0], hpz > 1, (run["losses"], o["ref"]))
                    if hpz > 1:  # every parameter's secondary partition is 1/hpz of its padded size
                        self.assertEqual(run["secondary"], [4 * n // hpz for n in run["partitions"]])
                    else:
                        self.assertEqual(run["secondary"], [None] * len(run["partitions"]))

    def test_without_overlap_comm_or_contiguous_gradients(self) -> None:
        for o in self.out:
            self.assertTrue(_close(o["plain"]["losses"], o["ref"], GAP_INT4))
            self.assertEqual(o["plain"]["losses"], o["sweep2"]["losses"])
            self.assertEqual({k for k in o["plain"]["summary"]}, {"qwz", "hpz", "qgz"})

    def test_hpz_alone_is_deepspeeds_hpz_bit_for_bit(self) -> None:
        for o in self.out:
            self.assertEqual(o["hpz_alone"]["losses"], o["ref_hpz2"])
            s = o["hpz_alone"]["summary"]
            self.assertGreater(s["hpz"]["calls"], 0)
            self.assertEqual(s["hpz"]["wire_bytes"] * 2, s["hpz"]["logical_bytes"])  # k=2: half of each gather
            self.assertGreater(s["deepspeed_all_gather_off"]["calls"], 0)
            self.assertGreater(s["deepspeed_reduce_scatter_off"]["calls"], 0)
            self.assertNotIn("qwz", s)

    def test_each_quantization_on_its_own(self) -> None:
        for o in self.out:
            w, g = o["zero_quantized_weights"], o["zero_quantized_gradients"]
            self.assertTrue(_close(w["losses"], o["ref"], GAP_INT8) and _close(g["losses"], o["ref"], GAP_INT4),
                            (w, g))
            self.assertEqual(set(w["summary"]), {"qwz", "deepspeed_reduce_scatter_off"})
            self.assertEqual(set(g["summary"]), {"qgz", "deepspeed_all_gather_off"})
            self.assertEqual(w["checked"], {"qwz": w["summary"]["qwz"]["calls"], "qgz": 0})
            self.assertEqual(g["checked"], {"qwz": 0, "qgz": g["summary"]["qgz"]["calls"]})

    def test_gradient_accumulation(self) -> None:
        for o in self.out:
            self.assertTrue(all(o["accum"]["kept"]), o["accum"]["kept"])
            self.assertTrue(_close(o["accum"]["losses"], o["ref_accum"], GAP_INT4))
            self.assertGreater(o["accum"]["summary"]["hpz"]["calls"], 0)

    def test_eval(self) -> None:
        for o in self.out:
            e = o["eval"]
            self.assertGreater(e["after"]["qwz"]["calls"], e["before"]["qwz"]["calls"])
            self.assertEqual(e["after"]["qgz"], e["before"]["qgz"])
            self.assertTrue(all(s is not None for s in e["secondary"]))
            self.assertTrue(_close([e["loss"]], [o["eval_ref"]], GAP_INT4), (e["loss"], o["eval_ref"]))

    def test_nan_in_padding_changes_no_bit(self) -> None:
        poisoned = [o["poisoned"]["count"] for o in self.out]
        self.assertGreater(sum(poisoned), 0)
        self.assertEqual(poisoned[0], 0)  # rank 0's partitions hold data only; the last ranks' end in padding
        for o in self.out:
            self.assertEqual(o["poisoned"]["losses"], o["sweep2"]["losses"])
            self.assertGreater(o["poisoned"]["staged"], 0)  # staging buffers made full of NaN

    def test_calls_allocate_their_staging_and_keep_nothing(self) -> None:
        # What zpccl.deepspeed states for memory: a call's staging is sized to the call (no larger buffer kept for
        # the largest), is the only tensor it allocates (a reduce-scatter's chunks are views of it), and is freed
        # once DeepSpeed is done with it: nothing of zpccl's stays allocated between calls.
        for r, o in enumerate(self.out):
            calls = o["memory"]
            with self.subTest(rank=r):
                self.assertEqual({c["kind"] for c in calls}, {"qwz", "qgz"})
                # The tiny model's odd parameters do not fill their blocks: gathers that need staging, seen by the
                # profiler as allocated (so that the equalities below are not 0 == 0).
                self.assertTrue(any(c["kind"] == "qwz" and c["staging"] and c["peak"] for c in calls), calls)
                for c in calls:
                    self.assertEqual((c["peak"], c["kept"]), (c["staging"], 0), c)

    def test_checkpoint_resumes_to_the_same_losses(self) -> None:
        for o in self.out:
            self.assertEqual(o["resume"]["resumed"], o["resume"]["went_on"])
            self.assertEqual(o["resume"]["went_on"][:1], o["sweep2"]["losses"][2:3])

    def test_gathered_parameters_stay_exact(self) -> None:
        for o in self.out:
            self.assertTrue(all(o["gathered"]["exact"]), o["gathered"])
            self.assertEqual(o["gathered"]["calls_after"], o["gathered"]["calls_before"])

    def test_disable_gives_deepspeed_its_functions_back(self) -> None:
        for o in self.out:
            d = o["disable"]
            self.assertEqual(d["replaced"], [True, True, True])
            self.assertEqual(d["restored"], [True, True, True])
            self.assertTrue(all(d["fetches"]))
            self.assertTrue(d["counters_unchanged"] and d["unserved"], d)

    def test_enable_on_a_plain_engine(self) -> None:
        for o in self.out:
            e = o["enable"]
            self.assertTrue(_close(e["losses"], o["ref"], GAP_INT8), (e["losses"], o["ref"]))
            self.assertEqual(set(e["summary"]), {"qwz", "qgz"})
            self.assertEqual(e["checked"], {"qwz": e["summary"]["qwz"]["calls"], "qgz": e["summary"]["qgz"]["calls"]})
            self.assertIn("already serves a DeepSpeed engine", e["again"])

    def test_refusals(self) -> None:
        for o in self.out:
            said = o["refused"]
            self.assertIn("runs ZeRO stage 2", said["stage2"])
            self.assertIn("hpz_size is DeepSpeed's zero_optimization.zero_hpz_partition_size", said["hpz_size"])
            self.assertIn("drop error_feedback", said["error_feedback"])
            self.assertIn("the engine has neither an hpZ group", said["no_hpz"])
            self.assertIn("nor persistent parameters (stage3_param_persistence_threshold)", said["no_hpz"])
            self.assertEqual(said["ranks_per_node"], "2 nodes")
            self.assertEqual(said["mpu_nodes"], "2 nodes")
            self.assertRegex(said["reducer"], r"optimizer lacks avg_scatter_grads, which runs its gradient "
                                              rf"reductions in DeepSpeed {re.escape(pinned('deepspeed'))}; this is "
                                              r"DeepSpeed .*grad_bits=None")
            self.assertEqual(said["reducer_weights_only"], "")
            self.assertIn("is not a DeepSpeed engine", said["not_engine"])
            self.assertIn("built with zero_quantized_weights", said["quantized_weights"])
            self.assertRegex(said["hpz_nodes"], r"zero_hpz_partition_size=4 .* ranks \[0, 1, 2, 3\], which are on "
                                                r"nodes \[0, 1\]")
            self.assertEqual(said["handle_after_refusal"], "")
            self.assertIn("the config asks for no ZeRO++ technique", said["nothing"])
            self.assertEqual(said["hpz_off"], "")
            self.assertRegex(said["hpz_mpu"], r"zero_hpz_partition_size=2 makes DeepSpeed gather .* over ranks "
                                              r"\[0, 1\], which are not all in the data-parallel group \[[01], "
                                              r"[23]\]: .*Set zero_optimization.zero_hpz_partition_size to 1, or "
                                              r"hpz=False")
        self.assertEqual(len({o["refused"]["hpz_nodes"] for o in self.out}), 1)  # every rank, the same verdict


class DeepSpeedUserConfigs(_OneSpawn):
    """Four ranks on one node, configs as HF Trainer and Accelerate write them (one spawn)."""

    ranks, local, target = 4, 4, staticmethod(_user_configs)

    def assertServed(self, run: dict[str, Any], paths: set[str]) -> None:
        """Every path in ``paths`` ran, nothing stayed DeepSpeed's, every quantized call equals the model."""
        s = run["summary"]
        self.assertEqual(set(s), paths, s)
        self.assertTrue(all(s[p]["calls"] > 0 for p in paths), s)
        self.assertEqual(run["checked"], {"qwz": s.get("qwz", {}).get("calls", 0),
                                          "qgz": s.get("qgz", {}).get("calls", 0)})

    def test_fp16_loss_scaler_skips_the_overflow_step(self) -> None:
        for o in self.out:
            ref, run = o["fp16_ref"], o["fp16"]
            self.assertEqual((ref["skipped"], ref["global_steps"]), (1, 3))
            self.assertEqual((run["skipped"], run["global_steps"]), (1, 3))
            self.assertTrue(_close(run["losses"], ref["losses"], GAP_INT4), (run["losses"], ref["losses"]))
            self.assertServed(run, {"qwz", "qgz"})
            poisoned = o["fp16_poisoned"]
            self.assertEqual((poisoned["losses"], poisoned["skipped"]), (run["losses"], run["skipped"]))
            self.assertEqual(poisoned["checked"], run["checked"])

    def test_small_buckets_and_a_frozen_parameter(self) -> None:
        for o in self.out:
            ref, run = o["small_ref"], o["small"]
            self.assertTrue(_close(run["losses"], ref["losses"], GAP_INT4), (run["losses"], ref["losses"]))
            self.assertServed(run, {"qwz", "hpz", "qgz"})

    def test_eval_forwards_between_steps_change_no_training_bit(self) -> None:
        for o in self.out:
            run, ref = o["small_eval"], o["small_ref"]
            self.assertEqual(run["losses"], o["small"]["losses"])
            self.assertEqual(len(run["evals"]), 3)
            self.assertTrue(_close(run["evals"], ref["evals"], GAP_INT4), (run["evals"], ref["evals"]))
            self.assertServed(run, {"qwz", "hpz", "qgz"})

    def test_gradients_reduced_and_accumulated_in_fp32(self) -> None:
        for o in self.out:
            ref, run, narrow = o["wide_ref"], o["wide"], o["flags211"]  # flags211: the same config in bf16
            self.assertTrue(_close(run["losses"], ref["losses"], GAP_INT4), (run["losses"], ref["losses"]))
            self.assertServed(run, {"qwz", "hpz", "qgz"})
            # The same calls as bf16's, each on gradients of twice the bytes.
            wide, bf16 = run["summary"]["qgz"], narrow["summary"]["qgz"]
            self.assertEqual(wide["calls"], bf16["calls"])
            self.assertEqual(wide["logical_bytes"], 2 * bf16["logical_bytes"])

    def test_hpz_sizes_with_overlap_comm_and_contiguous_gradients_on_and_off(self) -> None:
        for o in self.out:
            for hpz in (1, 2, 4):
                runs = [o[f"flags{hpz}{a:d}{b:d}"] for a in (True, False) for b in (True, False)]
                for run in runs:
                    self.assertEqual(run["losses"], runs[0]["losses"])
                    self.assertServed(run, {"qwz", "qgz"} | ({"hpz"} if hpz > 1 else set()))

    def test_every_parameter_persistent(self) -> None:
        for o in self.out:
            run = o["persistent"]
            s = run["summary"]
            # No quantized gather: each step's exact regather is one call for every parameter, said once at enable.
            self.assertEqual(set(s), {"hpz", "qgz", "persistent_gather"}, s)
            self.assertEqual(s["persistent_gather"]["calls"], run["global_steps"])
            self.assertEqual(run["checked"], {"qwz": 0, "qgz": s["qgz"]["calls"]})
            self.assertEqual(len([m for m in run["said"] if "persistent parameters (746 elements" in m]), 1)

    def test_persistent_gathers_alone_are_deepspeeds_bit_for_bit(self) -> None:
        for o in self.out:
            ref, run = o["persistent_exact_ref"], o["persistent_exact"]
            self.assertEqual(run["losses"], ref["losses"])
            # The gathers and reduce-scatters stay DeepSpeed's, counted as such.
            self.assertEqual(set(run["summary"]), {"persistent_gather", "deepspeed_all_gather_off",
                                                   "deepspeed_reduce_scatter_off"}, run["summary"])
            # Five persistent parameters, gathered in one call a step, where DeepSpeed makes five.
            calls = run["summary"]["persistent_gather"]["calls"]
            self.assertEqual(calls, run["global_steps"], run["summary"])
            self.assertEqual(run["checked"], {"qwz": 0, "qgz": 0})
            # A checkpoint's save and load regather them too, through zpccl; the resumed run is the same bits.
            resume = o["persistent_resume"]
            self.assertEqual(resume["resumed"], resume["went_on"])
            self.assertEqual((resume["saved"], resume["loaded"]), (1, 1))

    def test_disable_then_enable_again(self) -> None:
        for o in self.out:
            again = o["again"]
            self.assertTrue(again["unchanged"])  # the steps between ran on DeepSpeed's own collectives
            self.assertTrue(_close(again["losses"], o["again_ref"], GAP_INT4), (again["losses"], o["again_ref"]))
            self.assertServed(again, {"qwz", "hpz", "qgz"})

    def test_fp16_checkpoint_resumes_to_the_same_losses(self) -> None:
        for o in self.out:
            r = o["fp16_resume"]
            self.assertEqual(r["resumed"], r["went_on"])
            self.assertEqual(r["scale"][0], r["scale"][1])
            self.assertEqual(r["skipped"], 1)

    def test_tensor_parallel_pairs(self) -> None:
        for rank, o in enumerate(self.out):
            run = o["mpu"]
            self.assertEqual((run["ranks"], run["nranks"]), ([rank % 2, rank % 2 + 2], 2))
            self.assertEqual(set(run["summary"]), {"qwz", "qgz"}, run["summary"])
            self.assertTrue(_close(run["losses"], run["ref"], GAP_INT4), (run["losses"], run["ref"]))
            self.assertNotEqual(run["losses"], run["ref"])

    def test_an_engine_zpccl_does_not_serve_stays_deepspeeds(self) -> None:
        for o in self.out:
            two, alone = o["two"], o["two_alone"]
            self.assertEqual(two["other"], alone["other"])
            self.assertEqual(two["served"], alone["served"]["losses"])
            mine = {k: v for k, v in two["summary"].items() if not k.startswith("deepspeed_")}
            self.assertEqual(mine, alone["served"]["summary"])
            # The other engine's calls reached zpccl's functions, and were handed to DeepSpeed's.
            for path in ("deepspeed_all_gather_unserved", "deepspeed_reduce_scatter_unserved"):
                self.assertGreater(two["summary"].get(path, {}).get("calls", 0), 0, two["summary"])


class DeepSpeedUserFeatures(_OneSpawn):
    """Two ranks on one node, hpZ groups of two: checkpoint files, GatheredParameters with a modifier, zero.Init with
    weights loaded as from_pretrained does, tied weights, activation checkpointing and frozen layers (one spawn)."""

    ranks, local, target, timeout = 2, 2, staticmethod(_user_features), 300

    def assertBitsEqual(self, key: str, count: int) -> None:
        """Every weight compared under ``key`` (on any rank) equal bit for bit, ``count`` compared in all."""
        compared = sum(o["bits"][key]["count"] for o in self.out)
        self.assertEqual(compared, count, key)
        for o in self.out:
            self.assertEqual([names for names in o["bits"][key]["same"] if names], [], key)

    def test_checkpoint_files_hold_the_trained_weights(self) -> None:
        self.assertBitsEqual("16bit", 7)  # rank 0 reads the files
        self.assertBitsEqual("fp32", 7)
        for o in self.out:
            self.assertEqual(set(o["checkpoint_summary"]), {"qwz", "hpz", "qgz"}, o["checkpoint_summary"])

    def test_checkpoints_load_across_deepspeed_and_zpccl(self) -> None:
        self.assertBitsEqual("zp_to_ds", 14)
        self.assertBitsEqual("ds_to_zp", 14)

    def test_gathered_parameters_with_a_modifier_rank(self) -> None:
        self.assertBitsEqual("modified", 4)
        for o in self.out:
            self.assertTrue(o["modified_forward"], o["modified_calls"])
            self.assertEqual(o["modified_calls"], (1, 0))  # the layer's weight and bias, one hpZ gather

    def test_zero_init_with_weights_loaded_as_from_pretrained(self) -> None:
        self.assertBitsEqual("pretrained", 14)
        for o in self.out:
            losses = o["pretrained_losses"]
            self.assertEqual(losses[True][0], losses[False][0])
            self.assertTrue(_close(losses[True], losses[False], GAP_INT4), losses)

    def test_tied_weights_checkpointed_blocks_and_frozen_layers(self) -> None:
        for r, o in enumerate(self.out):
            for hpz in (1, 2):
                for reentrant in (True, False):
                    zp, ds = o[f"features{hpz}{reentrant:d}"][True], o[f"features{hpz}{reentrant:d}"][False]
                    with self.subTest(rank=r, hpz=hpz, reentrant=reentrant):
                        s = zp["summary"]
                        self.assertEqual(set(s), {"qwz", "qgz"} | ({"hpz"} if hpz > 1 else set()), s)
                        self.assertEqual(zp["checked"], {"qwz": s["qwz"]["calls"], "qgz": s["qgz"]["calls"]})
                        self.assertTrue(zp["frozen"] and ds["frozen"])
                        self.assertEqual(zp["losses"][0] == ds["losses"][0], hpz > 1, (zp["losses"], ds["losses"]))
                        self.assertTrue(_close(zp["losses"], ds["losses"], GAP_INT4), (zp["losses"], ds["losses"]))
                        # The recomputation gathers what the forward gathered: either way, the same steps.
                        other = o[f"features{hpz}{not reentrant:d}"][True]
                        self.assertEqual(zp["losses"], other["losses"])


class DeepSpeedEngines(_OneSpawn):
    """Two ranks on one node: an engine without an optimizer, engines destroyed and made again (one spawn)."""

    ranks, local, target, scratch, timeout = 2, 2, staticmethod(_engines), False, 200

    def test_engine_without_an_optimizer_serves_its_gathers(self) -> None:
        for o in self.out:
            self.assertEqual(o["inference_refused"], "")
            run = o["inference"]
            self.assertEqual(set(run["summary"]), {"qwz"}, run["summary"])
            self.assertEqual(run["checked"], {"qwz": run["summary"]["qwz"]["calls"], "qgz": 0})
            self.assertFalse(run["reduce"])  # no communicator for reductions that never come
            self.assertEqual(run["losses"][0], run["losses"][1])
            self.assertTrue(all(np.isfinite(run["losses"])))

    def test_destroy_gives_deepspeed_its_functions_back(self) -> None:
        for o in self.out:
            d = o["destroyed"]
            self.assertEqual(d["restored"], [True, True, True])
            self.assertTrue(d["unserved"] and d["fetches"], d)
            runs = o["after_destroy"]
            self.assertEqual([r["refused"] for r in runs], ["", ""])
            # The engine made after a destroyed one and the one made after it: the same calls, the same bits.
            self.assertEqual(set(runs[0]["summary"]), {"qwz", "hpz", "qgz"}, runs[0]["summary"])
            self.assertEqual(runs[0]["summary"], runs[1]["summary"])
            self.assertEqual(runs[0]["losses"], runs[1]["losses"])


class DeepSpeedExample(unittest.TestCase):
    """tools/python/examples/deepspeed_train.py runs on DeepSpeed's CPU accelerator, every path served."""

    def test_example_on_the_cpu(self) -> None:
        deepspeed_or_skip()
        script = SOURCE_TREE / "tools" / "python" / "examples" / "deepspeed_train.py"
        env = dict(os.environ, OMP_NUM_THREADS="1")
        env.pop("RANK", None)
        done = subprocess.run([sys.executable, str(script), "--cpu", "--nproc", "2", "--hpz", "2", "--layers", "1",
                               "--d-model", "192", "--heads", "4", "--seq", "32", "--batch", "2", "--steps", "3",
                               "--log-every", "1"], capture_output=True, text=True, timeout=300, env=env)
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        self.assertRegex(done.stdout, r"zpccl qwZ int8 / qgZ int4: 2 ranks \(CPU\), hpZ groups of 2")
        self.assertRegex(done.stdout, r"validation loss \d")
        for path in ("qwz", "hpz", "qgz"):
            self.assertRegex(done.stdout, rf"\n  {path}: [1-9]\d* calls")


class DeepSpeedThreeNodes(_OneSpawn):
    """Six ranks as three nodes of two: two-hop qgZ, hpZ inside each node, every type (one spawn)."""

    ranks, local, target, scratch = 6, 2, staticmethod(_three_nodes), False

    def test_fp32_training_bit_exact_and_deterministic(self) -> None:
        for o in self.out:
            first, second = o["runs"]
            self.assertEqual(first["layout"], (3, 2, 2))
            self.assertEqual(first["losses"], second["losses"])
            self.assertTrue(_close(first["losses"], o["ref"], GAP_INT4), (first["losses"], o["ref"]))
            s = first["summary"]
            self.assertEqual(set(s), {"qwz", "hpz", "qgz"})
            self.assertEqual(first["checked"], {"qwz": s["qwz"]["calls"], "qgz": s["qgz"]["calls"]})

    def test_an_engine_built_with_deepspeeds_qgz(self) -> None:
        for o in self.out:
            run = o["deepspeed_qgz"]
            self.assertTrue(_close(run["losses"], o["ref"], GAP_INT4), (run["losses"], o["ref"]))
            self.assertEqual(set(run["summary"]), {"qwz", "hpz", "qgz"})
            self.assertEqual(run["entered"], run["summary"]["qgz"]["calls"])  # all through all_to_all_quant_reduce
            self.assertEqual(run["checked"], {"qwz": run["summary"]["qwz"]["calls"],
                                              "qgz": run["summary"]["qgz"]["calls"]})

    def test_every_parameter_gather_served_or_counted(self) -> None:
        # The first forward after initialize gathers from the secondary partitions DeepSpeed made when it
        # partitioned the model (hpZ, exact); later forwards gather the primary partitions (qwZ) until a forward
        # makes the secondary partitions again, which the backward and the eval forwards after the first use.
        served = {"forward0": "hpz", "backward0": "hpz", "forward1": "qwz", "backward1": "hpz", "eval0": "qwz",
                  "eval1": "hpz"}
        for r, o in enumerate(self.out):
            ds, zp = o["paths"]["deepspeed"], o["paths"]["zpccl"]
            self.assertEqual(list(zp["phases"]), list(ds["phases"]))
            for phase, d in ds["phases"].items():
                z = zp["phases"][phase]
                with self.subTest(rank=r, phase=phase):
                    ds_gathers = sum(v for k, v in d.items() if k.startswith("ds.all_gather"))
                    zp_gathers = sum(v for k, v in z.items() if k.startswith("ds.all_gather"))
                    fetch_all_reduce = 0 if phase.startswith("step") else d.get("ds.all_reduce", 0)
                    # DeepSpeed's fetches, each served: its all-reduce fetches as qwZ gathers.
                    self.assertEqual(z.get("qwz", 0), d.get("gather_dp", 0) + fetch_all_reduce, (d, z))
                    self.assertEqual(z.get("hpz", 0), d.get("gather_hpz", 0), (d, z))
                    self.assertEqual(z.get("qgz", 0), d.get("reduce", 0), (d, z))
                    # DeepSpeed's exact gathers outside the fetches (one parameter a gather): after each step the
                    # persistent parameters', which zpccl makes one call; the rest stay DeepSpeed's, the same
                    # ones, each counted. The gradient norm's all-reduce in the step stays DeepSpeed's.
                    exact = ds_gathers - d.get("gather_dp", 0) - d.get("gather_hpz", 0)
                    if phase.startswith("step"):
                        self.assertEqual(exact, ds["persistent"], (d, z))
                        self.assertEqual(z.get("persistent_gather"), 1, z)
                        exact -= ds["persistent"]
                    self.assertEqual(zp_gathers, exact, (d, z))
                    self.assertEqual(z.get("ds.all_reduce", 0), d.get("ds.all_reduce", 0) - fetch_all_reduce)
                    self.assertFalse({k for k in z if k.startswith("ds.reduce") or k.startswith("ds.all_to_all")})
                    if phase in served:
                        self.assertGreater(z.get(served[phase], 0), 0, z)
                        self.assertNotIn({"hpz": "qwz", "qwz": "hpz"}[served[phase]], z)
                    self.assertEqual(z.get("deepspeed_all_gather_external", 0), zp_gathers if phase == "forward0"
                                     else 0, z)
                    self.assertFalse({k for k in z if k.startswith("deepspeed_")}
                                     - {"deepspeed_all_gather_external"}, z)
            self.assertEqual(ds["persistent"], 2)
            self.assertEqual(zp["persistent"], 2)
            self.assertEqual(ds["phases"]["forward0"].get("gather_dp", 0), 0)
            self.assertGreater(ds["phases"]["forward1"]["ds.all_reduce"], 0)  # the setting at work in DeepSpeed's
            # The first step's weights are exact in both (hpZ from the secondary partitions made of the model's
            # own), so its loss is DeepSpeed's bit for bit; the next forward's are qwZ.
            self.assertEqual(zp["losses"][0], ds["losses"][0])
            self.assertNotEqual(zp["losses"][1], ds["losses"][1])
            self.assertTrue(_close(zp["losses"], ds["losses"], GAP_INT4), (zp["losses"], ds["losses"]))
            self.assertEqual(o["paths"]["all_reduce_fetch"], [False])
            self.assertEqual(o["paths"]["all_reduce_fetch_after"], [True])
            said = " | ".join(zp["said"])
            for words in ("stage3_use_all_reduce_for_fetch_params: the parameter fetches it all-reduces are qwZ",
                          "2 persistent parameters (6 elements", "a parameter used outside its module's forward"):
                self.assertIn(words, said)
            self.assertEqual(len(zp["said"]), len(set(zp["said"])))  # each said once

    def test_hpz_groups_across_the_launchers_nodes_are_refused(self) -> None:
        for o in self.out:
            self.assertRegex(o["hpz3"], r"zpccl.deepspeed.initialize: zero_hpz_partition_size=3 makes DeepSpeed gather "
                                        r".* over ranks \[0, 1, 2\], which are on nodes \[0, 1\]: .*Use a "
                                        r"zero_hpz_partition_size that divides the ranks per node")
            self.assertTrue(o["hpz3_after"])
        self.assertEqual(len({o["hpz3"] for o in self.out}), 1)

    def test_replaced_functions_in_every_type(self) -> None:
        for o in self.out:
            d = o["direct"]
            self.assertEqual(d["shapes"], [[True] * 5] * 3)  # DeepSpeed's shapes: a rank may get none of a tensor
            self.assertLess(max(d["close"]), 0.5)  # int4 blocks of 64 of normal values: a fraction of one
            self.assertEqual(d["fp16_gathered"], [True, True])
            self.assertEqual(d["checked"], {"qwz": 1, "qgz": 3})
            other = d["other_group"]
            self.assertTrue(other["gathered"])
            self.assertEqual(other["summary"]["deepspeed_all_gather_group"]["calls"], 2)
            self.assertEqual(other["summary"]["deepspeed_reduce_scatter_group"]["calls"], 2)
            group = list(range(d["rank_world"][0] % 2, 6, 2))
            self.assertEqual(other["said"], [
                f"zpccl.deepspeed: an all-gather over group {group}, which zpccl has no communicator for; it stays "
                "on DeepSpeed's own collective",
                f"zpccl.deepspeed: a reduce-scatter over group {group}, which zpccl has no communicator for; it "
                "stays on DeepSpeed's own collective"])
        for rank, o in enumerate(self.out):  # the mean over ranks 0, 2, 4 or 1, 3, 5 of arange(6) * rank
            mean = sum(range(rank % 2, 6, 2)) / 3
            want = [mean * (2 * (rank // 2) + i) for i in range(2)]
            self.assertTrue(np.allclose(o["direct"]["other_group"]["reduced"], want, rtol=1e-6), (rank, want))


if __name__ == "__main__":
    unittest.main()
