"""The communicator: zpccl's collectives on NumPy arrays (host backend) and torch tensors (cuda backend).

Each method checks its arrays in Python first (type, device, contiguity, element counts: errors name the
method, e.g. ``quant_all_gather: recv has 10 elements, expected 12``), then calls the C function, whose own
checks raise :class:`~zpccl.errors.ZpcclError` with the library's message (e.g. ``zpQuantAllGather :
options->bits 6 must be 4 or 8``). Outputs left as ``None`` are allocated (1-D, the input's type and memory).

Collectives are collective: every rank calls them in the same order with matching sizes. A check that fails
on one rank only leaves its peers waiting (the host backend gives up after ``ZP_HOST_TIMEOUT_MS``).

On the cuda backend, calls are enqueued on ``stream`` (default: torch's current stream of the tensor's device)
and return at once, as NCCL's do; outputs allocated here come from torch's caching allocator on the current
stream, so pass a ``stream=`` other than the current one only with outputs you allocated for it.
"""
from __future__ import annotations

import operator
import sys
import warnings
from ctypes import byref, c_int, c_size_t, c_void_p, sizeof
from typing import Any

from . import _arrays, _lib, _torch
from ._arrays import Buffer
from .enums import (BITS_RULE, BLOCK_SIZE_RULE, CONFIG_UNDEF_INT, UNIQUE_ID_BYTES, Backend, DataType, RedOp, Result,
                    Rounding, is_bits, is_block_size)
from .errors import ZpcclError, ZpcclTypeError, ZpcclValueError


def version() -> int:
    """``zpGetVersion``: ``ZPCCL_VERSION_CODE`` of the loaded library (major * 10000 + minor * 100 + patch)."""
    value = c_int()
    _lib.check(_lib.lib().zpGetVersion(byref(value)), "zpGetVersion")
    return value.value


def get_unique_id() -> bytes:
    """``zpGetUniqueId``: 128 bytes that every rank passes to :class:`Comm` (share them out of band).

    With a visible GPU (and ``ZP_BACKEND`` not ``host``) this is an NCCL unique id: call it on one rank only.
    """
    uid = _lib.UniqueId()
    _lib.check(_lib.lib().zpGetUniqueId(byref(uid)), "zpGetUniqueId")
    return uid.to_bytes()


def payload_size(count: int, bits: int, block_size: int) -> int:
    """``zpQuantPayloadSize``: bytes of the payload of ``count`` elements (fp32 scales of every block padded to
    16 bytes, then the packed codes padded to 16 bytes)."""
    out = c_size_t()
    call = "payload_size"
    _lib.check(_lib.lib().zpQuantPayloadSize(_size_t(count, call, "count"), _c_int(bits, call, "bits"),
                                             _c_int(block_size, call, "block_size"), byref(out)), "zpQuantPayloadSize")
    return out.value


def loaded_nccl_libraries() -> list[str]:
    """The distinct NCCL library files mapped into this process (see :meth:`Comm.from_nccl_comm`)."""
    return _torch.loaded_nccl_libraries()


def _index(value: Any, call: str, name: str) -> int:
    """``value`` as a Python int (NumPy integers too; bools and floats refused). Range unchecked: an int bound for
    C goes through :func:`_size_t`, :func:`_c_int` or :func:`_pointer`."""
    if isinstance(value, bool):
        raise ZpcclTypeError(f"{call}: {name} must be an int, got bool", call)
    try:
        return operator.index(value)
    except TypeError:
        raise ZpcclTypeError(f"{call}: {name} must be an int, got {type(value).__name__}", call) from None


# ctypes converts a Python int to a C integer argument or struct field by keeping its low bits, silently: a count
# of 2**64 + 5 would reach the library as 5, and -1 as SIZE_MAX. Every int bound for C is checked against its
# C type here first, and refused with a message naming it.
_SIZE_MAX = 2**(8 * sizeof(c_size_t)) - 1
_POINTER_MAX = 2**(8 * sizeof(c_void_p)) - 1
_INT_MIN, _INT_MAX = -2**(8 * sizeof(c_int) - 1), 2**(8 * sizeof(c_int) - 1) - 1


def _size_t(value: Any, call: str, name: str) -> int:
    """``value`` as a C ``size_t``: an int in [0, SIZE_MAX], else :class:`ZpcclValueError` naming ``name``."""
    n = _index(value, call, name)
    if n < 0:
        raise ZpcclValueError(f"{call}: {name} {n} is negative (a C size_t)", call)
    if n > _SIZE_MAX:
        raise ZpcclValueError(f"{call}: {name} {n} does not fit in a C size_t (at most {_SIZE_MAX})", call)
    return n


def _c_int(value: Any, call: str, name: str) -> int:
    """``value`` as a C ``int``: an int in [INT_MIN, INT_MAX] (what the library accepts is its to check)."""
    n = _index(value, call, name)
    if not _INT_MIN <= n <= _INT_MAX:
        raise ZpcclValueError(f"{call}: {name} {n} does not fit in a C int ([{_INT_MIN}, {_INT_MAX}])", call)
    return n


def _pointer(value: Any, call: str, name: str) -> int:
    """``value`` as an address (``c_void_p``): an int in [0, 2**64 - 1]."""
    n = _index(value, call, name)
    if not 0 <= n <= _POINTER_MAX:
        raise ZpcclValueError(f"{call}: {name} {n:#x} is not an address (0 to {_POINTER_MAX:#x})", call)
    return n


