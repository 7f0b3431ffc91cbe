"""ZeRO++ inside PyTorch FSDP2: one call switches a ``fully_shard``-ed model to zpccl's collectives.

    from torch.distributed.fsdp import fully_shard
    import zpccl.fsdp

    for block in model.blocks:
        fully_shard(block, reshard_after_forward=2)     # 2: keep a 1/2 slice after forward (hpZ groups of 2)
    fully_shard(model)
    zp = zpccl.fsdp.enable(model, weight_bits=8, grad_bits=4, block_size=256)
    ...train as before...
    zp.disable()                                        # back to FSDP's own collectives (NCCL)

It goes through FSDP2's own hooks, ``FSDPModule.set_custom_all_gather`` and ``set_custom_reduce_scatter``
(torch 2.9 and later):

* all-gathers over the shard group (forward, prefetch, and backward with ``reshard_after_forward=True``): qwZ,
  block-quantized weights (``weight_bits``); every rank's gathered weights are bit-identical;
* the backward all-gather over FSDP's post-forward group (``reshard_after_forward=k``, k ranks of one node):
  hpZ, exact, inside the node. Each module's own k counts (a root left at its default has no such gather), and
  modules over one shard group may use several. FSDP's groups of k must be zpccl's hpZ groups (k consecutive
  ranks of one node, in order): ``enable`` checks it on every rank for every k and refuses otherwise, naming the
  modules. Where a front end takes only a bool (torchtitan, Accelerate), ``hpz_size=k`` gives the modules
  sharded with ``reshard_after_forward=True`` FSDP's post-forward groups of k ranks, built by FSDP's own
  post-forward mesh machinery (private: ``enable`` checks the installed torch has it), exactly what
  ``reshard_after_forward=k`` builds; ``disable`` puts FSDP's back. Memory, as with ``reshard_after_forward=k``:
  each rank keeps 1/k of such a module's parameters from its forward to its backward;
* gradient reduce-scatters: qgZ (``grad_bits``), fp32 or bf16 (FSDP's ``reduce_dtype``), for every reduction
  FSDP asks for: Sum, Avg, and the PreMulSum(1/f) that ``set_gradient_divide_factor(f)`` brings when f is not
  the shard group's size (torchtitan sets f = 1.0, a plain sum, on every module). PreMulSum is served as FSDP's
  ``set_force_sum_reduction_for_comms(True)`` path does it: a sum, then the output divided by f on the same
  stream, the same gradients bit for bit. With HSDP (or an all-reduce hook) that division comes before the
  replicate all-reduce (or the hook), as PreMulSum's does, where the force-sum path divides after it: the same
  bits where dividing by f is exact (1, powers of two), else equal up to rounding.

zpccl serves each FSDP parameter group once, however many modules share it (``fully_shard([m1, m2])``), and
through one ``enable`` at a time: ``enable`` on a module inside a served model, or on a model around a served
module, is refused until the first is disabled.

What zpccl does not serve stays on FSDP's collectives, and the ``zpccl.fsdp`` logger says so once per kind:
groups FSDP gathers as uint8 (their parameters mix dtypes), element types other than fp16/bf16/fp32, groups
other than the shard and hpZ groups (``hpz=False`` leaves the hpZ gather on NCCL too, and so does a
post-forward group set after ``enable``), and the replicate dimension of a 2-D (HSDP) mesh, whose all-reduce
FSDP makes itself. ``weight_bits=None`` leaves every all-gather
on FSDP's collectives (qgZ only), ``grad_bits=None`` every reduce-scatter (qwZ and hpZ only).

Blocks and parameters: FSDP concatenates the padded shards of a module's parameters into one flat buffer per
rank, so a quantization block could hold the end of a LayerNorm weight (values near 1) and the start of a
linear weight (values near 0.02), whose small values would then keep few bits. With ``param_blocks=True``
(default) blocks restart at every parameter boundary, as they restart at every rank's shard: the call copies
the flat buffer into a staging buffer where each parameter's part starts on a block boundary (zeros between,
which change no block's scale), runs the collective there (a reduce-scatter in place), and copies the result
back. Those buffers are reserved when ``enable`` runs, with the communicators' scratch, so that nothing
allocates in the training loop (:attr:`ZeroPlusPlus.reserved_bytes`).

Memory, beyond FSDP's own: the hooks fill FSDP's all-gather and reduce-scatter buffers and allocate nothing per
call. In torch's caching allocator: the two staging buffers, each of n x S elements (n ranks, S the largest
parameter group's staged shard: its parameters' padded shards, each but the last rounded up to a block), one in
the gathers' element type and one in the reduce-scatters' (:attr:`ZeroPlusPlus.reserved_bytes`); error
feedback's residuals when on; a few zero blocks. Outside it, allocated by the library: each communicator's
scratch, reserved for its largest collective (zpCommReserve, include/zpccl.h), and the NCCL communicators zpccl
makes (the reduce-scatters' own, and each one's node-layout splits) with their connection buffers, which NCCL
sizes. ``perf/fsdp_memory.py`` measures each part against FSDP2 with NCCL.

Gradient rounding (include/zpccl.h, "Gradient rounding"): ``grad_rounding="stochastic"`` (with ``seed``) rounds qgZ's
gradients stochastically, unbiased, in both of its quantizations; ``error_feedback=True`` keeps, per parameter group,
a bf16 residual of what the last reduce-scatter's quantization lost (the size of the group's reduce-scatter input,
staged layout included) and, on two-hop layouts, the intermediate hop's residual (1/local size of it). They are
allocated, zeroed, when ``enable`` runs; :attr:`ZeroPlusPlus.residual_bytes` and the ``"grad_residuals"`` entry of
:meth:`ZeroPlusPlus.summary` say how much memory they hold. A call whose input does not have the size the residual
was made for (FSDP reducing a subset of the group's parameters) runs without feedback, and the log says so once.

Communicators are made from the model's own process groups (the user passes nothing else): one for the
gathers and one for the reduce-scatters of each shard group, so that FSDP's all-gather and reduce-scatter
streams really overlap (one communicator serializes its calls). The gathers' communicator also serves hpZ for
one post-forward group size (the smallest); each further size over the same shard group gets an hpZ
communicator of its own. On CUDA they are cuda-backend communicators (``Comm.from_torch_group``: the gathers'
and the hpZ ones wrap the group's NCCL communicator when torch and zpccl share one NCCL library); with CPU
parameters and torch's threaded process group (ranks as threads, as torch's own FSDP tests run), host-backend
communicators, which is how the CPU tests exercise every path.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from . import _torch as _ztorch
from .comm import Comm, get_unique_id, payload_size
from ._policy import ZeroPlusPlusPolicy, resolve_policy
from .enums import QUANT_TYPES, UNIQUE_ID_BYTES, Backend, Result
from .errors import ZpcclError, ZpcclValueError

__all__ = ["ZeroPlusPlus", "ZeroPlusPlusPolicy", "enable", "disable", "session_of", "MIN_TORCH"]

log = logging.getLogger("zpccl.fsdp")

#: The first torch whose FSDP2 has the custom-communication hooks.
MIN_TORCH = (2, 9)
_CALL = "zpccl.fsdp.enable"
_QUANT_DTYPES = tuple(t.name.lower() for t in QUANT_TYPES)  # as torch names them


# ---- torch's FSDP2, as this torch has it ------------------------------------------------------------------


@dataclass(frozen=True)
class _Fsdp:
    """The pieces of torch's FSDP2 that this module uses, found in whatever torch is installed."""

    torch: Any
    dist: Any
    FSDPModule: type
    AllGather: type
    ReduceScatter: type
    ShardedState: Any
    FSDPParam: Any
    make_post_forward: Any  # _fsdp_init._get_post_forward_mesh_info: what reshard_after_forward=k calls

    @staticmethod
    def load() -> "_Fsdp":
        try:
            import torch
            import torch.distributed as dist
        except ImportError as e:
            raise ZpcclError(Result.INVALID_USAGE, f"{_CALL}: zpccl.fsdp needs PyTorch {MIN_TORCH[0]}."
                             f"{MIN_TORCH[1]} or later, and torch is not importable ({e})", _CALL) from None
        version = _torch_version(torch.__version__)
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
            raise ZpcclError(Result.INVALID_USAGE, f"{_CALL}: zpccl.fsdp needs {need}; this is torch "
                             f"{torch.__version__}", _CALL)
        init = _first_module("torch.distributed.fsdp._fully_shard._fsdp_init",
                             "torch.distributed._composable.fsdp._fsdp_init")
        return _Fsdp(torch, dist, FSDPModule, api.AllGather, api.ReduceScatter, param.ShardedState,
                     getattr(param, "FSDPParam", None), getattr(init, "_get_post_forward_mesh_info", None))

    def param_groups(self, module: Any) -> list[Any]:
        return _param_groups(module)

    def check_private(self, module: Any, pg: Any) -> None:
        """Refuses, with the versions that have them, when this torch lacks the private FSDP2 attributes zpccl.fsdp
        reads and sets (torch 2.9 to 2.15 have them all)."""
        state = module._get_fsdp_state()
        missing = [f"FSDPParamGroup.{a}" for a in _PG_ATTRS if not hasattr(pg, a)]
        missing += [f"FSDPState.{a}" for a in _STATE_ATTRS if not hasattr(state, a)]
        if missing:
            raise ZpcclError(Result.INVALID_USAGE, f"{_CALL}: zpccl.fsdp needs FSDP2's {', '.join(missing)}, which "
                             f"torch {_CHECKED_TORCH} have; this is torch {self.torch.__version__}", _CALL)

    def check_post_forward(self, served: list[Any]) -> None:
        """Refuses hpz_size, with the versions that have them, when this torch lacks the pieces of FSDP2's
        post-forward mesh machinery that it uses."""
        missing = [] if self.make_post_forward is not None else ["_fsdp_init._get_post_forward_mesh_info"]
        if not hasattr(self.FSDPParam, "_init_sharded_post_forward_param_metadata"):
            missing.append("FSDPParam._init_sharded_post_forward_param_metadata")
        for s in served:
            missing += [f"FSDPParam.{a}" for p in s.param_group.fsdp_params for a in _PARAM_POST_FORWARD_ATTRS
                        if not hasattr(p, a)]
            if not hasattr(s.param_group, "is_sharded_post_forward"):
                missing.append("FSDPParamGroup.is_sharded_post_forward")
        if missing:
            raise ZpcclError(Result.INVALID_USAGE, f"{_CALL}: hpz_size needs FSDP2's {', '.join(sorted(set(missing)))}"
                             f", which torch {_CHECKED_TORCH} have; this is torch {self.torch.__version__}", _CALL)


