"""torch's FSDP2 as the installed torch has it: the classes and the private attributes zpccl.fsdp uses, found and
checked once (:meth:`TorchFsdp.load`), and how FSDP's modules, parameter groups and post-forward groups are read.
Every other module of the package reaches FSDP through these."""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from ..enums import Result
from ..errors import ZpcclError

#: The call that every refusal of zpccl.fsdp's set-up names.
CALL = "zpccl.fsdp.enable"
#: The first torch whose FSDP2 has the custom-communication hooks.
MIN_TORCH = (2, 9)
#: The torch versions whose FSDP2 sources zpccl.fsdp's private attributes were checked against.
CHECKED_TORCH = "2.9 to 2.15"
#: What zpccl.fsdp reads or sets on FSDP2's parameter groups and states, beyond the public FSDPModule methods.
PG_ATTRS = ("mesh_info", "post_forward_mesh_info", "fsdp_params", "device", "gradient_divide_factor",
            "_all_gather_comm", "_reduce_scatter_comm")
STATE_ATTRS = ("_is_root", "_auto_reshard_after_forward")
#: What hpz_size reads on each FSDPParam; and what FSDP derives from its post-forward mesh when it makes one.
PARAM_POST_FORWARD_ATTRS = ("post_forward_mesh_info", "_orig_size", "is_dtensor")
POST_FORWARD_DERIVED = ("sharded_post_forward_size", "contiguous_sharded_post_forward_stride")


@dataclass(frozen=True)
class TorchFsdp:
    """The pieces of torch's FSDP2 that zpccl.fsdp uses, found in whatever torch is installed."""

    torch: Any
    dist: Any
    FSDPModule: type
    AllGather: type
    ReduceScatter: type
    ShardedState: Any
    FSDPParam: Any
    make_post_forward: Any  # _fsdp_init._get_post_forward_mesh_info: what reshard_after_forward=k calls

    @staticmethod
    def load() -> "TorchFsdp":
        try:
            import torch
            import torch.distributed as dist
        except ImportError as e:
            raise ZpcclError(Result.INVALID_USAGE, f"{CALL}: zpccl.fsdp needs PyTorch {MIN_TORCH[0]}."
                             f"{MIN_TORCH[1]} or later, and torch is not importable ({e})", CALL) from None
        version = torch_version(torch.__version__)
        need = f"torch {MIN_TORCH[0]}.{MIN_TORCH[1]} or later (FSDP2's FSDPModule.set_custom_all_gather)"
        try:
            from torch.distributed.fsdp import FSDPModule
        except ImportError:
            FSDPModule = None
        api = _first_module("torch.distributed.fsdp._fully_shard._fsdp_api",
                            "torch.distributed._composable.fsdp._fsdp_api")
        param = _first_module("torch.distributed.fsdp._fully_shard._fsdp_param",
                              "torch.distributed._composable.fsdp._fsdp_param")
        if (version < MIN_TORCH or FSDPModule is None or not hasattr(FSDPModule, "set_custom_all_gather")
                or api is None or not hasattr(api, "AllGather") or param is None):
            raise ZpcclError(Result.INVALID_USAGE, f"{CALL}: zpccl.fsdp needs {need}; this is torch "
                             f"{torch.__version__}", CALL)
        init = _first_module("torch.distributed.fsdp._fully_shard._fsdp_init",
                             "torch.distributed._composable.fsdp._fsdp_init")
        return TorchFsdp(torch, dist, FSDPModule, api.AllGather, api.ReduceScatter, param.ShardedState,
                         getattr(param, "FSDPParam", None), getattr(init, "_get_post_forward_mesh_info", None))

    def param_groups(self, module: Any) -> list[Any]:
        return param_groups(module)

    def check_private(self, module: Any, pg: Any) -> None:
        """Refuses, with the versions that have them, when this torch lacks the private FSDP2 attributes zpccl.fsdp
        reads and sets (torch 2.9 to 2.15 have them all)."""
        state = module._get_fsdp_state()
        missing = [f"FSDPParamGroup.{a}" for a in PG_ATTRS if not hasattr(pg, a)]
        missing += [f"FSDPState.{a}" for a in STATE_ATTRS if not hasattr(state, a)]
        if missing:
            raise ZpcclError(Result.INVALID_USAGE, f"{CALL}: zpccl.fsdp needs FSDP2's {', '.join(missing)}, which "
                             f"torch {CHECKED_TORCH} have; this is torch {self.torch.__version__}", CALL)

    def check_post_forward(self, served: list[Any]) -> None:
        """Refuses hpz_size, with the versions that have them, when this torch lacks the pieces of FSDP2's
        post-forward mesh machinery that it uses."""
        missing = [] if self.make_post_forward is not None else ["_fsdp_init._get_post_forward_mesh_info"]
        if not hasattr(self.FSDPParam, "_init_sharded_post_forward_param_metadata"):
            missing.append("FSDPParam._init_sharded_post_forward_param_metadata")
        for s in served:
            missing += [f"FSDPParam.{a}" for p in s.param_group.fsdp_params for a in PARAM_POST_FORWARD_ATTRS
                        if not hasattr(p, a)]
            missing += [f"FSDPParamGroup.{a}" for a in ("is_sharded_post_forward", "post_forward")
                        if not hasattr(s.param_group, a)]
        if missing:
            raise ZpcclError(Result.INVALID_USAGE, f"{CALL}: hpz_size needs FSDP2's {', '.join(sorted(set(missing)))}"
                             f", which torch {CHECKED_TORCH} have; this is torch {self.torch.__version__}", CALL)

    def class_name(self, module: Any) -> str:
        """The name of the class the user wrote, not of the FSDP subclass that fully_shard swaps in."""
        return next(c for c in type(module).__mro__ if not issubclass(c, self.FSDPModule)).__name__


