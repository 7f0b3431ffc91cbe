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
  hpZ, exact, inside the node. FSDP's groups of k must be zpccl's hpZ groups (k consecutive ranks of one node,
  in order): ``enable`` checks it on every rank and refuses otherwise;
* gradient reduce-scatters: qgZ (``grad_bits``), Sum and Avg, fp32 or bf16 (FSDP's ``reduce_dtype``).
  ``set_gradient_divide_factor(f)`` works with ``set_force_sum_reduction_for_comms(True)`` (FSDP then sums and
  divides afterwards) or with f equal to the shard group's size (Avg); otherwise FSDP asks for NCCL's
  PreMulSum, which qgZ does not do, and ``enable`` (or the call) says what to set instead.

What zpccl does not serve stays on FSDP's collectives, and the ``zpccl.fsdp`` logger says so once per kind:
groups FSDP gathers as uint8 (their parameters mix dtypes), element types other than fp16/bf16/fp32, groups
other than the shard and hpZ groups (``hpz=False`` leaves the hpZ gather on NCCL too), and the replicate
dimension of a 2-D (HSDP) mesh, whose all-reduce FSDP makes itself. ``weight_bits=None`` leaves every all-gather
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
streams really overlap (one communicator serializes its calls). On CUDA they are cuda-backend communicators
(``Comm.from_torch_group``: the gathers' wraps the group's NCCL communicator when torch and zpccl share one
NCCL library); with CPU parameters and torch's threaded process group (ranks as threads, as torch's own FSDP
tests run), host-backend communicators, which is how the CPU tests exercise every path.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from . import _torch as _ztorch
from .comm import Comm, get_unique_id, payload_size
from .enums import UNIQUE_ID_BYTES, Backend, Result
from .errors import ZpcclError, ZpcclValueError

__all__ = ["ZeroPlusPlus", "enable", "disable", "session_of", "MIN_TORCH"]

log = logging.getLogger("zpccl.fsdp")

#: The first torch whose FSDP2 has the custom-communication hooks.
MIN_TORCH = (2, 9)
_CALL = "zpccl.fsdp.enable"
_QUANT_DTYPES = ("float16", "bfloat16", "float32")


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
        return _Fsdp(torch, dist, FSDPModule, api.AllGather, api.ReduceScatter, param.ShardedState)

    def param_groups(self, module: Any) -> list[Any]:
        """The FSDPParamGroups of one FSDP module (a list in newer torch, one or None in older)."""
        state = module._get_fsdp_state()
        groups = getattr(state, "_fsdp_param_groups", None)
        if groups is None:
            one = getattr(state, "_fsdp_param_group", None)
            groups = [] if one is None else [one]
        return list(groups)


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


@dataclass
class _Group:
    """zpccl's communicators for one shard group, and what its calls need."""

    ranks: tuple[int, ...]  # global ranks, in group-rank order
    gather: Comm | None  # qwZ and hpZ (None with weight_bits=None)
    reduce: Comm | None  # qgZ (None with grad_bits=None)
    hpz_ranks: tuple[int, ...] | None  # global ranks of this rank's hpZ group (FSDP's post-forward group)


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


class _Hook:
    """State shared by one FSDP module's all-gather and reduce-scatter hooks: the ZeroPlusPlus that serves them."""

    def __init__(self, zp: "ZeroPlusPlus", param_group: Any) -> None:
        self.zp, self.param_group = zp, param_group


def _make_all_gather(base: type) -> type:
    class ZeroAllGather(base):  # type: ignore[misc, valid-type]
        """qwZ over the shard group, hpZ over the post-forward group, FSDP's own all-gather otherwise."""

        def __init__(self, hook: _Hook, fallback: Any) -> None:
            self.hook, self.fallback = hook, fallback

        def allocate(self, size: Any, *, dtype: Any, device: Any) -> Any:
            return self.fallback.allocate(size, dtype=dtype, device=device)

        def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, async_op: bool = False) -> Any:
            return self.hook.zp._all_gather(self.hook, output_tensor, input_tensor, group, async_op,
                                                 self.fallback)

    return ZeroAllGather