#: The torch versions whose FSDP2 sources zpccl.fsdp's private attributes were checked against.
_CHECKED_TORCH = "2.9 to 2.15"
#: What zpccl.fsdp reads or sets on FSDP2's parameter groups and states, beyond the public FSDPModule methods.
_PG_ATTRS = ("mesh_info", "post_forward_mesh_info", "fsdp_params", "device", "gradient_divide_factor",
             "_all_gather_comm", "_reduce_scatter_comm")
_STATE_ATTRS = ("_is_root", "_auto_reshard_after_forward")
#: What hpz_size reads on each FSDPParam; and what FSDP derives from its post-forward mesh when it makes one.
_PARAM_POST_FORWARD_ATTRS = ("post_forward_mesh_info", "_orig_size", "is_dtensor")
_POST_FORWARD_DERIVED = ("sharded_post_forward_size", "contiguous_sharded_post_forward_stride")


def _param_groups(module: Any) -> list[Any]:
    """The FSDPParamGroups of one FSDP module (a list in newer torch, one or None in older)."""
    state = module._get_fsdp_state()
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:
        one = getattr(state, "_fsdp_param_group", None)
        groups = [] if one is None else [one]
    return list(groups)


def _fsdp_modules(model: Any) -> list[tuple[str, Any]]:
    """``model``'s FSDP modules with their names in it ("" for the model), in module order."""
    return [(name, m) for name, m in model.named_modules() if callable(getattr(m, "_get_fsdp_state", None))]


def _torch_version(text: str) -> tuple[int, int]:
    parts = text.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (0, 0)


def _first_module(*names: str) -> Any:
    import importlib

    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


# ---- block layout across parameter boundaries ---------------------------------------------------------------


