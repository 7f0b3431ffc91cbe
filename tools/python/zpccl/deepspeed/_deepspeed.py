"""DeepSpeed as installed: its version and the pieces zpccl.deepspeed replaces or reads, found and checked once
(:meth:`DeepSpeed.load`), and what an engine is made of (:meth:`DeepSpeed.engine_facts`). Every other module of
the package reaches DeepSpeed through these.

ZeRO-3 hands every buffer of the collectives zpccl serves to a module-level function that it looks up when it
calls it, so replacing the module's attribute reroutes the call and nothing else:

* ``partition_parameters._dist_allgather_fn(input_tensor, output_tensor, group)``: the parameter all-gathers of
  ZeRO-3's fetch path (each parameter's ``all_gather_coalesced``, which the parameter coordinator calls for the
  forward, the backward and their prefetches): over the data-parallel group from the primary partitions, over the
  hpZ group (``zero_hpz_partition_size``) from the secondary ones; it returns a handle DeepSpeed waits on;
* ``stage3.reduce_scatter_coalesced(tensors, group)``: the gradient reduce-scatter of ``__avg_scatter_grads``,
  each tensor a parameter's whole gradient, returning each one's averaged partition on this rank;
* ``stage3.all_to_all_quant_reduce(tensors, groups)``: the same reduction, where DeepSpeed's own qgZ
  (``zero_quantized_gradients``) would run it.

A gather's buffer is its parameters' partitions back to back, and nothing in it says where one ends: each
parameter's ``all_gather_coalesced`` (an attribute ZeRO-3's ``Init`` sets on every parameter) is wrapped to tell
the gathers it runs which parameters they hold. Each parameter's ``all_gather`` (DeepSpeed's own exact gather,
which calls torch.distributed itself) is wrapped to count the ones ZeRO-3 runs by itself. The functions are one set per
process, and another engine's ZeRO-3 calls them too: the served engine's fetches and its optimizer's gradient
reductions (:data:`REDUCER`) are wrapped to mark its calls, and every other call stays DeepSpeed's. The fetch reads its
settings from the ``Init`` that made it (:func:`fetch_owner`), among them ``use_all_reduce_for_fetch_params``.
"""
from __future__ import annotations

import importlib
import inspect
import re
from dataclasses import dataclass
from typing import Any, Callable

from ..enums import Result
from ..errors import ZpcclError, ZpcclValueError

#: The call that every refusal of zpccl.deepspeed's set-up names.
CALL = "zpccl.deepspeed.enable"
#: The first DeepSpeed whose ZeRO-3 zpccl.deepspeed serves, and the releases its pieces were read in.
MIN_DEEPSPEED = (0, 19)
CHECKED_DEEPSPEED = "0.19.8"
#: The module-level functions zpccl.deepspeed replaces: (module, attribute, the parameters DeepSpeed passes).
REPLACED = (("deepspeed.runtime.zero.partition_parameters", "_dist_allgather_fn", ("input_tensor", "output_tensor",
                                                                                    "group")),
            ("deepspeed.runtime.zero.stage3", "reduce_scatter_coalesced", ("tensors", "group")),
            ("deepspeed.runtime.zero.stage3", "all_to_all_quant_reduce", ("tensors", "groups")))
#: The ZeRO-3 optimizer's method that runs its engine's gradient reductions (both replaced reductions are called from
#: it, name-mangled as Python stores it): wrapped on the served engine's optimizer, so that the reductions of another
#: engine of the process, which call the same module-level functions, stay DeepSpeed's.
REDUCER = "_DeepSpeedZeroOptimizer_Stage3__avg_scatter_grads"
#: What zpccl.deepspeed reads (or wraps: all_gather_coalesced) on every ZeRO-3 parameter.
PARAM_ATTRS = ("ds_id", "ds_numel", "ds_tensor", "ds_status", "ds_process_group", "ds_zero_param_process_group",
               "all_gather_coalesced", "all_gather")


def deepspeed_version(text: str) -> tuple[int, ...]:
    """(major, minor, patch) of a version string such as ``"0.19.8+abc"``; (0,) when it has none."""
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(g) for g in m.groups() if g is not None) if m else (0,)


