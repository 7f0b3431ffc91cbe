"""zpccl.ddp on CPU processes started by zpccl.launch (gloo, zpccl's host backend through Comm.from_torch_group):

* DDP with zpccl's comm hook, on one node of 2 ranks (one hop, int8) and on 2 nodes of 2 (two hops, int4), with
  buckets small enough that DDP makes several once it rebuilds them after the first iteration: the second step's
  gradients equal, bit for bit, the NumPy model of the all-reduce (tests/_reference.py) over every rank's local
  gradients laid out as zpccl.ddp stages each bucket (blocks restarting at each parameter); every rank's gradients
  bit-identical; within the header's error bound of the exact average; after the training steps every replica's
  parameters bit-identical, and the losses near those of DDP's own all-reduce, not equal to them;
* DDP's options and model kinds (gradient_as_bucket_view, static_graph, find_unused_parameters with a layer never
  used, no_sync accumulation, a float16 and a bfloat16 model, a model of float32 and float16 layers) over a group of
  3 ranks and a group of 1 rank, neither the default group: the gradients equal the NumPy model bucket by bucket,
  bit for bit, on every rank; the replicas bit-identical; one staging buffer, reserved at set-up, for every call;
* torch.compile'd DDP, through DDP's C++ reducer and through its Python reducer with compiled autograd (which hands
  the hook (grad, param) tuples): the gradients equal eager DDP's with the hook bit for bit, channels_last
  convolutions' too; QuantAllReduce called directly on tensors of any shape;
* refusals, each naming what to change (pickling or copying the hooked model among them);
* HSDP's recipe (FSDP2 on the 1-D shard mesh, zpccl.ddp.enable_replicate over the replicate group; with zpccl.fsdp
  inside the node as well) against native HSDP on a 2x2 mesh: the replicas' shards bit-identical, the losses near
  native HSDP's; a replicate group that shares ranks with the shard group refused.
Skipped without torch's gloo."""
from __future__ import annotations

import hashlib
import os
import unittest
from typing import Any

import numpy as np

import zpccl
import zpccl.launch

from . import _reference as ref
from ._procs import torch_for_procs
from .test_fsdp import batches, build_model

STEPS = 4
BLOCK = 32
BUCKET_MB = 0.02  # several buckets of the small model once DDP rebuilds them after the first iteration
# The steps (from 0) whose gradients are checked bit for bit: DDP's first iteration puts every parameter in one bucket,
# larger than zpccl's staging, so reduced in pieces; the second has the rebuilt buckets, one call each.
CHECKED_STEPS = (0, 1)
LR = 1e-2


def _setup(gpu: bool = False) -> Any:
    """torch.distributed on gloo (CPU), or on NCCL with every rank on GPU 0 as a node of its own (regime net: its
    NCCL_HOSTID, over sockets) and deterministic kernels, so that a backward run twice gives the same gradients."""
    if gpu:
        os.environ.update(zpccl.launch.regime_env("net", int(os.environ["RANK"])), CUBLAS_WORKSPACE_CONFIG=":4096:8")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if gpu:
        torch.use_deterministic_algorithms(True)
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    else:
        dist.init_process_group("gloo")
    return torch


def _loss(torch: Any, model: Any, ids: Any) -> Any:
    logits = model(ids).float()
    return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())


def _digest(tensors: list[Any]) -> str:
    import torch

    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _ddp_rank(bits: int, gpu: bool = False) -> dict[str, Any]:
    """One rank: the training with zpccl's hook, where each of CHECKED_STEPS also gives every rank's local gradients
    (no_sync) and zpccl's all-reduced ones with the buckets they came in; then the training with DDP's own
    all-reduce. With ``gpu``: on GPU 0 over NCCL (zpccl's cuda backend)."""
    torch = _setup(gpu)
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import zpccl.ddp

    rank = dist.get_rank()
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    data = [ids.to(device) for ids in batches(torch, rank, STEPS)]

    def wrap(module: Any) -> Any:
        return DDP(module.to(device), bucket_cap_mb=BUCKET_MB, device_ids=[0] if gpu else None)

    model = wrap(build_model(torch))
    params = list(model.parameters())
    index = {id(p): i for i, p in enumerate(params)}
    state = zpccl.ddp.make_state(model, grad_bits=bits, block_size=BLOCK)
    buckets: list[list[int]] = []

    def recording(st: Any, bucket):  # type: ignore[no-untyped-def]
        buckets.append([index[id(p)] for p in bucket.parameters()])
        return zpccl.ddp.comm_hook(st, bucket)

    model.register_comm_hook(state, recording)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses, checked = [], []
    for step, ids in enumerate(data):
        if step in CHECKED_STEPS:  # the local gradients first
            with model.no_sync():
                _loss(torch, model, ids).backward()
            local = [p.grad.cpu().numpy().copy() for p in params]
            model.zero_grad(set_to_none=True)
            calls_before = len(buckets)
        loss = _loss(torch, model, ids)
        loss.backward()
        if step in CHECKED_STEPS:
            everyone: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(everyone, local)
            checked.append(dict(local=everyone, reduced=[p.grad.cpu().numpy().copy() for p in params],
                                buckets=buckets[calls_before:]))
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    summary, grown = state.summary(), state.staging_grown
    state.close()

    exact_model = wrap(build_model(torch))
    exact_opt = torch.optim.AdamW(exact_model.parameters(), lr=LR)
    exact_losses = []
    for ids in data:
        loss = _loss(torch, exact_model, ids)
        loss.backward()
        exact_opt.step()
        exact_opt.zero_grad()
        exact_losses.append(loss.item())
    return dict(checked=checked, calls=len(buckets), losses=losses, exact_losses=exact_losses,
                digest=_digest(params), summary=summary, grown=grown, staging=state.staging_bytes)


# DDP's options and model kinds that zpccl.ddp must serve as it serves the plain case (_variant_rank).
VARIANTS = ("plain", "gradient_as_bucket_view", "static_graph", "find_unused_parameters", "no_sync", "float16",
            "bfloat16", "mixed_dtypes")
VARIANT_STEPS = 3
VARIANT_BUCKET_MB = 0.008  # several buckets of _variant_model once DDP rebuilds them


def _variant_model(torch: Any, variant: str) -> Any:
    """Three layers whose parameters are no multiple of BLOCK; the middle one in float16 for "mixed_dtypes" (DDP
    gives it buckets of its own), every one in the variant's dtype for "float16"/"bfloat16", and a layer the
    forward never uses for "find_unused_parameters"."""
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.c = nn.Linear(37, 53), nn.Linear(53, 70), nn.Linear(70, 11)
            if variant == "find_unused_parameters":
                self.unused = nn.Linear(5, 3)

        def forward(self, x: Any) -> Any:
            h = torch.tanh(self.a(x))
            h = torch.tanh(self.b(h.to(self.b.weight.dtype)))
            return self.c(h.to(self.c.weight.dtype))

    torch.manual_seed(0)
    model = Net()
    if variant in ("float16", "bfloat16"):
        model = model.to(getattr(torch, variant))
    if variant == "mixed_dtypes":
        model.b.to(torch.float16)
    return model


def _as_numpy(t: Any) -> np.ndarray:
    """A gradient as the NumPy model takes it (bfloat16 as uint16 bits)."""
    import torch

    t = t.detach().contiguous()
    return t.view(torch.int16).numpy().view(np.uint16).copy() if t.dtype == torch.bfloat16 else t.numpy().copy()