@dataclass(frozen=True)
class BlockLayout:
    """Where each parameter's part of a flat per-rank buffer goes so that it starts on a block boundary.

    ``sizes`` are the parts' element counts in buffer order; each part but the last is padded to a multiple of
    ``block_size`` (the last one's partial block ends at the shard's end, where blocks restart anyway).
    """

    sizes: tuple[int, ...]
    block_size: int
    staged_offsets: tuple[int, ...] = field(init=False)
    staged_count: int = field(init=False)

    def __post_init__(self) -> None:
        offsets, at = [], 0
        for i, n in enumerate(self.sizes):
            offsets.append(at)
            at += n if i == len(self.sizes) - 1 else -(-n // self.block_size) * self.block_size
        object.__setattr__(self, "staged_offsets", tuple(offsets))
        object.__setattr__(self, "staged_count", at)

    @property
    def count(self) -> int:
        return sum(self.sizes)

    @property
    def identity(self) -> bool:
        """Every part already starts on a block boundary: no staging needed."""
        return self.staged_count == self.count

    def pad(self, i: int) -> int:
        return 0 if i == len(self.sizes) - 1 else self.staged_offsets[i + 1] - self.staged_offsets[i] - self.sizes[i]

    def stage(self, torch: Any, src: Any, dst: Any, zeros: Any) -> None:
        """``dst`` (rows x staged_count) <- ``src`` (rows x count), each part on a block boundary, zeros between."""
        pieces, at = [], 0
        for i, n in enumerate(self.sizes):
            pieces.append(src.narrow(-1, at, n))
            if self.pad(i):
                pieces.append(zeros.narrow(-1, 0, self.pad(i)))
            at += n
        torch.cat(pieces, dim=-1, out=dst)

    def unstage(self, torch: Any, src: Any, dst: Any) -> None:
        """``dst`` (rows x count) <- the parts of ``src`` (rows x staged_count)."""
        torch.cat([src.narrow(-1, o, n) for o, n in zip(self.staged_offsets, self.sizes)], dim=-1, out=dst)


# ---- the hooks -----------------------------------------------------------------------------------------------


@dataclass
class PathStats:
    """What one path served: calls, logical (unquantized) bytes of the collective's output, and the bytes this
    rank's data occupied on the wire ((n - 1) copies of its shard's or slices' payloads)."""

    calls: int = 0
    logical_bytes: int = 0
    wire_bytes: int = 0

    def add(self, logical: int, wire: int) -> None:
        self.calls += 1
        self.logical_bytes += logical
        self.wire_bytes += wire


@dataclass(frozen=True)
class _Hpz:
    """hpZ for FSDP's post-forward groups of k ranks over one shard group."""

    k: int
    comm: Comm  # the gathers' communicator where its hpZ group is FSDP's group of k, else one of its own
    ranks: tuple[int, ...]  # this rank's post-forward group: global ranks, in group-rank order


@dataclass(eq=False)
class _Group:
    """zpccl's communicators for one shard group."""

    ranks: tuple[int, ...]  # global ranks, in group-rank order
    gather: Comm | None = None  # qwZ, and hpZ for one k (None with weight_bits=None)
    reduce: Comm | None = None  # qgZ (None with grad_bits=None)
    hpz: dict[int, _Hpz] = field(default_factory=dict)  # k -> its hpZ
    nodes: list[dict[str, int]] | None = None  # each group rank's node, local rank and local size (hpZ's checks)

    def close(self) -> None:
        comms = [self.gather, self.reduce] + [h.comm for h in self.hpz.values() if h.comm is not self.gather]
        for comm in comms:
            if comm is not None:
                comm.close()


@dataclass(eq=False)
class _PostForward:
    """A parameter group's post-forward mesh as FSDP had it, and each of its parameters' own copy with the sizes
    FSDP derived from it when it made the parameter: what hpz_size replaces and disable() puts back."""

    info: Any  # the parameter group's
    ours: Any  # hpz_size's
    params: list[tuple[Any, Any, dict[str, Any]]]  # (FSDPParam, its post-forward mesh, its derived sizes)

    @staticmethod
    def save(pg: Any, ours: Any) -> "_PostForward":
        return _PostForward(pg.post_forward_mesh_info, ours, [
            (p, p.post_forward_mesh_info, {a: p.__dict__[a] for a in _POST_FORWARD_DERIVED if a in p.__dict__})
            for p in pg.fsdp_params])

    def apply(self, torch: Any, pg: Any) -> None:
        """What ``reshard_after_forward=k`` sets up when FSDP makes the group, on the group made with True."""
        for p, _info, _derived in self.params:
            p.post_forward_mesh_info = self.ours
            # FSDP derives these from the unsharded parameter's shape alone: a meta tensor of it stands in.
            p._init_sharded_post_forward_param_metadata(torch.empty(p._orig_size, device="meta"))
        pg.post_forward_mesh_info = self.ours

    def restore(self, pg: Any) -> None:
        if pg.post_forward_mesh_info is self.ours:  # else the user has set reshard_after_forward since: theirs
            pg.post_forward_mesh_info = self.info
        for p, info, derived in self.params:
            p.post_forward_mesh_info = info
            for a in _POST_FORWARD_DERIVED:
                if a in derived:
                    setattr(p, a, derived[a])
                else:
                    p.__dict__.pop(a, None)


@dataclass(eq=False)
class _Served:
    """One FSDP parameter group that zpccl serves: what its hooks read, and what disable() puts back. A group is
    served once however many modules share it (``fully_shard([m1, m2])``)."""

    param_group: Any
    module: Any  # the FSDP module whose state holds it (the first of the modules sharded together)
    name: str  # that module's name in the model ("" for the model itself), for messages
    group: _Group | None = None  # its shard group's communicators
    hpz: _Hpz | None = None  # its post-forward group's, when hpZ serves its backward gather
    hooked: bool = False  # whether its FSDP collectives below were replaced
    all_gather: Any = None  # FSDP's collectives before enable
    reduce_scatter: Any = None
    post_forward: _PostForward | None = None  # hpz_size's change to its post-forward mesh

    @property
    def label(self) -> str:
        return repr(self.name) if self.name else "the model"


class _Staging:
    """A reserved byte buffer handed out as typed views, one collective at a time. FSDP makes its gathers on
    one stream and its reduce-scatters on another, but an explicit ``unshard(async_op=True)`` gathers on the
    caller's: a use on another stream than the last waits for the last one's work first."""

    def __init__(self, torch: Any, device: Any, nbytes: int) -> None:
        self.torch, self.device = torch, device
        self.buffer = torch.empty(max(nbytes, 0), dtype=torch.uint8, device=device)
        self.grown = False
        self._cuda = device.type == "cuda"
        self._last: tuple[Any, Any] | None = None  # (stream, event recorded after its use)

    def view(self, count: int, dtype: Any) -> Any:
        nbytes = count * dtype.itemsize
        if nbytes > self.buffer.numel():
            self.buffer = self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.device)
            self.grown = True
        return self.buffer.narrow(0, 0, nbytes).view(dtype)

    def begin(self) -> None:
        """Orders this use after the previous one, when that was on another stream."""
        if self._cuda and self._last is not None:
            stream = self.torch.cuda.current_stream(self.device)
            if stream != self._last[0]:
                stream.wait_event(self._last[1])

    def end(self) -> None:
        if self._cuda:
            stream = self.torch.cuda.current_stream(self.device)
            event = self._last[1] if self._last is not None else self.torch.cuda.Event()
            event.record(stream)
            self._last = (stream, event)


def _make_all_gather(base: type) -> type:
    class ZeroAllGather(base):  # type: ignore[misc, valid-type]
        """qwZ over the shard group, hpZ over the post-forward group, FSDP's own all-gather otherwise."""

        def __init__(self, zp: "ZeroPlusPlus", served: _Served, fallback: Any) -> None:
            self.zp, self.served, self.fallback = zp, served, fallback

        def allocate(self, size: Any, *, dtype: Any, device: Any) -> Any:
            return self.fallback.allocate(size, dtype=dtype, device=device)

        def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, async_op: bool = False) -> Any:
            return self.zp._all_gather(self.served, output_tensor, input_tensor, group, async_op, self.fallback)

    return ZeroAllGather


def _make_reduce_scatter(base: type) -> type:
    class ZeroReduceScatter(base):  # type: ignore[misc, valid-type]
        """qgZ over the shard group, FSDP's own reduce-scatter otherwise."""

        def __init__(self, zp: "ZeroPlusPlus", served: _Served, fallback: Any) -> None:
            self.zp, self.served, self.fallback = zp, served, fallback

        def allocate(self, size: Any, *, dtype: Any, device: Any) -> Any:
            return self.fallback.allocate(size, dtype=dtype, device=device)

        def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, op: Any,
                     async_op: bool = False) -> Any:
            return self.zp._reduce_scatter(self.served, output_tensor, input_tensor, group, op, async_op,
                                           self.fallback)

    return ZeroReduceScatter


# ---- the session ---------------------------------------------------------------------------------------------