def param_groups(module: Any) -> list[Any]:
    """The FSDPParamGroups of one FSDP module (a list in newer torch, one or None in older)."""
    state = module._get_fsdp_state()
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:
        one = getattr(state, "_fsdp_param_group", None)
        groups = [] if one is None else [one]
    return list(groups)


def fsdp_modules(model: Any) -> list[tuple[str, Any]]:
    """``model``'s FSDP modules with their names in it ("" for the model), in module order."""
    return [(name, m) for name, m in model.named_modules() if callable(getattr(m, "_get_fsdp_state", None))]


_WATCHERS = "_zpccl_reduced_watchers"


def watch_reduced_params(pg: Any, served: Any) -> None:
    """Has FSDP's parameter group tell ``served.reduced`` the parameters whose gradients its next reduce-scatter
    holds, where this torch's FSDPParamGroup takes them through ``_take_unsharded_grads_to_reduce``: a parameter
    without a gradient (an unused branch) may sit anywhere in the group, and sizes alone cannot always tell which.
    Elsewhere ``served.reduced`` stays None (the parameters are then told by their sizes). Several may watch one
    group (zpccl.fsdp's reduce-scatter and zpccl.ddp's replicate hook): each is told."""
    take = getattr(type(pg), "_take_unsharded_grads_to_reduce", None)
    if take is None:
        return
    watchers = pg.__dict__.get(_WATCHERS)
    if watchers is None:
        watchers = pg.__dict__[_WATCHERS] = []

        def take_and_tell() -> Any:
            params, grads = take(pg)
            reduced = list(params)
            for watcher in watchers:
                watcher.reduced = reduced
            return params, grads

        pg._take_unsharded_grads_to_reduce = take_and_tell
    if not any(w is served for w in watchers):
        watchers.append(served)


def unwatch_reduced_params(pg: Any, served: Any) -> None:
    """Stops telling ``served``; FSDP's own method is back once nobody watches."""
    watchers = pg.__dict__.get(_WATCHERS, [])
    watchers[:] = [w for w in watchers if w is not served]
    if not watchers:
        pg.__dict__.pop(_WATCHERS, None)
        pg.__dict__.pop("_take_unsharded_grads_to_reduce", None)


def fsdp_modules_anywhere() -> list[Any] | None:
    """Every live FSDP module of the process, from torch's registry of composable states (private), or None where
    this torch has no such registry."""
    registry = getattr(_first_module("torch.distributed._composable_state"), "_module_state_mapping", None)
    keyrefs = getattr(registry, "keyrefs", None)
    if keyrefs is None:
        return None
    modules = (ref() for ref in keyrefs())  # a snapshot: other threads (ranks as threads) may shard meanwhile
    return [m for m in modules if m is not None and callable(getattr(m, "_get_fsdp_state", None))]


def post_forward_group(pg: Any) -> Any:
    """FSDP's post-forward process group of a parameter group where it is a group of its own
    (``reshard_after_forward=k``, 1 < k < the shard group's size), else None."""
    info = pg.post_forward_mesh_info
    return None if info is None or info == pg.mesh_info else info.shard_process_group


def torch_version(text: str) -> tuple[int, int]:
    parts = text.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (0, 0)


def _first_module(*names: str) -> Any:
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None