def _check_quant_params(bits: Any, block_size: Any, call: str) -> tuple[int, int]:
    """Checks bits and block_size by the library's rules (:mod:`zpccl.enums`)."""
    bits, block_size = _index(bits, call, "bits"), _index(block_size, call, "block_size")
    if not is_bits(bits):
        raise ZpcclValueError(f"{call}: bits {bits} must be {BITS_RULE}", call)
    if not is_block_size(block_size):
        raise ZpcclValueError(f"{call}: block_size {block_size} must be {BLOCK_SIZE_RULE}", call)
    return bits, block_size


def _parse_op(op: Any, call: str) -> int:
    """A reduction given as ``"sum"``/``"avg"``/... or a :class:`RedOp` (support is the library's to check)."""
    if isinstance(op, str):
        try:
            return int(RedOp[op.upper()])
        except KeyError:
            names = ", ".join(o.name.lower() for o in RedOp)
            raise ZpcclValueError(f"{call}: op {op!r} is not one of {names}", call) from None
    return _c_int(op, call, "op")


class Comm:
    """A zpccl communicator (``zpComm_t``) of ``nranks`` ranks, this caller being ``rank``.

    Collective: every rank creates it with the same ``unique_id`` (from :func:`get_unique_id` on one rank)
    and ``nranks``. Keyword arguments fill ``zpConfig_t`` (``None`` keeps the library's default):

    * ``backend``: ``"cuda"``, ``"host"`` or ``"default"`` (cuda when a GPU is visible, else host, or
      ``$ZP_BACKEND``). On the host backend, ranks are threads of this process and buffers NumPy arrays (or CPU
      tensors); see :func:`zpccl.run_host_ranks` (ranks as processes: :meth:`from_torch_group` on a gloo group,
      :meth:`from_transport`). On cuda, the communicator uses the CUDA device current in the
      calling thread (``torch.cuda.set_device``), and buffers are CUDA tensors of that device.
    * ``ranks_per_node``: emulate nodes of that many consecutive ranks; ``node_id``: this rank's node label.
    * ``hpz_size``: ranks of an hpZ group (a divisor of the ranks per node; default the whole node).
    * ``weight_bits`` (default 8), ``grad_bits`` (default 4): code bits of qwZ and qgZ, 4 or 8.
    * ``block_size``: elements per quantization block, a power of two in [32, 8192] (default 256).
    * ``grad_rounding`` (``"nearest"``, the default, or ``"stochastic"``) and ``grad_seed`` (>= 0, default 0): how qgZ
      rounds gradients (include/zpccl.h, "Gradient rounding"; :meth:`quant_reduce_scatter` overrides per call).

    Use it as a context manager, or call :meth:`close`. Any call on a closed communicator raises
    :class:`ZpcclError`.
    """

    def __init__(self, nranks: int, rank: int, unique_id: bytes | bytearray | memoryview, *,
                 backend: Backend | str | int | None = None, ranks_per_node: int | None = None,
                 node_id: int | None = None, hpz_size: int | None = None, weight_bits: int | None = None,
                 grad_bits: int | None = None, block_size: int | None = None, blocking: int | None = None,
                 grad_rounding: Rounding | str | int | None = None, grad_seed: int | None = None) -> None:
        call = "Comm"
        self._handle: int | None = None
        self._transport: _lib.TransportBridge | None = None
        config = _lib.make_config(call, backend=backend, ranks_per_node=ranks_per_node, node_id=node_id,
                                  hpz_size=hpz_size, weight_bits=weight_bits, grad_bits=grad_bits,
                                  block_size=block_size, blocking=blocking, grad_rounding=grad_rounding,
                                  grad_seed=grad_seed)
        uid = _lib.UniqueId.from_bytes(unique_id, call)
        handle = c_void_p()
        res = _lib.lib().zpCommInitRankConfig(byref(handle), _c_int(nranks, call, "nranks"),
                                              uid, _c_int(rank, call, "rank"), byref(config))
        _lib.check(res, "zpCommInitRankConfig")
        self._adopt(handle.value)

    @classmethod
    def _wrap(cls, handle: int) -> "Comm":
        comm = cls.__new__(cls)
        comm._handle = None
        comm._transport = None
        comm._adopt(handle)
        return comm

    def _adopt(self, handle: int | None) -> None:
        """Takes ownership of a live handle and caches what never changes."""
        if not handle:
            raise ZpcclError(Result.INTERNAL_ERROR, "zpccl: init succeeded without a communicator", "Comm")
        self._handle = handle
        self._nranks = self._query("zpCommCount", "nranks")
        self._rank = self._query("zpCommUserRank", "rank")
        self._backend = Backend(self._query("zpCommBackend", "backend"))
        self._device = self._query("zpCommCuDevice", "cuda_device")
        self._hpz_size = self._query("zpCommHpzSize", "hpz_size")

    @classmethod
    def from_torch_group(cls, group: Any = None, *, device: Any = None, wrap: bool | None = None,
                         **config: Any) -> "Comm":
        """A communicator over the ranks of a ``torch.distributed`` process group: cuda-backend on an NCCL group,
        host-backend on a group that moves CPU tensors (gloo, ...), or when ``backend="host"`` or ``device="cpu"``.

        Collective over ``group`` (default: the world): every rank of it calls this with the same group.

        On the host backend each rank is a process, and the communicator's exchanges run as the group's own
        collectives on CPU tensors over zpccl's buffers (:class:`zpccl._torch.TorchTransport`, through
        :meth:`from_transport`): outputs are bit-equal to thread-ranks' on the same inputs. A rank's node is its
        launcher's (torchrun's ``GROUP_RANK``, else ``RANK // LOCAL_WORLD_SIZE``, once ``LOCAL_WORLD_SIZE`` is set)
        unless ``ranks_per_node`` or ``node_id`` is given, else its host. A peer that dies, a group destroyed under
        the communicator, or a peer missing for ``ZP_HOST_TIMEOUT_MS`` makes the collective raise
        :class:`ZpcclError` (``REMOTE_ERROR``) on every rank, naming the rank and the call; then close it.

        On CUDA, on ``device`` (default: torch's current CUDA device), ``wrap`` chooses how zpccl meets the group's
        NCCL:

        * ``None`` (default): wrap the group's own NCCL communicator when torch and zpccl call the same NCCL
          library (:func:`zpccl._torch.same_nccl_as_torch`; the installed package links the NCCL wheel torch
          loads), else build zpccl's own communicators from a unique id that rank 0 of the group broadcasts;
        * ``True``: wrap it, or raise when the NCCL libraries differ or torch does not expose the communicator;
        * ``False``: always build zpccl's own communicators (a separate NCCL communicator of the same ranks, e.g.
          so that two zpccl communicators do not serialize on one NCCL communicator).

        A wrapped communicator stays torch's: destroy the zpccl communicator before the process group.
        ``config`` takes the keyword arguments of :class:`Comm` (``ranks_per_node``, ``hpz_size``,
        ``weight_bits``, ...).
        """
        import torch
        import torch.distributed as dist

        call = "from_torch_group"
        if dist.is_initialized() and dist.get_rank(group) < 0:
            # torch's own refusal ("Invalid process group specified") names neither the call nor the rank.
            raise ZpcclValueError(f"{call}: rank {dist.get_rank()} is not a member of the group (torch.distributed."
                                  "new_group returns a placeholder to the ranks outside it): only its members call "
                                  "this", call)
        requested = config.get("backend")
        host_values = (Backend.HOST, "host", int(Backend.HOST))
        on_cpu = device is not None and torch.device(device).type == "cpu"
        if requested in host_values or on_cpu or "nccl" not in str(dist.get_backend(group)).lower():
            if requested not in (None, *host_values) or wrap:
                raise ZpcclValueError(f"{call}: a group of CPU tensors gives a host-backend communicator (backend="
                                      f"{requested!r}, wrap={wrap!r} need an NCCL group on CUDA devices)", call)
            if config.get("ranks_per_node") is None and config.get("node_id") is None:
                config["node_id"] = _torch.launcher_node_id()
            try:
                return cls.from_transport(_torch.TorchTransport(group), **config)
            except ZpcclError as exc:
                if exc.code == Result.REMOTE_ERROR and hasattr(exc, "add_note"):
                    exc.add_note(f"{call}: every rank of the group must call it, with the same group")
                raise
        if requested not in (None, Backend.CUDA, "cuda", int(Backend.CUDA)):
            raise ZpcclValueError(f"{call}: backend {requested!r} over an NCCL group: the cuda backend serves it", call)
        config["backend"] = Backend.CUDA
        dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device or "cuda")
        if dev.type != "cuda":
            raise ZpcclValueError(f"{call}: device {dev} is not a CUDA device", call)
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        dev = torch.device("cuda", index)
        if wrap is not False:
            same = _torch.same_nccl_as_torch(_lib.lib())
            ptr = _torch.nccl_comm_pointer(group, dev) if same else None
            if ptr is not None:
                with torch.cuda.device(index):
                    return cls.from_nccl_comm(ptr, allow_several_nccl=True, **config)
            if wrap:
                why = ("torch and zpccl load different NCCL libraries (" + ", ".join(loaded_nccl_libraries()) + ")"
                       if not same else "torch does not expose the group's NCCL communicator")
                raise ZpcclError(Result.INVALID_USAGE, f"{call}: cannot wrap the group's communicator: {why}; "
                                 "pass wrap=None or wrap=False to build zpccl's own", call)
        rank, nranks, _ = _torch.group_info(group)
        uid = get_unique_id() if rank == 0 else bytes(UNIQUE_ID_BYTES)
        uid = _torch.broadcast_bytes(uid, UNIQUE_ID_BYTES, group, dev)
        with torch.cuda.device(index):
            return cls(nranks, rank, uid, **config)

    @classmethod
    def from_transport(cls, transport: Any, **config: Any) -> "Comm":
        """``zpCommInitFromTransport``: a host-backend communicator whose ranks (processes) meet and move bytes
        through ``transport``, an object with ``nranks``, ``rank``, ``all_gather`` and ``all_to_all`` (the contract:
        :class:`zpccl._lib.TransportBridge`; over torch.distributed: :class:`zpccl._torch.TorchTransport`, which
        :meth:`from_torch_group` uses). Collective over the transport's ranks. The communicator keeps the callbacks
        alive until :meth:`close` or :meth:`abort`. ``config`` takes the keyword arguments of :class:`Comm`.
        """
        call = "from_transport"
        if config.get("backend") not in (None, Backend.HOST, "host", int(Backend.HOST)):
            raise ZpcclValueError(f"{call}: a transport serves the host backend only (backend={config['backend']!r})",
                                  call)
        config["backend"] = Backend.HOST
        bridge = _lib.TransportBridge(transport, call)
        cfg = _lib.make_config(call, **config)
        handle = c_void_p()
        try:
            _lib.check(_lib.lib().zpCommInitFromTransport(byref(handle), byref(bridge.struct), byref(cfg)),
                       "zpCommInitFromTransport")
        except ZpcclError:
            bridge.release()  # no communicator holds it, and finalize is not called
            raise
        comm = cls._wrap(handle.value)
        comm._transport = bridge
        return comm

    @classmethod
    def from_nccl_comm(cls, nccl_comm: int, *, allow_several_nccl: bool = False, **config: Any) -> "Comm":
        """``zpCommInitFromNccl``: wraps an existing ``ncclComm_t`` (an integer address) in a cuda-backend
        communicator. Collective over its ranks; the caller keeps ownership and must keep it alive until
        :meth:`close`. Sub-communicators are split from it.

        The pointer must come from the same NCCL library that libzpccl.so uses. Unless ``allow_several_nccl``,
        this refuses to run when the process maps several NCCL library files (see :func:`loaded_nccl_libraries`).
        From torch (private API, recent versions, after the group's communicator exists):
        ``group._get_backend(torch.device("cuda"))._comm_ptr()``.
        """
        call = "from_nccl_comm"
        ptr = _pointer(nccl_comm, call, "nccl_comm")
        L = _lib.lib()
        libs = _torch.loaded_nccl_libraries()
        if len(libs) > 1 and not allow_several_nccl:
            raise ZpcclError(Result.INVALID_USAGE, f"{call}: this process maps {len(libs)} NCCL libraries "
                             f"({', '.join(libs)}); an ncclComm_t of one must not be passed to another. Import "
                             "torch before zpccl so that both share one, or use Comm.from_torch_group", call)
        cfg = _lib.make_config(call, **config)
        handle = c_void_p()
        _lib.check(L.zpCommInitFromNccl(byref(handle), ptr, byref(cfg)), "zpCommInitFromNccl")
        return cls._wrap(handle.value)

    # ---- lifecycle -----------------------------------------------------------------------------------------

    @property
    def handle(self) -> int:
        """The ``zpComm_t`` as an integer (for other C code)."""
        return self._live("handle")

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` or :meth:`abort` was called."""
        return self._handle is None

    def close(self) -> None:
        """``zpCommDestroy``, after the work enqueued on it completed. Idempotent."""
        self._free("zpCommDestroy")

    def abort(self) -> None:
        """``zpCommAbort``: frees the communicator at once, aborting work in flight; peers waiting in a host
        collective wake up with ``REMOTE_ERROR`` (over a transport, a callback in flight returns first). Idempotent."""
        self._free("zpCommAbort")

    def _free(self, fn: str) -> None:
        """zpCommDestroy or zpCommAbort. The handle is given up first, so that other threads' calls stop using it. A
        refusal that leaves the communicator alive (from inside its own transport's callback) gives it back, with the
        callbacks, which the call in flight still runs."""
        handle, self._handle = self._handle, None
        if handle is None:
            return
        L = _lib.lib()
        try:
            _lib.check(getattr(L, fn)(handle), fn)
        except ZpcclError:
            if L.zpCommCount(handle, byref(c_int())) == Result.SUCCESS:
                self._handle = handle
            else:
                self._transport = None
            raise
        self._transport = None  # the library called its last callback

    def __enter__(self) -> "Comm":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc is not None and self._handle is not None:
            self.abort()  # peers may be waiting for a rank that will never come
        else:
            self.close()

    def __del__(self) -> None:
        # Not destroyed here: a collective library should not free NCCL resources from the garbage collector.
        if getattr(self, "_handle", None) is not None and not sys.is_finalizing():
            warnings.warn(f"unclosed {self!r}: call close() or use it as a context manager", ResourceWarning,
                          stacklevel=2)

    def __repr__(self) -> str:
        if self._handle is None:
            return "<zpccl.Comm closed>"
        where = "host" if self._backend == Backend.HOST else f"cuda:{self._device}"
        return f"<zpccl.Comm rank {self._rank} of {self._nranks} on {where}>"

    def _live(self, call: str) -> int:
        if self._handle is None:
            raise ZpcclError(Result.INVALID_ARGUMENT, f"{call}: the communicator is closed", call)
        return self._handle

    def _check(self, result: int, call: str) -> None:
        _lib.check(result, call, self._handle)

    # ---- queries -------------------------------------------------------------------------------------------

    def _query(self, fn: str, call: str) -> int:
        handle = self._live(call)
        out = c_int()
        self._check(getattr(_lib.lib(), fn)(handle, byref(out)), fn)
        return out.value

    nranks = property(lambda self: self._query("zpCommCount", "nranks"), doc="Ranks in the communicator.")
    rank = property(lambda self: self._query("zpCommUserRank", "rank"), doc="This rank.")
    cuda_device = property(lambda self: self._query("zpCommCuDevice", "cuda_device"),
                           doc="The CUDA device; -1 on the host backend.")
    backend = property(lambda self: Backend(self._query("zpCommBackend", "backend")), doc="The backend.")
    node_count = property(lambda self: self._query("zpCommNodeCount", "node_count"), doc="Distinct nodes.")
    node_rank = property(lambda self: self._query("zpCommNodeRank", "node_rank"),
                         doc="Index of this rank's node, nodes numbered in order of their lowest rank.")
    local_rank = property(lambda self: self._query("zpCommLocalRank", "local_rank"), doc="Rank inside the node.")
    local_size = property(lambda self: self._query("zpCommLocalSize", "local_size"), doc="Ranks of this node.")
    hpz_rank = property(lambda self: self._query("zpCommHpzRank", "hpz_rank"), doc="Rank inside the hpZ group.")
    hpz_size = property(lambda self: self._query("zpCommHpzSize", "hpz_size"), doc="Ranks of the hpZ group.")

    def reserve(self, max_bytes: int) -> None:
        """``zpCommReserve``: sizes scratch memory for collectives of up to ``max_bytes`` logical output bytes,
        so that later calls allocate nothing (and can be captured in a CUDA graph)."""
        handle = self._live("reserve")
        self._check(_lib.lib().zpCommReserve(handle, _size_t(max_bytes, "reserve", "max_bytes")), "zpCommReserve")

    def async_error(self) -> Result:
        """``zpCommGetAsyncError``: the first asynchronous error (a failed peer, an abort), ``SUCCESS`` if none."""
        handle = self._live("async_error")
        out = c_int()
        self._check(_lib.lib().zpCommGetAsyncError(handle, byref(out)), "zpCommGetAsyncError")
        return Result(out.value)

    # ---- argument plumbing ---------------------------------------------------------------------------------

    def _place(self, buf: Buffer, call: str, name: str) -> None:
        """The buffer lives where this communicator's backend works."""
        if self._backend == Backend.HOST:
            if buf.device >= 0:
                raise ZpcclValueError(f"{call}: {name} is a CUDA tensor ({buf.where()}) but the communicator uses "
                                      "the host backend, which takes host memory (NumPy arrays, CPU tensors)", call)
        elif buf.device < 0:
            what = "a NumPy array" if buf.kind == "numpy" else "a CPU tensor"
            raise ZpcclValueError(f"{call}: {name} is {what} (host memory) but the communicator uses the cuda "
                                  f"backend, which takes CUDA tensors of cuda:{self._device}", call)
        elif buf.device != self._device:
            raise ZpcclValueError(f"{call}: {name} is on {buf.where()}, the communicator on cuda:{self._device}",
                                  call)

    def _input(self, obj: Any, call: str, name: str, dtype: Any, quantized: bool) -> Buffer:
        buf = _arrays.as_buffer(obj, call, name, dtype=dtype)
        if quantized:
            _arrays.require_quant_type(buf, call, name)
        self._place(buf, call, name)
        return buf

    def _output(self, obj: Any, like: Buffer, count: int, call: str, name: str, dtype: Any) -> Buffer:
        """The caller's output checked against ``like`` (type, memory, exactly ``count`` elements), or a new one."""
        if obj is None:
            return _arrays.as_buffer(_arrays.empty_like(like, count), call, name, dtype=dtype)
        buf = _arrays.as_buffer(obj, call, name, dtype=dtype, writable=True)
        _arrays.check_same_type(like, buf, call, "send", name)
        _arrays.check_count(buf, count, call, name)
        return buf

    def _stream(self, buf: Buffer, stream: Any, call: str) -> int | None:
        """The cudaStream_t for a call: None on the host backend; the given stream, else torch's current one."""
        if self._backend == Backend.HOST:
            if stream not in (None, 0):
                raise ZpcclValueError(f"{call}: stream must be None on the host backend", call)
            return None
        if stream is None:
            torch = _arrays.torch_module()
            return int(torch.cuda.current_stream(buf.device).cuda_stream) if torch and buf.kind == "torch" else None
        if isinstance(stream, int) and not isinstance(stream, bool):
            return _pointer(stream, call, "stream")
        for attr in ("cuda_stream", "ptr"):  # torch.cuda.Stream, cupy.cuda.Stream
            if hasattr(stream, attr):
                return _pointer(getattr(stream, attr), call, "stream")
        raise ZpcclTypeError(f"{call}: stream must be a torch.cuda.Stream or an int cudaStream_t, got "
                             f"{type(stream).__name__}", call)

    @staticmethod
    def _options(bits: Any, block_size: Any, call: str) -> _lib.QuantOptions | None:
        """A per-call override, or None to use the communicator's settings."""
        if bits is None and block_size is None:
            return None
        opts = _lib.QuantOptions(0, 0)
        if bits is not None:
            opts.bits = _c_int(bits, call, "bits")
            if opts.bits == 0:  # 0 means "the communicator's" in C: say None for that
                raise ZpcclValueError(f"{call}: bits 0 must be {BITS_RULE} (None keeps the communicator's)", call)
        if block_size is not None:
            opts.blockSize = _c_int(block_size, call, "block_size")
            if opts.blockSize == 0:
                raise ZpcclValueError(f"{call}: block_size 0 must be {BLOCK_SIZE_RULE} (None keeps the "
                                      "communicator's)", call)
        return opts

    # ---- block quantization format -------------------------------------------------------------------------

    payload_size = staticmethod(payload_size)

    def quantize(self, x: Any, bits: int, block_size: int, payload: Any = None, *, dtype: Any = None,
                 stream: Any = None) -> Any:
        """``zpQuantize``: quantizes ``x`` (float16, bfloat16 or float32) into a payload and returns it.

        The payload is a 16-byte aligned uint8 array/tensor of ``payload_size(x.size, bits, block_size)`` bytes
        (a given one may be larger) in ``x``'s memory: fp32 scales, then the packed codes.
        """
        call = "quantize"
        handle = self._live(call)
        bits, block_size = _check_quant_params(bits, block_size, call)
        xb = self._input(x, call, "x", dtype, quantized=True)
        need = payload_size(xb.count, bits, block_size)
        if payload is None:
            payload = _arrays.empty_payload(xb, need)
        pb = _arrays.as_buffer(payload, call, "payload", writable=True)
        self._place(pb, call, "payload")
        if pb.nbytes < need:
            raise ZpcclValueError(f"{call}: payload has {pb.nbytes} bytes, expected at least {need}", call)
        st = self._stream(xb, stream, call)
        self._check(_lib.lib().zpQuantize(xb.ptr, pb.ptr, xb.count, int(xb.dtype), bits, block_size, handle, st),
                    "zpQuantize")
        return payload

    def dequantize(self, payload: Any, count: int, dtype: Any, bits: int, block_size: int, out: Any = None, *,
                   stream: Any = None) -> Any:
        """``zpDequantize``: the ``count`` elements of type ``dtype`` held in ``payload`` (made by
        :meth:`quantize` with the same count, bits and block size), into ``out`` or a new 1-D array.

        A new NumPy output of bfloat16 is an ``ml_dtypes.bfloat16`` array if ml_dtypes is installed, else a
        ``uint16`` array holding the bits.
        """
        call = "dequantize"
        handle = self._live(call)
        bits, block_size = _check_quant_params(bits, block_size, call)
        count = _size_t(count, call, "count")
        code = _arrays.resolve_dtype(dtype, call)
        pb = _arrays.as_buffer(payload, call, "payload")
        self._place(pb, call, "payload")
        need = payload_size(count, bits, block_size)
        if pb.nbytes < need:
            raise ZpcclValueError(f"{call}: payload has {pb.nbytes} bytes, expected at least {need} for {count} "
                                  f"elements", call)
        if out is None:
            out = _arrays.empty_typed(pb, count, code)
        ob = _arrays.as_buffer(out, call, "out", dtype=code, writable=True)
        _arrays.require_quant_type(ob, call, "out")
        self._place(ob, call, "out")
        _arrays.check_count(ob, count, call, "out")
        st = self._stream(pb, stream, call)
        self._check(_lib.lib().zpDequantize(pb.ptr, ob.ptr, count, int(code), bits, block_size, handle, st),
                    "zpDequantize")
        return out

    # ---- collectives ---------------------------------------------------------------------------------------

    def quant_all_gather(self, send: Any, recv: Any = None, bits: int | None = None, block_size: int | None = None,
                         *, dtype: Any = None, stream: Any = None) -> Any:
        """qwZ (``zpQuantAllGather``): gathers every rank's ``send`` (float16/bfloat16/float32), each shard
        travelling block-quantized, into ``recv`` of ``nranks * send.size`` elements in rank order.

        Every rank's ``recv`` is bit-identical, its own shard included (dequantized, not the original). In place
        when ``send`` is ``recv[rank * n:(rank + 1) * n]``. ``bits``/``block_size`` override the communicator's
        ``weight_bits``/``block_size`` for this call (``zpQuantAllGatherEx``).
        """
        call = "quant_all_gather"
        handle = self._live(call)
        sb = self._input(send, call, "send", dtype, quantized=True)
        rb = self._output(recv, sb, sb.count * self._nranks, call, "recv", dtype)
        opts = self._options(bits, block_size, call)
        st = self._stream(sb, stream, call)
        L = _lib.lib()
        if opts is None:
            res = L.zpQuantAllGather(sb.ptr, rb.ptr, sb.count, int(sb.dtype), handle, st)
        else:
            res = L.zpQuantAllGatherEx(sb.ptr, rb.ptr, sb.count, int(sb.dtype), byref(opts), handle, st)
        self._check(res, "zpQuantAllGather")
        return rb.obj

    def hier_all_gather(self, send: Any, recv: Any = None, bits: int | None = None, block_size: int | None = None,
                        *, dtype: Any = None, stream: Any = None) -> Any:
        """hpZ (``zpHierAllGather``): gathers the secondary shards of this rank's hpZ group, exactly, into
        ``recv`` of ``hpz_size * send.size`` elements in hpZ-rank order (traffic stays inside the node).

        Any element type: one without a ``zpDataType_t`` (int16, bool, complex, ...) travels as bytes. Arrays that
        hold Python objects (``dtype=object``, structured dtypes with object fields) are refused.
        With ``bits`` (8 or 4; float16/bfloat16/float32 only) the shards travel block-quantized as in
        :meth:`quant_all_gather` (``zpHierAllGatherEx``, DeepSpeed's behaviour); the default is exact.
        """
        call = "hier_all_gather"
        handle = self._live(call)
        sb = self._input(send, call, "send", dtype, quantized=bits is not None)
        rb = self._output(recv, sb, sb.count * self._hpz_size, call, "recv", dtype)
        code, count = (sb.dtype, sb.count) if sb.dtype is not None else (DataType.UINT8, sb.nbytes)
        st = self._stream(sb, stream, call)
        opts = self._options(bits, block_size, call)
        L = _lib.lib()
        if opts is None:
            res = L.zpHierAllGather(sb.ptr, rb.ptr, count, int(code), handle, st)
        else:
            res = L.zpHierAllGatherEx(sb.ptr, rb.ptr, count, int(code), byref(opts), handle, st)
        self._check(res, "zpHierAllGather")
        return rb.obj

    def hier_secondary_shard(self, full_count: int) -> tuple[int, int]:
        """``zpHierSecondaryShard``: ``(offset, count)`` of this rank's secondary shard in a full tensor of
        ``full_count`` elements (a multiple of ``hpz_size``): keep ``full[offset:offset + count]`` after the
        forward gather, and :meth:`hier_all_gather` rebuilds ``full`` from it."""
        call = "hier_secondary_shard"
        handle = self._live(call)
        offset, count = c_size_t(), c_size_t()
        self._check(_lib.lib().zpHierSecondaryShard(_size_t(full_count, call, "full_count"), byref(offset),
                                                    byref(count), handle), "zpHierSecondaryShard")
        return offset.value, count.value

    def quant_reduce_scatter(self, send: Any, recv: Any = None, op: str | RedOp | int = "sum",
                             bits: int | None = None, block_size: int | None = None, *, dtype: Any = None,
                             stream: Any = None, rounding: str | Rounding | int | None = None,
                             seed: int | None = None, residual: Any = None, hop_residual: Any = None,
                             sequence: int | None = None) -> Any:
        """qgZ (``zpQuantReduceScatterA2A``): ``send`` holds ``nranks`` slices of ``send.size / nranks``
        elements; rank r receives the reduction (``"sum"`` or ``"avg"``, which divides by ``nranks``) of every
        rank's slice r, with two quantization round trips at most. Deterministic. In place when ``recv`` is
        ``send[rank * n:(rank + 1) * n]``. ``bits``/``block_size`` override ``grad_bits``/``block_size``.

        Gradient rounding (``zpQuantReduceScatterA2AEx2``, include/zpccl.h "Gradient rounding"): ``rounding``
        (``"nearest"`` or ``"stochastic"``) and ``seed`` override ``grad_rounding``/``grad_seed``; ``residual``
        (bfloat16, ``send.size`` elements: a bf16 tensor, or a NumPy ``uint16`` array of bf16 bits, zeroed before
        the first call) turns on error feedback and is rewritten by the call; ``hop_residual`` (the same type,
        :meth:`grad_hop_residual_count` elements) keeps the intermediate hop's error on two-hop layouts (ignored,
        and may be None, where qgZ takes one hop); ``sequence`` (>= 0, equal on every rank) replaces the
        communicator's call number in the random draws (a run resumed from a checkpoint).
        """
        call = "quant_reduce_scatter"
        handle = self._live(call)
        sb = self._input(send, call, "send", dtype, quantized=True)
        if sb.count % self._nranks != 0:
            raise ZpcclValueError(f"{call}: send has {sb.count} elements, not a multiple of nranks {self._nranks}",
                                  call)
        rb = self._output(recv, sb, sb.count // self._nranks, call, "recv", dtype)
        opcode = _parse_op(op, call)
        opts = self._options(bits, block_size, call)
        st = self._stream(sb, stream, call)
        L = _lib.lib()
        if any(v is not None for v in (rounding, seed, residual, hop_residual, sequence)):
            g = self._grad_options(opts, rounding, seed, residual, hop_residual, rb.count, call)
            if sequence is not None:
                g.sequence = _c_int(sequence, call, "sequence")
            res = L.zpQuantReduceScatterA2AEx2(sb.ptr, rb.ptr, rb.count, int(sb.dtype), opcode, byref(g), handle, st)
            self._check(res, "zpQuantReduceScatterA2AEx2")
            return rb.obj
        if opts is None:
            res = L.zpQuantReduceScatterA2A(sb.ptr, rb.ptr, rb.count, int(sb.dtype), opcode, handle, st)
        else:
            res = L.zpQuantReduceScatterA2AEx(sb.ptr, rb.ptr, rb.count, int(sb.dtype), opcode, byref(opts), handle,
                                              st)
        self._check(res, "zpQuantReduceScatterA2A")
        return rb.obj

    def quant_all_reduce(self, send: Any, recv: Any = None, op: str | RedOp | int = "sum", bits: int | None = None,
                         block_size: int | None = None, *, dtype: Any = None, stream: Any = None,
                         rounding: str | Rounding | int | None = None, seed: int | None = None, residual: Any = None,
                         hop_residual: Any = None, sequence: int | None = None) -> Any:
        """The quantized all-reduce (``zpQuantAllReduce``): every rank's ``recv`` (``send.size`` elements) holds the
        reduction (``"sum"`` or ``"avg"``, which divides by ``nranks``) of every rank's ``send``, bit-identical on
        every rank, deterministic (include/zpccl.h, "Quantized all-reduce": qgZ's reduce-scatter of one shard a rank,
        then the gather of the reduced shards in qwZ's format; its error bound). In place when ``recv`` is ``send``
        (or shares its memory exactly). ``bits``/``block_size`` override ``grad_bits``/``block_size``; ``rounding``,
        ``seed``, ``residual`` (bfloat16, ``send.size`` elements), ``hop_residual``
        (``grad_hop_residual_count(all_reduce_shard_count(send.size))`` elements) and ``sequence`` as in
        :meth:`quant_reduce_scatter` (``zpQuantAllReduceEx``).

        Both backends run it, with the same bits; on the cuda backend a ``send.size`` that is not ``nranks`` whole
        shards goes through a padded copy in the communicator's scratch (:meth:`reserve` sizes it).
        """
        call = "quant_all_reduce"
        handle = self._live(call)
        sb = self._input(send, call, "send", dtype, quantized=True)
        rb = self._output(recv, sb, sb.count, call, "recv", dtype)
        opcode = _parse_op(op, call)
        opts = self._options(bits, block_size, call)
        st = self._stream(sb, stream, call)
        L = _lib.lib()
        if opts is None and all(v is None for v in (rounding, seed, residual, hop_residual, sequence)):
            self._check(L.zpQuantAllReduce(sb.ptr, rb.ptr, sb.count, int(sb.dtype), opcode, handle, st),
                        "zpQuantAllReduce")
            return rb.obj
        shard = self.all_reduce_shard_count(sb.count, opts.blockSize if opts is not None and opts.blockSize else None)
        g = self._grad_options(opts, rounding, seed, residual, hop_residual, shard, call)
        if sequence is not None:
            g.sequence = _c_int(sequence, call, "sequence")
        self._check(L.zpQuantAllReduceEx(sb.ptr, rb.ptr, sb.count, int(sb.dtype), opcode, byref(g), handle, st),
                    "zpQuantAllReduceEx")
        return rb.obj

    def all_reduce_shard_count(self, count: int, block_size: int | None = None) -> int:
        """``zpQuantAllReduceShardCount``: elements of a full shard of :meth:`quant_all_reduce` for ``count``
        elements in blocks of ``block_size`` (None: the communicator's): ``ceil(ceil(count / nranks) / block_size)
        * block_size``; rank r reduces elements ``[min(r * shard, count), min((r + 1) * shard, count))``."""
        call = "all_reduce_shard_count"
        handle = self._live(call)
        out = c_size_t()
        block = 0 if block_size is None else _c_int(block_size, call, "block_size")
        if block_size is not None and block == 0:
            raise ZpcclValueError(f"{call}: block_size 0 must be {BLOCK_SIZE_RULE} (None keeps the communicator's)",
                                  call)
        self._check(_lib.lib().zpQuantAllReduceShardCount(_size_t(count, call, "count"), block, byref(out), handle),
                    "zpQuantAllReduceShardCount")
        return out.value

    def _residual(self, obj: Any, call: str, name: str) -> Buffer:
        """A residual buffer: bf16 (a NumPy uint16 array holds bf16 bits); another type reaches the library, which
        refuses it by name (options->residualType)."""
        np_mod = sys.modules.get("numpy")
        dtype = "bfloat16" if np_mod is not None and isinstance(obj, np_mod.ndarray) and obj.dtype == np_mod.uint16 \
            else None
        buf = _arrays.as_buffer(obj, call, name, dtype=dtype, writable=True)
        self._place(buf, call, name)
        return buf

    def _grad_options(self, quant: _lib.QuantOptions | None, rounding: Any, seed: Any, residual: Any,
                      hop_residual: Any, recvcount: int, call: str) -> _lib.GradOptions:
        """zpGradOptions_t of a gradient call; ``recvcount`` sizes the hop residual (qgZ's, or the all-reduce's
        shard)."""
        g = _lib.GradOptions.initializer()
        if quant is not None:
            g.bits, g.blockSize = quant.bits or CONFIG_UNDEF_INT, quant.blockSize or CONFIG_UNDEF_INT
        if rounding is not None:
            g.rounding = _lib.parse_rounding(rounding, call)
        if seed is not None:
            g.seed = _c_int(seed, call, "seed")
        if residual is not None:
            rbuf = self._residual(residual, call, "residual")
            g.residual, g.residualCount, g.residualType = rbuf.ptr, rbuf.count, int(rbuf.dtype)
        if hop_residual is not None:
            needed = self.grad_hop_residual_count(recvcount)
            hbuf = self._residual(hop_residual, call, "hop_residual")
            if needed:
                g.hopResidual, g.hopResidualCount = hbuf.ptr, hbuf.count
                if residual is None:
                    g.residualType = int(hbuf.dtype)
        return g

    def grad_hop_residual_count(self, recvcount: int) -> int:
        """``zpGradHopResidualCount``: elements of the intermediate hop's residual for a qgZ call of ``recvcount``
        (nodes * recvcount on two-hop layouts, 0 where qgZ takes one hop)."""
        call = "grad_hop_residual_count"
        handle = self._live(call)
        count = c_size_t()
        self._check(_lib.lib().zpGradHopResidualCount(_size_t(recvcount, call, "recvcount"), byref(count), handle),
                    "zpGradHopResidualCount")
        return count.value
