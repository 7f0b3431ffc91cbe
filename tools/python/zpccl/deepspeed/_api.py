"""``initialize``, ``enable``, ``disable`` and ``session_of``: what a user of zpccl.deepspeed calls."""
from __future__ import annotations

import copy
from typing import Any

from .._policy import ZeroPlusPlusPolicy, resolve_policy
from ..enums import Result
from ..errors import ZpcclError, ZpcclValueError
from ._config import resolve
from ._deepspeed import CALL, DeepSpeed
from ._state import LIVE, ZeroPlusPlus

INIT = "zpccl.deepspeed.initialize"


def initialize(*args: Any, policy: ZeroPlusPlusPolicy | None = None, **kwargs: Any) -> tuple[Any, ...]:
    """``deepspeed.initialize`` with zpccl serving the engine: takes deepspeed.initialize's arguments and returns
    what it returns (``engine, optimizer, training_dataloader, lr_scheduler``); :func:`session_of` gives the
    engine's :class:`ZeroPlusPlus`.

    The config (``config=``, ``config_params=`` or ``args.deepspeed_config``: a dict or a JSON file) goes through
    :func:`~zpccl.deepspeed.split_config` first: DeepSpeed gets it without the ZeRO++ switches zpccl takes over
    (``zero_quantized_weights``, ``zero_quantized_gradients``) and without the ``"zpccl"`` section, so that it never
    builds its own quantizer; zpccl serves what they ask for. ``policy`` (a :class:`~zpccl.ZeroPlusPlusPolicy`) may
    stand for the section. Raises :class:`~zpccl.ZpcclError` (or its ValueError/TypeError subclasses) saying what to
    change, before DeepSpeed runs where the config is at fault.
    """
    ds = DeepSpeed.load(INIT)
    params = dict(kwargs)
    if args:
        params["args"], args = args[0], args[1:]
    if args:
        raise ZpcclValueError(f"{INIT}: pass deepspeed.initialize's arguments after args by keyword", INIT)
    names = [n for n in ("config", "config_params") if params.get(n) is not None]
    cli = params.get("args")
    from_cli = getattr(cli, "deepspeed_config", None) if cli is not None else None
    if from_cli is not None:
        names.append("args.deepspeed_config")
    if len(names) != 1:
        raise ZpcclValueError(f"{INIT}: give the DeepSpeed config once (config=, config_params= or "
                              f"args.deepspeed_config), got {', '.join(names) or 'none'}", INIT)
    config = params.pop("config", None) or params.pop("config_params", None) or from_cli
    if from_cli is not None:
        cli = copy.copy(cli)
        cli.deepspeed_config = None
        params["args"] = cli
    ds_config, policy = resolve(config, policy, INIT)
    if policy is None:
        raise ZpcclValueError(f"{INIT}: the config asks for no ZeRO++ technique: set zero_optimization's "
                              "zero_quantized_weights, zero_quantized_gradients or zero_hpz_partition_size, add a "
                              "\"zpccl\" section, or pass policy= (or call deepspeed.initialize)", INIT)
    _check_policy(policy, INIT)
    _check_free(INIT)
    result = ds.deepspeed.initialize(config=ds_config, **params)
    _enable(ds, result[0], policy, INIT)
    return result


def enable(engine: Any, policy: ZeroPlusPlusPolicy | None = None, **options: Any) -> ZeroPlusPlus:
    """Switches a DeepSpeed ZeRO stage-3 engine to zpccl's collectives (see :mod:`zpccl.deepspeed`). Collective:
    every rank of the engine's data-parallel group calls it, after ``deepspeed.initialize`` and between steps.

    ``policy`` is a :class:`~zpccl.ZeroPlusPlusPolicy`; or give its fields as keyword arguments instead (not
    both), e.g. ``enable(engine, weight_bits=8, grad_bits=4, block_size=256)``. As DeepSpeed reads them:
    ``weight_bits`` (8 or 4, or None: the data-parallel gathers stay DeepSpeed's), ``grad_bits`` (4 or 8, or None:
    the reduce-scatters stay DeepSpeed's), ``block_size`` / ``grad_block_size``, ``hpz`` (serve the gathers over
    DeepSpeed's hpZ groups, ``zero_hpz_partition_size``, with hpZ; False leaves them DeepSpeed's),
    ``param_blocks``, ``ranks_per_node`` / ``node_id`` (the node layout; else the launcher's
    ``LOCAL_WORLD_SIZE`` on the CPU, the host on CUDA), ``grad_rounding`` and ``seed``. ``hpz_size`` is
    DeepSpeed's ``zero_hpz_partition_size`` here, and ``error_feedback`` is refused (DeepSpeed's gradient buckets
    have no fixed shape to keep a residual for).

    An engine made without an optimizer (inference, a reference model) reduces no gradients: its gathers are
    served, and ``grad_bits`` has nothing to serve there.

    An engine built with ``zero_quantized_weights`` is refused (DeepSpeed quantizes before it hands the gathers
    over): build it with :func:`initialize`. One engine at a time: the functions zpccl replaces are DeepSpeed's,
    one set per process; another engine of the process keeps DeepSpeed's own collectives. ``engine.destroy()``
    disables first, so that the next engine of the process can be served.

    Returns the :class:`ZeroPlusPlus` that serves the engine (``.summary()``, ``.disable()``).
    """
    ds = DeepSpeed.load(CALL)
    policy = resolve_policy(CALL, policy, options)
    _check_policy(policy, CALL)
    _check_free(CALL)
    return _enable(ds, engine, policy, CALL)


def session_of(engine: Any) -> ZeroPlusPlus | None:
    """The live :class:`ZeroPlusPlus` that serves ``engine``, or None."""
    return next((s for s in LIVE if s.engine is engine), None)


def disable(engine: Any) -> None:
    """Gives DeepSpeed its own collectives back (undoes :func:`enable`); a no-op when zpccl does not serve it."""
    session = session_of(engine)
    if session is not None:
        session.disable()


def _enable(ds: DeepSpeed, engine: Any, policy: ZeroPlusPlusPolicy, call: str) -> ZeroPlusPlus:
    facts = ds.engine_facts(engine, call)
    session = ZeroPlusPlus(ds, engine, policy, facts, call)
    LIVE.append(session)
    try:
        session.attach()
    except BaseException:
        session.disable()
        raise
    return session


def _check_policy(policy: ZeroPlusPlusPolicy, call: str) -> None:
    if policy.hpz_size is not None:
        raise ZpcclValueError(f"{call}: hpz_size is DeepSpeed's zero_optimization.zero_hpz_partition_size here (it "
                              "makes the hpZ groups and keeps their secondary partitions): set that, and drop "
                              "hpz_size", call)
    if policy.error_feedback:
        raise ZpcclValueError(f"{call}: error_feedback keeps a residual per reduce-scatter input of a fixed shape, "
                              "and DeepSpeed's gradient buckets have none: drop error_feedback", call)


def _check_free(call: str) -> None:
    if LIVE:
        raise ZpcclError(Result.INVALID_USAGE, f"{call}: zpccl already serves a DeepSpeed engine in this process "
                         "(DeepSpeed's functions it replaces are one set per process): call disable() on its "
                         "ZeroPlusPlus first", call)
