"""The state of one ``enable``: :class:`ZeroPlusPlus`, what it serves (:class:`Served`, one per FSDP parameter
group) and the registry of served groups that keeps a second ``enable`` from stacking on them."""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from .._policy import ZeroPlusPlusPolicy
from .._session import Session
from ..enums import Result
from ..errors import ZpcclError
from ._collectives import Collectives
from ._groups import Communicators, Group, Hpz
from ._post_forward import PostForward, off_wrapped
from ._report import Report
from ._torch_fsdp import TorchFsdp, fsdp_modules, param_groups, unwatch_reduced_params


@dataclass(eq=False)
class Served:
    """One FSDP parameter group that zpccl serves: what its hooks read, and what disable() puts back. A group is
    served once however many modules share it (``fully_shard([m1, m2])``)."""

    param_group: Any
    module: Any  # the FSDP module whose state holds it (the first of the modules sharded together)
    name: str  # that module's name in the model ("" for the model itself), for messages
    group: Group | None = None  # its shard group's communicators
    hpz: Hpz | None = None  # its post-forward group's, when hpZ serves its backward gather
    hooked: bool = False  # whether its FSDP collectives below were replaced
    all_gather: Any = None  # FSDP's collectives before enable
    reduce_scatter: Any = None
    post_forward: PostForward | None = None  # hpz_size's change to its post-forward mesh
    reduced: list[Any] | None = None  # the FSDPParams its latest reduce-scatter holds, where torch tells them
    session: Any = None  # the ZeroPlusPlus that serves it, kept alive by the hooks FSDP holds

    @property
    def label(self) -> str:
        return repr(self.name) if self.name else "the model"

    @property
    def module_label(self) -> str:
        """"module 'name'", or "the model" (for messages that name the module in a sentence)."""
        return f"module {self.name!r}" if self.name else "the model"


#: id(FSDP parameter group) -> the live ZeroPlusPlus that serves it. Served groups, not models, are what a second
#: enable must not stack on: a model, a module inside it and a model around it share them. Weak: a session lives
#: as long as FSDP holds its hooks (through :attr:`Served.session`) or the user holds it, so a model dropped
#: without disable() is freed, as FSDP's own is; an entry goes with its session, before its group's id can be
#: reused.
SERVED: "weakref.WeakValueDictionary[int, ZeroPlusPlus]" = weakref.WeakValueDictionary()


def _reads(path: str, doc: str) -> property:
    """A read-only attribute that reads ``self.<path>`` (what the session holds, told where it lives)."""
    get = attrgetter(path)
    return property(lambda self: get(self), doc=doc)