def _make_reduce_scatter(base: type) -> type:
    class ZeroReduceScatter(base):  # type: ignore[misc, valid-type]
        """qgZ over the shard group, FSDP's own reduce-scatter otherwise."""

        def __init__(self, hook: _Hook, fallback: Any) -> None:
            self.hook, self.fallback = hook, fallback

        def allocate(self, size: Any, *, dtype: Any, device: Any) -> Any:
            return self.fallback.allocate(size, dtype=dtype, device=device)

        def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, op: Any,
                     async_op: bool = False) -> Any:
            return self.hook.zp._reduce_scatter(self.hook, output_tensor, input_tensor, group, op, async_op,
                                                     self.fallback)

    return ZeroReduceScatter


# ---- the session ---------------------------------------------------------------------------------------------


class ZeroPlusPlus:
    """zpccl serving one FSDP2 model: its communicators, staging buffers, hooks and counters.

    Made by :func:`enable`; :meth:`disable` puts FSDP's previous collectives back and frees the communicators.
    """

    def __init__(self, fsdp: _Fsdp, model: Any, *, weight_bits: int | None, grad_bits: int | None, block_size: int,
                 hpz: bool, param_blocks: bool, comm_config: dict[str, Any], error_feedback: bool = False,
                 grad_block_size: int | None = None) -> None:
        self._fsdp, self.model = fsdp, model
        self.error_feedback = error_feedback
        #: id(param group) -> (residual, hop residual or None): error feedback's bf16 buffers (allocated by enable).
        self._residuals: dict[int, tuple[Any, Any]] = {}
        #: Bytes the error-feedback residuals hold (sender's, and the intermediate hop's).
        self.residual_bytes = 0
        self.hop_residual_bytes = 0
        self.weight_bits, self.grad_bits, self.block_size = weight_bits, grad_bits, block_size
        #: Elements per quantization block of the gradients (qgZ); block_size is the weights'.
        self.grad_block_size = grad_block_size or block_size
        self.hpz, self.param_blocks = hpz, param_blocks
        self._config = dict(comm_config)
        self._groups: dict[tuple[int, ...], _Group] = {}
        self._modules: list[tuple[Any, Any, Any, Any]] = []  # (param group, its previous all-gather, reduce-scatter)
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
        """Gives every module its previous collectives back and destroys zpccl's communicators. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for param_group, _module, all_gather, reduce_scatter in self._modules:
            param_group._all_gather_comm = all_gather
            param_group._reduce_scatter_comm = reduce_scatter
        self._modules.clear()
        if self.device is not None and self.device.type == "cuda":
            self._fsdp.torch.cuda.synchronize(self.device)
        for g in self._groups.values():
            for comm in (g.gather, g.reduce):
                if comm is not None:
                    comm.close()
        self._groups.clear()
        self._residuals.clear()
        self._gather_stage = self._reduce_stage = None
        _SESSIONS.pop(id(self.model), None)

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
        """Elements per quantization block of the reduce-scatters (gradients) or of the all-gathers (weights)."""
        return self.grad_block_size if reduce else self.block_size

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

    def _all_gather(self, hook: _Hook, output: Any, input: Any, group: Any, async_op: bool, fallback: Any) -> Any:
        def nccl() -> Any:
            return fallback(output_tensor=output, input_tensor=input, group=group, async_op=async_op)

        dtype = str(output.dtype).replace("torch.", "")
        ranks = self._ranks(group)
        g = self._groups.get(ranks)
        if g is not None:
            if dtype not in _QUANT_DTYPES:
                kind = "uint8" if dtype == "uint8" else "dtype"
                why = ("a module whose parameters mix dtypes is gathered as uint8 bytes" if kind == "uint8"
                       else f"{dtype} parameters are not quantized (qwZ takes fp16, bf16, fp32)")
                return self._fallback("all_gather_" + kind, why, nccl)
            return self._qwz(hook, g, output, input)
        for g in self._groups.values():
            if g.hpz_ranks == ranks:
                return self._hpz(g, output, input)
        kind = "all_gather_hpz_off" if self._is_post_forward_group(hook, ranks) else "all_gather_group"
        why = (f"the backward all-gather over FSDP's post-forward group {list(ranks)} (hpz=False)"
               if kind == "all_gather_hpz_off" else f"an all-gather over group {list(ranks)}, which zpccl has no "
               "communicator for")
        return self._fallback(kind, why, nccl)

    def _is_post_forward_group(self, hook: _Hook, ranks: tuple[int, ...]) -> bool:
        info = getattr(hook.param_group, "post_forward_mesh_info", None)
        pg = getattr(info, "shard_process_group", None)
        return pg is not None and self._ranks(pg) == ranks

    def _qwz(self, hook: _Hook, g: _Group, output: Any, input: Any) -> None:
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

    def _hpz(self, g: _Group, output: Any, input: Any) -> None:
        k = len(g.hpz_ranks or ())
        g.gather.hier_all_gather(input, output)
        self._count("hpz", output.numel() * output.element_size(), (k - 1) * input.numel() * input.element_size())

    def _gather_sizes(self, hook: _Hook, count: int) -> list[int] | None:
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

    def _reduce_sizes(self, hook: _Hook, count: int) -> list[int] | None:
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

    def _reduce_scatter(self, hook: _Hook, output: Any, input: Any, group: Any, op: Any, async_op: bool,
                        fallback: Any) -> Any:
        def nccl() -> Any:
            return fallback(output_tensor=output, input_tensor=input, group=group, op=op, async_op=async_op)

        ranks = self._ranks(group)
        g = self._groups.get(ranks)
        if g is None:
            return self._fallback("reduce_scatter_group", f"a reduce-scatter over group {list(ranks)}, which zpccl "
                                  "has no communicator for", nccl)
        dtype = str(output.dtype).replace("torch.", "")
        if dtype not in _QUANT_DTYPES:
            return self._fallback("reduce_scatter_dtype", f"{dtype} gradients are not quantized (qgZ takes fp16, "
                                  "bf16, fp32)", nccl)
        name = _op_name(self._fsdp.dist, op)
        if name is None:
            raise ZpcclValueError(_premul_message(op, len(ranks)), "zpccl.fsdp reduce-scatter")
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
        wire = (n - 1) * payload_size(layout.staged_count, self.grad_bits, self.grad_block_size)
        self._count("qgz", input.numel() * esz, wire)
        if grad:
            self._count("grad_residuals", 0, 0)

    def _grad_kwargs(self, hook: _Hook, elements: int) -> dict[str, Any]:
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
    """"sum" or "avg" for FSDP's reduce op, None for anything else (PreMulSum)."""
    for name, value in (("sum", dist.ReduceOp.SUM), ("avg", dist.ReduceOp.AVG)):
        try:
            if op == value:
                return name
        except (TypeError, RuntimeError):
            continue
    return None