def _variant_rank() -> dict[str, Any]:
    """One rank of 4: DDP over a group that is not the default one, ranks 0-2 (three ranks: Avg divides by an odd
    count) and rank 3 alone (world size 1), in every variant of VARIANTS. Each step records every rank's local
    gradients (a copy of the module run on the same batches: DDP's bucket contents, "no_sync" accumulating two
    batches), the gradients after zpccl's hook and the buckets it was handed."""
    torch = _setup()
    import copy

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import zpccl.ddp

    rank = dist.get_rank()
    groups = [dist.new_group([0, 1, 2]), dist.new_group([3])]
    group = groups[0] if rank < 3 else groups[1]
    out: dict[str, Any] = {}
    for variant in VARIANTS:
        options = {variant: True} if variant in ("gradient_as_bucket_view", "static_graph",
                                                  "find_unused_parameters") else {}
        model = DDP(_variant_model(torch, variant), process_group=group, bucket_cap_mb=VARIANT_BUCKET_MB, **options)
        params = list(model.parameters())
        index = {id(p): i for i, p in enumerate(params)}
        state = zpccl.ddp.make_state(model, grad_bits=8, block_size=BLOCK)
        buckets: list[list[int]] = []

        def recording(st: Any, bucket):  # type: ignore[no-untyped-def]
            buckets.append([index[id(p)] for p in bucket.parameters()])
            return zpccl.ddp.comm_hook(st, bucket)

        model.register_comm_hook(state, recording)
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        g = torch.Generator().manual_seed(500 + rank)
        steps, staging = [], set()
        for _step in range(VARIANT_STEPS):
            xs = [torch.randn(6, 37, generator=g).to(params[0].dtype) for _ in range(2 if variant == "no_sync" else 1)]
            twin = copy.deepcopy(model.module)
            for x in xs:
                twin(x).float().pow(2).mean().backward()
            for x in xs[:-1]:
                with model.no_sync():
                    model(x).float().pow(2).mean().backward()
            before = len(buckets)
            model(xs[-1]).float().pow(2).mean().backward()
            steps.append(dict(local=[None if p.grad is None else _as_numpy(p.grad) for p in twin.parameters()],
                              reduced=[None if p.grad is None else _as_numpy(p.grad) for p in params],
                              buckets=buckets[before:]))
            opt.step()
            opt.zero_grad(set_to_none=True)
            staging.add(state.stage.buffer.data_ptr())
        out[variant] = dict(steps=steps, digest=_digest(params), grown=state.staging_grown, staging=len(staging),
                            dtypes=[str(p.dtype).replace("torch.", "") for p in params],
                            sizes=[p.numel() for p in params])
        state.close()
    return out


def _refusals(_: int) -> list[tuple[str, str, str]]:
    """Each refusal's exception type, message and zpccl code, in order."""
    torch = _setup()
    from torch.nn.parallel import DistributedDataParallel as DDP

    import zpccl.ddp

    seen = []

    def refused(fn: Any) -> None:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - recorded for the parent to check
            seen.append((type(exc).__name__, str(exc), getattr(exc, "code", None)))
        else:
            seen.append(("", "not refused", None))

    model = DDP(build_model(torch), bucket_cap_mb=BUCKET_MB)
    refused(lambda: zpccl.ddp.enable(model.module))
    refused(lambda: zpccl.ddp.enable(model, weight_bits=8))
    refused(lambda: zpccl.ddp.enable(model, error_feedback=True))
    refused(lambda: zpccl.ddp.enable(model, grad_bits=6))
    refused(lambda: zpccl.ddp.enable(model, grad_bits=None))
    refused(lambda: zpccl.ddp.enable(model, grad_bitz=8))
    refused(lambda: zpccl.ddp.enable(model, zpccl.ZeroPlusPlusPolicy(), grad_bits=8))
    refused(lambda: zpccl.ddp.enable(DDP(build_model(torch, dtype=torch.float64))))
    sparse = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.EmbeddingBag(64, 8, sparse=True))
    refused(lambda: zpccl.ddp.enable(DDP(sparse)))
    state = zpccl.ddp.enable(model, grad_bits=8, block_size=BLOCK)
    refused(lambda: zpccl.ddp.enable(model))
    refused(lambda: zpccl.ddp.comm_hook(state, _SparseBucket(torch)))
    state.close()
    refused(lambda: _loss(torch, model, batches(torch, 0, 1)[0]).backward())
    return seen


def _layouts() -> dict[str, int]:
    """Each state's node count with ranks_per_node=2 over 4 ranks (nodes {0, 1} and {2, 3} of the world): a DDP
    subgroup of ranks 0-2, and HSDP's replicate groups {0, 2} and {1, 3}, one rank of each node."""
    torch = _setup()
    import torch.distributed as dist

    import zpccl.ddp

    rank, out = dist.get_rank(), {}
    subgroups = [dist.new_group([0, 1, 2]), dist.new_group([3])]
    if rank < 3:
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4), process_group=subgroups[0])
        with zpccl.ddp.make_state(model, grad_bits=8, ranks_per_node=2) as state:
            out["subgroup"] = state.comm.node_count
    replicate = [dist.new_group([0, 2]), dist.new_group([1, 3])][rank % 2]
    policy = zpccl.ZeroPlusPlusPolicy(weight_bits=None, grad_bits=8, hpz=False, ranks_per_node=2)
    with zpccl.ddp.QuantAllReduce(replicate, policy, device=torch.device("cpu"), dtypes=[torch.float32],
                                  staging_bytes=0, call="test") as state:
        out["replicate"] = state.comm.node_count
    return out


def _compiled_rank(mode: str) -> dict[str, Any]:
    """One rank's gradients, step by step, of _variant_model trained under DDP with zpccl's hook: "eager",
    "compiled" (torch.compile, aot_eager: DDP's C++ reducer hands the hook its buckets) or "python_reducer"
    (optimize_ddp="python_reducer" and compiled autograd: DDP's Python reducer hands the hook each parameter's
    gradient as a (grad, param) tuple, as torchtitan's compiled DDP runs)."""
    torch = _setup()
    import torch._dynamo
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import zpccl.ddp

    torch._dynamo.reset()
    torch._dynamo.config.optimize_ddp = "python_reducer" if mode == "python_reducer" else "ddp_optimizer"
    torch._dynamo.config.compiled_autograd = mode == "python_reducer"
    model = DDP(_variant_model(torch, "plain"))
    state = zpccl.ddp.enable(model, grad_bits=8, block_size=BLOCK)
    run = model if mode == "eager" else torch.compile(model, backend="aot_eager")
    g = torch.Generator().manual_seed(700 + dist.get_rank())
    grads = []
    for _step in range(3):
        run(torch.randn(6, 37, generator=g)).pow(2).mean().backward()
        grads.append([p.grad.numpy().copy() for p in model.parameters()])
        model.zero_grad(set_to_none=True)
    out = dict(grads=grads, calls=state.summary()["quant_all_reduce"]["calls"])
    state.close()
    return out