class ZeroPlusPlus:
    """zpccl serving one FSDP2 model: its communicators, staging buffers, hooks and counters.

    Made by :func:`enable`; :meth:`disable` puts FSDP's previous collectives back and frees the communicators.
    """

    def __init__(self, fsdp: _Fsdp, model: Any, policy: ZeroPlusPlusPolicy) -> None:
        self._fsdp, self.model = fsdp, model
        #: What serves the model, as :func:`enable` was told.
        self.policy = policy
        #: id(param group) -> (residual, hop residual or None): error feedback's bf16 buffers (allocated by enable).
        self._residuals: dict[int, tuple[Any, Any]] = {}
        #: Bytes the error-feedback residuals hold (sender's, and the intermediate hop's).
        self.residual_bytes = 0
        self.hop_residual_bytes = 0
        self._groups: dict[tuple[int, ...], _Group] = {}  # shard group's global ranks -> its communicators
        self._served: list[_Served] = []  # the parameter groups, in module order
        self._said: set[str] = set()
        self.stats: dict[str, PathStats] = {}
        self._layouts: dict[tuple[Any, ...], BlockLayout] = {}
        self._gather_stage: _Staging | None = None
        self._reduce_stage: _Staging | None = None
        self._zeros: dict[tuple[Any, int], Any] = {}
        self.reserved_bytes = 0
        self.device: Any = None
        self.backend: Backend | None = None
        self._closed = False
        self._ranks_of: dict[Any, tuple[int, ...]] = {}

    # ---- the policy's choices ----

    @property
    def weight_bits(self) -> int | None:
        """qwZ's code bits (None: the all-gathers stay on FSDP's)."""
        return self.policy.weight_bits

    @property
    def grad_bits(self) -> int | None:
        """qgZ's code bits (None: the reduce-scatters stay on FSDP's)."""
        return self.policy.grad_bits

    @property
    def block_size(self) -> int:
        """Elements per quantization block of the weights (qwZ)."""
        return self.policy.block_size

    @property
    def grad_block_size(self) -> int:
        """Elements per quantization block of the gradients (qgZ)."""
        return self.policy.grad_block

    @property
    def hpz(self) -> bool:
        """Whether hpZ serves the backward gathers over FSDP's post-forward groups."""
        return self.policy.hpz

    @property
    def hpz_size(self) -> int | None:
        """The post-forward group size that modules sharded with reshard_after_forward=True get (None: none)."""
        return self.policy.hpz_size

    @property
    def param_blocks(self) -> bool:
        """Whether blocks restart at parameter boundaries."""
        return self.policy.param_blocks

    @property
    def error_feedback(self) -> bool:
        """Whether qgZ keeps residuals per parameter group."""
        return self.policy.error_feedback

    def _ranks(self, group: Any) -> tuple[int, ...]:
        """The global ranks of a process group, in group-rank order (looked up once a group)."""
        ranks = self._ranks_of.get(group)
        if ranks is None:
            ranks = self._ranks_of[group] = tuple(self._fsdp.dist.get_process_group_ranks(group))
        return ranks

    # ---- reporting ----

    def _count(self, path: str, logical: int, wire: int) -> None:
        self.stats.setdefault(path, PathStats()).add(logical, wire)

    def _say_once(self, kind: str, message: str, level: int = logging.WARNING) -> None:
        if kind not in self._said:
            self._said.add(kind)
            log.log(level, "zpccl.fsdp: %s", message)

    def summary(self) -> dict[str, dict[str, int]]:
        """The counters as plain dicts: ``{"qwz": {"calls": .., "logical_bytes": .., "wire_bytes": ..}, ...}``.
        With error feedback, ``"grad_residuals"`` counts the qgZ calls that fed back (``calls``) and the memory of
        the residuals (``residual_bytes``, ``hop_residual_bytes``, ``tensors``); it sends nothing itself."""
        out = {k: dict(calls=v.calls, logical_bytes=v.logical_bytes, wire_bytes=v.wire_bytes)
               for k, v in sorted(self.stats.items())}
        if self.error_feedback:
            fed = out.pop("grad_residuals", dict(calls=0, logical_bytes=0, wire_bytes=0))
            out["grad_residuals"] = dict(fed, residual_bytes=self.residual_bytes,
                                         hop_residual_bytes=self.hop_residual_bytes, tensors=len(self._residuals))
        return out

    def reset_stats(self) -> None:
        self.stats.clear()

    # ---- lifecycle ----

    def disable(self) -> None:
        """Gives every module its previous collectives (and, under ``hpz_size``, its post-forward mesh) back and
        destroys zpccl's communicators. Idempotent. Call it between steps, not between a forward and its
        backward."""
        if self._closed:
            return
        held = [s.name for s in self._served if s.post_forward and s.param_group.is_sharded_post_forward]
        if held:
            raise ZpcclError(Result.INVALID_USAGE, f"zpccl.fsdp.disable: modules {held} hold their parameters "
                             "resharded to hpz_size's groups between a forward and its backward; call disable() "
                             "after the backward", "zpccl.fsdp.disable")
        self._closed = True
        for served in self._served:
            if served.hooked:
                served.param_group._all_gather_comm = served.all_gather
                served.param_group._reduce_scatter_comm = served.reduce_scatter
            if served.post_forward is not None:
                served.post_forward.restore(served.param_group)
            if _SERVED.get(id(served.param_group)) is self:
                del _SERVED[id(served.param_group)]
        self._served.clear()
        if self.device is not None and self.device.type == "cuda":
            self._fsdp.torch.cuda.synchronize(self.device)
        for g in self._groups.values():
            g.close()
        self._groups.clear()
        self._residuals.clear()
        self._gather_stage = self._reduce_stage = None

    def __enter__(self) -> "ZeroPlusPlus":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.disable()

    # ---- the calls ----

    def _fallback(self, kind: str, message: str, call: Callable[[], Any]) -> Any:
        self._say_once(kind, message + "; it stays on FSDP's own collective")
        self._count("torch_" + kind, 0, 0)
        return call()

    def _block(self, reduce: bool) -> int:
        return self.policy.block(reduce)

    def _layout(self, sizes: list[int] | None, count: int, reduce: bool) -> BlockLayout:
        key = (tuple(sizes) if sizes else (count,), self._block(reduce))
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._layouts[key] = BlockLayout(*key)
        return layout

    def _zeros_for(self, rows: int, dtype: Any, reduce: bool) -> Any:
        key = (dtype, rows, self._block(reduce))
        z = self._zeros.get(key)
        if z is None:
            z = self._zeros[key] = self._fsdp.torch.zeros(rows, key[2], dtype=dtype, device=self.device)
        return z

    def _all_gather(self, hook: _Served, output: Any, input: Any, group: Any, async_op: bool, fallback: Any) -> Any:
        def nccl() -> Any:
            return fallback(output_tensor=output, input_tensor=input, group=group, async_op=async_op)

        ranks = self._ranks(group)
        if hook.group is not None and ranks == hook.group.ranks:
            dtype = str(output.dtype).replace("torch.", "")
            if dtype not in _QUANT_DTYPES:
                kind = "uint8" if dtype == "uint8" else "dtype"
                why = ("a module whose parameters mix dtypes is gathered as uint8 bytes" if kind == "uint8"
                       else f"{dtype} parameters are not quantized (qwZ takes fp16, bf16, fp32)")
                return self._fallback("all_gather_" + kind, why, nccl)
            return self._qwz(hook, hook.group, output, input)
        if hook.hpz is not None and ranks == hook.hpz.ranks:
            return self._hpz(hook.hpz, output, input)
        pf = _post_forward_group(hook.param_group)
        if pf is None or self._ranks(pf) != ranks:
            return self._fallback("all_gather_group", f"an all-gather over group {list(ranks)}, which zpccl has no "
                                  "communicator for", nccl)
        if not self.hpz:
            return self._fallback("all_gather_hpz_off", f"the backward all-gather over FSDP's post-forward group "
                                  f"{list(ranks)} (hpz=False)", nccl)
        return self._fallback("all_gather_post_forward", f"the backward all-gather over FSDP's post-forward group "
                              f"{list(ranks)}, which module {hook.label} did not have when enable ran (call enable "
                              "after setting reshard_after_forward)", nccl)

    def _qwz(self, hook: _Served, g: _Group, output: Any, input: Any) -> None:
        torch, comm = self._fsdp.torch, g.gather
        n, r, count = comm.nranks, comm.rank, input.numel()
        layout = self._layout(self._gather_sizes(hook, count), count, reduce=False)
        esz = output.element_size()
        if layout.identity:
            comm.quant_all_gather(input, output)
        else:
            sp = layout.staged_count
            self._gather_stage.begin()
            staged = self._gather_stage.view(n * sp, output.dtype)
            own = staged.narrow(0, r * sp, sp)
            layout.stage(torch, input, own, self._zeros_for(1, output.dtype, reduce=False)[0])
            comm.quant_all_gather(own, staged)
            layout.unstage(torch, staged.view(n, sp), output.view(n, count))
            self._gather_stage.end()
        wire = (n - 1) * payload_size(layout.staged_count, self.weight_bits, self.block_size)
        self._count("qwz", output.numel() * esz, wire)

    def _hpz(self, hpz: _Hpz, output: Any, input: Any) -> None:
        hpz.comm.hier_all_gather(input, output)
        wire = (hpz.k - 1) * input.numel() * input.element_size()
        self._count("hpz", output.numel() * output.element_size(), wire)

    def _gather_sizes(self, hook: _Served, count: int) -> list[int] | None:
        """Each parameter's part of the flat shard being gathered, or None when it cannot be told."""
        if not self.param_blocks:
            return None
        sizes = []
        for p in getattr(hook.param_group, "fsdp_params", ()):
            data = getattr(p, "_sharded_param_data", None)
            if data is None:
                return self._unknown_sizes("all-gather")
            sizes.append(data.numel())
        return sizes if sum(sizes) == count else self._unknown_sizes("all-gather")

    def _reduce_sizes(self, hook: _Served, count: int) -> list[int] | None:
        """Each parameter's part of one rank's slice of the reduce-scatter input, or None when it cannot be told:
        FSDP reduces the parameters that got a gradient, in order; padded shards as in the all-gather."""
        if not self.param_blocks:
            return None
        params = list(getattr(hook.param_group, "fsdp_params", ()))
        for subset in ([p for p in params if p.sharded_param.requires_grad], params):
            try:
                sizes = [p.padded_sharded_param_size.numel() for p in subset]
            except AttributeError:
                break
            if sum(sizes) == count:
                return sizes
        return self._unknown_sizes("reduce-scatter")

    def _unknown_sizes(self, what: str) -> None:
        self._say_once("sizes_" + what, f"the parameter boundaries of a {what} input are not what FSDP's "
                       "parameters say (an all-gather extension, or unused parameters): its blocks run across "
                       "parameters", logging.INFO)
        return None

    def _reduce_scatter(self, hook: _Served, output: Any, input: Any, group: Any, op: Any, async_op: bool,
                        fallback: Any) -> Any:
        def nccl() -> Any:
            return fallback(output_tensor=output, input_tensor=input, group=group, op=op, async_op=async_op)

        ranks = self._ranks(group)
        g = hook.group
        if g is None or g.reduce is None or ranks != g.ranks:
            return self._fallback("reduce_scatter_group", f"a reduce-scatter over group {list(ranks)}, which zpccl "
                                  "has no communicator for", nccl)
        dtype = str(output.dtype).replace("torch.", "")
        if dtype not in _QUANT_DTYPES:
            return self._fallback("reduce_scatter_dtype", f"{dtype} gradients are not quantized (qgZ takes fp16, "
                                  "bf16, fp32)", nccl)
        name = _op_name(self._fsdp.dist, op)
        if name is None:
            return self._fallback("reduce_scatter_op", f"a reduce-scatter with {op}, which qgZ does not do", nccl)
        factor = hook.param_group.gradient_divide_factor if name == "premul_sum" else None
        if name == "premul_sum":
            if not isinstance(factor, (int, float)):
                return self._fallback("reduce_scatter_premul", f"a PreMulSum reduce-scatter whose parameter group "
                                      f"holds no divide factor ({factor!r})", nccl)
            name = "sum"  # then divided as FSDP's force-sum path does
        torch, comm = self._fsdp.torch, g.reduce
        n, count = comm.nranks, output.numel()
        layout = self._layout(self._reduce_sizes(hook, count), count, reduce=True)
        esz = output.element_size()
        grad = self._grad_kwargs(hook, n * layout.staged_count)
        if layout.identity:
            comm.quant_reduce_scatter(input, output, op=name, **grad)
        else:
            # In place in the staging buffer (the result over this rank's own slice, NCCL's rule): it holds the
            # staged input only, no second buffer for the output.
            sp = layout.staged_count
            self._reduce_stage.begin()
            staged = self._reduce_stage.view(n * sp, output.dtype)
            own = staged.narrow(0, comm.rank * sp, sp)
            zeros = self._zeros_for(n, output.dtype, reduce=True)
            layout.stage(torch, input.view(n, count), staged.view(n, sp), zeros)
            comm.quant_reduce_scatter(staged, own, op=name, **grad)
            layout.unstage(torch, own, output)
            self._reduce_stage.end()
        _divide(output, factor)
        wire = (n - 1) * payload_size(layout.staged_count, self.grad_bits, self.grad_block_size)
        self._count("qgz", input.numel() * esz, wire)
        if grad:
            self._count("grad_residuals", 0, 0)

    def _grad_kwargs(self, hook: _Served, elements: int) -> dict[str, Any]:
        """The residuals of this parameter group's reduce-scatter of ``elements`` (staged) elements, or {}."""
        if not self.error_feedback:
            return {}
        res, hop = self._residuals.get(id(hook.param_group), (None, None))
        if res is None or res.numel() != elements:
            self._say_once("residual_size", f"a reduce-scatter of {elements} elements has no residual of its size "
                           "(FSDP reduced a subset of the group's parameters): it runs without error feedback",
                           logging.INFO)
            return {}
        return dict(residual=res, hop_residual=hop)


