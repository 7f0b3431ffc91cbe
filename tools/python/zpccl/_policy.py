"""What a framework integration of zpccl is told: one frozen, validated policy, shared by every integration.

:class:`ZeroPlusPlusPolicy` holds the choices that ``zpccl.fsdp.enable`` takes (and that a DeepSpeed integration
takes the same way): code widths, block sizes, hpZ, blocks restarting at parameters, the node layout and qgZ's
rounding. It is checked once, when made, against the library's own bounds (:mod:`zpccl.enums`, equal to
include/zpccl.h's), so that a wrong value is refused before any communicator exists, with a message naming the
argument. What can only be checked against a model and its process groups (hpz_size against the ranks per node
of a shard group, say) is the integration's to check.

It imports neither torch nor any integration: an integration imports it, never the reverse.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .enums import BITS_INT4, BITS_INT8, BITS_RULE, BLOCK_SIZE_RULE, INT_MAX, Rounding, is_bits, is_block_size
from .errors import ZpcclTypeError, ZpcclValueError

__all__ = ["ZeroPlusPlusPolicy", "resolve_policy"]

_WHO = "ZeroPlusPlusPolicy"
#: qgZ's roundings by the names the policy takes ("nearest", "stochastic").
ROUNDINGS = tuple(r.name.lower() for r in Rounding)


@dataclass(frozen=True)
class ZeroPlusPlusPolicy:
    """How zpccl serves a model's collectives. Every field has a default; ``dataclasses.replace`` makes a variant.

    * ``weight_bits`` (4 or 8): qwZ's codes; ``grad_bits`` (4 or 8): qgZ's. ``None`` leaves that collective (the
      weights' all-gathers over the shard group, or the gradients' reduce-scatters) on the framework's own. Both
      None leave hpZ alone, exact gathers inside the node (``hpz`` must then be True): an integration whose hpZ
      gathers need no qwZ communicator serves it (zpccl.deepspeed), one that does refuses it (zpccl.fsdp).
    * ``block_size``: elements per quantization block, a power of two in [32, 8192]; ``grad_block_size``: the
      gradients' own, if given (else ``block_size``): smaller blocks follow a gradient's spread of magnitudes
      more closely, at a scale's 4 bytes a block.
    * ``hpz``: serve the backward all-gather over a node-local group (FSDP's ``reshard_after_forward=k``) with
      hpZ; ``hpz_size`` (an int >= 2 dividing the ranks per node, or None): give the modules resharded over the
      whole shard group such a group of that many ranks.
    * ``param_blocks``: blocks restart at each parameter boundary (costs a staging copy each way).
    * ``ranks_per_node`` (>= 1) / ``node_id`` (>= 0), at most one: emulate a node layout, nodes of that many
      consecutive ranks of the world / this rank's node label (otherwise a rank's node is its host, as NCCL tells
      it).
    * ``grad_rounding`` (``"nearest"`` or ``"stochastic"``) and ``seed`` (>= 0): qgZ's rounding of gradients;
      ``error_feedback``: keep a bf16 residual of what each reduce-scatter's quantization lost.

    Raises :class:`~zpccl.ZpcclValueError` (or :class:`~zpccl.ZpcclTypeError`) naming the argument to change.
    """

    weight_bits: int | None = BITS_INT8
    grad_bits: int | None = BITS_INT4
    block_size: int = 256
    grad_block_size: int | None = None
    hpz: bool = True
    hpz_size: int | None = None
    param_blocks: bool = True
    ranks_per_node: int | None = None
    node_id: int | None = None
    grad_rounding: str = "nearest"
    seed: int | None = None
    error_feedback: bool = False

    def __post_init__(self) -> None:
        for name in ("weight_bits", "grad_bits"):
            value = getattr(self, name)
            if value is not None and not (_is_int(value) and is_bits(value)):
                _refuse(f"{name} {value!r} must be {BITS_RULE} (or None: the framework's own collective)")
        if self.weight_bits is None and self.grad_bits is None and not self.hpz:
            _refuse("weight_bits and grad_bits are both None and hpz is False, so zpccl would serve nothing: give "
                    "one of them, or leave zpccl out")
        for name in ("block_size", "grad_block_size"):
            value = getattr(self, name)
            if (value is not None or name == "block_size") and not (_is_int(value) and is_block_size(value)):
                _refuse(f"{name} {value!r} must be {BLOCK_SIZE_RULE}")
        for name in ("hpz", "param_blocks", "error_feedback"):
            if not isinstance(getattr(self, name), bool):
                _refuse(f"{name} {getattr(self, name)!r} must be True or False")
        if self.grad_rounding not in ROUNDINGS:
            _refuse(f"grad_rounding {self.grad_rounding!r} must be one of {', '.join(map(repr, ROUNDINGS))}")
        if self.seed is not None and not (_is_int(self.seed) and 0 <= self.seed <= INT_MAX):
            _refuse(f"seed {self.seed!r} must be an int in [0, {INT_MAX}]")
        if self.grad_bits is None:
            given = [n for n, v in (("grad_block_size", self.grad_block_size is not None),
                                    ("error_feedback", self.error_feedback),
                                    ("grad_rounding", self.grad_rounding != "nearest")) if v]
            if given:
                _refuse(f"{' and '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to qgZ's gradients, which "
                        "grad_bits=None leaves on the framework's reduce-scatters: give grad_bits")
        self._check_layout()

    def _check_layout(self) -> None:
        """The node layout and hpz_size, as far as they can be told without the process groups."""
        for name, least in (("ranks_per_node", 1), ("node_id", 0)):
            value = getattr(self, name)
            if value is not None and not (_is_int(value) and least <= value <= INT_MAX):
                _refuse(f"{name} {value!r} must be an int of at least {least}, or None")
        if self.ranks_per_node is not None and self.node_id is not None:
            _refuse("ranks_per_node and node_id are exclusive: give the layout one way")
        k = self.hpz_size
        if k is None:
            return
        if not (_is_int(k) and 2 <= k <= INT_MAX):
            _refuse(f"hpz_size {k!r} must be an int of at least 2 (the ranks of an hpZ group, dividing the ranks "
                    "per node), or None")
        if self.weight_bits is None or not self.hpz:
            off, on = ("weight_bits=None", "give weight_bits (4 or 8)") if self.weight_bits is None else (
                "hpz=False", "set hpz=True")
            _refuse(f"hpz_size gives modules a backward gather for hpZ, which {off} leaves on the framework's "
                    f"all-gathers: drop hpz_size, or {on}")
        if self.ranks_per_node is not None and self.ranks_per_node % k:
            _refuse(f"hpz_size {k} must divide ranks_per_node {self.ranks_per_node}")

    @property
    def grad_block(self) -> int:
        """Elements per quantization block of the gradients: ``grad_block_size``, else ``block_size``."""
        return self.block_size if self.grad_block_size is None else self.grad_block_size

    def block(self, reduce: bool) -> int:
        """Elements per block of the reduce-scatters (gradients, ``reduce=True``) or of the all-gathers."""
        return self.grad_block if reduce else self.block_size

    def bits(self, reduce: bool) -> int | None:
        """Code bits of the reduce-scatters (``reduce=True``) or of the all-gathers; None: left to the framework."""
        return self.grad_bits if reduce else self.weight_bits

    def comm_config(self, reduce: bool, world_rank: int | None = None) -> dict[str, Any]:
        """The :class:`~zpccl.Comm` keyword arguments of a communicator for the reduce-scatters (``reduce=True``)
        or the all-gathers, in that collective's blocks. A collective left to the framework still needs a valid
        width in the communicator's config; it never uses it.

        ``world_rank``: this rank in the world, for a communicator over a subgroup of it (HSDP's shard group):
        ``ranks_per_node`` numbers the world's ranks, so the communicator is told this rank's node (``node_id``),
        not a count of its own ranks, which would lay its nodes out in the subgroup's numbering."""
        node_id, ranks_per_node = self.node_id, self.ranks_per_node
        if ranks_per_node is not None and world_rank is not None:
            node_id, ranks_per_node = world_rank // ranks_per_node, None
        config = dict(weight_bits=self.weight_bits or BITS_INT8, grad_bits=self.grad_bits or BITS_INT4,
                      block_size=self.block(reduce),
                      ranks_per_node=ranks_per_node, node_id=node_id, grad_rounding=self.grad_rounding,
                      grad_seed=self.seed)
        return {key: v for key, v in config.items() if v is not None}


_FIELDS = tuple(f.name for f in dataclasses.fields(ZeroPlusPlusPolicy))


def resolve_policy(call: str, policy: Any, options: dict[str, Any]) -> ZeroPlusPlusPolicy:
    """The policy a call runs with: ``policy``, or one made from the call's keyword arguments (the policy's
    fields); both at once is refused, naming them. Errors name ``call``."""
    unknown = sorted(set(options) - set(_FIELDS))
    if unknown:
        raise ZpcclTypeError(f"{call}: unknown argument(s) {', '.join(unknown)}; it takes policy= or the fields of "
                             f"{_WHO}: {', '.join(_FIELDS)}", call)
    if policy is not None:
        if not isinstance(policy, ZeroPlusPlusPolicy):
            raise ZpcclTypeError(f"{call}: policy must be a zpccl.{_WHO}, got {type(policy).__name__}", call)
        if options:
            given = ", ".join(f"{name}=" for name in sorted(options))
            raise ZpcclValueError(f"{call}: give policy or keyword arguments, not both: policy= and {given} "
                                  "(dataclasses.replace(policy, ...) makes a variant)", call)
        return policy
    try:
        return ZeroPlusPlusPolicy(**options)
    except ZpcclValueError as e:  # the same words, naming the call the arguments were given to
        raise ZpcclValueError(call + e.message[len(_WHO):], call) from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _refuse(message: str) -> None:
    raise ZpcclValueError(f"{_WHO}: {message}", _WHO)