def _channels_last_rank(reducer: str) -> list[Any]:
    """One rank's gradients (in logical order), step by step, of convolutions in channels_last under eager DDP with
    zpccl's hook, through DDP's "cpp" reducer (buckets hold each gradient in its memory order) or its "python" one
    (each gradient handed over in its parameter's strides)."""
    torch = _setup()
    import torch._dynamo
    from torch.nn.parallel import DistributedDataParallel as DDP

    import zpccl.ddp

    torch._dynamo.config.optimize_ddp = "python_reducer" if reducer == "python" else "ddp_optimizer"
    torch.manual_seed(0)
    nn = torch.nn
    model = DDP(nn.Sequential(nn.Conv2d(3, 8, 3), nn.Tanh(), nn.Conv2d(8, 5, 3)).to(memory_format=torch.channels_last))
    state = zpccl.ddp.enable(model, grad_bits=8, block_size=BLOCK)
    g = torch.Generator().manual_seed(800 + torch.distributed.get_rank())
    grads = []
    for _step in range(2):
        x = torch.randn(2, 3, 9, 9, generator=g).to(memory_format=torch.channels_last)
        model(x).pow(2).mean().backward()
        assert not model.module[0].weight.grad.is_contiguous(), "the test means gradients in channels_last"
        grads.append([p.grad.contiguous().numpy().copy() for p in model.parameters()])
        model.zero_grad(set_to_none=True)
    state.close()
    return grads


def _join_rank(_: int) -> dict[str, Any]:
    """Uneven inputs under DDP's join(): rank r trains 2 + r batches; a rank that has joined shadows the others'
    backward passes, handing the hook buckets of zeros. Its parameters' digest and the hook's calls."""
    torch = _setup()
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import zpccl.ddp

    rank = dist.get_rank()
    model = DDP(_variant_model(torch, "plain"), bucket_cap_mb=VARIANT_BUCKET_MB)
    state = zpccl.ddp.enable(model, grad_bits=8, block_size=BLOCK)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    g = torch.Generator().manual_seed(900 + rank)
    with model.join():
        for _step in range(2 + rank):
            model(torch.randn(6, 37, generator=g)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    out = dict(digest=_digest(list(model.parameters())), calls=state.summary()["quant_all_reduce"]["calls"])
    state.close()
    return out


def _ignored_params_rank(_: int) -> dict[str, Any]:
    """A model whose sparse embedding table and float64 parameter DDP ignores
    (``_set_params_and_buffers_to_ignore_for_model``, as models that reduce such tables themselves do), the rest
    served by zpccl: whether enable refused it, its staging bytes, the dense layer's gradients after a backward, the
    hook's calls."""
    torch = _setup()
    from torch.nn.parallel import DistributedDataParallel as DDP

    import zpccl.ddp

    nn = torch.nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = nn.EmbeddingBag(5000, 64, sparse=True)
            self.fc, self.gate = nn.Linear(64, 9), nn.Module()
            self.gate.temperature = nn.Parameter(torch.ones((), dtype=torch.float64))

        def forward(self, ids: Any) -> Any:
            return self.fc(self.table(ids)) * self.gate.temperature.float()

    torch.manual_seed(0)
    net = Net()
    DDP._set_params_and_buffers_to_ignore_for_model(net, ["table.weight", "gate.temperature"])
    model = DDP(net, bucket_cap_mb=VARIANT_BUCKET_MB)
    try:
        state = zpccl.ddp.enable(model, grad_bits=8, block_size=BLOCK)
    except Exception as exc:  # noqa: BLE001 - recorded for the parent to check
        return dict(refused=f"{type(exc).__name__}: {exc}")
    g = torch.Generator().manual_seed(60 + torch.distributed.get_rank())
    model(torch.randint(0, 5000, (4, 3), generator=g)).pow(2).mean().backward()
    out = dict(refused=None, staging=state.staging_bytes, fc=[p.grad.numpy().copy() for p in net.fc.parameters()],
               fc_bytes=sum(p.numel() * p.element_size() for p in net.fc.parameters()),
               calls=state.summary()["quant_all_reduce"]["calls"])
    state.close()
    return out


def _copy_refusals(_: int) -> list[tuple[str, str]]:
    """Pickling (torch.save) and copying a zpccl.ddp state, and the DDP model it hooks: each refusal's exception
    type and message."""
    torch = _setup()
    import copy
    import io

    from torch.nn.parallel import DistributedDataParallel as DDP

    import zpccl.ddp

    torch.manual_seed(0)  # modules of torch's own classes, which pickle
    model = DDP(torch.nn.Sequential(torch.nn.Linear(37, 53), torch.nn.Tanh(), torch.nn.Linear(53, 11)))
    state = zpccl.ddp.enable(model, grad_bits=8, block_size=BLOCK)
    seen = []
    for fn in (lambda: torch.save(state, io.BytesIO()), lambda: copy.deepcopy(model),
               lambda: torch.save(model, io.BytesIO())):
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - recorded for the parent to check
            seen.append((type(exc).__name__, str(exc)))
        else:
            seen.append(("", "not refused"))
    # The model's parameters still save, and the state still serves it.
    torch.save(model.module.state_dict(), io.BytesIO())
    model(torch.randn(2, 37)).pow(2).mean().backward()
    seen.append(("calls", str(state.summary()["quant_all_reduce"]["calls"])))
    state.close()
    return seen


def _direct_calls(_: int) -> list[Any]:
    """QuantAllReduce called directly over 2 ranks (as an FSDP all-reduce hook, or by hand): a 2-D tensor and the
    same values as a 1-D one, a 0-d tensor, and a tensor that is not contiguous (each rank's values rank + 1 and
    more); what each gives, or its refusal."""
    torch = _setup()
    import zpccl.ddp

    rank = torch.distributed.get_rank()
    policy = zpccl.ZeroPlusPlusPolicy(weight_bits=None, grad_bits=8, hpz=False, block_size=BLOCK)
    values = (torch.arange(75, dtype=torch.float32) * 0.37 + rank).sin() * (rank + 1)
    out: list[Any] = []
    with zpccl.ddp.QuantAllReduce(None, policy, device=torch.device("cpu"), dtypes=[torch.float32],
                                  staging_bytes=4096, call="test") as state:
        flat = values.clone()
        state.all_reduce(flat, [40, 35])
        square = values.clone().view(5, 15)
        state.all_reduce(square, [40, 35])
        out.append((flat.numpy(), square.numpy()))
        out.append(state.all_reduce(torch.tensor(rank + 1.0)).item())
        try:
            state.all_reduce(values.clone().view(5, 15).t())
        except Exception as exc:  # noqa: BLE001 - recorded for the parent to check
            out.append((type(exc).__name__, str(exc)))
        else:
            out.append(("", "not refused"))
    return out


def _unstaged_pieces(_: int) -> dict[str, Any]:
    """QuantAllReduce with blocks from the tensor's start (param_blocks=False) over 2 ranks: a tensor of 1000
    elements reduced with calls of at most 4 blocks of fp32 (staging_bytes 512), and with one call; the counts of
    the calls each made, and both results."""
    torch = _setup()
    import zpccl.ddp

    rank = torch.distributed.get_rank()
    policy = zpccl.ZeroPlusPlusPolicy(weight_bits=None, grad_bits=8, hpz=False, block_size=BLOCK, param_blocks=False)
    values = (torch.arange(1000, dtype=torch.float32) * 0.37 + rank).sin() * (rank + 1)
    out: dict[str, Any] = {}
    for name, staging in (("pieces", 4 * BLOCK * 4), ("whole", 1024 * 4)):
        with zpccl.ddp.QuantAllReduce(None, policy, device=torch.device("cpu"), dtypes=[torch.float32],
                                      staging_bytes=staging, call="test") as state:
            calls: list[int] = []
            reduce = state.comm.quant_all_reduce

            def counted(send: Any, *args: Any, reduce: Any = reduce, calls: list[int] = calls, **kwargs: Any) -> Any:
                calls.append(send.numel())
                return reduce(send, *args, **kwargs)

            state.comm.quant_all_reduce = counted
            got = values.clone()  # each rank's own: a part no call reduced would differ between the ranks
            state.all_reduce(got, [600, 400])
            out[name] = (calls, got.numpy())
    return out


class _SparseBucket:
    """A DDP bucket as DDP hands one of a parameter with sparse gradients: its buffer is the sparse gradient."""

    def __init__(self, torch: Any) -> None:
        self.grad = torch.sparse_coo_tensor(torch.tensor([[1, 5]]), torch.ones(2, 8), (64, 8))

    def buffer(self) -> Any:
        return self.grad

    def parameters(self) -> list[Any]:
        return [self.grad]


def _hsdp_rank(mode: str) -> dict[str, Any]:
    """One rank of a 2x2 mesh (replicate, shard): "native" HSDP on the 2-D mesh, or FSDP2 on the shard mesh with
    zpccl.ddp.enable_replicate over the replicate group ("replicate"), and zpccl.fsdp inside the node as well
    ("replicate+fsdp"); "+accumulate" appended: two micro-batches a step, the first with
    set_requires_all_reduce(False), as HSDP accumulates gradients."""
    accumulate = mode.endswith("+accumulate")
    mode = mode.removesuffix("+accumulate")
    torch = _setup()
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import zpccl.ddp
    import zpccl.fsdp

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    model = build_model(torch)
    target = mesh if mode == "native" else mesh["shard"]
    for block in model.blocks:
        fully_shard(block, mesh=target)
    fully_shard(model, mesh=target)
    zp = None if mode == "native" else zpccl.ddp.enable_replicate(model, mesh["replicate"].get_group(),
                                                                  grad_bits=8, block_size=BLOCK)
    fsdp = zpccl.fsdp.enable(model, block_size=BLOCK, grad_bits=8) if mode == "replicate+fsdp" else None
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    data = batches(torch, dist.get_rank(), 2 * STEPS if accumulate else STEPS)
    for step in range(STEPS):
        # Accumulating: two micro-batches a step, the first without the replicate all-reduce.
        micro = data[2 * step:2 * step + 2] if accumulate else [data[step]]
        for k, ids in enumerate(micro):
            model.set_requires_all_reduce(k == len(micro) - 1)
            loss = _loss(torch, model, ids)
            loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    shards = [p.to_local() for p in model.parameters()]
    out: dict[str, Any] = dict(losses=losses, digest=_digest(shards))
    if zp is not None:
        out["summary"] = zp.summary()
        zp.close()
    if fsdp is not None:
        out["fsdp"] = {k: v["calls"] for k, v in fsdp.summary().items()}
        fsdp.disable()
    return out


def _replicate_refusals(_: int) -> list[tuple[str, str]]:
    """enable_replicate's refusals on a 2x2 mesh (replicate, shard), each exception's type and message in order,
    then the node count of a state made over a 1-D replicate mesh (a DeviceMesh, not its group)."""
    torch = _setup()
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import zpccl.ddp

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))

    def sharded(target: Any) -> Any:
        model = build_model(torch)
        for block in model.blocks:
            fully_shard(block, mesh=target)
        fully_shard(model, mesh=target)
        return model

    seen = []
    for model, group in ((build_model(torch), mesh["replicate"].get_group()),
                         (sharded(mesh), mesh["replicate"].get_group()),
                         (sharded(mesh["shard"]), mesh["shard"].get_group()),
                         (sharded(mesh["shard"]), dist.group.WORLD),
                         (sharded(mesh["shard"]), None)):
        try:
            zpccl.ddp.enable_replicate(model, group, grad_bits=8, block_size=BLOCK).close()
        except Exception as exc:  # noqa: BLE001 - recorded for the parent to check
            seen.append((type(exc).__name__, str(exc)))
        else:
            seen.append(("", "not refused"))
    with zpccl.ddp.enable_replicate(sharded(mesh["shard"]), mesh["replicate"], grad_bits=8) as state:
        seen.append(("nranks", str(state.nranks)))
    return seen


