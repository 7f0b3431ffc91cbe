"""``hpz_size``: post-forward groups for front ends that take only a bool.

Where a front end shards with ``reshard_after_forward=True`` only (torchtitan, Accelerate), ``hpz_size=k`` gives
those modules FSDP's post-forward groups of k ranks, made by FSDP's own post-forward mesh machinery, exactly what
``reshard_after_forward=k`` makes; their backward gathers are then hpZ. ``set_reshard_after_forward(True)`` after
``enable`` (FSDP's docs toggle it around an evaluation) means k again: the group of k is put back in the parameter
group's post_forward, before FSDP reshards. A group still in its shard of k when its post-forward mesh changes
(``set_reshard_after_forward(False)``, then ``unshard()``: torchtitan's chunked loss) goes back to its shard of the
shard group before FSDP gathers it, over that group. :meth:`PostForward.restore` puts FSDP's back when the session
is disabled. A module sharded with an int, or (under hpz_size) one with no post-forward group when enable ran,
keeps FSDP's meaning of that True (the whole shard group), and the log says so once when a backward gather follows
such a reshard (:func:`say_when_set_true`).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import ZpcclValueError
from ._report import Report
from ._torch_fsdp import CALL, POST_FORWARD_DERIVED, TorchFsdp, fsdp_modules, fsdp_modules_anywhere


@dataclass(eq=False)
class PostForward:
    """A parameter group's post-forward mesh as FSDP had it, and each of its parameters' own copy with the sizes
    FSDP derived from it when it made the parameter: what hpz_size replaces and disable() puts back."""

    info: Any  # the parameter group's
    ours: Any  # hpz_size's
    params: list[tuple[Any, Any, dict[str, Any]]]  # (FSDPParam, its post-forward mesh, its derived sizes)
    #: Whether the group's last forward ran with gradients: a backward follows it (else an evaluation).
    backward_follows: bool = False

    @staticmethod
    def save(pg: Any, ours: Any) -> "PostForward":
        return PostForward(pg.post_forward_mesh_info, ours, [
            (p, p.post_forward_mesh_info, {a: p.__dict__[a] for a in POST_FORWARD_DERIVED if a in p.__dict__})
            for p in pg.fsdp_params])

    def apply(self, torch: Any, pg: Any, said: Any) -> None:
        """What ``reshard_after_forward=k`` sets up when FSDP makes the group, on the group made with True; and, in
        the group's post_forward (where FSDP reads it, however the forward ran: a module's hooks or a method
        registered with register_fsdp_forward_method), the group of k put back where ``set_reshard_after_forward
        (True)`` has since set FSDP's whole shard group, calling ``said(pg)``."""
        for p, _info, _derived in self.params:
            p.post_forward_mesh_info = self.ours
            # FSDP derives these from the unsharded parameter's shape alone: a meta tensor of it stands in.
            p._init_sharded_post_forward_param_metadata(torch.empty(p._orig_size, device="meta"))
        pg.post_forward_mesh_info = self.ours

        def keep_k() -> None:
            self.backward_follows = torch.is_grad_enabled()
            info = pg.post_forward_mesh_info
            if info is not self.ours and info is not None and info == pg.mesh_info:  # True, set since enable
                pg.post_forward_mesh_info = self.ours
                said(pg)

        def shard_of_the_shard_group() -> None:
            # FSDP gathers a group held in its post-forward shard over the post-forward mesh it has now, which a
            # set_reshard_after_forward since the reshard has changed: that mesh does not hold the shard of k.
            if pg.post_forward_mesh_info is not self.ours:
                to_shard_of_the_shard_group(pg)

        on_post_forward(pg, keep_k)
        before_method(pg, "unshard", shard_of_the_shard_group)

    def restore(self, pg: Any) -> None:
        """FSDP's post-forward mesh back. A group held in its shard of k (after a forward without gradients)
        goes back to its shard of the shard group first: FSDP's mesh does not hold the shard of k."""
        to_shard_of_the_shard_group(pg)
        off_wrapped(pg)
        if pg.post_forward_mesh_info is self.ours:  # else the user has set reshard_after_forward since: theirs
            pg.post_forward_mesh_info = self.info
        for p, info, derived in self.params:
            p.post_forward_mesh_info = info
            for a in POST_FORWARD_DERIVED:
                if a in derived:
                    setattr(p, a, derived[a])
                else:
                    p.__dict__.pop(a, None)


def to_shard_of_the_shard_group(pg: Any) -> None:
    """A group held in its post-forward shard goes back to its shard of the shard group, which FSDP keeps all
    along (nothing is gathered), and frees the post-forward shard; its next gather is over the shard group."""
    if pg.is_sharded_post_forward:
        pg._to_sharded()
        for p in pg.fsdp_params:  # the shard of k, which FSDP frees only on its own way out of it
            p._sharded_post_forward_param = p._sharded_post_forward_param_data = None