def _op_name(dist: Any, op: Any) -> str | None:
    """"sum", "avg" or "premul_sum" for FSDP's reduce op, None for anything else."""
    for name, value in (("sum", dist.ReduceOp.SUM), ("avg", dist.ReduceOp.AVG),
                        ("premul_sum", dist.ReduceOp.PREMUL_SUM)):
        try:
            if op == value:
                return name
        except (TypeError, RuntimeError):
            continue
    return None


def _divide(output: Any, factor: float | None) -> None:
    """What FSDP does after a reduce-scatter on its force-sum path (set_force_sum_reduction_for_comms(True)): the
    summed output divided by the parameter group's gradient divide factor, in its own dtype, on the stream the
    reduce-scatter ran on. FSDP asks for NCCL's PreMulSum(1/factor) instead when the factor is not the shard
    group's size; a sum then this division serves it, bit for bit what the force-sum path gives (the factor
    comes from the parameter group: the op may not expose it). A factor of 1 is a plain sum. With a replicate
    dimension (HSDP) or an all-reduce hook, the force-sum path divides after those, where PreMulSum, and so this,
    divides before: the same bits where dividing by the factor is exact (1, powers of two), else equal up to
    rounding."""
    if factor is not None and factor != 1:
        output.div_(factor)


#: id(FSDP parameter group) -> the live ZeroPlusPlus that serves it. Served groups, not models, are what a second
#: enable must not stack on: a model, a module inside it and a model around it share them.
_SERVED: dict[int, ZeroPlusPlus] = {}


def session_of(model: Any) -> ZeroPlusPlus | None:
    """The live :class:`ZeroPlusPlus` that serves ``model`` (or a module inside it), or None."""
    if not _SERVED or not callable(getattr(model, "named_modules", None)):
        return None
    for _name, m in _fsdp_modules(model):
        for pg in _param_groups(m):
            if id(pg) in _SERVED:
                return _SERVED[id(pg)]
    return None


def disable(model: Any) -> None:
    """Puts FSDP's own collectives back (undoes :func:`enable`) on ``model`` and on everything else the same
    ``enable`` serves; a no-op when zpccl does not serve it."""
    session = session_of(model)
    if session is not None:
        session.disable()


# ---- enable --------------------------------------------------------------------------------------------------