def _hsdp_unused_rank(_: int) -> dict[str, Any]:
    """One rank of a 2x2 mesh (replicate, shard) training, under zpccl.ddp.enable_replicate alone ("replicate") and
    with zpccl.fsdp as well ("replicate+fsdp"), one FSDP module whose middle layer the forward skips on step 1: for
    each step, the replicate hook's input and output and the padded shard sizes of the parameters that got a
    gradient, in order; whether FSDP's own parameter group is back once both are closed."""
    torch = _setup()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import zpccl.ddp
    import zpccl.fsdp

    nn = torch.nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.side, self.b = nn.Linear(37, 53), nn.Linear(53, 53), nn.Linear(53, 11)

        def forward(self, x: Any, use_side: bool) -> Any:
            h = torch.tanh(self.a(x))
            return self.b(h + self.side(h) if use_side else h)

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    out: dict[str, Any] = {}
    for mode in ("replicate", "replicate+fsdp"):
        torch.manual_seed(0)
        model = Net()
        fully_shard(model, mesh=mesh["shard"])
        state = zpccl.ddp.enable_replicate(model, mesh["replicate"], grad_bits=8, block_size=BLOCK)
        fsdp = zpccl.fsdp.enable(model, block_size=BLOCK, grad_bits=8) if mode == "replicate+fsdp" else None
        pg = model._get_fsdp_state()._fsdp_param_groups[0]
        hook, seen = pg._all_reduce_hook, []

        def recording(output: Any, hook: Any = hook, seen: list[Any] = seen) -> None:
            before = output.clone()
            hook(output)
            seen.append((before.numpy().copy(), output.numpy().copy()))

        pg._all_reduce_hook = recording
        g = torch.Generator().manual_seed(40 + torch.distributed.get_rank())
        sizes = []
        for step in range(3):
            model(torch.randn(6, 37, generator=g), step != 1).pow(2).mean().backward()
            sizes.append([p.padded_sharded_param_size.numel() for p in pg.fsdp_params
                          if p.sharded_param.grad is not None])
            model.zero_grad(set_to_none=True)
        if fsdp is not None:
            fsdp.disable()
        state.close()
        out[mode] = dict(seen=seen, sizes=sizes, restored="_take_unsharded_grads_to_reduce" not in vars(pg))
    return out


