"""``enable``, ``disable`` and ``session_of``: what a user of zpccl.fsdp calls."""
from __future__ import annotations

import logging
from typing import Any

from .._policy import ZeroPlusPlusPolicy, resolve_policy
from ..enums import Backend, Result
from ..errors import ZpcclError, ZpcclValueError
from ._hooks import hook_classes
from ._post_forward import apply_hpz_size, say_when_set_true
from ._report import log
from ._state import SERVED, Served, ZeroPlusPlus
from ._torch_fsdp import CALL, TorchFsdp, fsdp_modules, param_groups, watch_reduced_params


def enable(model: Any, policy: ZeroPlusPlusPolicy | None = None, **options: Any) -> ZeroPlusPlus:
    """Switches a ``fully_shard``-ed model to zpccl's collectives (see :mod:`zpccl.fsdp`). Collective: every
    rank of the model's process groups calls it, after ``fully_shard`` and before the first step.

    ``policy`` is a :class:`~zpccl.ZeroPlusPlusPolicy`; or give its fields as keyword arguments instead (not
    both), e.g. ``enable(model, weight_bits=8, grad_bits=4, block_size=256)``. Its fields, as FSDP reads them:

    * ``weight_bits`` (8 or 4): qwZ's codes; ``grad_bits`` (4 or 8): qgZ's; ``block_size``: elements per
      quantization block, a power of two in [32, 8192]; ``grad_block_size``: the gradients' own, if given (else
      ``block_size``): smaller blocks follow a gradient's spread of magnitudes more closely, at a scale's 4 bytes a
      block (int4 at 64: 3.56x fewer bytes than bf16, at 256: 3.88x). ``weight_bits=None`` leaves the
      all-gathers (forward and backward) on FSDP's own collectives, ``grad_bits=None`` the reduce-scatters; zpccl
      then makes no communicator, staging or scratch for them.
    * ``hpz``: serve the backward all-gather over FSDP's post-forward group (``reshard_after_forward=k``) with
      hpZ; False leaves it on FSDP's collective.
    * ``hpz_size`` (an int >= 2 dividing the ranks per node, or None): give every module sharded with
      ``reshard_after_forward=True`` a post-forward group of that many ranks, as ``reshard_after_forward=k`` would
      (for front ends that take only a bool); its backward gathers are then hpZ. Memory: each rank keeps 1/k of
      those modules' parameters from their forward to their backward. Modules with an int keep theirs, and
      modules left at False (a root at its default) keep False; ``set_reshard_after_forward(True)`` on them
      after ``enable`` means k again (not FSDP's whole shard group); :meth:`ZeroPlusPlus.disable` puts FSDP's back.
    * ``param_blocks``: blocks restart at each parameter boundary (costs two copies of each collective's data
      on the device, and two staging buffers of the largest module's gathered size: see :mod:`zpccl.fsdp`).
    * ``ranks_per_node`` / ``node_id``: emulate a node layout, nodes of that many consecutive ranks of the world
      (whatever group a communicator spans: HSDP's shard groups too) / this rank's node label (otherwise a rank's
      node is its host, as NCCL tells it: hostname or ``NCCL_HOSTID``).
    * ``grad_rounding`` (``"nearest"`` or ``"stochastic"``) and ``seed`` (>= 0): qgZ's rounding of gradients;
      ``error_feedback``: keep a bf16 residual per parameter group (see :mod:`zpccl.fsdp` for its memory).

    zpccl serves a parameter group through one ``enable`` at a time: calling it on a module inside a model it
    already serves, or on a model around a module it serves, is refused until that one is disabled.

    Returns the :class:`ZeroPlusPlus` that serves the model (``.summary()``, ``.disable()``). Raises
    :class:`~zpccl.ZpcclError` (or its ValueError/TypeError subclasses) with a message saying what to change.
    """
    fsdp = TorchFsdp.load()
    policy = resolve_policy(CALL, policy, options)
    if policy.weight_bits is None and policy.grad_bits is None:
        raise ZpcclValueError(f"{CALL}: weight_bits and grad_bits are both None, so zpccl would serve nothing: "
                              "zpccl.fsdp serves hpZ only beside qwZ (its hpZ gathers use the gathers' "
                              "communicator); give weight_bits or grad_bits, or leave zpccl out", CALL)
    groups = _served_groups(fsdp, model)
    served = [s for s in groups if fsdp.dist.get_world_size(s.param_group.mesh_info.shard_process_group) > 1]
    if policy.hpz_size is not None:
        fsdp.check_post_forward(served)
    session = ZeroPlusPlus(fsdp, model, policy, served, groups[0].param_group.device)
    _say_alone(session, [s for s in groups if s not in served])
    try:
        _attach(fsdp, session, served)
    except BaseException:
        session.disable()
        raise
    for s in served:
        s.session = session
        SERVED[id(s.param_group)] = session
    return session


def session_of(model: Any) -> ZeroPlusPlus | None:
    """The live :class:`ZeroPlusPlus` that serves ``model`` (or a module inside it), or None."""
    if not SERVED or not callable(getattr(model, "named_modules", None)):
        return None
    for _name, m in fsdp_modules(model):
        for pg in param_groups(m):
            if id(pg) in SERVED:
                return SERVED[id(pg)]
    return None


def disable(model: Any) -> None:
    """Puts FSDP's own collectives back (undoes :func:`enable`) on ``model`` and on everything else the same
    ``enable`` serves; a no-op when zpccl does not serve it."""
    session = session_of(model)
    if session is not None:
        session.disable()


