"""The state of one ``enable``: :class:`ZeroPlusPlus`, which makes the communicators, checks DeepSpeed's hpZ groups
against zpccl's, puts the replaced functions and the wrapped fetches in place, and takes them back."""
from __future__ import annotations

import functools
import logging
from typing import Any

from .._policy import ZeroPlusPlusPolicy
from .._report import Report
from .._session import Session, backend_for, hpz_group_problem, refuse_hpz_group
from ..comm import Comm
from ..enums import Backend, Result
from ..errors import ZpcclError, ZpcclValueError
from ._collectives import Collectives
from ._deepspeed import CALL, CHECKED_DEEPSPEED, REDUCER, REPLACED, DeepSpeed, EngineFacts

log = logging.getLogger("zpccl.deepspeed")

#: The live handle, if any: the functions it replaces are DeepSpeed's module-level ones, one set per process, so
#: one engine at a time is served.
LIVE: list["ZeroPlusPlus"] = []


class ZeroPlusPlus(Session):
    """zpccl serving one DeepSpeed ZeRO-3 engine: its policy, communicators and counters.

    Made by :func:`~zpccl.deepspeed.enable`; :meth:`disable` gives DeepSpeed its own functions back and frees the
    communicators.
    """

    def __init__(self, ds: DeepSpeed, engine: Any, policy: ZeroPlusPlusPolicy, facts: EngineFacts,
                 call: str = CALL) -> None:
        self._ds, self.engine, self.facts = ds, engine, facts
        self._call = call  # what the user called (enable, or initialize), named by every refusal of the set-up
        #: What serves the engine, as :func:`~zpccl.deepspeed.enable` was told.
        self.policy = policy
        self.report = Report(log, own="DeepSpeed's own collective", prefix="deepspeed_")
        self.collectives = Collectives(ds, policy, facts, self.report)
        self._originals: dict[int, Any] = {}  # REPLACED index -> DeepSpeed's function
        self._ours: dict[int, Any] = {}
        # (owner, attribute, the owner's own attribute before (None: its class's), ours): the wrapped fetches of the
        # parameters and the optimizer's reduction.
        self._wrapped: list[tuple[Any, str, Any, Any]] = []
        self._all_reduce_owners: list[Any] = []  # the Inits whose use_all_reduce_for_fetch_params zpccl turned off
        self._closed = False

    # ---- what it serves ----

    @property
    def backend(self) -> Backend | None:
        """The backend of zpccl's communicators (cuda, or host for an engine on DeepSpeed's CPU accelerator)."""
        comm = self.collectives.gather or self.collectives.reduce
        return comm.backend if comm is not None else None

    @property
    def hpz_size(self) -> int | None:
        """The ranks of the hpZ groups zpccl serves (DeepSpeed's zero_hpz_partition_size), or None."""
        comm = self.collectives.hpz_comm
        return comm.hpz_size if comm is not None else None

    # ---- set-up ----

    def attach(self) -> None:
        """Makes the communicators over the data-parallel group (collectively, in the same order on every rank),
        checks DeepSpeed's hpZ groups, then puts zpccl's functions in DeepSpeed's place."""
        policy, facts, calls, call = self.policy, self.facts, self.collectives, self._call
        serve_hpz = policy.hpz and facts.hpz_group is not None
        if policy.weight_bits is None and policy.grad_bits is None and not serve_hpz and not facts.persistent:
            raise ZpcclValueError(f"{call}: weight_bits=None and grad_bits=None leave zpccl hpZ and the persistent "
                                  "parameters' gathers, and the engine has neither an hpZ group "
                                  "(zero_optimization.zero_hpz_partition_size of at least 2) nor persistent "
                                  "parameters (stage3_param_persistence_threshold)", call)
        if policy.weight_bits is not None and facts.all_reduce_fetch and None in facts.fetch_owners:
            raise ZpcclError(Result.INVALID_USAGE, f"{call}: stage3_use_all_reduce_for_fetch_params makes ZeRO-3 "
                             "fetch parameters with an exact all-reduce, which never reaches the gather zpccl "
                             f"replaces, and DeepSpeed {self._ds.version} keeps that setting where zpccl cannot "
                             "reach it: set zero_optimization.stage3_use_all_reduce_for_fetch_params to false, or "
                             "weight_bits=None", call)
        reduces = facts.optimizer is not None  # an engine without an optimizer reduces no gradients
        if policy.grad_bits is not None and reduces and not callable(getattr(facts.optimizer, REDUCER, None)):
            raise ZpcclError(Result.INVALID_USAGE, f"{call}: the engine's ZeRO-3 optimizer lacks "
                             f"{REDUCER.split('__')[-1]}, which runs its gradient reductions in DeepSpeed "
                             f"{CHECKED_DEEPSPEED}; this is DeepSpeed {self._ds.version}: install DeepSpeed "
                             f"{CHECKED_DEEPSPEED}, or grad_bits=None", call)
        if policy.grad_bits is not None or serve_hpz:
            # With grad_bits=None, or no optimizer to reduce with, it is made for the node layout only, and closed
            # once the gathers' is made.
            calls.reduce = self._make(reduce=True)
        if serve_hpz:
            self._check_hpz_groups(calls.reduce)
        if policy.weight_bits is not None or serve_hpz:
            calls.gather = self._make(reduce=False, hpz_size=facts.hpz_size if serve_hpz else None)
        if serve_hpz:
            calls.hpz_comm = calls.gather
            ours, theirs = calls.gather.hpz_rank, self._ds.dist.get_rank(facts.hpz_group)
            if ours != theirs:
                raise ZpcclError(Result.INTERNAL_ERROR, f"{call}: zpccl's hpZ rank {ours} is not this rank's place "
                                 f"{theirs} in DeepSpeed's hpZ group", call)
        if (policy.grad_bits is None or not reduces) and calls.reduce is not None:
            calls.reduce.close()
            calls.reduce = None
        calls.prepare({self._ds.gather_dtype(p) for p in facts.params}, len(calls.dp_ranks))
        self._say_what_stays()
        self._replace()
        log.info("zpccl.deepspeed: ZeRO-3 over %d ranks on %s: %s, %s, %s, blocks of %d%s%s", len(calls.dp_ranks),
                 self.backend.name.lower() if self.backend is not None else "?",
                 "all-gathers on DeepSpeed's" if policy.weight_bits is None else "qwZ int%d" % policy.weight_bits,
                 "hpZ groups of %d" % facts.hpz_size if serve_hpz else "no hpZ",
                 "no optimizer, no gradient reductions" if not reduces else
                 "reduce-scatters on DeepSpeed's" if policy.grad_bits is None else "qgZ int%d" % policy.grad_bits,
                 policy.block_size,
                 " (gradients' of %d)" % policy.grad_block if policy.grad_block != policy.block_size else "",
                 ", blocks restart at parameters" if policy.param_blocks else "")

    def _make(self, reduce: bool, hpz_size: int | None = None) -> Comm:
        """A communicator over the data-parallel group, in the blocks of its collective: cuda-backend on an NCCL
        group (the reduce-scatters' not wrapping torch's NCCL communicator, so that DeepSpeed's gather and reduce
        streams really overlap), host-backend on a group of CPU tensors (gloo)."""
        # ranks_per_node numbers the world's ranks: the data-parallel group is a subgroup beside model parallelism.
        config = dict(self.policy.comm_config(reduce, self._ds.dist.get_rank()), hpz_size=hpz_size)
        device = self.facts.device
        if backend_for(device, self._call, "DeepSpeed's accelerator runs on") == Backend.CUDA:
            return Comm.from_torch_group(self.facts.dp_group, device=device, wrap=False if reduce else None, **config)
        return Comm.from_torch_group(self.facts.dp_group, device="cpu", **config)

    def _check_hpz_groups(self, comm: Comm) -> None:
        """Checks, with every rank of the data-parallel group, that each rank's DeepSpeed hpZ group is one of zpccl's
        hpZ groups: k consecutive local ranks of one node, from a multiple of k, in order. Every rank reaches the
        same verdict from the same gathered facts."""
        dist, facts, call, dp_ranks = self._ds.dist, self.facts, self._call, self.collectives.dp_ranks
        k = facts.hpz_size
        mine = dict(rank=dist.get_rank(), node=comm.node_rank, local=comm.local_rank, local_size=comm.local_size,
                    hpz=list(self._ds.group_ranks(facts.hpz_group)))
        everyone: list[Any] = [None] * comm.nranks
        dist.all_gather_object(everyone, mine, group=facts.dp_group)
        by_rank = {e["rank"]: e for e in everyone}
        for group in sorted({tuple(e["hpz"]) for e in everyone}):
            members = [by_rank.get(r) for r in group]
            if any(m is None for m in members):
                # DeepSpeed makes its hpZ groups of consecutive world ranks whatever the model-parallel layout, and
                # an mpu that gives consecutive ranks to different data-parallel groups splits them: no size of k
                # keeps them inside one.
                raise ZpcclValueError(
                    f"{call}: zero_hpz_partition_size={k} makes DeepSpeed gather weights from its secondary "
                    f"partitions over ranks {list(group)}, which are not all in the data-parallel group "
                    f"{list(dp_ranks)}: DeepSpeed groups {k} consecutive ranks of the world, and the model-"
                    "parallel layout (mpu) puts consecutive ranks in different data-parallel groups. Set "
                    "zero_optimization.zero_hpz_partition_size to 1, or hpz=False to leave that gather on "
                    "DeepSpeed's", call)
            problem = hpz_group_problem(members, k)
            if problem:
                raise refuse_hpz_group(call, "zero_hpz_partition_size", k, "DeepSpeed gather weights from its "
                                       f"secondary partitions (the backward's) over ranks {list(group)}", problem,
                                       "DeepSpeed's")

    def _say_what_stays(self) -> None:
        facts, policy = self.facts, self.policy
        if policy.grad_bits is not None and not facts.reduce_scatter:
            self.report.say_once("reduce_scatter_false", "zero_optimization.reduce_scatter=false makes DeepSpeed "
                                 "all-reduce gradient buckets that fit reduce_bucket_size; those stay DeepSpeed's")
        if facts.hpz_group is not None and not policy.hpz:
            self.report.say_once("hpz_off", "hpz=False: the gathers over DeepSpeed's hpZ groups (from the secondary "
                                 "partitions) stay DeepSpeed's", logging.INFO)
        if facts.persistent:
            numel = sum(p.ds_numel for p in facts.persistent)
            self.report.say_once("persistent", f"{len(facts.persistent)} persistent parameters ({numel} elements, "
                                 "each smaller than stage3_param_persistence_threshold) stay gathered; after each "
                                 "step DeepSpeed gathers them again exactly, as its ZeRO++ does, and zpccl makes "
                                 "that one exact all-gather on DeepSpeed's group where DeepSpeed makes one per "
                                 "parameter (summary()'s persistent_gather)", logging.INFO)

    def _replace(self) -> None:
        """DeepSpeed's three functions replaced by zpccl's; each parameter's all_gather (its exact gathers) and
        all_gather_coalesced (where zpccl serves gathers), the optimizer's gradient reduction (with qgZ) and the
        engine's destroy (which disables first) wrapped; with qwZ, the fetches' use_all_reduce_for_fetch_params
        off."""
        calls, ds = self.collectives, self._ds
        ours = {0: functools.partial(_all_gather, calls, ds.function(0)),
                1: functools.partial(_reduce_scatter, calls, ds.function(1)),
                2: functools.partial(_quant_reduce, calls, ds.function(2))}
        for i, fn in ours.items():
            self._originals[i] = ds.function(i)
            self._ours[i] = fn
            ds.set_function(i, fn)
        if self.policy.weight_bits is not None:
            # stage3_use_all_reduce_for_fetch_params fetches several parameters with an all-reduce of a zero-padded
            # buffer instead of a gather. DeepSpeed's own quantized gathers take precedence over it; zpccl's qwZ
            # takes the same precedence, so that the fetches reach the gather it replaces.
            for owner in self.facts.fetch_owners:
                if getattr(owner, "use_all_reduce_for_fetch_params", False):
                    owner.use_all_reduce_for_fetch_params = False
                    self._all_reduce_owners.append(owner)
            if self._all_reduce_owners:
                self.report.say_once("all_reduce_fetch", "stage3_use_all_reduce_for_fetch_params: the parameter "
                                     "fetches it all-reduces are qwZ gathers instead, as DeepSpeed's own quantized "
                                     "gathers are (disable() gives the setting back)", logging.INFO)
        for p in self.facts.params:
            self._wrap(p, "all_gather", functools.partial(_exact, calls, p.all_gather, p))
        if calls.gather is not None:  # qwZ or hpZ: the gathers of the engine's own fetches
            for p in self.facts.params:
                self._wrap(p, "all_gather_coalesced", functools.partial(_fetch, calls, p.all_gather_coalesced))
        optimizer = self.facts.optimizer
        if calls.reduce is not None and optimizer is not None:
            self._wrap(optimizer, REDUCER, functools.partial(_reduction, calls, getattr(optimizer, REDUCER)))
        if callable(getattr(self.engine, "destroy", None)):
            # A destroyed engine is never served again, and the next engine of the process (a sweep, a restart)
            # must find DeepSpeed's functions and no live session.
            self._wrap(self.engine, "destroy", functools.partial(_destroy, self, self.engine.destroy))

    def _wrap(self, owner: Any, name: str, ours: Any) -> None:
        self._wrapped.append((owner, name, vars(owner).get(name), ours))
        setattr(owner, name, ours)

    # ---- lifecycle ----

    def disable(self) -> None:
        """Gives DeepSpeed its own functions back and destroys zpccl's communicators. Idempotent. Call it between
        steps."""
        if self._closed:
            return
        self._closed = True
        ds = self._ds
        for i, theirs in self._originals.items():
            if ds.function(i) is self._ours[i]:
                ds.set_function(i, theirs)
            else:
                module, name, _ = REPLACED[i]
                log.warning("zpccl.deepspeed: %s.%s was replaced again after enable; disable leaves it as it is",
                            module, name)
        for owner, name, before, ours in reversed(self._wrapped):
            if vars(owner).get(name) is ours:
                if before is None:
                    delattr(owner, name)  # the class's own again
                else:
                    setattr(owner, name, before)
        self._wrapped.clear()
        for owner in self._all_reduce_owners:
            owner.use_all_reduce_for_fetch_params = True
        self._all_reduce_owners.clear()
        if self.facts.device.type == "cuda":
            ds.torch.cuda.synchronize(self.facts.device)
        for comm in (self.collectives.gather, self.collectives.reduce):
            if comm is not None:
                comm.close()
        self.collectives.gather = self.collectives.reduce = self.collectives.hpz_comm = None
        self.collectives.release()
        if self in LIVE:
            LIVE.remove(self)