def _hsdp_experts_rank(unused_reduced: bool) -> dict[str, Any]:
    """One rank of a (2, 1) mesh (replicate, shard) accumulating two micro-batches a step as HSDP does
    (set_requires_all_reduce(False) on the first) through a module of two experts of one size, the first
    micro-batch routed to expert 0, the second to expert 1; with FSDP's set_reduce_scatter_unused_params as given.
    Each expert's gradient after the step and the exact average over the replicas of the local ones, or the step's
    refusal."""
    torch = _setup()
    import copy

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import zpccl.ddp

    nn = torch.nn

    class Experts(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp, self.experts = nn.Linear(8, 40), nn.ModuleList([nn.Linear(40, 40), nn.Linear(40, 40)])

        def forward(self, x: Any, expert: int) -> Any:
            return self.experts[expert](torch.tanh(self.inp(x)))

    mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("replicate", "shard"))
    torch.manual_seed(0)
    model = Experts()
    twin = copy.deepcopy(model)
    fully_shard(model, mesh=mesh["shard"])
    model.set_reduce_scatter_unused_params(unused_reduced)
    state = zpccl.ddp.enable_replicate(model, mesh["replicate"], grad_bits=8, block_size=BLOCK)
    g = torch.Generator().manual_seed(70 + dist.get_rank())
    xs = [torch.randn(4, 8, generator=g) for _ in range(2)]
    out: dict[str, Any] = {}
    try:
        for expert, x in enumerate(xs):
            model.set_requires_all_reduce(expert == 1)
            model(x, expert).pow(2).mean().backward()
            twin(x, expert).pow(2).mean().backward()
    except Exception as exc:  # noqa: BLE001 - recorded for the parent to check
        out["refused"] = f"{type(exc).__name__}: {exc}"
    else:
        out["got"] = [e.weight.grad.to_local().numpy().copy() for e in model.experts]
        exact = [e.weight.grad.clone() for e in twin.experts]
        for t in exact:
            dist.all_reduce(t)
        out["exact"] = [(t / 2).numpy() for t in exact]
    state.close()
    return out


def header_bound(parts: list[np.ndarray], bits: int, two_hops: bool) -> np.ndarray:
    """include/zpccl.h's bound of |out - exact average| for one parameter, with the parameter's maxima in place of
    each block's (every block of it lies inside it, blocks restarting at parameters): no smaller than the bound."""
    n, q, u = len(parts), ref.QMAX[bits], 2.0**-24
    A = sum(float(np.abs(p).max()) for p in parts)
    M = float(np.abs(sum(p.astype(np.float64) for p in parts)).max())
    E = A / (2 * q) * ((2 + 1 / (2 * q)) if two_hops else 1.0)
    return (E + (M + E) * (1 / (2 * q) + 3 * u) + (n + 1) * 2.0**-16 * A) / n


