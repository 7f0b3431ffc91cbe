"""What the framework integrations' sessions share (zpccl.fsdp's and zpccl.deepspeed's ``ZeroPlusPlus``): the
policy's choices read as the session's own attributes, the counters, the context manager, the backend a device
takes, and the rule that a framework's hpZ group must follow to be one of zpccl's.

It imports neither torch nor any integration: an integration imports it, never the reverse.
"""
from __future__ import annotations

from operator import attrgetter
from typing import Any

from ._policy import ZeroPlusPlusPolicy
from ._report import PathStats, Report
from .enums import Backend
from .errors import ZpcclValueError

__all__ = ["Session", "backend_for", "hpz_group_problem", "refuse_hpz_group"]


class Session:
    """The base of an integration's ``ZeroPlusPlus``: it holds ``policy`` and ``report`` and defines
    ``disable``. The policy's choices read as attributes (``zp.weight_bits`` is ``zp.policy.weight_bits``; see
    :class:`~zpccl.ZeroPlusPlusPolicy`): weight_bits, grad_bits, block_size, grad_block_size (the blocks the
    gradients use: grad_block_size, else block_size), hpz, hpz_size, param_blocks, error_feedback."""

    policy: ZeroPlusPlusPolicy
    report: Report

    @property
    def stats(self) -> dict[str, PathStats]:
        """The counters, by path (``"qwz"``, ``"hpz"``, ``"qgz"``, and one for each kind of call left on the
        framework's own collective)."""
        return self.report.stats

    def summary(self) -> dict[str, dict[str, int]]:
        """The counters as plain dicts: ``{"qwz": {"calls": .., "logical_bytes": .., "wire_bytes": ..}, ...}``."""
        return self.report.summary()

    def reset_stats(self) -> None:
        self.stats.clear()

    def disable(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.disable()


#: The session's attribute -> the policy's attribute it reads.
_POLICY_ATTRIBUTES = {name: name for name in ("weight_bits", "grad_bits", "block_size", "hpz", "hpz_size",
                                              "param_blocks", "error_feedback")}
_POLICY_ATTRIBUTES["grad_block_size"] = "grad_block"
for _name, _field in _POLICY_ATTRIBUTES.items():
    setattr(Session, _name, property(attrgetter("policy." + _field), doc=f"The policy's {_field} (read-only)."))


def hpz_group_problem(members: list[dict[str, int]], k: int) -> str | None:
    """Why the ranks ``members`` (in group order, each's ``node``, ``local`` rank and its node's ``local_size``)
    are not one of zpccl's hpZ groups of ``k`` ranks, k consecutive local ranks of one node from a multiple of k;
    None when they are."""
    nodes = sorted({m["node"] for m in members})
    local = [m["local"] for m in members]
    if len(nodes) > 1:
        return f"on nodes {nodes}"
    if members[0]["local_size"] % k:
        return f"on a node of {members[0]['local_size']} ranks, which groups of {k} do not divide"
    if local != list(range(local[0], local[0] + k)) or local[0] % k:
        return f"local ranks {local} of node {nodes[0]}, not {k} consecutive ones from a multiple of {k}"
    return None


def refuse_hpz_group(call: str, setting: str, k: int, gather: str, problem: str, left_on: str,
                     detail: str = "") -> ZpcclValueError:
    """The error of a framework's hpZ group that zpccl cannot serve: ``setting``\\ =k makes ``gather`` (who gathers
    over which ranks), which are ``problem`` (hpz_group_problem's); it says what to change, or hpz=False to leave
    that gather on ``left_on``. ``detail``: more about the group, said after the rule."""
    return ZpcclValueError(
        f"{call}: {setting}={k} makes {gather}, which are {problem}: hpZ keeps that gather inside one node, over {k} "
        f"consecutive ranks of it{detail}. Use a {setting} that divides the ranks per node (with ranks numbered "
        f"node by node), or hpz=False to leave that gather on {left_on}", call)


def backend_for(device: Any, call: str, where: str) -> Backend:
    """The backend of zpccl's communicators for the framework's torch ``device``: cuda on a CUDA device, host on the
    CPU; any other device refused, ``where`` (what runs there, ending "on") said before it."""
    if device.type == "cuda":
        return Backend.CUDA
    if device.type == "cpu":
        return Backend.HOST
    raise ZpcclValueError(f"{call}: {where} {device}: zpccl serves CUDA devices and, on its host backend, the CPU",
                          call)
