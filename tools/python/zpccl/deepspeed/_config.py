"""How a DeepSpeed config reaches zpccl before DeepSpeed acts on it.

DeepSpeed builds its ZeRO++ quantizer while ``deepspeed.initialize`` runs (and cannot build it without its CUDA
kernels), so the ZeRO++ switches have to leave the config before DeepSpeed reads it. :func:`split_config` takes a
config and returns the one DeepSpeed gets (without them) and the :class:`~zpccl.ZeroPlusPlusPolicy` they map to:

* ``zero_optimization.zero_quantized_weights: true``: qwZ, ``weight_bits`` 8 (DeepSpeed's own qwZ width);
* ``zero_optimization.zero_quantized_gradients: true``: qgZ, ``grad_bits`` 4 (DeepSpeed's own qgZ width);
* ``zero_optimization.zero_hpz_partition_size: k`` stays in DeepSpeed's config (DeepSpeed keeps the secondary
  partitions and their lifecycle); zpccl serves the gathers over those groups with hpZ, exactly. It alone (no
  quantization) is hpZ alone;
* a top-level ``"zpccl"`` section holds the policy's other fields (``block_size``, ``grad_block_size``,
  ``grad_rounding``, ``ranks_per_node``, ...), and may set ``weight_bits`` / ``grad_bits`` too: a width, or a
  collective the switches leave off; None for one they turn on is refused as a contradiction. A section that
  leaves both None, with no hpZ, asks for the one thing zpccl does exactly besides hpZ: the persistent
  parameters' gathers in one call (refused at enable when the model has none).

``zero_quantized_nontrainable_weights`` keeps DeepSpeed's own quantized copies of frozen weights, which need its
kernels: refused.
"""
from __future__ import annotations

import copy
import json
import os
from typing import Any

from .._policy import ZeroPlusPlusPolicy, resolve_policy
from ..enums import BITS_INT4, BITS_INT8
from ..errors import ZpcclTypeError, ZpcclValueError

#: The top-level key of a DeepSpeed config that holds the policy's fields.
SECTION = "zpccl"
#: DeepSpeed's ZeRO++ switches that zpccl takes over: (key in zero_optimization, policy field, its width).
TAKEN = (("zero_quantized_weights", "weight_bits", BITS_INT8), ("zero_quantized_gradients", "grad_bits", BITS_INT4))
#: ZeRO++ keys zpccl refuses, with why.
REFUSED = {"zero_quantized_nontrainable_weights": "it keeps DeepSpeed's own quantized copies of frozen weights, "
                                                  "made by its CUDA kernels; drop it"}
HPZ_KEY = "zero_hpz_partition_size"


def split_config(config: Any) -> tuple[dict[str, Any], ZeroPlusPlusPolicy | None]:
    """``(deepspeed_config, policy)``: the config DeepSpeed gets, without the ZeRO++ switches zpccl takes over and
    without the ``"zpccl"`` section, and the policy they ask for (None when they ask for nothing). ``config`` is a
    dict (left unchanged) or the path of a JSON file. Raises :class:`~zpccl.ZpcclValueError` naming what to
    change."""
    return resolve(config, None, "zpccl.deepspeed.split_config")