#: The FSDPParamGroup methods that zpccl.fsdp runs a check before (:func:`before_method`).
WRAPPED = ("post_forward", "unshard")


def on_post_forward(pg: Any, check: Callable[[], None]) -> None:
    """Runs ``check()`` first in the parameter group's post_forward, where FSDP reads the post-forward mesh
    however the forward ran (a module's hooks, or a method registered with register_fsdp_forward_method)."""
    before_method(pg, "post_forward", check)


def before_method(pg: Any, name: str, check: Callable[[], None]) -> None:
    """Runs ``check()`` before the parameter group's method ``name`` (one of :data:`WRAPPED`) and any check put
    there before: an instance attribute over FSDP's method, which FSDP's own calls reach too (``self.unshard``),
    and which :func:`off_wrapped` removes."""
    inner = pg.__dict__.get(name) or getattr(type(pg), name).__get__(pg)

    def checked(*args: Any, **kwargs: Any) -> Any:
        check()
        return inner(*args, **kwargs)

    setattr(pg, name, checked)


def off_wrapped(pg: Any) -> None:
    for name in WRAPPED:
        pg.__dict__.pop(name, None)


def say_when_set_true(served: Any, report: Report, hpz_size: int | None) -> None:
    """For a group that hpz_size did not give a group of k (:attr:`Served.post_forward` None): says once when a
    backward gather follows a post-forward reshard to FSDP's whole shard group that ``set_reshard_after_forward
    (True)`` after enable asked for: that gather is qwZ, not hpZ. zpccl follows FSDP there (the user asked for
    True), and the log names what gives the module hpZ: a group sharded with the user's int k lost it to the True
    (FSDP's method takes only a bool: hpz_size=k keeps k through such a toggle); one with no post-forward group when
    enable ran (False, or FSDP's root) was none of hpz_size's (enable after the toggle gives it k). A gather after
    any other (an explicit ``reshard()``, as torchtitan's chunked loss makes) is over the whole group whatever the
    post-forward mesh: nothing is said."""
    pg = served.param_group
    resharded_whole = [False]  # the last reshard was a post-forward one to the whole shard group

    def post_forward() -> None:
        info = pg.post_forward_mesh_info
        resharded_whole[0] = info is not None and info == pg.mesh_info

    def unshard() -> None:
        backward = getattr(pg._training_state, "name", "") == "PRE_BACKWARD"
        if resharded_whole[0] and backward and pg.is_sharded:
            say()
        if not pg.is_sharded_post_forward:
            resharded_whole[0] = False

    def say() -> None:
        if served.hpz is not None:
            k = served.hpz.k
            report.say_once("set_reshard_after_forward over an int", f"set_reshard_after_forward(True) after enable "
                            f"put {served.module_label} (sharded with reshard_after_forward={k}) on FSDP's whole "
                            "shard group, as FSDP does (its method takes only a bool): its backward gathers are qwZ "
                            "over that group, not hpZ. To keep hpZ through such a toggle, shard with "
                            f"reshard_after_forward=True and enable(..., hpz_size={k})")
        else:
            report.say_once("set_reshard_after_forward over False", f"set_reshard_after_forward(True) after enable "
                            f"put {served.module_label}, which had no post-forward group when enable ran (False, or "
                            f"FSDP's root), on FSDP's whole shard group: hpz_size={hpz_size} gave groups of "
                            f"{hpz_size} to the modules sharded with True then, so its backward gathers are qwZ, not "
                            "hpZ. For hpZ there, call enable after set_reshard_after_forward(True)")

    on_post_forward(pg, post_forward)
    before_method(pg, "unshard", unshard)


def apply_hpz_size(fsdp: TorchFsdp, k: int, model: Any, served: list[Any], report: Report) -> None:
    """Gives the parameter groups sharded with reshard_after_forward=True a post-forward group of k ranks, as
    reshard_after_forward=k would have made them: through torch's own maker of post-forward meshes, one mesh per
    shard mesh, shared by its groups (their process groups made once). Every group is checked before any
    changes."""
    targets, unset = _targets(k, model, served, report)
    if not targets:
        report.say_once("hpz_size: nothing", f"hpz_size={k} serves no module: none is resharded after forward over "
                        "its whole shard group (reshard_after_forward=True) where FSDP can reshard it to a smaller "
                        "one", logging.INFO)
    for g in {id(s.group): s.group for s in targets}.values():
        _check_fits(k, g, [s for s in targets if s.group is g])
    for s in unset:
        say_when_set_true(s, report, k)
    meshes: dict[tuple, Any] = {}
    for s in targets:
        mesh = s.param_group.mesh_info.mesh
        key = (mesh.device_type, tuple(mesh.mesh.shape), tuple(mesh.mesh.flatten().tolist()))
        if key not in meshes:
            meshes[key] = fsdp.make_post_forward(k, s.param_group.mesh_info)
        s.post_forward = PostForward.save(s.param_group, meshes[key])
        s.post_forward.apply(fsdp.torch, s.param_group, lambda _pg, name=s.module_label: report.say_once(
                                 "hpz_size: set_reshard_after_forward",
                                 f"set_reshard_after_forward(True) after enable: hpz_size={k} keeps {name} "
                                 f"(and every other it applies to) on post-forward groups of {k}, whose backward "
                                 "gathers are hpZ, as at enable; call disable() for FSDP's whole shard group",
                                 logging.INFO))