def _premul_message(what: Any, size: int) -> str:
    return (f"zpccl.fsdp: FSDP asks for a reduce-scatter with {what} (set_gradient_divide_factor with a factor "
            f"other than the shard group's size {size} makes it use NCCL's PreMulSum), which qgZ does not do; also "
            "call model.set_force_sum_reduction_for_comms(True), so that FSDP sums and divides afterwards, or set "
            f"the factor to {size} (an average)")


_SESSIONS: dict[int, ZeroPlusPlus] = {}


def session_of(model: Any) -> ZeroPlusPlus | None:
    """The live :class:`ZeroPlusPlus` of ``model``, or None."""
    return _SESSIONS.get(id(model))


def disable(model: Any) -> None:
    """Puts FSDP's own collectives back on ``model`` (undoes :func:`enable`); a no-op when not enabled."""
    session = _SESSIONS.get(id(model))
    if session is not None:
        session.disable()


# ---- enable --------------------------------------------------------------------------------------------------


def enable(model: Any, *, weight_bits: int | None = 8, grad_bits: int | None = 4, block_size: int = 256,
           hpz: bool = True, param_blocks: bool = True, ranks_per_node: int | None = None, node_id: int | None = None,
           grad_rounding: str = "nearest", seed: int | None = None, error_feedback: bool = False,
           grad_block_size: int | None = None) -> ZeroPlusPlus:
    """Switches a ``fully_shard``-ed model to zpccl's collectives (see the module's docstring). Collective: every
    rank of the model's process groups calls it, after ``fully_shard`` and before the first step.

    * ``weight_bits`` (8 or 4): qwZ's codes; ``grad_bits`` (4 or 8): qgZ's; ``block_size``: elements per
      quantization block, a power of two in [32, 8192]; ``grad_block_size``: the gradients' own, if given (else
      ``block_size``): smaller blocks follow a gradient's spread of magnitudes more closely, at a scale's 4 bytes a
      block (int4 at 64: 3.56x fewer bytes than bf16, at 256: 3.88x). ``weight_bits=None`` leaves the
      all-gathers (forward and backward) on FSDP's own collectives, ``grad_bits=None`` the reduce-scatters; zpccl
      then makes no communicator, staging or scratch for them.
    * ``hpz``: serve the backward all-gather over FSDP's post-forward group (``reshard_after_forward=k``) with
      hpZ; False leaves it on FSDP's collective.
    * ``param_blocks``: blocks restart at each parameter boundary (costs two copies of each collective's data
      on the device, and two staging buffers of the largest module's gathered size: see the module's docstring).
    * ``ranks_per_node`` / ``node_id``: emulate a node layout (otherwise a rank's node is its host, as NCCL
      tells it: hostname or ``NCCL_HOSTID``).
    * ``grad_rounding`` (``"nearest"`` or ``"stochastic"``) and ``seed`` (>= 0): qgZ's rounding of gradients;
      ``error_feedback``: keep a bf16 residual per parameter group (see the module's docstring for its memory).

    Returns the :class:`ZeroPlusPlus` that serves the model (``.summary()``, ``.disable()``). Raises
    :class:`~zpccl.ZpcclError` (or its ValueError/TypeError subclasses) with a message saying what to change.
    """
    fsdp = _Fsdp.load()
    for name, value in (("weight_bits", weight_bits), ("grad_bits", grad_bits)):
        if value is not None and (value not in (4, 8) or isinstance(value, bool)):
            raise ZpcclValueError(f"{_CALL}: {name} {value!r} must be 4 or 8 (or None: FSDP's own collective)",
                                  _CALL)
    if weight_bits is None and grad_bits is None:
        raise ZpcclValueError(f"{_CALL}: weight_bits and grad_bits are both None, so zpccl would serve nothing: "
                              "give one of them, or do not call enable", _CALL)
    grad_block = block_size if grad_block_size is None else grad_block_size
    for name, value in (("block_size", block_size), ("grad_block_size", grad_block)):
        if (isinstance(value, bool) or not isinstance(value, int) or not 32 <= value <= 8192
                or value & (value - 1)):
            raise ZpcclValueError(f"{_CALL}: {name} {value!r} must be a power of two in [32, 8192]", _CALL)
    if grad_bits is None and grad_block_size is not None:
        raise ZpcclValueError(f"{_CALL}: grad_block_size applies to qgZ's gradients, which grad_bits=None leaves on "
                              "FSDP's reduce-scatters: give grad_bits", _CALL)
    if grad_rounding not in ("nearest", "stochastic"):
        raise ZpcclValueError(f"{_CALL}: grad_rounding {grad_rounding!r} must be 'nearest' or 'stochastic'", _CALL)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31):
        raise ZpcclValueError(f"{_CALL}: seed {seed!r} must be an int in [0, 2**31)", _CALL)
    if not isinstance(error_feedback, bool):
        raise ZpcclValueError(f"{_CALL}: error_feedback {error_feedback!r} must be True or False", _CALL)
    if grad_bits is None and (error_feedback or grad_rounding != "nearest"):
        raise ZpcclValueError(f"{_CALL}: error_feedback and grad_rounding apply to qgZ's gradients, which "
                              "grad_bits=None leaves on FSDP's reduce-scatters: give grad_bits", _CALL)
    if session_of(model) is not None:
        raise ZpcclError(Result.INVALID_USAGE, f"{_CALL}: zpccl already serves this model; call disable() first", _CALL)
    modules = [m for m in model.modules() if isinstance(m, fsdp.FSDPModule)]
    if not modules:
        raise ZpcclValueError(f"{_CALL}: {type(model).__name__} has no fully_shard-ed module: call "
                              "torch.distributed.fsdp.fully_shard on it (and its blocks) first", _CALL)
    session = ZeroPlusPlus(fsdp, model, weight_bits=weight_bits, grad_bits=grad_bits, block_size=block_size,
                           grad_block_size=grad_block_size, hpz=hpz, param_blocks=param_blocks,
                           error_feedback=error_feedback,
                           comm_config=dict(ranks_per_node=ranks_per_node, node_id=node_id,
                                            grad_rounding=grad_rounding, grad_seed=seed))
    try:
        _attach(session, modules)
    except BaseException:
        session.disable()
        raise
    _SESSIONS[id(model)] = session
    return session