def enable(model: Any, policy: ZeroPlusPlusPolicy | None = None, **options: Any) -> ZeroPlusPlus:
    """Switches a ``fully_shard``-ed model to zpccl's collectives (see the module's docstring). Collective: every
    rank of the model's process groups calls it, after ``fully_shard`` and before the first step.

    ``policy`` is a :class:`~zpccl.ZeroPlusPlusPolicy`; or give its fields as keyword arguments instead (not
    both), e.g. ``enable(model, weight_bits=8, grad_bits=4, block_size=256)``. Its fields, as FSDP reads them:

    * ``weight_bits`` (8 or 4): qwZ's codes; ``grad_bits`` (4 or 8): qgZ's; ``block_size``: elements per
      quantization block, a power of two in [32, 8192]; ``grad_block_size``: the gradients' own, if given (else
      ``block_size``): smaller blocks follow a gradient's spread of magnitudes more closely, at a scale's 4 bytes a
      block (int4 at 64: 3.56x fewer bytes than bf16, at 256: 3.88x). ``weight_bits=None`` leaves the
      all-gathers (forward and backward) on FSDP's own collectives, ``grad_bits=None`` the reduce-scatters; zpccl
      then makes no communicator, staging or scratch for them.
    * ``hpz``: serve the backward all-gather over FSDP's post-forward group (``reshard_after_forward=k``) with
      hpZ; False leaves it on FSDP's collective.
    * ``hpz_size`` (an int >= 2 dividing the ranks per node, or None): give every module sharded with
      ``reshard_after_forward=True`` a post-forward group of that many ranks, as ``reshard_after_forward=k`` would
      (for front ends that take only a bool); its backward gathers are then hpZ. Memory: each rank keeps 1/k of
      those modules' parameters from their forward to their backward. Modules with an int keep theirs, and
      modules left at False (a root at its default) keep False; :meth:`ZeroPlusPlus.disable` puts FSDP's back.
    * ``param_blocks``: blocks restart at each parameter boundary (costs two copies of each collective's data
      on the device, and two staging buffers of the largest module's gathered size: see the module's docstring).
    * ``ranks_per_node`` / ``node_id``: emulate a node layout (otherwise a rank's node is its host, as NCCL
      tells it: hostname or ``NCCL_HOSTID``).
    * ``grad_rounding`` (``"nearest"`` or ``"stochastic"``) and ``seed`` (>= 0): qgZ's rounding of gradients;
      ``error_feedback``: keep a bf16 residual per parameter group (see the module's docstring for its memory).

    zpccl serves a parameter group through one ``enable`` at a time: calling it on a module inside a model it
    already serves, or on a model around a module it serves, is refused until that one is disabled.

    Returns the :class:`ZeroPlusPlus` that serves the model (``.summary()``, ``.disable()``). Raises
    :class:`~zpccl.ZpcclError` (or its ValueError/TypeError subclasses) with a message saying what to change.
    """
    fsdp = _Fsdp.load()
    policy = resolve_policy(_CALL, policy, options)
    served = _served_groups(fsdp, model)
    if policy.hpz_size is not None:
        fsdp.check_post_forward(served)
    session = ZeroPlusPlus(fsdp, model, policy)
    session._served = served
    try:
        _attach(session)
    except BaseException:
        session.disable()
        raise
    for s in served:
        _SERVED[id(s.param_group)] = session
    return session


def _served_groups(fsdp: _Fsdp, model: Any) -> list[_Served]:
    """The model's FSDP parameter groups, each once (modules sharded together share one), in module order;
    refused where zpccl already serves one."""
    modules = [(name, m) for name, m in _fsdp_modules(model) if isinstance(m, fsdp.FSDPModule)]
    if not modules:
        raise ZpcclValueError(f"{_CALL}: {type(model).__name__} has no fully_shard-ed module: call "
                              "torch.distributed.fsdp.fully_shard on it (and its blocks) first", _CALL)
    served: dict[int, _Served] = {}
    for name, m in modules:
        groups = fsdp.param_groups(m)
        if len(groups) > 1:
            raise ZpcclValueError(f"{_CALL}: module {name or _class_name(fsdp, m)!r} has several parameter groups "
                                  "(shard_placement_fn with several meshes); FSDP's custom collectives take one "
                                  "group a module", _CALL)
        for pg in groups:
            if id(pg) not in served:
                fsdp.check_private(m, pg)
                served[id(pg)] = _Served(pg, m, name)
    if not served:
        raise ZpcclValueError(f"{_CALL}: the model's FSDP modules hold no parameters", _CALL)
    for s in served.values():
        other = _SERVED.get(id(s.param_group))
        if other is not None:
            there = next(o for o in other._served if o.param_group is s.param_group)
            here = "this model" if not s.name else f"its module {s.name!r}"
            as_ = f"as its module {there.name!r} of" if there.name else "as"
            raise ZpcclError(Result.INVALID_USAGE, f"{_CALL}: zpccl already serves {here} "
                             f"({_class_name(fsdp, s.module)}), {as_} the {_class_name(fsdp, other.model)} it was "
                             "enabled on; call disable() on that ZeroPlusPlus first", _CALL)
    return list(served.values())


def _class_name(fsdp: _Fsdp, module: Any) -> str:
    """The name of the class the user wrote, not of the FSDP subclass that fully_shard swaps in."""
    return next(c for c in type(module).__mro__ if not issubclass(c, fsdp.FSDPModule)).__name__


def _attach(session: ZeroPlusPlus) -> None:
    served = session._served
    session.device = served[0].param_group.device
    if any(getattr(s.param_group.mesh_info, "replicate_process_group", None) is not None for s in served):
        session._say_once("hsdp", "the replicate dimension of a 2-D (HSDP) mesh: FSDP all-reduces gradients over it "
                          "itself; that stays on NCCL", logging.INFO)
    for s in served:
        shard = s.param_group.mesh_info.shard_process_group
        s.group = session._groups.get(session._ranks(shard)) or _open_group(session, shard, served)
    if session.hpz_size is not None:
        _apply_hpz_size(session)
    for g in session._groups.values():
        _serve_gathers(session, g, [s for s in served if s.group is g])
    _reserve(session)
    if session.error_feedback:
        for s in served:
            _allocate_residuals(session, s)
    AllGatherHook, ReduceScatterHook = _make_all_gather(session._fsdp.AllGather), \
        _make_reduce_scatter(session._fsdp.ReduceScatter)
    for s in served:
        s.all_gather, s.reduce_scatter = s.param_group._all_gather_comm, s.param_group._reduce_scatter_comm
        s.hooked = True
        if session.weight_bits is not None:
            s.module.set_custom_all_gather(AllGatherHook(session, s, s.all_gather))
        if session.grad_bits is not None:
            s.module.set_custom_reduce_scatter(ReduceScatterHook(session, s, s.reduce_scatter))
    ks = sorted({k for g in session._groups.values() for k in g.hpz})
    log.info("zpccl.fsdp: %d parameter groups on %s, %d shard group(s): %s, %s, blocks of %d%s%s%s",
             len(served), session.backend.name.lower() if session.backend else "?", len(session._groups),
             "all-gathers on FSDP's" if session.weight_bits is None else "qwZ int%d" % session.weight_bits,
             "reduce-scatters on FSDP's" if session.grad_bits is None else "qgZ int%d" % session.grad_bits,
             session.block_size,
             " (gradients' of %d)" % session.grad_block_size if session.grad_block_size != session.block_size else "",
             ", hpZ groups of %s" % " and ".join(map(str, ks)) if ks else "",
             ", blocks restart at parameters" if session.param_blocks else "")
    if session.error_feedback:
        log.info("zpccl.fsdp: error feedback: %d residual(s), %d bytes (and %d for the intermediate hop)",
                 len(session._residuals), session.residual_bytes, session.hop_residual_bytes)


def _allocate_residuals(session: ZeroPlusPlus, served: _Served) -> None:
    """Error feedback's zeroed bf16 residuals for one parameter group: its reduce-scatter input's elements (in the
    staged layout when blocks restart at parameters), and the intermediate hop's on two-hop layouts."""
    torch, pg, comm = session._fsdp.torch, served.param_group, served.group.reduce
    layout = _group_layout(session, pg, reduce=True)
    per_rank = layout.staged_count if session.param_blocks else layout.count
    res = torch.zeros(comm.nranks * per_rank, dtype=torch.bfloat16, device=session.device)
    hop_count = comm.grad_hop_residual_count(per_rank)
    hop = torch.zeros(hop_count, dtype=torch.bfloat16, device=session.device) if hop_count else None
    session._residuals[id(pg)] = (res, hop)
    session.residual_bytes += res.numel() * 2
    session.hop_residual_bytes += hop_count * 2


def _post_forward_group(pg: Any) -> Any:
    """FSDP's post-forward process group of a parameter group where it is a group of its own
    (``reshard_after_forward=k``, 1 < k < the shard group's size), else None."""
    info = pg.post_forward_mesh_info
    return None if info is None or info == pg.mesh_info else info.shard_process_group