def resolve(config: Any, policy: ZeroPlusPlusPolicy | None,
            call: str) -> tuple[dict[str, Any], ZeroPlusPlusPolicy | None]:
    """:func:`split_config`, where ``policy`` (if given) is what the caller asked for besides the config: it must
    not contradict the switches, and cannot come with a ``"zpccl"`` section."""
    cfg = _load(config, call)
    section = cfg.pop(SECTION, None)
    zero = cfg.get("zero_optimization")
    if zero is not None and not isinstance(zero, dict):
        raise ZpcclTypeError(f"{call}: zero_optimization must be a dict, got {type(zero).__name__}", call)
    zero = dict(zero or {})
    for key, why in REFUSED.items():
        if _switch(zero, key, call):
            raise ZpcclValueError(f"{call}: zero_optimization.{key}: zpccl does not serve it: {why}", call)
    on = {field: _switch(zero, key, call) for key, field, _ in TAKEN}
    for key, _, _ in TAKEN:
        zero.pop(key, None)
    if "zero_optimization" in cfg:
        cfg["zero_optimization"] = zero
    hpz = _hpz_size(zero.get(HPZ_KEY, 1), call)
    if not (any(on.values()) or hpz > 1 or section is not None or policy is not None):
        return cfg, None
    stage = zero.get("stage", 0)
    if _stage(stage) != 3:
        raise ZpcclValueError(f"{call}: zpccl serves ZeRO stage 3, and zero_optimization.stage is {stage!r}: set it "
                              "to 3, or leave zpccl (and DeepSpeed's ZeRO++ keys) out", call)
    if policy is not None and section is not None:
        raise ZpcclValueError(f"{call}: give the policy as policy= or as the config's \"{SECTION}\" section, not "
                              "both", call)
    if policy is None:
        if section is not None and not isinstance(section, dict):
            raise ZpcclTypeError(f"{call}: the config's \"{SECTION}\" section must be a dict of ZeroPlusPlusPolicy's "
                                 f"fields, got {type(section).__name__}", call)
        fields: dict[str, Any] = {field: width if on[field] else None for _, field, width in TAKEN}
        fields.update(section or {})
        given = "the \"zpccl\" section"
    else:
        fields, given = {field: getattr(policy, field) for _, field, _ in TAKEN}, "policy="
    for key, field, _ in TAKEN:
        if on[field] and fields[field] is None:
            raise ZpcclValueError(f"{call}: zero_optimization.{key} asks for {field}, and {given} sets {field}=None: "
                                  "drop one of them", call)
    if policy is None:
        policy = resolve_policy(call, None, fields)
    return cfg, policy


#: The strings DeepSpeed's config (pydantic, lax) reads as a boolean, lower-cased.
_TRUE = frozenset(("1", "on", "t", "true", "y", "yes"))
_FALSE = frozenset(("0", "off", "f", "false", "n", "no"))


def _switch(zero: dict[str, Any], key: str, call: str) -> bool:
    """A boolean key of zero_optimization (absent: off) as DeepSpeed reads it: "false", "off" or 0 are off, so that
    zpccl never turns on a collective DeepSpeed would leave off; a value DeepSpeed refuses is refused, naming it."""
    value = zero.get(key, False)
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ZpcclValueError(f"{call}: zero_optimization.{key} must be a boolean (true or false), got {value!r}", call)


def _stage(value: Any) -> int | None:
    """zero_optimization.stage as DeepSpeed reads it (3, 3.0 and "3" are stage 3), None where it is no stage."""
    if isinstance(value, bool):
        return int(value)
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if number.is_integer() else None


def _hpz_size(value: Any, call: str) -> int:
    """zero_hpz_partition_size as DeepSpeed reads it (an int; None or 0 mean 1), or a refusal naming the key: a
    value DeepSpeed would refuse (``"auto"``, which only some keys take) must not reach int()'s words."""
    try:
        if isinstance(value, bool) or isinstance(value, float) and not value.is_integer():
            raise ValueError
        return int(value or 1)
    except (TypeError, ValueError):
        raise ZpcclValueError(f"{call}: zero_optimization.{HPZ_KEY} must be an int (the ranks of DeepSpeed's hpZ "
                              f"groups, 1 for none), got {value!r}", call) from None


def _load(config: Any, call: str) -> dict[str, Any]:
    """A deep copy of a config dict, or the dict of a JSON file."""
    if isinstance(config, dict):
        return copy.deepcopy(config)
    if isinstance(config, (str, os.PathLike)) and os.path.isfile(config):
        with open(config, encoding="utf-8") as f:
            loaded = json.load(f)
        if isinstance(loaded, dict):
            return loaded
    raise ZpcclTypeError(f"{call}: config must be a DeepSpeed config dict or the path of its JSON file, got "
                         f"{config!r:.80}", call)