def _attach(session: ZeroPlusPlus, modules: list[Any]) -> None:
    fsdp, dist = session._fsdp, session._fsdp.dist
    groups = [(m, pg) for m in modules for pg in fsdp.param_groups(m)]
    if not groups:
        raise ZpcclValueError(f"{_CALL}: the model's FSDP modules hold no parameters", _CALL)
    if any(len(fsdp.param_groups(m)) > 1 for m in modules):
        raise ZpcclValueError(f"{_CALL}: a module has several parameter groups (shard_placement_fn with "
                              "several meshes); FSDP's custom collectives take one group a module", _CALL)
    session.device = groups[0][1].device
    for _m, pg in groups:
        _check_divide_factor(dist, pg)
        mesh_info = pg.mesh_info
        if getattr(mesh_info, "replicate_process_group", None) is not None:
            session._say_once("hsdp", "the replicate dimension of a 2-D (HSDP) mesh: FSDP all-reduces gradients "
                              "over it itself; that stays on NCCL", logging.INFO)
    # One pair of communicators a shard group (and hpZ size), made in module order on every rank.
    group_ranks: list[tuple[Any, tuple[int, ...]]] = []
    for _m, pg in groups:
        shard = pg.mesh_info.shard_process_group
        ranks = tuple(dist.get_process_group_ranks(shard))
        k = _hpz_size(session, pg)
        if ranks not in session._groups:
            session._groups[ranks] = _make_group(session, shard, ranks, k)
        elif k is not None and session._groups[ranks].gather.hpz_size != k:  # k: weight_bits given, gather made
            raise ZpcclValueError(f"{_CALL}: modules over one shard group use reshard_after_forward={k} and "
                                  f"={session._groups[ranks].gather.hpz_size}; zpccl's hpZ takes one group size",
                                  _CALL)
        group_ranks.append((pg, ranks))
    _reserve(session, group_ranks)
    if session.error_feedback:
        for _m, pg in groups:
            _allocate_residuals(session, pg)
    AllGatherHook, ReduceScatterHook = _make_all_gather(fsdp.AllGather), _make_reduce_scatter(fsdp.ReduceScatter)
    for m, pg in groups:
        hook = _Hook(session, pg)
        session._modules.append((pg, m, pg._all_gather_comm, pg._reduce_scatter_comm))
        if session.weight_bits is not None:
            m.set_custom_all_gather(AllGatherHook(hook, pg._all_gather_comm))
        if session.grad_bits is not None:
            m.set_custom_reduce_scatter(ReduceScatterHook(hook, pg._reduce_scatter_comm))
    log.info("zpccl.fsdp: %d modules on %s, %d shard group(s): %s, %s, blocks of %d%s%s%s",
             len(groups), session.backend.name.lower() if session.backend else "?", len(session._groups),
             "all-gathers on FSDP's" if session.weight_bits is None else "qwZ int%d" % session.weight_bits,
             "reduce-scatters on FSDP's" if session.grad_bits is None else "qgZ int%d" % session.grad_bits,
             session.block_size,
             " (gradients' of %d)" % session.grad_block_size if session.grad_block_size != session.block_size else "",
             ", hpZ groups of %d" % len(next(g.hpz_ranks for g in session._groups.values() if g.hpz_ranks))
             if any(g.hpz_ranks for g in session._groups.values()) else "",
             ", blocks restart at parameters" if session.param_blocks else "")
    if session.error_feedback:
        log.info("zpccl.fsdp: error feedback: %d residual(s), %d bytes (and %d for the intermediate hop)",
                 len(session._residuals), session.residual_bytes, session.hop_residual_bytes)


