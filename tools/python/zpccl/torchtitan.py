"""zpccl for torchtitan: name this module on torchtitan's command line, and any of its configs trains with qwZ,
hpZ and qgZ.

    torchrun --nproc_per_node 8 -m torchtitan.train --module zpccl.torchtitan --config llama3_8b \\
        --zpccl.hpz_size 8 --zpccl.grad_bits 4

torchtitan (0.3) reads a config from a Python module: ``--module`` names the module and ``--config`` a function
of it that returns the config. Here, every config function of torchtitan's registries is such a function: it
returns torchtitan's config, whose ``model_spec.post_optimizer_build_fn`` (the hook torchtitan's trainer calls
once the optimizer is built, with the optimizers, the model parts and the parallel dimensions) also runs
:func:`zpccl.fsdp.enable` on every model part, after the hook the config already had. The config gains one
section, ``zpccl``, a :class:`~zpccl.ZeroPlusPlusPolicy`: its fields are the options (``--zpccl.weight_bits``,
``--zpccl.grad_bits``, ``--zpccl.block_size``, ``--zpccl.hpz_size``, ...), checked when the command line is
parsed.

* ``--config NAME`` looks NAME up in the registry that its start names (``llama3_debugmodel``: torchtitan's
  llama3), then in every registry, torchtitan's models before its experiments; the first that has it gives it.
  ``--config MODULE.NAME`` takes it from one: MODULE is a short name as torchtitan's ``--module`` takes it
  (``llama3``, ``graph_trainer.llama3``) or any importable module (its ``config_registry`` submodule first, as
  torchtitan does), so a config registry of your own is reached the same way.
* In Python, :func:`wrap` does the same to a config you hold: ``wrap(llama3_debugmodel(), hpz_size=8)``. A hook
  chained onto a wrapped config's ``post_optimizer_build_fn`` reaches zpccl's twice once the config is made again
  (``build`` does): zpccl serves each model part once, and refuses a second policy there.
* hpZ: torchtitan's ``--parallelism.fsdp_reshard_after_forward`` takes only ``default``, ``always`` or ``never``
  (resharding over the whole shard group, or not at all). ``--zpccl.hpz_size k`` gives the modules it shards with
  ``reshard_after_forward=True`` post-forward groups of k ranks inside a node, so their backward gathers are
  hpZ; each rank then keeps 1/k of those modules' parameters from their forward to their backward (see
  :mod:`zpccl.fsdp`). Under ``default`` torchtitan's root and its ``[norm, lm_head]`` group keep no post-forward
  group (False); under ``always`` they get one of k too, and the chunked loss, which gathers lm_head apart from
  the forward, gathers that group over its shard group (qwZ). In torchtitan 0.3 this needs ``--parallelism.spmd_backend partial_dtensor``: its default backends
  (``spmd_types``, ``full_dtensor``) shard over a full SPMD mesh (``dp_mesh_dims``), which FSDP reshards to no
  smaller group, so those modules' backward gathers stay qwZ over the whole shard group, and the log says so.
* torchtitan sets ``set_gradient_divide_factor(1.0)`` on every module (it divides by the token count itself):
  qgZ serves that as a sum, bit for bit what FSDP's force-sum path gives.
* torchtitan's chunked loss (``ChunkedLossWrapper``, its llama3 configs' loss) runs lm_head's backward apart from
  the decoder's, so FSDP reduces the gradients of its ``[norm, lm_head]`` group in two reduce-scatters: qgZ serves
  each, its blocks restarting at that part's parameters. With ``--zpccl.error_feedback`` those two run without
  error feedback (its residual is made for the whole group), and the ``zpccl.fsdp`` logger says so once, with
  what to change (a loss that is not chunked, or norm and lm_head sharded apart).
* A model part that torchtitan did not shard over more than one rank (``data_parallel_shard_degree`` 1, no
  context parallelism) moves nothing between ranks in FSDP's collectives: zpccl leaves it to FSDP, and the
  ``zpccl.torchtitan`` logger says so.

The session that serves a model part is ``zpccl.fsdp.session_of(trainer.model_parts[i])`` (its ``summary()``
counts each path's calls and bytes).

torchtitan is imported when a config is first looked up, not when this module is.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import logging
from typing import Any, Callable

# Modules and classes only at the top level: torchtitan lists a config module's lower-case callables when a
# --config name is not found there.
from . import _policy
from ._policy import ZeroPlusPlusPolicy
from .enums import Result
from .errors import ZpcclError, ZpcclTypeError, ZpcclValueError

__all__ = ["EnableZpccl", "config_class", "find_config", "wrap"]

log = logging.getLogger("zpccl.torchtitan")

#: The config section that holds the policy (``--zpccl.<field>`` on the command line).
SECTION = "zpccl"
#: Where torchtitan's short module names live, in the order its ConfigManager tries them.
_PREFIXES = ("torchtitan.models", "torchtitan.experiments", "torchtitan.experiments.rl.examples")


@dataclasses.dataclass(frozen=True)
class EnableZpccl:
    """torchtitan's ``post_optimizer_build_fn`` that runs the hook the config had (``previous``), then
    :func:`zpccl.fsdp.enable` with ``policy`` on every model part, in order (every rank does the same)."""

    policy: ZeroPlusPlusPolicy
    previous: Callable[..., Any] | None = None

    def __call__(self, optimizers: Any, model_parts: list[Any], parallel_dims: Any, *args: Any,
                 **kwargs: Any) -> None:
        if self.previous is not None:
            self.previous(optimizers, model_parts, parallel_dims, *args, **kwargs)
        from . import fsdp

        torch_fsdp = fsdp._Fsdp.load()
        for i, part in enumerate(model_parts):
            sizes = _shard_sizes(part)
            what = f"model part {i} ({torch_fsdp.class_name(part)})"
            if not sizes:
                log.warning("zpccl.torchtitan: %s has no fully_shard-ed module: its collectives are not FSDP's, and "
                            "zpccl serves none of them", what)
            elif sizes == {1}:
                log.info("zpccl.torchtitan: %s is sharded over one rank: FSDP's collectives move nothing between "
                         "ranks there, so zpccl leaves them as they are", what)
            elif not self._served_already(fsdp.session_of(part), what):
                fsdp.enable(part, self.policy)
                if self.policy.hpz_size is not None and _spmd_mesh(part):
                    log.warning("zpccl.torchtitan: %s is sharded over a full SPMD mesh, which FSDP reshards to no "
                                "smaller group: hpz_size gives it no hpZ; --parallelism.spmd_backend "
                                "partial_dtensor shards it over a data-parallel mesh, which hpz_size serves", what)

    def _served_already(self, session: Any, what: str) -> bool:
        """Whether an earlier hook of the chain has served the model part with this policy. A hook chained onto a
        wrapped config's post_optimizer_build_fn calls zpccl's, and the config wraps that chain again whenever it
        is made (``build`` makes it with ``replace``): zpccl's hook is then reached twice, and serves once. Another
        policy there is refused, naming both."""
        if session is None:
            return False
        if session.policy != self.policy:
            raise ZpcclError(Result.INVALID_USAGE, f"zpccl.torchtitan: {what} is already served by zpccl with "
                             f"{session.policy}, from a post_optimizer_build_fn earlier in the chain than the one "
                             f"of {self.policy}: chain your hook onto the config before zpccl.torchtitan wraps it, "
                             "or give the policy one way", "zpccl.torchtitan")
        log.info("zpccl.torchtitan: %s is already served by zpccl with this policy (its post_optimizer_build_fn "
                 "reaches zpccl's hook twice: a hook chained onto a wrapped config, wrapped again); served once",
                 what)
        return True


def wrap(config: Any, policy: ZeroPlusPlusPolicy | None = None, **options: Any) -> Any:
    """``config`` (a torchtitan trainer config) as a config of :func:`config_class` of its type, whose ``zpccl``
    section is ``policy`` (or a :class:`~zpccl.ZeroPlusPlusPolicy` of ``options``; neither: the defaults) and
    whose ``model_spec.post_optimizer_build_fn`` is :class:`EnableZpccl` after the hook ``config`` had (in a copy
    of the model spec: ``config`` is left as it was). Wrapping a wrapped config with a policy or options replaces
    its policy; without, keeps it."""
    call = "zpccl.torchtitan.wrap"
    if not dataclasses.is_dataclass(config) or isinstance(config, type) or not hasattr(config, "model_spec"):
        raise ZpcclTypeError(f"{call}: config must be a torchtitan trainer config (a Trainer.Config, with a "
                             f"model_spec), got {type(config).__name__}", call)
    if policy is None and not options:
        policy = getattr(config, SECTION, None) or ZeroPlusPlusPolicy()
    policy = _policy.resolve_policy(call, policy, options)
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init}
    values[SECTION] = policy
    out = config_class(type(config))(**values)
    for f in dataclasses.fields(config):
        if not f.init:
            setattr(out, f.name, getattr(config, f.name))
    return out


@functools.cache
def config_class(base: type) -> type:
    """The subclass of torchtitan's trainer config class ``base`` with a ``zpccl`` section (a
    :class:`~zpccl.ZeroPlusPlusPolicy`). Whenever a config of it is made (by :func:`wrap`, by torchtitan's
    command-line parser, by ``build``), it takes a copy of its model spec whose ``post_optimizer_build_fn`` is
    :class:`EnableZpccl` with its policy, after the hook that was there. It builds the same trainer as ``base``."""
    if any(f.name == SECTION for f in dataclasses.fields(base)):
        return base
    base_post_init = getattr(base, "__post_init__", None)

    def __post_init__(self: Any) -> None:
        if base_post_init is not None:
            base_post_init(self)
        _check_policy(getattr(self, SECTION))
        if self.model_spec is not None:
            # A spec of its own: configs made from one another (replace, build) share the one they were made with.
            spec = self.model_spec = dataclasses.replace(self.model_spec)
            previous = spec.post_optimizer_build_fn
            if isinstance(previous, EnableZpccl):
                previous = previous.previous
            spec.post_optimizer_build_fn = EnableZpccl(getattr(self, SECTION), previous)

    namespace = {
        "__annotations__": {SECTION: ZeroPlusPlusPolicy},
        SECTION: dataclasses.field(default_factory=ZeroPlusPlusPolicy),
        "__post_init__": __post_init__,
        "__module__": __name__,
        "__doc__": f"torchtitan's {base.__qualname__} with zpccl's policy as its ``{SECTION}`` section.",
    }
    # torchtitan requires its configs to be keyword-only dataclasses with slots (Configurable checks it).
    cls = dataclasses.dataclass(kw_only=True, slots=True)(type(base.__name__, (base,), namespace))
    cls.__qualname__ = f"Zpccl{base.__qualname__.replace('.', '')}"
    return cls


def _check_policy(policy: ZeroPlusPlusPolicy) -> None:
    """What zpccl.fsdp would refuse in the hook, after the model and optimizer are built, refused with the config:
    a policy that serves neither side (the policy takes it for an integration whose hpZ needs no qwZ)."""
    if policy.weight_bits is None and policy.grad_bits is None:
        raise ZpcclValueError("zpccl.torchtitan: weight_bits and grad_bits (--zpccl.weight_bits, --zpccl.grad_bits) "
                              "are both None, so zpccl.fsdp would serve nothing (its hpZ gathers need qwZ's "
                              "communicator): give one of them, or leave --module zpccl.torchtitan out",
                              "zpccl.torchtitan")


def find_config(name: str) -> Callable[[], Any]:
    """The config function ``name`` names (see the module's documentation), from torchtitan's registries or a
    module of ``MODULE.NAME``. Raises ValueError naming where it looked."""
    call = "zpccl.torchtitan"
    module, _, func = name.rpartition(".")
    if module:
        registries = [_import_registry(module)]
    else:
        registries = _all_registries(name)
    failed = []
    for path, loaded in registries:
        if isinstance(loaded, Exception):
            failed.append(f"{path} ({type(loaded).__name__}: {loaded})")
            continue
        fn = getattr(loaded, func, None)
        if callable(fn):
            return fn
    searched = [p for p, m in registries if not isinstance(m, Exception)]
    raise ZpcclValueError(f"{call}: no config function {func!r} in {', '.join(searched) or 'no registry'}"
                          + (f"; not importable: {'; '.join(failed)}" if failed else "")
                          + ". Name one of torchtitan's configs (llama3_debugmodel), or MODULE.NAME", call)


def _shard_sizes(part: Any) -> set[int]:
    """The sizes of the shard groups of the model part's FSDP parameter groups (empty: not sharded by FSDP)."""
    from .fsdp._torch_fsdp import fsdp_modules, param_groups

    return {pg.mesh_info.shard_mesh_size for _name, m in fsdp_modules(part) for pg in param_groups(m)}


def _spmd_mesh(part: Any) -> bool:
    """Whether any of the model part's FSDP parameter groups is sharded over a full SPMD mesh (dp_mesh_dims)."""
    from .fsdp._torch_fsdp import fsdp_modules, param_groups

    return any(getattr(pg.mesh_info, "is_spmd_mesh", False) for _n, m in fsdp_modules(part) for pg in param_groups(m))


def _import_registry(module: str) -> tuple[str, Any]:
    """(path, module) of a config registry named as torchtitan's ``--module`` takes it: a short name of
    torchtitan's, else the module's ``config_registry`` submodule, else the module; (name, the last ImportError)
    when none imports."""
    error: Exception | None = None
    for path in [f"{p}.{module}.config_registry" for p in _PREFIXES] + [f"{module}.config_registry", module]:
        try:
            return path, importlib.import_module(path)
        except ImportError as e:
            error = e
    return module, error


def _all_registries(name: str) -> list[tuple[str, Any]]:
    """torchtitan's registries, imported in turn until one has ``name``: those whose short name ``name`` starts
    with (longest first), then the models', then the experiments'. (path, module or its ImportError) each."""
    try:
        from torchtitan.experiments import _supported_experiments
        from torchtitan.models import _supported_models
    except ImportError as e:
        raise ZpcclValueError(f"zpccl.torchtitan: looking up config {name!r} needs torchtitan (0.3), which is not "
                              f"importable ({e})", "zpccl.torchtitan") from None
    listed = sorted(_supported_models) + sorted(_supported_experiments - _supported_models)
    first = sorted((m for m in listed if name.startswith(m.replace(".", "_") + "_")), key=len, reverse=True)
    out = []
    for short in first + [m for m in listed if m not in first]:
        out.append(_import_registry(short))
        if callable(getattr(out[-1][1], name, None)):
            break
    return out


def __getattr__(name: str) -> Any:
    """torchtitan's ``--config NAME`` reads ``getattr(zpccl.torchtitan, NAME)``: the config function NAME of
    torchtitan's registries, wrapped (:func:`wrap`)."""
    if name.startswith("_"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        fn = find_config(name)
    except ZpcclValueError as e:
        # torchtitan asks with getattr(module, name, None), which hides this message: log it.
        log.error("%s", e.message)
        raise AttributeError(e.message) from None

    @functools.wraps(fn)
    def config() -> Any:
        return wrap(fn())

    return config