class ZeroPlusPlus(Session):
    """zpccl serving one FSDP2 model: its policy, communicators (:attr:`comms`), the collectives its hooks call
    (:attr:`collectives`, with their staging buffers) and counters.

    Made by :func:`~zpccl.fsdp.enable`; :meth:`disable` puts FSDP's previous collectives back and frees the
    communicators.
    """

    def __init__(self, fsdp: TorchFsdp, model: Any, policy: ZeroPlusPlusPolicy, served: list[Served],
                 device: Any) -> None:
        self._fsdp, self.model = fsdp, model
        #: What serves the model, as :func:`~zpccl.fsdp.enable` was told.
        self.policy = policy
        self.device: Any = device
        self.report = Report()
        self.comms = Communicators(fsdp, policy, self.device)
        self.collectives = Collectives(fsdp, policy, self.device, self.report, self.comms.ranks)
        self._served = list(served)  # the parameter groups, in module order
        self._closed = False
        self.collectives.first_call = self._say_sharded_after

    # ---- what it holds (the policy's choices: Session) ----

    backend = _reads("comms.backend", "The backend of zpccl's communicators (cuda, or host for CPU parameters).")
    _groups = _reads("comms.groups", "Each shard group's communicators, by its global ranks.")
    reserved_bytes = _reads("collectives.reserved_bytes", "Bytes of the two staging buffers, in torch's caching "
                            "allocator.")
    residual_bytes = _reads("collectives.residual_bytes", "Bytes the error-feedback residuals hold (the senders').")
    hop_residual_bytes = _reads("collectives.hop_residual_bytes", "Bytes the intermediate hop's error-feedback "
                                "residuals hold.")

    @property
    def staging_grown(self) -> bool:
        """Whether a call found a staging buffer too small and allocated a larger one (a defect of the
        reservation: nothing should allocate in the training loop)."""
        return any(s is not None and s.grown for s in (self.collectives.gather_stage, self.collectives.reduce_stage))

    # ---- reporting ----

    def summary(self) -> dict[str, dict[str, int]]:
        """The counters as plain dicts: ``{"qwz": {"calls": .., "logical_bytes": .., "wire_bytes": ..}, ...}``.
        With error feedback, ``"grad_residuals"`` counts the qgZ calls that fed back (``calls``) and the memory of
        the residuals (``residual_bytes``, ``hop_residual_bytes``, ``tensors``); it sends nothing itself."""
        out = self.report.summary()
        if self.error_feedback:
            fed = out.pop("grad_residuals", dict(calls=0, logical_bytes=0, wire_bytes=0))
            out["grad_residuals"] = dict(fed, residual_bytes=self.residual_bytes,
                                         hop_residual_bytes=self.hop_residual_bytes,
                                         tensors=len(self.collectives.residuals))
        return out

    def _say_sharded_after(self) -> None:
        """Says once, at the first collective, which of the model's FSDP parameter groups zpccl does not serve
        because they were made after enable (fully_shard on the root after enable, say): the collectives FSDP
        runs for those never reach zpccl's hooks, so no other line would tell."""
        mine = {id(s.param_group) for s in self._served}
        late: list[str] = []
        for name, module in fsdp_modules(self.model):
            for pg in param_groups(module):
                if (id(pg) in mine or id(pg) in SERVED or getattr(pg, "mesh_info", None) is None
                        or self._fsdp.dist.get_world_size(pg.mesh_info.shard_process_group) < 2):
                    continue  # served here or by another enable; or a group of one rank (said at enable)
                mine.add(id(pg))
                late.append(repr(name) if name else "the model")
        if late:
            self.report.say_once("sharded after enable", f"modules {late} were sharded after enable: zpccl serves "
                                 "the FSDP parameter groups a model has when enable runs, so theirs stay on FSDP's "
                                 "own collectives; call enable after fully_shard on every module")

    # ---- lifecycle ----

    def disable(self) -> None:
        """Gives every module its previous collectives (and, under ``hpz_size``, its post-forward mesh) back and
        destroys zpccl's communicators. Idempotent. Call it between steps, not between a forward and its
        backward; after a forward without gradients (an evaluation), whose modules hold their shard of
        ``hpz_size``'s group with no backward to follow, those go back to their shard of the shard group."""
        if self._closed:
            return
        held = [repr(s.name) if s.name else "the model" for s in self._served
                if s.post_forward and s.post_forward.backward_follows and s.param_group.is_sharded_post_forward]
        if held:
            raise ZpcclError(Result.INVALID_USAGE, f"zpccl.fsdp.disable: modules [{', '.join(held)}] hold their "
                             "parameters resharded to hpz_size's groups between a forward and its backward; call "
                             "disable() after the backward", "zpccl.fsdp.disable")
        self._closed = True
        for served in self._served:
            if served.hooked:
                served.param_group._all_gather_comm = served.all_gather
                served.param_group._reduce_scatter_comm = served.reduce_scatter
                unwatch_reduced_params(served.param_group, served)
            off_wrapped(served.param_group)  # hpz_size's check may be there before the hooks (a failed enable)
            if served.post_forward is not None:
                served.post_forward.restore(served.param_group)
            if SERVED.get(id(served.param_group)) is self:
                del SERVED[id(served.param_group)]
        self._served.clear()
        if self.device is not None and self.device.type == "cuda":
            self._fsdp.torch.cuda.synchronize(self.device)
        self.comms.close()
        self.collectives.release()