def _allocate_residuals(session: ZeroPlusPlus, pg: Any) -> None:
    """Error feedback's zeroed bf16 residuals for one parameter group: its reduce-scatter input's elements (in the
    staged layout when blocks restart at parameters), and the intermediate hop's on two-hop layouts."""
    torch = session._fsdp.torch
    shard = pg.mesh_info.shard_process_group
    g = session._groups[tuple(session._fsdp.dist.get_process_group_ranks(shard))]
    layout = _group_layout(session, pg, reduce=True)
    per_rank = layout.staged_count if session.param_blocks else layout.count
    res = torch.zeros(g.reduce.nranks * per_rank, dtype=torch.bfloat16, device=session.device)
    hop_count = g.reduce.grad_hop_residual_count(per_rank)
    hop = torch.zeros(hop_count, dtype=torch.bfloat16, device=session.device) if hop_count else None
    session._residuals[id(pg)] = (res, hop)
    session.residual_bytes += res.numel() * 2
    session.hop_residual_bytes += hop_count * 2


def _check_divide_factor(dist: Any, pg: Any) -> None:
    factor = getattr(pg, "gradient_divide_factor", None)
    size = pg.mesh_info.shard_process_group.size()
    if factor is None or getattr(pg, "force_sum_reduction_for_comms", False) or factor == size:
        return
    reduce_dtype = getattr(getattr(pg, "mp_policy", None), "reduce_dtype", None)
    if reduce_dtype is not None and str(reduce_dtype) == "torch.float16":
        return  # FSDP sums fp16 and divides before and after
    raise ZpcclValueError(_premul_message(f"PreMulSum(1/{factor})", size).replace("zpccl.fsdp:", _CALL + ":"),
                          _CALL)


