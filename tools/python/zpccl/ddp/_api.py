"""What users call: :func:`enable` (DDP), :func:`make_state` and :func:`comm_hook` (DDP, composed by hand), and
:func:`enable_replicate` (HSDP's replicate all-reduce through FSDP2's ``set_all_reduce_hook``)."""
from __future__ import annotations

from typing import Any

from .._policy import ZeroPlusPlusPolicy, resolve_policy
from .._staging import BlockLayout
from ..enums import Result
from ..errors import ZpcclError, ZpcclTypeError, ZpcclValueError
from ._state import QuantAllReduce

#: The policy's fields an all-reduce takes; the others (weight_bits, hpz, hpz_size) are sharded models' gathers.
FIELDS = ("grad_bits", "block_size", "grad_block_size", "param_blocks", "ranks_per_node", "node_id",
          "grad_rounding", "seed")
_GATHER_FIELDS = ("weight_bits", "hpz", "hpz_size")


def resolve(call: str, policy: ZeroPlusPlusPolicy | None, options: dict[str, Any]) -> ZeroPlusPlusPolicy:
    """The policy of an all-reduce: ``policy`` (its gradient fields serve; its weight fields are zpccl.fsdp's), or
    one made from ``options`` (the fields in :data:`FIELDS`). Refusals name the argument and what to change."""
    unknown = sorted(set(options) - set(FIELDS) - set(_GATHER_FIELDS) - {"error_feedback"})
    if unknown:
        raise ZpcclTypeError(f"{call}: unknown argument(s) {', '.join(unknown)}; it takes policy= or "
                             f"{', '.join(FIELDS)}", call)
    gathers = [name for name in _GATHER_FIELDS if name in options]
    if gathers:
        raise ZpcclValueError(f"{call}: {', '.join(gathers)} appl{'ies' if len(gathers) == 1 else 'y'} to the weight "
                              "gathers of sharded models (zpccl.fsdp); a gradient all-reduce takes "
                              f"{', '.join(FIELDS)}", call)
    if policy is None:
        if "grad_bits" in options and options["grad_bits"] is None:
            raise ZpcclValueError(f"{call}: grad_bits=None leaves the all-reduce to torch, so zpccl would serve "
                                  "nothing: give grad_bits 4 or 8, or leave zpccl out", call)
        options = dict(options, weight_bits=None, hpz=False)
    resolved = resolve_policy(call, policy, options)
    if resolved.grad_bits is None:
        raise ZpcclValueError(f"{call}: the policy's grad_bits is None, so zpccl would serve nothing: give grad_bits "
                              "4 or 8", call)
    if resolved.error_feedback:
        raise ZpcclValueError(f"{call}: error_feedback is not served here: DDP rebuilds its buckets after the first "
                              "iteration and FSDP's all-reduce hook gets no parameter group, so a residual would not "
                              "follow its gradients; leave it False (grad_rounding='stochastic' is served)", call)
    return resolved


# ---- DDP ---------------------------------------------------------------------------------------------------------

def make_state(model: Any, policy: ZeroPlusPlusPolicy | None = None, **options: Any) -> QuantAllReduce:
    """The state of :func:`comm_hook` for a ``DistributedDataParallel`` model, made once: a communicator over the
    model's process group (collective: every rank calls it), the staging buffer for its largest bucket, the zero
    blocks. :func:`enable` registers it; call this to compose :func:`comm_hook` with a hook of your own."""
    return _state_for(model, policy, options, "zpccl.ddp.make_state")