def _targets(k: int, model: Any, served: list[Any], report: Report) -> tuple[list[Any], list[Any]]:
    """The parameter groups that hpz_size applies to: those resharded after forward over the whole shard group.
    Those it cannot apply to keep it, and the log says why once per reason. Also the groups it could apply to but
    that have no post-forward group (False, or FSDP's root), which set_reshard_after_forward(True) may put on the
    whole shard group later."""
    targets, kept, unset = [], {}, []
    nested: set[int] | None = None  # id() of every module some other FSDP module holds, made at the first need
    for s in served:
        pg = s.param_group
        if pg.post_forward_mesh_info is not None and pg.post_forward_mesh_info != pg.mesh_info:
            continue  # an int of the user's
        state = s.module._get_fsdp_state()
        if state._auto_reshard_after_forward and state._is_root is None and nested is None:
            nested = _nested_fsdp_modules(model)
        why = _why_not(k, s)
        if pg.post_forward_mesh_info is None or _default_root(s, nested):  # False, or a root FSDP sets to False
            if why is None:
                unset.append(s)
        elif why is None:
            targets.append(s)
        else:
            kept.setdefault(why, []).append(s.name)
    for why, names in kept.items():
        report.say_once("hpz_size: " + why, f"hpz_size={k} leaves modules {names} at reshard_after_forward=True: "
                        f"{why}", logging.INFO if why.startswith("its shard group") else logging.WARNING)
    return targets, unset


def _why_not(k: int, served: Any) -> str | None:
    """Why FSDP cannot give this parameter group a post-forward group of k ranks, or None where it can."""
    pg = served.param_group
    if len(served.group.ranks) == k:
        return (f"its shard group has {k} ranks: FSDP's post-forward group would be the shard group itself, whose "
                "backward gathers are qwZ")
    if getattr(pg.mesh_info, "is_spmd_mesh", False):  # before DTensors: an SPMD mesh's parameters are ones
        return "FSDP does not reshard a module of an SPMD mesh (dp_mesh_dims) to a smaller group"
    if any(p.is_dtensor for p in pg.fsdp_params):
        return "its parameters are DTensors (tensor parallel), which FSDP does not reshard to a smaller group"
    if dims := sorted({d for p in pg.fsdp_params if (d := _shard_dim(p))}):
        return (f"shard_placement_fn shards some of its parameters on {', '.join(f'Shard({d})' for d in dims)}, "
                "which FSDP's reshard to a smaller group does not reassemble (its backward fails there)")
    if any(getattr(p, "_release_all_gather_outputs_after_post_all_gather", False) for p in pg.fsdp_params):
        return "its all-gather extension releases the gathered outputs that a smaller group's shard is cut from"
    return None


def _shard_dim(param: Any) -> int:
    """The dim FSDP shards a parameter on (shard_placement_fn's choice; 0 by default)."""
    return getattr(getattr(param, "fsdp_placement", None), "dim", 0)


def _default_root(served: Any, nested: set[int] | None) -> bool:
    """Whether FSDP will set the module's reshard_after_forward to False as a root left at its default: it marks
    the outermost FSDP modules roots when the first forward runs; before that, those no other FSDP module holds
    (``nested``: :func:`_nested_fsdp_modules`)."""
    state = served.module._get_fsdp_state()
    if not state._auto_reshard_after_forward:
        return False
    if state._is_root is not None:
        return bool(state._is_root)
    return nested is not None and id(served.module) not in nested


def _nested_fsdp_modules(model: Any) -> set[int]:
    """id() of every module that an FSDP module other than itself holds: among the process's FSDP modules (enable
    may run on a module inside the model that FSDP runs), or, where torch does not list them, ``model``'s."""
    outer = fsdp_modules_anywhere()
    if outer is None:
        outer = [m for _name, m in fsdp_modules(model)]
    return {id(sub) for m in outer for sub in m.modules() if sub is not m}


def _check_fits(k: int, g: Any, served: list[Any]) -> None:
    """hpz_size against one shard group and its nodes; the same verdict on every rank (gathered facts)."""
    names = [s.name for s in served]
    if len(g.ranks) % k:
        raise ZpcclValueError(f"{CALL}: hpz_size {k} must divide the ranks of the shard group that modules {names} "
                              f"are sharded over, {len(g.ranks)}", CALL)
    sizes = sorted({f["local_size"] for f in g.nodes})
    if any(size % k for size in sizes):
        raise ZpcclValueError(f"{CALL}: hpz_size {k} must divide the ranks per node: the shard group of modules "
                              f"{names} has nodes of {sizes} ranks", CALL)