def _hpz_size(session: ZeroPlusPlus, pg: Any) -> int | None:
    """k when FSDP gathers the backward weights over a post-forward group of k ranks and hpZ serves it."""
    info = getattr(pg, "post_forward_mesh_info", None)
    if info is None or info == pg.mesh_info or not session.hpz or session.weight_bits is None:
        return None
    size = info.shard_process_group.size()
    return size if size > 1 else None


def _make_group(session: ZeroPlusPlus, shard: Any, ranks: tuple[int, ...], k: int | None) -> _Group:
    dist = session._fsdp.dist
    # A collective left on FSDP's still needs a valid width in the communicator's config; it never uses it.
    config = dict(weight_bits=session.weight_bits or 8, grad_bits=session.grad_bits or 4,
                  **{key: v for key, v in session._config.items() if v is not None})
    device = session.device
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

    def make(reduce: bool, hpz_size: int | None = None, wrap: bool | None = None) -> Comm:
        # Each communicator quantizes in its own collective's blocks (gradients' and weights' may differ).
        kw = dict(config, block_size=session._block(reduce))
        if device.type == "cuda":
            return Comm.from_torch_group(shard, device=device, hpz_size=hpz_size, wrap=wrap, **kw)
        return _host_comm(shard, dict(kw, hpz_size=hpz_size))

    gather = reduce = None
    try:
        if session.grad_bits is not None or k is not None:
            # The hpZ groups are checked against the node layout the reduce-scatters' communicator found, before
            # the gathers' is made with them (an hpZ size that does not fit the nodes would fail its init); with
            # grad_bits=None that check is all it is made for.
            reduce = make(True, wrap=False)
        hpz_ranks = _check_hpz_groups(session, shard, ranks, reduce, k) if k is not None else None
        if session.grad_bits is None and reduce is not None:
            reduce.close()
            reduce = None
        if session.weight_bits is not None:
            gather = make(False, hpz_size=k)
            if hpz_ranks is not None and gather.hpz_rank != hpz_ranks.index(ranks[gather.rank]):
                raise ZpcclError(Result.INTERNAL_ERROR, f"{_CALL}: zpccl's hpZ rank {gather.hpz_rank} is not this "
                                 f"rank's place in FSDP's post-forward group {list(hpz_ranks)}", _CALL)
    except BaseException:
        for comm in (gather, reduce):
            if comm is not None:
                comm.close()
        raise
    return _Group(ranks, gather, reduce, hpz_ranks)


def _host_comm(group: Any, config: dict[str, Any]) -> Comm:
    rank, nranks, _ = _ztorch.group_info(group)
    uid = get_unique_id() if rank == 0 else bytes(UNIQUE_ID_BYTES)
    uid = _ztorch.broadcast_bytes(uid, UNIQUE_ID_BYTES, group, "cpu")
    return Comm(nranks, rank, uid, backend="host", **config)