# ---- communicators -------------------------------------------------------------------------------------------


def _open_group(session: ZeroPlusPlus, shard: Any, served: list[_Served]) -> _Group:
    """A shard group's entry, with its reduce-scatters' communicator, and the node layout that hpZ's checks need.
    The gathers' communicators come later (:func:`_serve_gathers`): their hpZ groups depend on the post-forward
    groups. Collective over the shard group, in module order on every rank."""
    g = session._groups[session._ranks(shard)] = _Group(session._ranks(shard))
    _choose_backend(session, shard)
    hpz = session.weight_bits is not None and session.hpz and (session.hpz_size is not None or any(
        _post_forward_group(s.param_group) is not None for s in served
        if session._ranks(s.param_group.mesh_info.shard_process_group) == g.ranks))
    if session.grad_bits is not None or hpz:
        # With grad_bits=None it is made for the node layout only, and closed once the gathers' are made.
        g.reduce = _make_comm(session, shard, reduce=True, wrap=False)
    if hpz:
        mine = dict(node=g.reduce.node_rank, local=g.reduce.local_rank, local_size=g.reduce.local_size)
        g.nodes = [{} for _ in g.ranks]
        session._fsdp.dist.all_gather_object(g.nodes, mine, group=shard)
    return g


def _choose_backend(session: ZeroPlusPlus, shard: Any) -> None:
    device, dist = session.device, session._fsdp.dist
    if device.type == "cuda":
        session.backend = Backend.CUDA
    elif device.type == "cpu":
        backend = str(dist.get_backend(shard)).lower()
        if backend != "threaded":
            raise ZpcclValueError(
                f"{_CALL}: the model's parameters are on the CPU and its process group is {backend!r}: zpccl's "
                "host backend runs ranks as threads of one process (torch's threaded process group); use CUDA "
                "devices, or a threaded group", _CALL)
        session.backend = Backend.HOST
    else:
        raise ZpcclValueError(f"{_CALL}: parameters on {device}: zpccl serves CUDA devices (and, on the host "
                              "backend, the CPU)", _CALL)


def _make_comm(session: ZeroPlusPlus, shard: Any, reduce: bool, hpz_size: int | None = None,
               wrap: bool | None = None) -> Comm:
    # Each communicator quantizes in its own collective's blocks (gradients' and weights' may differ).
    config = dict(session.policy.comm_config(reduce), hpz_size=hpz_size)
    if session.device.type == "cuda":
        return Comm.from_torch_group(shard, device=session.device, wrap=wrap, **config)
    return _host_comm(shard, config)


def _host_comm(group: Any, config: dict[str, Any]) -> Comm:
    rank, nranks, _ = _ztorch.group_info(group)
    uid = get_unique_id() if rank == 0 else bytes(UNIQUE_ID_BYTES)
    uid = _ztorch.broadcast_bytes(uid, UNIQUE_ID_BYTES, group, "cpu")
    return Comm(nranks, rank, uid, backend="host", **config)


def _serve_gathers(session: ZeroPlusPlus, g: _Group, served: list[_Served]) -> None:
    """The gathers' communicator of one shard group, and hpZ for each post-forward group size k its parameter
    groups use: the gathers' communicator takes the smallest k as its hpZ group, every other k gets a communicator
    of its own. Checked first, with every rank of the group, that FSDP's post-forward groups are zpccl's hpZ
    groups."""
    by_k: dict[int, list[_Served]] = {}
    mine: dict[int, tuple[int, ...]] = {}  # k -> this rank's post-forward group
    for s in served:
        pf = _post_forward_group(s.param_group) if session.hpz and session.weight_bits is not None else None
        if pf is not None:
            by_k.setdefault(pf.size(), []).append(s)
            ranks = mine.setdefault(pf.size(), session._ranks(pf))
            if ranks != session._ranks(pf):
                raise ZpcclError(Result.INTERNAL_ERROR, f"{_CALL}: parameter groups over shard group "
                                 f"{list(g.ranks)} put this rank in two post-forward groups of {pf.size()}: "
                                 f"{list(ranks)} and {list(session._ranks(pf))}", _CALL)
    shard = served[0].param_group.mesh_info.shard_process_group
    if by_k:
        _check_hpz_groups(session, g, shard, mine, by_k)
    try:
        if session.weight_bits is not None:
            ks = sorted(by_k)
            g.gather = _make_comm(session, shard, reduce=False, hpz_size=ks[0] if ks else None)
            for k in ks:
                comm = g.gather if k == ks[0] else _make_comm(session, shard, reduce=False, hpz_size=k)
                g.hpz[k] = _Hpz(k, comm, mine[k])
                if comm.hpz_rank != mine[k].index(g.ranks[comm.rank]):
                    raise ZpcclError(Result.INTERNAL_ERROR, f"{_CALL}: zpccl's hpZ rank {comm.hpz_rank} is not this "
                                     f"rank's place in FSDP's post-forward group {list(mine[k])}", _CALL)
                for s in by_k[k]:
                    s.hpz = g.hpz[k]
    finally:
        if session.grad_bits is None and g.reduce is not None:
            g.reduce.close()
            g.reduce = None


def _check_hpz_groups(session: ZeroPlusPlus, g: _Group, shard: Any, mine: dict[int, tuple[int, ...]],
                      by_k: dict[int, list[_Served]]) -> None:
    """Checks, with every rank of the shard group, that each of FSDP's post-forward groups of k ranks, for every k
    the group's modules use, is one of zpccl's hpZ groups of size k (k consecutive local ranks of one node, from a
    multiple of k, in order). Every rank reaches the same verdict: all look at the same gathered facts."""
    theirs: list[Any] = [None] * len(g.ranks)
    session._fsdp.dist.all_gather_object(theirs, {k: list(r) for k, r in mine.items()}, group=shard)
    index = {r: i for i, r in enumerate(g.ranks)}
    if any(set(t) != set(mine) for t in theirs):
        raise ZpcclValueError(f"{_CALL}: the ranks of shard group {list(g.ranks)} shard their modules with different "
                              f"reshard_after_forward sizes ({[sorted(t) for t in theirs]}): every rank must shard "
                              "the same model the same way", _CALL)
    for k in sorted(mine):
        for pf in (t[k] for t in theirs):
            members = [g.nodes[index[r]] for r in pf]
            nodes = sorted({m["node"] for m in members})
            local = [m["local"] for m in members]
            problem = None
            if len(nodes) > 1:
                problem = f"on nodes {nodes}"
            elif members[0]["local_size"] % k:
                problem = f"on a node of {members[0]['local_size']} ranks, which groups of {k} do not divide"
            elif local != list(range(local[0], local[0] + k)) or local[0] % k:
                problem = f"local ranks {local} of node {nodes[0]}, not {k} consecutive ones from a multiple of {k}"
            if problem:
                given = "hpz_size" if all(s.post_forward for s in by_k[k]) else "reshard_after_forward"
                raise ZpcclValueError(
                    f"{_CALL}: {given}={k} makes FSDP gather backward weights over ranks {[index[r] for r in pf]} "
                    f"of the shard group, which are {problem}: hpZ keeps that gather inside one node, over {k} "
                    f"consecutive ranks of it (modules {[s.name for s in by_k[k]]}). Use a {given} that divides "
                    "the ranks per node (with ranks numbered node by node), or hpz=False to leave that gather on "
                    "NCCL", _CALL)


# ---- hpz_size ------------------------------------------------------------------------------------------------