class DdpChecks(unittest.TestCase):
    """What DdpCommHook and DdpOnGpu check of a run of _ddp_rank."""

    def check_layout(self, nranks: int, bits: int, env: dict[str, str], ranks_per_node: int,
                     gpu: bool = False) -> None:
        ranks = zpccl.launch.spawn(_ddp_rank, nranks, bits, gpu, env=dict(env, OMP_NUM_THREADS="1"), timeout=600)
        nodes = [r // ranks_per_node for r in range(nranks)]
        two_hops = 1 < ranks_per_node < nranks
        first = ranks[0]
        buckets = [len(c["buckets"]) for c in first["checked"]]
        self.assertEqual(buckets[0], 1, "DDP's first iteration: one bucket of every parameter")
        self.assertGreater(buckets[1], 1, "DDP's rebuilt buckets: the test means several")
        self.assertLess(first["staging"], sum(g.nbytes for g in first["checked"][0]["reduced"]),
                        "the first bucket fits the staging buffer: the test means pieces")
        self.assertEqual(first["summary"]["quant_all_reduce"]["calls"], first["calls"])
        self.assertFalse(first["grown"], "a call allocated a larger staging buffer")
        for r, out in enumerate(ranks):
            self.assertEqual(out["digest"], first["digest"], f"rank {r}'s parameters drifted from rank 0's")
        for k, step in enumerate(CHECKED_STEPS):
            with self.subTest(step=step):
                self.check_step(ranks, k, bits, nodes, two_hops)
        for r, out in enumerate(ranks):
            self.assertNotEqual(out["losses"], out["exact_losses"])
            for step, (a, b) in enumerate(zip(out["losses"], out["exact_losses"])):
                self.assertLess(abs(a - b) / b, 0.01 if bits == 8 else 0.03, f"rank {r} step {step + 1}")

    def check_step(self, ranks: list[dict[str, Any]], k: int, bits: int, nodes: list[int], two_hops: bool) -> None:
        checked = ranks[0]["checked"][k]
        nranks, local, reduced = len(ranks), checked["local"], checked["reduced"]  # local[rank][parameter]
        self.assertEqual(sorted(i for b in checked["buckets"] for i in b), list(range(len(reduced))))
        for r, out in enumerate(ranks):
            for i, g in enumerate(out["checked"][k]["reduced"]):
                self.assertTrue(np.array_equal(g, reduced[i]), f"rank {r} parameter {i}: differs from rank 0's")
        # Bit for bit the model, bucket by bucket, over every rank's local gradients staged as zpccl.ddp stages them.
        for bucket in checked["buckets"]:
            parts = [[_staged_part(local[r][i].ravel(), BLOCK, last=(j == len(bucket) - 1))
                      for j, i in enumerate(bucket)] for r in range(nranks)]
            got = ref.quant_all_reduce([np.concatenate(p) for p in parts], ref.F32, "avg", bits, BLOCK, nodes)
            at = 0
            for j, i in enumerate(bucket):
                expected = got[at:at + local[0][i].size].reshape(local[0][i].shape)
                self.assertTrue(np.array_equal(reduced[i], expected), f"parameter {i} differs from the model")
                at += parts[0][j].size
        # Within the header's bound of the exact average.
        worst = 0.0
        for i, got in enumerate(reduced):
            mean = sum(local[r][i].astype(np.float64) for r in range(nranks)) / nranks
            bound = header_bound([local[r][i] for r in range(nranks)], bits, two_hops)
            err = float(np.abs(got - mean).max())
            self.assertLessEqual(err, bound, f"parameter {i}")
            worst = max(worst, err / bound)
        self.assertGreater(worst, 0.0, "no error at all: not quantized?")


class DdpCommHook(DdpChecks):
    @classmethod
    def setUpClass(cls) -> None:
        torch_for_procs()

    def test_one_node_int8(self) -> None:
        self.check_layout(2, 8, {}, ranks_per_node=2)

    def test_two_nodes_of_two_int4(self) -> None:
        self.check_layout(4, 4, {"LOCAL_WORLD_SIZE": "2"}, ranks_per_node=2)

    def test_ddp_options_dtypes_and_groups(self) -> None:
        """Every variant of VARIANTS, over a 3-rank group and a 1-rank group (neither the default one): the
        gradients after the hook equal, bit for bit, the NumPy model over the group's local gradients bucket by
        bucket (staged as zpccl.ddp stages them), on every rank of the group; the replicas' parameters stay
        bit-identical; the staging buffer is the one reserved at set-up for every call. A group of one rank leaves its
        gradients exact: the average over one rank is the gradient itself."""
        ranks = zpccl.launch.spawn(_variant_rank, 4, env={"OMP_NUM_THREADS": "1"}, timeout=600)
        for variant in VARIANTS:
            for members in ([0, 1, 2], [3]):
                with self.subTest(variant=variant, group=members):
                    outs = [ranks[r][variant] for r in members]
                    self.assertEqual({o["digest"] for o in outs}, {outs[0]["digest"]}, "replicas drifted")
                    for o in outs:
                        self.assertFalse(o["grown"], "a call grew the staging buffer")
                        self.assertEqual(o["staging"], 1, "the staging buffer moved between steps")
                    # DDP rebuilds its buckets after the first iteration (static_graph: the second).
                    self.assertGreater(len(outs[0]["steps"][-1]["buckets"]), 1, "the test means several buckets")
                    for k in range(VARIANT_STEPS):
                        steps = [o["steps"][k] for o in outs]
                        self.check_variant_step(steps, outs[0]["dtypes"], outs[0]["sizes"], variant, k)

    def check_variant_step(self, steps: list[dict[str, Any]], dtypes: list[str], sizes: list[int], variant: str,
                           k: int) -> None:
        buckets = steps[0]["buckets"]
        if variant == "mixed_dtypes":
            self.assertTrue(any(len({dtypes[i] for i in b}) == 1 and dtypes[b[0]] == "float16" for b in buckets))
        for st in steps[1:]:
            self.assertEqual(st["buckets"], buckets)
        reduced = steps[0]["reduced"]
        for r, st in enumerate(steps):
            for i, got in enumerate(st["reduced"]):
                same = got is None and reduced[i] is None or np.array_equal(got, reduced[i])
                self.assertTrue(same, f"step {k} rank {r} parameter {i}: differs from the group's first rank")
        if len(steps) == 1:  # a group of one rank: the gradients stay exact, nothing travels
            for i, got in enumerate(reduced):
                local = steps[0]["local"][i]
                self.assertTrue(got is None and local is None or np.array_equal(got, local),
                                f"step {k} parameter {i} ({variant}): a group of one rank changed its gradient")
            return
        for bucket in buckets:
            dtype = {"float32": ref.F32, "float16": ref.F16, "bfloat16": ref.BF16}[dtypes[bucket[0]]]
            zero = np.uint16 if dtype == ref.BF16 else np.dtype(dtype)
            # An unused parameter (no local gradient) holds zeros in DDP's bucket.
            parts = [[_staged_part(st["local"][i].ravel() if st["local"][i] is not None else np.zeros(sizes[i], zero),
                                   BLOCK, last=(j == len(bucket) - 1)) for j, i in enumerate(bucket)] for st in steps]
            got = ref.quant_all_reduce([np.concatenate(p) for p in parts], dtype, "avg", 8, BLOCK, [0] * len(steps))
            at = 0
            for j, i in enumerate(bucket):
                if reduced[i] is not None:
                    expected = got[at:at + reduced[i].size].reshape(reduced[i].shape)
                    self.assertTrue(np.array_equal(reduced[i], expected),
                                    f"step {k} parameter {i} ({variant}) differs from the model")
                at += parts[0][j].size

    def test_compiled_ddp_equals_eager_bit_for_bit(self) -> None:
        """torch.compile'd DDP with zpccl's hook, through DDP's C++ reducer (buckets) and through its Python reducer
        with compiled autograd (each parameter's (grad, param)): the gradients equal eager DDP's with the hook bit for
        bit (blocks restart at each parameter, so a gradient's bits do not depend on its bucket)."""
        env = {"OMP_NUM_THREADS": "1"}
        eager = zpccl.launch.spawn(_compiled_rank, 2, "eager", env=env, timeout=300)
        for mode in ("compiled", "python_reducer"):
            got = zpccl.launch.spawn(_compiled_rank, 2, mode, env=env, timeout=300)
            for r in range(2):
                self.assertGreater(got[r]["calls"], 0, mode)
                for k, (ours, want) in enumerate(zip(got[r]["grads"], eager[r]["grads"])):
                    for i, (a, b) in enumerate(zip(ours, want)):
                        self.assertTrue(np.array_equal(a, b), f"{mode} rank {r} step {k} parameter {i}")
                        self.assertTrue(np.array_equal(a, got[0]["grads"][k][i]), f"{mode}: ranks differ")

    def test_python_reducer_reduces_channels_last_gradients_in_memory_order(self) -> None:
        """A gradient in channels_last, handed over by DDP's Python reducer in its parameter's strides, is reduced in
        memory order as DDP's bucket holds it: the same bits as the C++ reducer's buckets."""
        env = {"OMP_NUM_THREADS": "1"}
        buckets = zpccl.launch.spawn(_channels_last_rank, 2, "cpp", env=env, timeout=300)
        python = zpccl.launch.spawn(_channels_last_rank, 2, "python", env=env, timeout=300)
        for r in range(2):
            for k, (ours, want) in enumerate(zip(python[r], buckets[r])):
                for i, (a, b) in enumerate(zip(ours, want)):
                    self.assertTrue(np.array_equal(a, b), f"rank {r} step {k} parameter {i}")

    def test_uneven_inputs_under_join_keep_replicas_bit_identical(self) -> None:
        """DDP's join() with 3 ranks training 2, 3 and 4 batches: the ranks that joined run the hook on buckets of
        zeros in step with the others (every rank the same calls), and the replicas end bit-identical."""
        got = zpccl.launch.spawn(_join_rank, 3, 0, env={"OMP_NUM_THREADS": "1"}, timeout=300)
        self.assertEqual({o["digest"] for o in got}, {got[0]["digest"]}, "replicas drifted")
        self.assertEqual({o["calls"] for o in got}, {got[0]["calls"]})
        self.assertGreater(got[0]["calls"], 4, "the last rank's 4 backward passes, several buckets once rebuilt")

    def test_pickling_refused_naming_what_to_save(self) -> None:
        got = zpccl.launch.spawn(_copy_refusals, 2, 0, env={"OMP_NUM_THREADS": "1"}, timeout=300)
        what = ("zpccl.ddp.enable: a zpccl.ddp state holds a communicator and cannot be pickled or copied: save or "
                "copy the module (model.module, or its state_dict()) instead")
        for rank, seen in enumerate(got):
            for kind, text in seen[:3]:
                self.assertEqual(kind, "ZpcclTypeError", text)
                self.assertIn(what, text, f"rank {rank}")
            self.assertEqual(seen[3], ("calls", "1"), f"rank {rank}: the state stopped serving after the refusals")

    def test_parameters_ddp_ignores_are_left_alone(self) -> None:
        """Parameters DDP ignores never reach the hook: a sparse embedding table and a float64 parameter among them
        are not refused, and the staging buffer is sized for the parameters DDP reduces, not for the table."""
        got = zpccl.launch.spawn(_ignored_params_rank, 2, 0, env={"OMP_NUM_THREADS": "1"}, timeout=300)
        for rank, out in enumerate(got):
            self.assertIsNone(out["refused"], f"rank {rank}")
            self.assertGreater(out["calls"], 0, f"rank {rank}")
            self.assertLessEqual(out["staging"], out["fc_bytes"] + 2 * BLOCK * 4, f"rank {rank}: staging")
            for a, b in zip(out["fc"], got[0]["fc"]):
                self.assertTrue(np.array_equal(a, b), f"rank {rank}: differs from rank 0")

    def test_direct_calls_take_any_shape_and_refuse_strides(self) -> None:
        """QuantAllReduce.all_reduce on a tensor of any shape reduces its elements in order (a 2-D tensor gives the
        bits of its 1-D view; a 0-d one its average); a tensor that is not contiguous is refused by name."""
        got = zpccl.launch.spawn(_direct_calls, 2, 0, env={"OMP_NUM_THREADS": "1"}, timeout=300)
        for rank, (shaped, scalar, refused) in enumerate(got):
            flat, square = shaped
            self.assertEqual(square.shape, (5, 15))
            self.assertTrue(np.array_equal(square.ravel(), flat), f"rank {rank}")
            self.assertTrue(np.array_equal(flat, got[0][0][0]), f"rank {rank} differs from rank 0")
            self.assertEqual(scalar, 1.5, f"rank {rank}")
            self.assertEqual(refused[0], "ZpcclValueError", refused[1])
            self.assertIn("test: tensor of shape (15, 5) and strides (1, 15) is not contiguous", refused[1])

    def test_unstaged_calls_stay_within_the_reserved_bytes(self) -> None:
        """With blocks from the tensor's start (param_blocks=False), a tensor larger than the bytes the scratch is
        reserved for (DDP's first bucket, every parameter) goes in calls of whole blocks within them, with the bits
        of one call."""
        got = zpccl.launch.spawn(_unstaged_pieces, 2, 0, env={"OMP_NUM_THREADS": "1"}, timeout=300)
        for rank, out in enumerate(got):
            pieces, whole = out["pieces"], out["whole"]
            self.assertEqual(whole[0], [1000], f"rank {rank}")
            self.assertEqual(pieces[0], [128] * 7 + [104], f"rank {rank}")
            self.assertTrue(np.array_equal(pieces[1], whole[1]), f"rank {rank}: pieces differ from one call")
            self.assertTrue(np.array_equal(pieces[1], got[0]["pieces"][1]), f"rank {rank} differs from rank 0")

    def test_ranks_per_node_numbers_the_worlds_ranks(self) -> None:
        """ranks_per_node lays out the world, not each group in its own numbering: the replicate groups of two
        nodes of two span both nodes (one node of two, in their own numbering), the subgroup 0-2 two uneven ones."""
        got = zpccl.launch.spawn(_layouts, 4, env={"OMP_NUM_THREADS": "1"}, timeout=300)
        for rank, out in enumerate(got):
            self.assertEqual(out["replicate"], 2, f"rank {rank}: the replicate group's nodes")
            if rank < 3:
                self.assertEqual(out["subgroup"], 2, f"rank {rank}: the subgroup's nodes")

    def test_refusals_name_what_to_change(self) -> None:
        got = zpccl.launch.spawn(_refusals, 2, 0, env={"OMP_NUM_THREADS": "1"}, timeout=300)
        expected = [
            ("ZpcclTypeError", "zpccl.ddp.enable: model must be a torch.nn.parallel.DistributedDataParallel, got Net"),
            ("ZpcclValueError", "zpccl.ddp.enable: weight_bits applies to the weight gathers of sharded models "
                                "(zpccl.fsdp)"),
            ("ZpcclValueError", "zpccl.ddp.enable: error_feedback is not served here"),
            ("ZpcclValueError", "zpccl.ddp.enable: grad_bits 6 must be 4 or 8"),
            ("ZpcclValueError", "zpccl.ddp.enable: grad_bits=None leaves the all-reduce to torch"),
            ("ZpcclTypeError", "zpccl.ddp.enable: unknown argument(s) grad_bitz"),
            ("ZpcclValueError", "zpccl.ddp.enable: give policy or keyword arguments, not both"),
            ("ZpcclValueError", "zpccl.ddp.enable: gradients of dtype float64: zpQuantAllReduce takes float16, "
                                "bfloat16 and float32"),
            ("ZpcclValueError", "zpccl.ddp.enable: module '1' (EmbeddingBag) makes sparse gradients, which "
                                "zpQuantAllReduce does not reduce: construct it with sparse=False"),
            ("ZpcclError", "zpccl.ddp.enable: the model already has a communication hook (comm_hook)"),
            ("ZpcclValueError", "zpccl.ddp.comm_hook: a bucket of sparse gradients (torch.sparse_coo)"),
            ("", "zpccl.ddp.enable: this zpccl.ddp state is closed"),
        ]
        for rank, seen in enumerate(got):
            self.assertEqual(len(seen), len(expected), seen)
            for (kind, text, _), (want_kind, want) in zip(seen, expected):
                self.assertIn(want, text, f"rank {rank}")
                if want_kind:
                    self.assertEqual(kind, want_kind, text)


def _staged_part(x: np.ndarray, block: int, last: bool) -> np.ndarray:
    """A parameter's part of a staged bucket: padded with zeros to whole blocks unless it is the last (an
    independent statement of zpccl's BlockLayout)."""
    if last or x.size % block == 0:
        return x
    return np.concatenate([x, np.zeros(block - x.size % block, x.dtype)])


class HsdpReplicateHook(unittest.TestCase):
    def test_set_requires_all_reduce_false_accumulates_as_native_hsdp(self) -> None:
        """Gradient accumulation as HSDP makes it (set_requires_all_reduce(False) on all but the last micro-batch):
        one replicate all-reduce a step and FSDP module, not one a micro-batch; the replicas bit-identical; the
        losses near native HSDP's accumulating the same way."""
        torch_for_procs()
        env = {"LOCAL_WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"}
        native = zpccl.launch.spawn(_hsdp_rank, 4, "native+accumulate", env=env, timeout=600)
        ours = zpccl.launch.spawn(_hsdp_rank, 4, "replicate+accumulate", env=env, timeout=600)
        for r in range(4):
            peer = (r + 2) % 4
            self.assertEqual(ours[r]["digest"], ours[peer]["digest"], f"ranks {r} and {peer} drifted")
            self.assertEqual(ours[r]["summary"]["quant_all_reduce"]["calls"], 3 * STEPS)
            self.assertNotEqual(ours[r]["losses"], native[r]["losses"])
            for step, (a, b) in enumerate(zip(ours[r]["losses"], native[r]["losses"])):
                self.assertLess(abs(a - b) / b, 0.004, f"rank {r} step {step + 1}: {a} vs {b}")

    def test_replicas_bit_identical_and_losses_near_native_hsdp(self) -> None:
        torch_for_procs()
        env = {"LOCAL_WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"}
        native = zpccl.launch.spawn(_hsdp_rank, 4, "native", env=env, timeout=600)
        for mode, tolerance in (("replicate", 0.01), ("replicate+fsdp", 0.02)):
            ours = zpccl.launch.spawn(_hsdp_rank, 4, mode, env=env, timeout=600)
            for r in range(4):
                peer = (r + 2) % 4  # the same shard in the other replica
                self.assertEqual(ours[r]["digest"], ours[peer]["digest"], f"{mode}: ranks {r} and {peer} drifted")
                self.assertEqual(native[r]["digest"], native[peer]["digest"])
                self.assertNotEqual(ours[r]["losses"], native[r]["losses"])
                for step, (a, b) in enumerate(zip(ours[r]["losses"], native[r]["losses"])):
                    self.assertLess(abs(a - b) / b, tolerance, f"{mode} rank {r} step {step + 1}: {a} vs {b}")
                # One call a step for each FSDP module (the blocks and the root).
                self.assertEqual(ours[r]["summary"]["quant_all_reduce"]["calls"], 3 * STEPS)
                if mode == "replicate+fsdp":  # gathers: 3 in forward, the 2 resharded blocks' again in backward
                    self.assertEqual(ours[r]["fsdp"], {"qwz": 5 * STEPS, "qgz": 3 * STEPS}, mode)

    def test_refusals_name_what_to_change(self) -> None:
        """A model not sharded, one sharded on the 2-D mesh, and a replicate group that shares ranks with the shard
        group (the shard group itself, the world as a group and as None) are refused, naming what to give; a 1-D
        DeviceMesh is taken as its group."""
        torch_for_procs()
        got = zpccl.launch.spawn(_replicate_refusals, 4, 0, env={"OMP_NUM_THREADS": "1"}, timeout=300)
        call = "zpccl.ddp.enable_replicate: "
        for rank, seen in enumerate(got):
            shard = ", ".join(map(str, sorted({rank, rank ^ 1})))  # the shard groups of the 2x2 mesh: {0, 1}, {2, 3}
            shares = (f"the replicate group shares ranks {shard} with the shard group of module 'Net': give the group "
                      "of the ranks that hold this rank's shard in the other replicas (mesh['replicate'].get_group())")
            expected = [
                ("ZpcclValueError", call + "Net has no fully_shard-ed module: shard it on the 1-D shard mesh first"),
                ("ZpcclValueError", call + "module 'Net' is sharded on a 2-D (HSDP) mesh"),
                ("ZpcclValueError", call + shares),
                ("ZpcclValueError", call + shares),
                ("ZpcclValueError", call + shares),
                ("nranks", "2"),
            ]
            self.assertEqual(len(seen), len(expected), seen)
            for (kind, text), (want_kind, want) in zip(seen, expected):
                self.assertEqual(kind, want_kind, text)
                self.assertIn(want, text, f"rank {rank}")


    def test_blocks_restart_at_parameters_when_a_branch_is_unused(self) -> None:
        """A step whose forward skips a layer in the middle of an FSDP module: FSDP reduces the other parameters'
        shards, and the replicate all-reduce restarts blocks at each of them, bit for bit the NumPy model of their
        staged shards over the replicate group; alone and with zpccl.fsdp serving the shard group as well."""
        torch_for_procs()
        got = zpccl.launch.spawn(_hsdp_unused_rank, 4, 0, env={"OMP_NUM_THREADS": "1"}, timeout=300)
        for mode in ("replicate", "replicate+fsdp"):
            for r in range(2):
                peers = [got[r][mode], got[r + 2][mode]]  # the replicate group {r, r + 2}
                self.assertTrue(all(p["restored"] for p in peers), f"{mode}: FSDP's group still wrapped after close")
                for step in range(3):
                    with self.subTest(mode=mode, replicate_group=(r, r + 2), step=step):
                        sizes = peers[0]["sizes"][step]
                        self.assertEqual(peers[1]["sizes"][step], sizes)
                        if step == 1:
                            self.assertLess(len(sizes), 6, "the test means a parameter without a gradient")
                        inputs = [p["seen"][step][0] for p in peers]
                        staged = []
                        for x in inputs:
                            bounds = np.cumsum([0] + sizes)
                            staged.append(np.concatenate([_staged_part(x[lo:hi], BLOCK, last=(j == len(sizes) - 1))
                                                          for j, (lo, hi) in enumerate(zip(bounds, bounds[1:]))]))
                        reduced = ref.quant_all_reduce(staged, ref.F32, "avg", 8, BLOCK, [0, 0])
                        at, expected = 0, []
                        for j, n in enumerate(sizes):
                            expected.append(reduced[at:at + n])
                            at += n if j == len(sizes) - 1 else -(-n // BLOCK) * BLOCK
                        for p in peers:
                            self.assertTrue(np.array_equal(p["seen"][step][1], np.concatenate(expected)),
                                            "differs from the model with blocks restarting at each parameter")


    def test_accumulating_micro_batches_that_use_different_experts(self) -> None:
        """Micro-batches accumulated with set_requires_all_reduce(False) whose gradients are for different
        parameters of one size (two experts, each micro-batch routed to one): the held sum is never added to another
        parameter's gradient. Refused by name, saying what serves it; with set_reduce_scatter_unused_params(True)
        every expert's gradient is within int8's error of the exact average."""
        torch_for_procs()
        env = {"OMP_NUM_THREADS": "1"}
        refused = zpccl.launch.spawn(_hsdp_experts_rank, 2, False, env=env, timeout=300)
        for rank, out in enumerate(refused):
            self.assertIn("refused", out, f"rank {rank}: accumulated across different parameters")
            self.assertIn("zpccl.ddp.enable_replicate: micro-batches accumulated with set_requires_all_reduce(False) "
                          "gave gradients for different parameters", out["refused"])
            self.assertIn("set_reduce_scatter_unused_params(True)", out["refused"])
        served = zpccl.launch.spawn(_hsdp_experts_rank, 2, True, env=env, timeout=300)
        for rank, out in enumerate(served):
            self.assertNotIn("refused", out, out.get("refused"))
            for e, (got, exact) in enumerate(zip(out["got"], out["exact"])):
                err = float(np.abs(got - exact).max())
                self.assertLess(err, 0.02 * float(np.abs(exact).max()), f"rank {rank} expert {e}")
                self.assertTrue(np.array_equal(got, served[0]["got"][e]), f"rank {rank} expert {e}: replicas differ")


class ShardHookHeldOutputs(unittest.TestCase):
    """The HSDP hook's accumulation in one process, on a parameter group and a state that record what they get:
    outputs of micro-batches with all_reduce_grads False are zeroed and summed, the next all-reducing micro-batch
    reduces its own plus that sum, once; a held sum of another shape is refused by name."""

    def test_held_outputs_reduced_once_and_other_shapes_refused(self) -> None:
        torch = torch_for_procs()
        from types import SimpleNamespace

        from zpccl.ddp._api import _ShardHook

        reduced: list[Any] = []
        state = SimpleNamespace(call="zpccl.ddp.enable_replicate", _live=lambda: None, on_close=lambda undo: None,
                                all_reduce=lambda t, sizes: reduced.append((t.clone(), sizes)))
        param = SimpleNamespace(padded_sharded_param_size=torch.Size([4]),
                                sharded_param=SimpleNamespace(requires_grad=True))
        pg = SimpleNamespace(fsdp_params=[param, param], all_reduce_grads=False)
        hook = _ShardHook(state, pg)
        for value in (1.0, 2.0):
            out = torch.full((8,), value)
            hook(out)
            self.assertTrue(torch.equal(out, torch.zeros(8)), "FSDP must accumulate zeros for a held micro-batch")
        self.assertEqual(reduced, [])
        pg.all_reduce_grads = True
        out = torch.full((8,), 3.0)
        hook(out)
        self.assertEqual(len(reduced), 1)
        self.assertTrue(torch.equal(reduced[0][0], torch.full((8,), 6.0)))
        self.assertEqual(reduced[0][1], [4, 4])
        hook(torch.full((8,), 1.0))  # nothing held any more: reduced as it is
        self.assertTrue(torch.equal(reduced[1][0], torch.ones(8)))
        pg.all_reduce_grads = False
        hook(torch.ones(8))
        pg.all_reduce_grads = True
        with self.assertRaises(zpccl.ZpcclError) as caught:
            hook(torch.ones(4))
        self.assertIn("zpccl.ddp.enable_replicate: micro-batches accumulated with set_requires_all_reduce(False) "
                      "gave gradients for different parameters (reduce-scatter outputs of (8,) torch.float32 and "
                      "(4,) torch.float32), which the replicate all-reduce cannot add up: call "
                      "set_reduce_scatter_unused_params(True)", str(caught.exception))


class DdpOnGpu(DdpChecks):
    """DdpCommHook's checks on the cuda backend: two processes on GPU 0 as two nodes (over sockets), DDP on NCCL,
    one hop; the gradients bit for bit the NumPy model's, so the host backend's."""

    def test_two_processes_as_two_nodes_on_one_gpu(self) -> None:
        torch = torch_for_procs()
        if not torch.cuda.is_available() or not torch.distributed.is_nccl_available():
            self.skipTest("needs a CUDA device and NCCL")
        self.check_layout(2, 8, {}, ranks_per_node=1, gpu=True)


if __name__ == "__main__":
    unittest.main()