def _served_groups(fsdp: TorchFsdp, model: Any) -> list[Served]:
    """The model's FSDP parameter groups, each once (modules sharded together share one), in module order;
    refused where zpccl already serves one."""
    modules = [(name, m) for name, m in fsdp_modules(model) if isinstance(m, fsdp.FSDPModule)]
    if not modules:
        raise ZpcclValueError(f"{CALL}: {type(model).__name__} has no fully_shard-ed module: call "
                              "torch.distributed.fsdp.fully_shard on it (and its blocks) first", CALL)
    served: dict[int, Served] = {}
    for name, m in modules:
        groups = fsdp.param_groups(m)
        if len(groups) > 1:
            raise ZpcclValueError(f"{CALL}: module {name or fsdp.class_name(m)!r} has several parameter groups "
                                  "(shard_placement_fn with several meshes); FSDP's custom collectives take one "
                                  "group a module", CALL)
        for pg in groups:
            if id(pg) not in served:
                fsdp.check_private(m, pg)
                served[id(pg)] = Served(pg, m, name)
    if not served:
        raise ZpcclValueError(f"{CALL}: the model's FSDP modules hold no parameters", CALL)
    for s in served.values():
        other = SERVED.get(id(s.param_group))
        if other is not None:
            there = next(o for o in other._served if o.param_group is s.param_group)
            here = "this model" if not s.name else f"its module {s.name!r}"
            as_ = f"as its module {there.name!r} of" if there.name else "as"
            raise ZpcclError(Result.INVALID_USAGE, f"{CALL}: zpccl already serves {here} "
                             f"({fsdp.class_name(s.module)}), {as_} the {fsdp.class_name(other.model)} it was "
                             "enabled on; call disable() on that ZeroPlusPlus first", CALL)
    return list(served.values())


def _say_alone(session: ZeroPlusPlus, alone: list[Served]) -> None:
    """Says, once, which modules zpccl leaves to FSDP because their shard group is one rank: FSDP moves nothing
    over such a group (each rank holds the whole of those parameters), so zpccl makes no communicator for it."""
    if not alone:
        return
    nothing = not session._served
    session.report.say_once("shard_group_of_one", f"{', '.join(s.label for s in alone)}: sharded over a group of "
                            "one rank, where FSDP communicates nothing (each rank holds those parameters whole); "
                            "zpccl leaves them to FSDP" + (" and serves nothing in this model" if nothing else ""),
                            logging.WARNING if nothing else logging.INFO)


def _attach(fsdp: TorchFsdp, session: ZeroPlusPlus, served: list[Served]) -> None:
    """Makes what serves the model, in an order every rank follows: each shard group's communicators (module
    order), hpz_size's post-forward groups, the gathers' and hpZ communicators, the reserved buffers; then puts
    the hooks in FSDP's place."""
    policy, comms, calls = session.policy, session.comms, session.collectives
    if any(getattr(s.param_group.mesh_info, "replicate_process_group", None) is not None for s in served):
        session.report.say_once("hsdp", "the replicate dimension of a 2-D (HSDP) mesh: FSDP all-reduces gradients "
                                "over it itself, on the process group's own backend; zpccl.ddp.enable_replicate serves it from the "
                                "1-D shard mesh (README.md, \"DDP and HSDP\")", logging.INFO)
    for s in served:
        s.group = comms.group_of(s.param_group.mesh_info.shard_process_group, served)
    if policy.hpz_size is not None:
        apply_hpz_size(fsdp, policy.hpz_size, session.model, served, session.report)
    for g in comms.groups.values():
        comms.serve_gathers(g, [s for s in served if s.group is g])
    calls.reserve(served, reserve_scratch=comms.backend == Backend.CUDA)
    if policy.error_feedback:
        for s in served:
            calls.allocate_residuals(s)
    AllGatherHook, ReduceScatterHook = hook_classes(fsdp.AllGather, fsdp.ReduceScatter)
    for s in served:
        s.all_gather, s.reduce_scatter = s.param_group._all_gather_comm, s.param_group._reduce_scatter_comm
        s.hooked = True
        watch_reduced_params(s.param_group, s)
        if s.hpz is not None and s.post_forward is None:  # the user's int k
            say_when_set_true(s, session.report, policy.hpz_size)
        if policy.weight_bits is not None:
            s.module.set_custom_all_gather(AllGatherHook(calls, s, s.all_gather))
        if policy.grad_bits is not None:
            s.module.set_custom_reduce_scatter(ReduceScatterHook(calls, s, s.reduce_scatter))
    ks = sorted({k for g in comms.groups.values() for k in g.hpz})
    log.info("zpccl.fsdp: %d parameter groups on %s, %d shard group(s): %s, %s, blocks of %d%s%s%s",
             len(served), comms.backend.name.lower() if comms.backend else "?", len(comms.groups),
             "all-gathers on FSDP's" if policy.weight_bits is None else "qwZ int%d" % policy.weight_bits,
             "reduce-scatters on FSDP's" if policy.grad_bits is None else "qgZ int%d" % policy.grad_bits,
             policy.block_size,
             " (gradients' of %d)" % policy.grad_block if policy.grad_block != policy.block_size else "",
             ", hpZ groups of %s" % " and ".join(map(str, ks)) if ks else "",
             ", blocks restart at parameters" if policy.param_blocks else "")
    if policy.error_feedback:
        log.info("zpccl.fsdp: error feedback: %d residual(s), %d bytes (and %d for the intermediate hop)",
                 len(calls.residuals), calls.residual_bytes, calls.hop_residual_bytes)