def _check_hpz_groups(session: ZeroPlusPlus, shard: Any, ranks: tuple[int, ...], comm: Comm, k: int) -> tuple:
    """Checks, with every rank of the shard group, that each of FSDP's post-forward groups of k ranks is one of
    zpccl's hpZ groups of size k (k consecutive local ranks of one node, from a multiple of k, in order); returns
    this rank's, in global ranks. Every rank reaches the same verdict: all look at the same gathered facts."""
    dist = session._fsdp.dist
    pf = _post_forward_group_of(session, ranks)
    mine = dict(node=comm.node_rank, local=comm.local_rank, local_size=comm.local_size,
                pf=list(dist.get_process_group_ranks(pf)))
    facts: list[Any] = [None] * len(ranks)
    dist.all_gather_object(facts, mine, group=shard)
    index = {g: i for i, g in enumerate(ranks)}
    for f in facts:
        members = [facts[index[g]] for g in f["pf"]]
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
            raise ZpcclValueError(
                f"{_CALL}: reshard_after_forward={k} makes FSDP gather backward weights over ranks "
                f"{[index[g] for g in f['pf']]} of the shard group, which are {problem}: hpZ keeps that gather "
                f"inside one node, over {k} consecutive ranks of it. Use a reshard_after_forward that divides the "
                "ranks per node (with ranks numbered node by node), or hpz=False to leave that gather on NCCL",
                _CALL)
    return tuple(mine["pf"])


def _post_forward_group_of(session: ZeroPlusPlus, ranks: tuple[int, ...]) -> Any:
    for m in session.model.modules():
        if not isinstance(m, session._fsdp.FSDPModule):
            continue
        for pg in session._fsdp.param_groups(m):
            info = getattr(pg, "post_forward_mesh_info", None)
            if info is not None and tuple(session._fsdp.dist.get_process_group_ranks(
                    pg.mesh_info.shard_process_group)) == ranks:
                return info.shard_process_group
    raise ZpcclError(Result.INTERNAL_ERROR, f"{_CALL}: no post-forward group for shard group {list(ranks)}", _CALL)


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


def _reserve(session: ZeroPlusPlus, groups: list[tuple[Any, tuple[int, ...]]]) -> None:
    """What the calls use, made before the first so that nothing allocates in the training loop: the staging
    buffers (the largest parameter group's), the zero blocks that staging pads with, and each communicator's
    scratch for the largest collective it makes, in the element types the groups use."""
    torch = session._fsdp.torch
    gather_bytes = max(_staged_bytes(session, pg, len(ranks), reduce=False) for pg, ranks in groups)
    reduce_bytes = max(_staged_bytes(session, pg, len(ranks), reduce=True) for pg, ranks in groups)
    session._gather_stage = _Staging(torch, session.device, gather_bytes)
    session._reduce_stage = _Staging(torch, session.device, reduce_bytes)
    session.reserved_bytes = gather_bytes + reduce_bytes
    largest: dict[tuple[int, ...], list[int]] = {}  # shard group -> [its largest all-gather, reduce-scatter]
    for pg, ranks in groups:
        n = len(ranks)
        # On the default stream now: made at a first call, on one of FSDP's streams, each would cost that stream
        # a segment of the caching allocator's small pool.
        if _staged_bytes(session, pg, n, reduce=False):
            session._zeros_for(1, _collective_dtype(pg, reduce=False), reduce=False)
        if _staged_bytes(session, pg, n, reduce=True):
            session._zeros_for(n, _collective_dtype(pg, reduce=True), reduce=True)
        big = largest.setdefault(ranks, [0, 0])
        big[0] = max(big[0], _collective_bytes(session, pg, n, reduce=False))
        big[1] = max(big[1], _collective_bytes(session, pg, n, reduce=True))
    if session.backend == Backend.CUDA:
        for ranks, (gather_max, reduce_max) in largest.items():
            g = session._groups[ranks]
            for comm, nbytes in ((g.gather, gather_max), (g.reduce, reduce_max)):
                if comm is not None:
                    comm.reserve(nbytes)
    log.debug("zpccl.fsdp: staging %d bytes for gathers and %d for reduce-scatters (torch's allocator); "
              "communicators' scratch reserved for collectives of %s logical bytes (gather, reduce-scatter per "
              "shard group; allocated by the library outside torch's allocator)", gather_bytes, reduce_bytes,
              ", ".join(f"{g}/{r}" for g, r in largest.values()))


def _group_layout(session: ZeroPlusPlus, pg: Any, reduce: bool) -> BlockLayout:
    """The block layout of one rank's part of a parameter group's all-gathers or reduce-scatters: each parameter's
    padded shard, in the blocks of that collective."""
    sizes = [p.padded_sharded_param_size.numel() for p in pg.fsdp_params]
    return session._layout(sizes, sum(sizes), reduce)