# What DeepSpeed calls in place of its own (bound to the handle's Collectives and DeepSpeed's function).

def _all_gather(calls: Collectives, theirs: Any, input_tensor: Any, output_tensor: Any, group: Any = None) -> Any:
    return calls.all_gather(input_tensor, output_tensor, group, lambda: theirs(input_tensor, output_tensor, group))


def _reduce_scatter(calls: Collectives, theirs: Any, tensors: Any, group: Any = None) -> Any:
    tensors = list(tensors)
    return calls.reduce_scatter(tensors, group, lambda: theirs(tensors, group))


def _quant_reduce(calls: Collectives, theirs: Any, tensors: Any, groups: Any) -> Any:
    tensors = list(tensors)
    return calls.quant_reduce(tensors, lambda: theirs(tensors, groups))


def _fetch(calls: Collectives, theirs: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
    params = list(params)
    with calls.fetching(params):
        return theirs(params, *args, **kwargs)


def _reduction(calls: Collectives, theirs: Any, *args: Any, **kwargs: Any) -> Any:
    with calls.reducing():
        return theirs(*args, **kwargs)


def _destroy(session: ZeroPlusPlus, theirs: Any, *args: Any, **kwargs: Any) -> Any:
    session.disable()
    return theirs(*args, **kwargs)


def _exact(calls: Collectives, theirs: Any, param: Any, param_list: Any = None, async_op: bool = False,
           *args: Any, **kwargs: Any) -> Any:
    params = [param] if param_list is None else list(param_list)
    return calls.exact_gather(params, param_list is None, not async_op,
                              lambda: theirs(params, async_op, *args, **kwargs))