def _apply_hpz_size(session: ZeroPlusPlus) -> None:
    """Gives the parameter groups sharded with reshard_after_forward=True a post-forward group of hpz_size ranks,
    as reshard_after_forward=hpz_size would have made them: through torch's own maker of post-forward meshes,
    one mesh per shard mesh, shared by its groups (their process groups made once). Every group is checked before
    any changes."""
    k, fsdp = session.hpz_size, session._fsdp
    targets = _hpz_size_targets(session)
    for g in {id(s.group): s.group for s in targets}.values():
        _check_hpz_size_fits(session, g, [s for s in targets if s.group is g])
    meshes: dict[tuple, Any] = {}
    for s in targets:
        mesh = s.param_group.mesh_info.mesh
        key = (mesh.device_type, tuple(mesh.mesh.shape), tuple(mesh.mesh.flatten().tolist()))
        if key not in meshes:
            meshes[key] = fsdp.make_post_forward(k, s.param_group.mesh_info)
        s.post_forward = _PostForward.save(s.param_group, meshes[key])
        s.post_forward.apply(fsdp.torch, s.param_group)


def _hpz_size_targets(session: ZeroPlusPlus) -> list[_Served]:
    """The parameter groups that hpz_size applies to: those resharded after forward over the whole shard group.
    Those it cannot apply to keep it, and the log says why once per reason."""
    k, targets, kept = session.hpz_size, [], {}
    for s in session._served:
        pg = s.param_group
        if pg.post_forward_mesh_info is None or pg.post_forward_mesh_info != pg.mesh_info or _default_root(session, s):
            continue  # False, or an int of the user's, or a root that FSDP will set to False
        if len(s.group.ranks) == k:
            why = (f"its shard group has {k} ranks: FSDP's post-forward group would be the shard group itself, "
                   "whose backward gathers are qwZ")
        elif any(p.is_dtensor for p in pg.fsdp_params):
            why = "its parameters are DTensors (tensor parallel), which FSDP does not reshard to a smaller group"
        elif getattr(pg.mesh_info, "is_spmd_mesh", False):
            why = "FSDP does not reshard a module of an SPMD mesh (dp_mesh_dims) to a smaller group"
        elif any(getattr(p, "_release_all_gather_outputs_after_post_all_gather", False) for p in pg.fsdp_params):
            why = "its all-gather extension releases the gathered outputs that a smaller group's shard is cut from"
        else:
            targets.append(s)
            continue
        kept.setdefault(why, []).append(s.name)
    for why, names in kept.items():
        session._say_once("hpz_size: " + why, f"hpz_size={k} leaves modules {names} at reshard_after_forward=True: "
                          f"{why}", logging.INFO if why.startswith("its shard group") else logging.WARNING)
    return targets


def _default_root(session: ZeroPlusPlus, served: _Served) -> bool:
    """Whether FSDP will set the module's reshard_after_forward to False as a root left at its default: it marks
    the outermost FSDP modules roots when the first forward runs."""
    state = served.module._get_fsdp_state()
    if not state._auto_reshard_after_forward:
        return False
    if state._is_root is not None:
        return bool(state._is_root)
    names = {name for name, _m in _fsdp_modules(session.model)}
    parts = served.name.split(".") if served.name else []
    return not any(".".join(parts[:i]) in names for i in range(len(parts)))


def _check_hpz_size_fits(session: ZeroPlusPlus, g: _Group, served: list[_Served]) -> None:
    """hpz_size against one shard group and its nodes; the same verdict on every rank (gathered facts)."""
    k, names = session.hpz_size, [s.name for s in served]
    if len(g.ranks) % k:
        raise ZpcclValueError(f"{_CALL}: hpz_size {k} must divide the ranks of the shard group that modules {names} "
                              f"are sharded over, {len(g.ranks)}", _CALL)
    sizes = sorted({f["local_size"] for f in g.nodes})
    if any(size % k for size in sizes):
        raise ZpcclValueError(f"{_CALL}: hpz_size {k} must divide the ranks per node: the shard group of modules "
                              f"{names} has nodes of {sizes} ranks", _CALL)


def _staged_bytes(session: ZeroPlusPlus, pg: Any, n: int, reduce: bool) -> int:
    """Bytes of staging one collective of this parameter group needs (0 when its parts need none): its all-gather
    output or reduce-scatter input in the staged layout (the reduce-scatter runs in place there)."""
    if not session.param_blocks or (session.grad_bits if reduce else session.weight_bits) is None:
        return 0
    try:
        layout = _group_layout(session, pg, reduce)
        dtype = _collective_dtype(pg, reduce)
    except AttributeError:
        return 0
    return 0 if layout.identity else n * layout.staged_count * dtype.itemsize


def _collective_bytes(session: ZeroPlusPlus, pg: Any, n: int, reduce: bool) -> int:
    """Logical bytes of this parameter group's all-gather output or reduce-scatter input, staged or not."""
    layout = _group_layout(session, pg, reduce)
    return n * max(layout.count, layout.staged_count) * _collective_dtype(pg, reduce).itemsize


def _collective_dtype(pg: Any, reduce: bool) -> Any:
    """The element type of a parameter group's all-gather (param_dtype, else the parameters' own) or reduce-scatter
    (reduce_dtype, else that); the widest where parameters differ (FSDP then gathers bytes, which stay on NCCL)."""
    def of(p: Any) -> Any:
        dtype = (getattr(p, "reduce_dtype", None) if reduce else None) or getattr(p, "param_dtype", None)
        return dtype or p.sharded_param.dtype

    return max((of(p) for p in pg.fsdp_params), key=lambda d: d.itemsize)


def _reserve(session: ZeroPlusPlus) -> None:
    """What the calls use, made before the first so that nothing allocates in the training loop: the staging
    buffers (the largest parameter group's), the zero blocks that staging pads with, and each communicator's
    scratch for the largest collective it makes, in the element types the groups use."""
    torch, served = session._fsdp.torch, session._served
    gather_bytes = max(_staged_bytes(session, s.param_group, len(s.group.ranks), reduce=False) for s in served)
    reduce_bytes = max(_staged_bytes(session, s.param_group, len(s.group.ranks), reduce=True) for s in served)
    session._gather_stage = _Staging(torch, session.device, gather_bytes)
    session._reduce_stage = _Staging(torch, session.device, reduce_bytes)
    session.reserved_bytes = gather_bytes + reduce_bytes
    largest: dict[Comm, int] = {}  # communicator -> the logical bytes of its largest collective
    for s in served:
        pg, n = s.param_group, len(s.group.ranks)
        # On the default stream now: made at a first call, on one of FSDP's streams, each would cost that stream
        # a segment of the caching allocator's small pool.
        if _staged_bytes(session, pg, n, reduce=False):
            session._zeros_for(1, _collective_dtype(pg, reduce=False), reduce=False)
        if _staged_bytes(session, pg, n, reduce=True):
            session._zeros_for(n, _collective_dtype(pg, reduce=True), reduce=True)
        # An hpZ gather's output is the whole of the group's gathered parameters, as a qwZ gather's is.
        for comm, reduce in ((s.group.gather, False), (s.hpz.comm if s.hpz else None, False), (s.group.reduce, True)):
            if comm is not None:
                largest[comm] = max(largest.get(comm, 0), _collective_bytes(session, pg, n, reduce))
    if session.backend == Backend.CUDA:
        for comm, nbytes in largest.items():
            comm.reserve(nbytes)
    log.debug("zpccl.fsdp: staging %d bytes for gathers and %d for reduce-scatters (torch's allocator); "
              "communicators' scratch reserved for collectives of %s logical bytes (allocated by the library "
              "outside torch's allocator)", gather_bytes, reduce_bytes, ", ".join(map(str, largest.values())))


def _group_layout(session: ZeroPlusPlus, pg: Any, reduce: bool) -> BlockLayout:
    """The block layout of one rank's part of a parameter group's all-gathers or reduce-scatters: each parameter's
    padded shard, in the blocks of that collective."""
    sizes = [p.padded_sharded_param_size.numel() for p in pg.fsdp_params]
    return session._layout(sizes, sum(sizes), reduce)