def _state_for(model: Any, policy: ZeroPlusPlusPolicy | None, options: dict[str, Any], call: str) -> QuantAllReduce:
    ddp = _ddp(model, call)
    policy = resolve(call, policy, options)
    # The parameters DDP reduces: those it ignores (parameters_to_ignore, by name) never reach the hook.
    ignored = set(getattr(ddp, "parameters_to_ignore", ()))
    params = [p for name, p in ddp.module.named_parameters() if p.requires_grad and name not in ignored]
    if not params:
        raise ZpcclValueError(f"{call}: the model has no parameter that requires a gradient", call)
    _refuse_sparse(ddp.module, ignored, call)
    return QuantAllReduce(ddp.process_group, policy, device=params[0].device, dtypes=[p.dtype for p in params],
                          staging_bytes=_largest_bucket_bytes(ddp, params, policy.grad_block), call=call)


def enable(model: Any, policy: ZeroPlusPlusPolicy | None = None, **options: Any) -> QuantAllReduce:
    """Registers zpccl's quantized all-reduce as ``model``'s DDP communication hook (``register_comm_hook``) and
    returns its state (:func:`make_state`). Collective over the model's process group; before the first backward.

    DDP's buckets are then averaged by zpQuantAllReduce (``grad_bits`` codes in blocks of ``grad_block_size`` or
    ``block_size``, restarting at each parameter with ``param_blocks``), every rank's gradients bit-identical, so
    that replicas never drift. DDP takes one hook for its lifetime: :meth:`QuantAllReduce.close` stops zpccl (the
    hook then raises), and a model that must go back to torch's all-reduce is wrapped in DDP anew.
    """
    call = "zpccl.ddp.enable"
    ddp = _ddp(model, call)
    if getattr(ddp, "_comm_hooks", None):
        hooks = ", ".join(getattr(h, "__qualname__", repr(h)) for h, _ in ddp._comm_hooks)
        raise ZpcclError(Result.INVALID_USAGE, f"{call}: the model already has a communication hook ({hooks}); DDP "
                         "takes one for its lifetime: wrap the module in DistributedDataParallel anew", call)
    state = _state_for(ddp, policy, options, call)
    try:
        ddp.register_comm_hook(state, comm_hook)
    except BaseException:
        state.close()
        raise
    return state


def comm_hook(state: QuantAllReduce, bucket):  # type: ignore[no-untyped-def]
    """The DDP communication hook: the bucket's gradients (a ``dist.GradBucket``) averaged over the process group by
    zpQuantAllReduce, in place in the bucket's buffer, which the returned (completed) ``torch.futures.Future``
    holds. Blocks restart at the bucket's parameters (``param_blocks``). On the host backend the call returns when
    the all-reduce is done; on CUDA it is enqueued on the current stream, which the future's device lists.

    DDP's Python reducer (``torch._dynamo.config.optimize_ddp = "python_reducer"``, compiled DDP with compiled
    autograd) hands the hook each parameter's gradient as a ``(grad, param)`` tuple once it is accumulated, and
    reads the result from the gradient: that gradient is averaged in place, in memory order (a channels_last one as
    DDP's bucket holds it). With blocks restarting at each parameter, its bits are those the bucket would have given
    it.

    ``bucket`` and the result carry no annotation: DDP's register_comm_hook accepts only none or the objects
    themselves, and this module's annotations are strings."""
    import torch

    call = "zpccl.ddp.comm_hook"
    if isinstance(bucket, tuple):
        buffer, sizes = bucket[0], None
    else:
        buffer = bucket.buffer()
        sizes = [p.numel() for p in bucket.parameters()]
    if buffer.layout != torch.strided:
        raise ZpcclValueError(f"{call}: a bucket of sparse gradients ({buffer.layout}): zpQuantAllReduce reduces dense "
                              "ones; make that parameter's gradient dense, or keep DDP's own all-reduce", call)
    # A gradient in its parameter's layout (channels_last) is reduced in memory order, as DDP's bucket holds it.
    dense = buffer.permute(sorted(range(buffer.dim()), key=buffer.stride, reverse=True))
    if dense.is_contiguous():
        state.all_reduce(dense, sizes)
    else:  # overlapping or with gaps: through a contiguous copy
        buffer.copy_(state.all_reduce(buffer.contiguous(), sizes))
    future = torch.futures.Future(devices=[buffer.device] if buffer.device.type == "cuda" else None)
    future.set_result(buffer)
    return future


