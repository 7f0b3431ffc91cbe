"""zpccl's communicators over the model's own process groups (the user passes nothing else).

Per shard group, one communicator for the gathers and one for the reduce-scatters, so that FSDP's all-gather and
reduce-scatter streams really overlap (one communicator serializes its calls). The gathers' communicator also
serves hpZ for one post-forward group size (the smallest); each further size over the same shard group gets an
hpZ communicator of its own. Before any is made for hpZ, every rank of the shard group checks that FSDP's
post-forward groups are zpccl's hpZ groups. On CUDA they are cuda-backend communicators
(``Comm.from_torch_group``); with CPU parameters host-backend ones: over the group's own collectives when its ranks
are processes (gloo, under torchrun), among threads on torch's threaded process group.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import _torch as _ztorch
from .._policy import ZeroPlusPlusPolicy
from .._session import backend_for, hpz_group_problem, refuse_hpz_group
from ..comm import Comm, get_unique_id
from ..enums import UNIQUE_ID_BYTES, Backend, Result
from ..errors import ZpcclError, ZpcclValueError
from ._torch_fsdp import CALL, TorchFsdp, post_forward_group


@dataclass(frozen=True)
class Hpz:
    """hpZ for FSDP's post-forward groups of k ranks over one shard group."""

    k: int
    comm: Comm  # the gathers' communicator where its hpZ group is FSDP's group of k, else one of its own
    ranks: tuple[int, ...]  # this rank's post-forward group: global ranks, in group-rank order


@dataclass(eq=False)
class Group:
    """zpccl's communicators for one shard group."""

    ranks: tuple[int, ...]  # global ranks, in group-rank order
    gather: Comm | None = None  # qwZ, and hpZ for one k (None with weight_bits=None)
    reduce: Comm | None = None  # qgZ (None with grad_bits=None)
    hpz: dict[int, Hpz] = field(default_factory=dict)  # k -> its hpZ
    nodes: list[dict[str, int]] | None = None  # each group rank's node, local rank and local size (hpZ's checks)

    def close(self) -> None:
        comms = [self.gather, self.reduce] + [h.comm for h in self.hpz.values() if h.comm is not self.gather]
        for comm in comms:
            if comm is not None:
                comm.close()