def unwrapped(fn: Any) -> Any:
    """``fn`` as written, through DeepSpeed's decorators: functools.wraps' ``__wrapped__``, and instrument_w_nvtx's
    ``(*args, **kwargs)`` closure over the function it wraps; None where they nest deeper than DeepSpeed's do."""
    for _ in range(8):
        if hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
            continue
        try:
            names = tuple(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            return fn
        inner = [v for v in map(_cell, getattr(fn, "__closure__", None) or ()) if inspect.isfunction(v)]
        if names == ("args", "kwargs") and len(inner) == 1:
            fn = inner[0]
            continue
        return fn
    return None


def parameter_names(fn: Any) -> tuple[str, ...]:
    """The parameter names of ``fn`` as written (:func:`unwrapped`)."""
    fn = unwrapped(fn)
    try:
        return tuple(inspect.signature(fn).parameters) if fn is not None else ()
    except (TypeError, ValueError):
        return ()


def fetch_owner(fetch: Any) -> Any:
    """The ZeRO-3 ``Init`` whose settings a parameter's ``all_gather_coalesced`` reads when it runs (the ``self``
    its closure holds), or None where DeepSpeed builds that function otherwise."""
    fn = unwrapped(fetch)
    code = getattr(fn, "__code__", None)
    if code is None or "self" not in code.co_freevars:
        return None
    return _cell(fn.__closure__[code.co_freevars.index("self")])


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


@dataclass(frozen=True)
class DeepSpeed:
    """The pieces of DeepSpeed that zpccl.deepspeed uses, found in whatever DeepSpeed is installed."""

    deepspeed: Any
    torch: Any
    dist: Any  # torch.distributed: DeepSpeed's process groups are torch's
    modules: dict[str, Any]  # the modules of REPLACED, by name
    allgather_dtype: Callable[[Any, Any], Any] | None  # partition_parameters.get_allgather_dtype(param, tensor)
    version: str

    @staticmethod
    def load(call: str = CALL) -> "DeepSpeed":
        need = f"DeepSpeed {MIN_DEEPSPEED[0]}.{MIN_DEEPSPEED[1]} or later (read in {CHECKED_DEEPSPEED})"
        try:
            import deepspeed
            import torch
            import torch.distributed as dist
        except ImportError as e:
            raise ZpcclError(Result.INVALID_USAGE, f"{call}: zpccl.deepspeed needs {need}, and it is not importable "
                             f"({e}): pip install 'deepspeed>={MIN_DEEPSPEED[0]}.{MIN_DEEPSPEED[1]}'", call) from None
        version = str(getattr(deepspeed, "__version__", "0"))
        if deepspeed_version(version) < MIN_DEEPSPEED:
            raise ZpcclError(Result.INVALID_USAGE, f"{call}: zpccl.deepspeed needs {need}; this is DeepSpeed "
                             f"{version}: pip install 'deepspeed>={MIN_DEEPSPEED[0]}.{MIN_DEEPSPEED[1]}'", call)
        modules, missing = {}, []
        for module, name, params in REPLACED:
            try:
                modules[module] = importlib.import_module(module)
            except ImportError:
                missing.append(f"{module}.{name}")
                continue
            fn = getattr(modules[module], name, None)
            if not callable(fn) or parameter_names(fn)[:len(params)] != params:
                missing.append(f"{module}.{name}({', '.join(params)})")
        if missing:
            raise ZpcclError(Result.INVALID_USAGE, f"{call}: zpccl.deepspeed replaces {', '.join(missing)}, which "
                             f"DeepSpeed {CHECKED_DEEPSPEED} has and DeepSpeed {version} does not have so", call)
        pp = modules[REPLACED[0][0]]
        return DeepSpeed(deepspeed, torch, dist, modules, getattr(pp, "get_allgather_dtype", None), version)

    def function(self, i: int) -> Any:
        """The function REPLACED[i] names, as the module holds it now."""
        module, name, _ = REPLACED[i]
        return getattr(self.modules[module], name)

    def set_function(self, i: int, fn: Any) -> None:
        module, name, _ = REPLACED[i]
        setattr(self.modules[module], name, fn)

    def gather_dtype(self, param: Any) -> Any:
        """The element type ZeRO-3 gathers ``param`` in (its communication dtype, else its partition's)."""
        if self.allgather_dtype is not None:
            return self.allgather_dtype(param, param.ds_tensor)
        return param.ds_tensor.dtype

    def group_ranks(self, group: Any) -> tuple[int, ...]:
        """The global ranks of a process group (None: the world), in group-rank order."""
        if group is None:
            return tuple(range(self.dist.get_world_size()))
        return tuple(self.dist.get_process_group_ranks(group))

    def engine_facts(self, engine: Any, call: str = CALL) -> "EngineFacts":
        """What serving ``engine`` needs to know, refused where zpccl cannot serve it."""
        stage_of = getattr(engine, "zero_optimization_stage", None)
        if not callable(stage_of) or not hasattr(engine, "module"):
            raise ZpcclValueError(f"{call}: {type(engine).__name__} is not a DeepSpeed engine: pass the engine "
                                  "deepspeed.initialize returned", call)
        stage = int(stage_of())
        if stage != 3:
            raise ZpcclValueError(f"{call}: the engine runs ZeRO stage {stage}; zpccl serves ZeRO stage 3's parameter "
                                  "gathers and gradient reduce-scatters, and stages 0 to 2 keep DeepSpeed's exact "
                                  "collectives: set zero_optimization.stage to 3, or leave zpccl out", call)
        zero = engine._config.zero_config
        for key in ("zero_quantized_weights", "zero_quantized_nontrainable_weights"):
            if getattr(zero, key, False):
                raise ZpcclValueError(f"{call}: the engine was built with {key}, so DeepSpeed quantizes weights with "
                                      "its own kernels before it hands their gathers over: build it with "
                                      "zpccl.deepspeed.initialize, which gives that key to zpccl instead, or drop it "
                                      "from the config", call)
        params = [p for p in engine.module.parameters() if hasattr(p, "ds_id")]
        if not params:
            raise ZpcclValueError(f"{call}: the engine's module has no ZeRO-3 parameters", call)
        lacking = [a for a in PARAM_ATTRS if not hasattr(params[0], a)]
        if lacking:
            raise ZpcclError(Result.INVALID_USAGE, f"{call}: ZeRO-3's parameters lack {', '.join(lacking)}, which "
                             f"DeepSpeed {CHECKED_DEEPSPEED} sets; this is DeepSpeed {self.version}", call)
        from deepspeed.accelerator import get_accelerator

        hpz = params[0].ds_zero_param_process_group
        optimizer = getattr(engine, "optimizer", None)
        if _is_offload_only(optimizer):
            # An engine made without an optimizer (inference, a frozen reference model) holds ZeRO-3's parameter
            # offload in the optimizer's place: it gathers parameters and reduces no gradient.
            optimizer = None
        owners = {id(o): o for o in (fetch_owner(p.all_gather_coalesced) for p in params)}
        return EngineFacts(params=params, optimizer=optimizer, dp_group=params[0].ds_process_group, hpz_group=hpz,
                           hpz_size=self.dist.get_world_size(hpz) if hpz is not None else 1,
                           device=self.torch.device(get_accelerator().current_device_name()),
                           reduce_scatter=bool(getattr(optimizer, "reduce_scatter", True)),
                           quantized_gradients=bool(getattr(zero, "zero_quantized_gradients", False)),
                           all_reduce_fetch=bool(getattr(zero, "use_all_reduce_for_fetch_params", False)),
                           fetch_owners=list(owners.values()),
                           persistent=[p for p in params if getattr(p, "ds_persist", False)],
                           prefetch_bucket=int(getattr(zero, "prefetch_bucket_size", 0)),
                           persistence_threshold=int(getattr(zero, "param_persistence_threshold", 0)))


def _is_offload_only(optimizer: Any) -> bool:
    """Whether ``optimizer`` is ZeRO-3's parameter offload alone, which DeepSpeed puts in an engine made without an
    optimizer (DeepSpeedZeRoOffload: fetches and releases parameters, reduces no gradient)."""
    try:
        from deepspeed.runtime.zero.parameter_offload import DeepSpeedZeRoOffload
    except ImportError:
        return False
    return isinstance(optimizer, DeepSpeedZeRoOffload)


@dataclass
class EngineFacts:
    """What zpccl.deepspeed reads from a ZeRO-3 engine once, at enable."""

    params: list[Any]  # the module's ZeRO-3 parameters, in module order
    optimizer: Any  # the engine's ZeRO-3 optimizer (its REDUCER runs the gradient reductions); None: it has none
    dp_group: Any  # the group ZeRO-3 partitions them over (None: the world)
    hpz_group: Any  # its hpZ group of this rank (zero_hpz_partition_size > 1), else None
    hpz_size: int
    device: Any  # where gathers and reductions run (the accelerator's current device)
    reduce_scatter: bool  # zero_optimization.reduce_scatter (False: DeepSpeed all-reduces gradient buckets)
    quantized_gradients: bool  # zero_quantized_gradients: all_to_all_quant_reduce is the reduction's entry
    all_reduce_fetch: bool  # stage3_use_all_reduce_for_fetch_params: fetches all-reduce rather than gather
    fetch_owners: list[Any]  # the ZeRO-3 Inits the parameters' fetches read their settings from (None: not found)
    persistent: list[Any]  # the parameters DeepSpeed keeps gathered (stage3_param_persistence_threshold)
    prefetch_bucket: int  # stage3_prefetch_bucket_size: the most elements ZeRO-3 gathers in one fetch
    persistence_threshold: int  # stage3_param_persistence_threshold: a persistent parameter has fewer elements