def _ddp(model: Any, call: str) -> Any:
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        raise ZpcclTypeError(f"{call}: model must be a torch.nn.parallel.DistributedDataParallel, got "
                             f"{type(model).__name__}: wrap it first (DistributedDataParallel(model, "
                             "process_group=...)); for FSDP2's replicate dimension see zpccl.ddp.enable_replicate",
                             call)
    return model


def _refuse_sparse(module: Any, ignored: set[str], call: str) -> None:
    """Refuses a model with an embedding that makes sparse gradients: DDP hands each such gradient to the hook as a
    bucket of its own, a sparse tensor, which the all-reduce cannot take (the hook would fail at the first
    backward). An embedding whose parameters DDP ignores (``ignored``, their names) never reaches the hook."""
    import torch

    for name, m in module.named_modules():
        sparse = isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse
        served = [p for n, p in m.named_parameters(prefix=name, recurse=False) if n not in ignored]
        if sparse and any(p.requires_grad for p in served):
            raise ZpcclValueError(f"{call}: module {name!r} ({type(m).__name__}) makes sparse gradients, which "
                                  "zpQuantAllReduce does not reduce: construct it with sparse=False, or keep DDP's own "
                                  "all-reduce for this model", call)


def _largest_bucket_bytes(ddp: Any, params: list[Any], block: int) -> int:
    """Bytes of staging for DDP's largest bucket after it rebuilds them, each parameter padded to whole blocks: DDP
    closes a bucket once it reaches its cap, so a bucket holds less than the cap plus its last parameter, plus a
    block's padding per parameter; never more than every parameter together. (The first iteration's one bucket of
    every parameter goes in pieces.)"""
    padded = [-(-p.numel() // block) * block * p.element_size() for p in params]
    caps = [getattr(ddp, "bucket_bytes_cap", 0)] + list(getattr(ddp, "bucket_bytes_cap_list", None) or [])
    widest = max(p.element_size() for p in params)
    bound = max(caps) + max(p.numel() * p.element_size() for p in params) + len(params) * block * widest
    return min(sum(padded), bound)


# ---- HSDP: FSDP2's all-reduce hook on a 1-D shard mesh -------------------------------------------------------------

def enable_replicate(model: Any, replicate_group: Any, policy: ZeroPlusPlusPolicy | None = None,
                     **options: Any) -> QuantAllReduce:
    """HSDP's replicate all-reduce on zpccl: ``model`` is sharded with ``fully_shard`` on the 1-D shard mesh (the
    ranks of one replica, e.g. ``mesh["shard"]`` of a 2-D mesh), and every FSDP module of it gets
    ``set_all_reduce_hook``: after FSDP's reduce-scatter over the shard group, the reduced shard is averaged over
    ``replicate_group`` (the ranks holding the same shard in the other replicas: a process group, or the 1-D
    ``mesh["replicate"]``; one that shares ranks with a shard group is refused) by zpQuantAllReduce, in place,
    bit-identical in every replica. Collective over the replicate group; returns the state
    (:class:`QuantAllReduce`). The costs of this recipe are in the package's documentation (README, "DDP and
    HSDP").
    """
    call = "zpccl.ddp.enable_replicate"
    from ..fsdp._collectives import _collective_dtype
    from ..fsdp._torch_fsdp import TorchFsdp, fsdp_modules

    fsdp = TorchFsdp.load()
    if not hasattr(fsdp.FSDPModule, "set_all_reduce_hook"):
        raise ZpcclError(Result.INVALID_USAGE, f"{call}: this torch {fsdp.torch.__version__} has no "
                         "FSDPModule.set_all_reduce_hook", call)
    modules = [(name, m) for name, m in fsdp_modules(model) if isinstance(m, fsdp.FSDPModule)]
    if not modules:
        raise ZpcclValueError(f"{call}: {type(model).__name__} has no fully_shard-ed module: shard it on the 1-D shard "
                              "mesh first", call)
    groups, shard_groups = [], {}
    for name, m in modules:
        for pg in fsdp.param_groups(m):
            if getattr(pg.mesh_info, "replicate_process_group", None) is not None:
                raise ZpcclValueError(f"{call}: module {name or fsdp.class_name(m)!r} is sharded on a 2-D (HSDP) mesh,"
                                      " whose replicate all-reduce FSDP makes itself: shard it on the 1-D shard mesh "
                                      "(mesh['shard']) for zpccl to serve the replicate dimension", call)
            groups.append((m, pg))
            shard_groups.setdefault(pg.mesh_info.shard_process_group, name or fsdp.class_name(m))
    replicate_group = _replicate_group(replicate_group, shard_groups, call)
    policy = resolve(call, policy, options)
    dtypes = [_collective_dtype(pg, reduce=True) for _, pg in groups if pg.fsdp_params]
    staged = max((_staged_bytes(pg, policy.grad_block, _collective_dtype(pg, reduce=True))
                  for _, pg in groups if pg.fsdp_params), default=0)
    state = QuantAllReduce(replicate_group, policy, device=groups[0][1].device, dtypes=dtypes, staging_bytes=staged,
                           call=call)
    for m, pg in groups:
        m.set_all_reduce_hook(_ShardHook(state, pg))
    return state


def _replicate_group(group: Any, shard_groups: dict[Any, str], call: str) -> Any:
    """The process group of ``enable_replicate``'s ``replicate_group`` (a 1-D DeviceMesh gives its group), checked
    against the shard groups (each with the name of its first module): a replicate group meets each shard group in
    this rank alone, or the all-reduce would average different shards of a parameter together."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    if isinstance(group, DeviceMesh):
        if group.ndim != 1:
            raise ZpcclValueError(f"{call}: replicate_group is a {group.ndim}-D DeviceMesh: give its replicate "
                                  "dimension (mesh['replicate'])", call)
        group = group.get_group()
    rank = dist.get_rank()
    ranks = set(dist.get_process_group_ranks(dist.group.WORLD if group is None else group))
    if rank not in ranks:
        raise ZpcclValueError(f"{call}: this rank ({rank}) is not in replicate_group (ranks "
                              f"{', '.join(map(str, sorted(ranks)))}): give each rank the replicate group it "
                              "belongs to", call)
    for shard_group, name in shard_groups.items():
        shared = ranks & set(dist.get_process_group_ranks(shard_group)) if shard_group is not None else {rank}
        if shared != {rank}:
            shared_ranks = ", ".join(map(str, sorted(shared)))
            raise ZpcclValueError(f"{call}: the replicate group shares ranks {shared_ranks} with the shard group of "
                                  f"module {name!r}: give the group of the ranks that hold this rank's shard in the "
                                  "other replicas (mesh['replicate'].get_group())", call)
    return group


class _ShardHook:
    """The all-reduce hook of one FSDP parameter group: its reduce-scatter output (each parameter's padded shard,
    for the parameters that got a gradient) averaged over the replicate group, blocks restarting at each. FSDP tells
    which parameters those are where this torch lets it (``watch_reduced_params``): a parameter without a gradient
    (a branch the step skipped) may sit anywhere in the group, where sizes alone cannot place the boundaries.

    Gradient accumulation as HSDP makes it, ``set_requires_all_reduce(False)`` on all but the last micro-batch, is
    honoured: on the 1-D shard mesh FSDP calls the hook whatever that flag says and adds its output to the sharded
    gradient, so the hook holds such outputs back (their sum, in a buffer of one reduced shard made at the first
    one) and hands FSDP zeros; the next micro-batch that all-reduces reduces its output plus that sum, once, as
    native HSDP reduces its partial sum. Outputs for different parameters (a branch or an expert a micro-batch
    skipped) are refused, where FSDP tells them or their shapes differ: their sum would add one parameter's
    gradient to another's."""

    def __init__(self, state: QuantAllReduce, pg: Any) -> None:
        from ..fsdp._torch_fsdp import unwatch_reduced_params, watch_reduced_params

        params = list(pg.fsdp_params)
        self.state, self.pg = state, pg
        self.candidates = [[p.padded_sharded_param_size.numel() for p in subset]
                           for subset in ([p for p in params if p.sharded_param.requires_grad], params)]
        self.held: Any = None  # the sum of the outputs held back, valid while self.holding
        self.held_params: list[Any] | None = None  # their parameters, where FSDP told them
        self.holding = False
        self.reduced: list[Any] | None = None  # the parameters of the next output, as FSDP tells them
        watch_reduced_params(pg, self)
        state.on_close(lambda: unwatch_reduced_params(pg, self))

    def __call__(self, output: Any) -> None:
        if not getattr(self.pg, "all_reduce_grads", True):
            self._hold(output)
            return
        if self.holding:
            self._check_held(output, self.reduced)
            output += self.held
            self.holding = False
        self.state.all_reduce(output, self._sizes(output.numel()))

    def _sizes(self, count: int) -> list[int]:
        """The parts of an output of ``count`` elements: the parameters FSDP told (each told once), else the group's
        trainable ones or all of them; parameters that do not add up to the output (an extension of FSDP's):
        all_reduce says so once."""
        told, self.reduced = self.reduced, None
        sizes = [p.padded_sharded_param_size.numel() for p in told or ()]
        if sizes and sum(sizes) == count:
            return sizes
        return next((s for s in self.candidates if sum(s) == count), self.candidates[-1])

    def _hold(self, output: Any) -> None:
        self.state._live()
        told, self.reduced = self.reduced, None
        if self.holding:
            self._check_held(output, told)
            self.held += output
        else:
            if self.held is not None and self.held.shape == output.shape and self.held.dtype == output.dtype:
                self.held.copy_(output)
            else:
                self.held = output.clone()
            self.held_params = told
        self.holding = True
        output.zero_()

    def _check_held(self, output: Any, told: list[Any] | None) -> None:
        """Refuses an output that is not for the held sum's parameters (``told``: its parameters, where known)."""
        same_params = told is None or self.held_params is None or (
            len(told) == len(self.held_params) and all(a is b for a, b in zip(told, self.held_params)))
        if self.held.shape != output.shape or self.held.dtype != output.dtype or not same_params:
            call = self.state.call
            names = ""
            if not same_params:
                def fqns(params: list[Any]) -> str:
                    return ", ".join(str(getattr(p, "_param_fqn", None) or "?") for p in params)

                names = f", of parameters [{fqns(self.held_params or [])}] and [{fqns(told or [])}]"
            raise ZpcclError(Result.INVALID_USAGE, f"{call}: micro-batches accumulated with set_requires_all_reduce("
                             "False) gave gradients for different parameters (reduce-scatter outputs of "
                             f"{tuple(self.held.shape)} {self.held.dtype} and {tuple(output.shape)} {output.dtype}"
                             f"{names}), which the replicate all-reduce cannot add up: call "
                             "set_reduce_scatter_unused_params(True) on the FSDP modules, so that every micro-batch "
                             "reduces every parameter (zeros for those it skipped)", call)


def _staged_bytes(pg: Any, block: int, dtype: Any) -> int:
    """Bytes of one parameter group's reduce-scatter output laid out with blocks restarting at each parameter."""
    return BlockLayout(tuple(p.padded_sharded_param_size.numel() for p in pg.fsdp_params), block).staged_count * \
        dtype.itemsize