class Communicators:
    """The :class:`Group` of every shard group one session serves, made collectively over each, in module order
    on every rank."""

    def __init__(self, fsdp: TorchFsdp, policy: ZeroPlusPlusPolicy, device: Any) -> None:
        self.fsdp, self.policy, self.device = fsdp, policy, device
        self.groups: dict[tuple[int, ...], Group] = {}  # shard group's global ranks -> its communicators
        self.backend: Backend | None = None
        self._ranks_of: dict[Any, tuple[int, ...]] = {}

    def ranks(self, group: Any) -> tuple[int, ...]:
        """The global ranks of a process group, in group-rank order (looked up once a group)."""
        ranks = self._ranks_of.get(group)
        if ranks is None:
            ranks = self._ranks_of[group] = tuple(self.fsdp.dist.get_process_group_ranks(group))
        return ranks

    def group_of(self, shard: Any, served: list[Any]) -> Group:
        """The entry of shard group ``shard``, opened at its first parameter group (:meth:`_open`)."""
        return self.groups.get(self.ranks(shard)) or self._open(shard, served)

    def close(self) -> None:
        for g in self.groups.values():
            g.close()
        self.groups.clear()

    def _open(self, shard: Any, served: list[Any]) -> Group:
        """A shard group's entry, with its reduce-scatters' communicator, and the node layout that hpZ's checks
        need. The gathers' communicators come later (:meth:`serve_gathers`): their hpZ groups depend on the
        post-forward groups."""
        policy = self.policy
        g = self.groups[self.ranks(shard)] = Group(self.ranks(shard))
        self.backend = backend_for(self.device, CALL, "parameters on")
        hpz = policy.weight_bits is not None and policy.hpz and (policy.hpz_size is not None or any(
            post_forward_group(s.param_group) is not None for s in served
            if self.ranks(s.param_group.mesh_info.shard_process_group) == g.ranks))
        if policy.grad_bits is not None or hpz:
            # With grad_bits=None it is made for the node layout only, and closed once the gathers' are made.
            g.reduce = self._make(shard, reduce=True, wrap=False)
        if hpz:
            mine = dict(node=g.reduce.node_rank, local=g.reduce.local_rank, local_size=g.reduce.local_size)
            g.nodes = [{} for _ in g.ranks]
            self.fsdp.dist.all_gather_object(g.nodes, mine, group=shard)
        return g


    def _make(self, shard: Any, reduce: bool, hpz_size: int | None = None, wrap: bool | None = None) -> Comm:
        # Each communicator quantizes in its own collective's blocks (gradients' and weights' may differ).
        config = dict(self.policy.comm_config(reduce, self.fsdp.dist.get_rank()), hpz_size=hpz_size)
        if self.device.type == "cuda":
            return Comm.from_torch_group(shard, device=self.device, wrap=wrap, **config)
        # Ranks as processes (gloo, under torchrun): the host backend's exchanges run as the group's own collectives,
        # the node layout the launcher's unless given. Ranks as threads (torch's threaded group): they meet under a
        # unique id.
        if str(self.fsdp.dist.get_backend(shard)).lower() != "threaded":
            return Comm.from_torch_group(shard, backend="host", **config)
        rank, nranks, _ = _ztorch.group_info(shard)
        uid = get_unique_id() if rank == 0 else bytes(UNIQUE_ID_BYTES)
        uid = _ztorch.broadcast_bytes(uid, UNIQUE_ID_BYTES, shard, "cpu")
        return Comm(nranks, rank, uid, backend="host", **config)

    def serve_gathers(self, g: Group, served: list[Any]) -> None:
        """The gathers' communicator of one shard group, and hpZ for each post-forward group size k its parameter
        groups use: the gathers' communicator takes the smallest k as its hpZ group, every other k gets a
        communicator of its own; each served group gets its k's :class:`Hpz`. Checked first, with every rank of
        the group, that FSDP's post-forward groups are zpccl's hpZ groups."""
        policy = self.policy
        by_k: dict[int, list[Any]] = {}
        mine: dict[int, tuple[int, ...]] = {}  # k -> this rank's post-forward group
        for s in served:
            pf = post_forward_group(s.param_group) if policy.hpz and policy.weight_bits is not None else None
            if pf is not None:
                by_k.setdefault(pf.size(), []).append(s)
                ranks = mine.setdefault(pf.size(), self.ranks(pf))
                if ranks != self.ranks(pf):
                    raise ZpcclError(Result.INTERNAL_ERROR, f"{CALL}: parameter groups over shard group "
                                     f"{list(g.ranks)} put this rank in two post-forward groups of {pf.size()}: "
                                     f"{list(ranks)} and {list(self.ranks(pf))}", CALL)
        shard = served[0].param_group.mesh_info.shard_process_group
        if by_k:
            self._check_hpz_groups(g, shard, mine, by_k)
        try:
            if policy.weight_bits is not None:
                ks = sorted(by_k)
                g.gather = self._make(shard, reduce=False, hpz_size=ks[0] if ks else None)
                for k in ks:
                    comm = g.gather if k == ks[0] else self._make(shard, reduce=False, hpz_size=k)
                    g.hpz[k] = Hpz(k, comm, mine[k])
                    if comm.hpz_rank != mine[k].index(g.ranks[comm.rank]):
                        raise ZpcclError(Result.INTERNAL_ERROR, f"{CALL}: zpccl's hpZ rank {comm.hpz_rank} is not "
                                         f"this rank's place in FSDP's post-forward group {list(mine[k])}", CALL)
                    for s in by_k[k]:
                        s.hpz = g.hpz[k]
        finally:
            if policy.grad_bits is None and g.reduce is not None:
                g.reduce.close()
                g.reduce = None

    def _check_hpz_groups(self, g: Group, shard: Any, mine: dict[int, tuple[int, ...]],
                          by_k: dict[int, list[Any]]) -> None:
        """Checks, with every rank of the shard group, that each of FSDP's post-forward groups of k ranks, for every
        k the group's modules use, is one of zpccl's hpZ groups of size k (k consecutive local ranks of one node,
        from a multiple of k, in order). Every rank reaches the same verdict: all look at the same gathered
        facts."""
        theirs: list[Any] = [None] * len(g.ranks)
        self.fsdp.dist.all_gather_object(theirs, {k: list(r) for k, r in mine.items()}, group=shard)
        index = {r: i for i, r in enumerate(g.ranks)}
        if any(set(t) != set(mine) for t in theirs):
            raise ZpcclValueError(f"{CALL}: the ranks of shard group {list(g.ranks)} shard their modules with "
                                  f"different reshard_after_forward sizes ({[sorted(t) for t in theirs]}): every rank "
                                  "must shard the same model the same way", CALL)
        for k in sorted(mine):
            for pf in (t[k] for t in theirs):
                problem = hpz_group_problem([g.nodes[index[r]] for r in pf], k)
                if problem:
                    given = "hpz_size" if all(s.post_forward for s in by_k[k]) else "reshard_after_forward"
                    raise refuse_hpz_group(CALL, given, k, f"FSDP gather backward weights over ranks "
                                           f"{[index[r] for r in pf]} of the shard group", problem, "NCCL",
                                           f" (modules {[s.name for s in by_k[k]]})")
