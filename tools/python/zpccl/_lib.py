"""ctypes bindings of every function of ``include/zpccl.h``, and the structs it passes.

The library is found, on first use, at:

1. ``$ZPCCL_LIBRARY`` (a file, or a folder holding ``libzpccl.so`` or a versioned ``libzpccl.so.*``); when set,
   nothing else is tried;
2. inside this package (``zpccl/libzpccl.so``, where ``pip install .`` puts it; its RPATH finds NCCL in the
   ``nvidia-nccl-cu13`` wheel, the one torch loads);
3. the build folder of the source tree this package sits in (``<repo>/build/libzpccl.so``);
4. the system's library path (``ctypes.util.find_library("zpccl")``, then ``libzpccl.so.0``, as ``meson install``
   puts it).

Handles and pointers are ``c_void_p`` (64-bit values survive), counts ``c_size_t``, enums ``c_int``. Every
function gets ``argtypes`` and ``restype`` (see ``PROTOTYPES``), so a wrong Python argument fails in ctypes
instead of being truncated to 32 bits. ctypes releases the GIL around each call, so thread-ranks of the host
backend can wait for each other inside a collective.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import pathlib
import sys
import threading
from ctypes import CFUNCTYPE, POINTER, c_char, c_char_p, c_int, c_longlong, c_size_t, c_ubyte, c_uint, c_void_p
from typing import Any

from .enums import (CONFIG_MAGIC, CONFIG_UNDEF_INT, GRAD_OPTIONS_MAGIC, INT_MAX, TRANSPORT_ERROR_BYTES, TRANSPORT_MAGIC,
                    UNIQUE_ID_BYTES, VERSION_CODE, Backend, DataType, Result, Rounding)
from .errors import LibraryNotFoundError, ZpcclError, ZpcclTypeError, ZpcclValueError


class UniqueId(ctypes.Structure):
    """``zpUniqueId``: 128 opaque bytes shared by every rank before init (passed by value)."""

    _fields_ = [("internal", c_char * UNIQUE_ID_BYTES)]

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview | "UniqueId", call: str) -> "UniqueId":
        """The id holding ``data`` (exactly 128 bytes, as ``get_unique_id`` returns)."""
        if isinstance(data, UniqueId):
            return data
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ZpcclTypeError(f"{call}: unique_id must be 128 bytes, got {type(data).__name__}", call)
        raw = bytes(data)
        if len(raw) != UNIQUE_ID_BYTES:
            raise ZpcclValueError(f"{call}: unique_id has {len(raw)} bytes, expected {UNIQUE_ID_BYTES}", call)
        uid = cls()
        ctypes.memmove(ctypes.addressof(uid), raw, UNIQUE_ID_BYTES)
        return uid

    def to_bytes(self) -> bytes:
        """The 128 bytes (``internal`` as a ``c_char`` array would stop at the first NUL)."""
        return ctypes.string_at(ctypes.addressof(self), UNIQUE_ID_BYTES)


class Config(ctypes.Structure):
    """``zpConfig_t``: ``size_t`` + 2 ``unsigned`` + 10 ``int`` = 56 bytes on x86-64 and aarch64.

    Build it with :meth:`initializer` (``ZP_CONFIG_INITIALIZER``) and set only the fields you need; a field left
    at ``CONFIG_UNDEF_INT`` takes the library's default. Field names are the C names.
    """

    _fields_ = [
        ("size", c_size_t),
        ("magic", c_uint),
        ("version", c_uint),
        ("backend", c_int),
        ("ranksPerNode", c_int),
        ("nodeId", c_int),
        ("hpzSize", c_int),
        ("weightBits", c_int),
        ("gradBits", c_int),
        ("blockSize", c_int),
        ("blocking", c_int),
        ("gradRounding", c_int),
        ("gradSeed", c_int),
    ]

    #: The integer fields after the size/magic/version header, in order.
    INT_FIELDS = ("backend", "ranksPerNode", "nodeId", "hpzSize", "weightBits", "gradBits", "blockSize", "blocking",
                  "gradRounding", "gradSeed")

    @classmethod
    def initializer(cls) -> "Config":
        """The equivalent of ``zpConfig_t c = ZP_CONFIG_INITIALIZER;``."""
        return cls(ctypes.sizeof(cls), CONFIG_MAGIC, VERSION_CODE, *([CONFIG_UNDEF_INT] * len(cls.INT_FIELDS)))

    def as_dict(self) -> dict[str, int]:
        """Every field, by C name (for logs and tests)."""
        return {name: getattr(self, name) for name, _ in self._fields_}


class QuantOptions(ctypes.Structure):
    """``zpQuantOptions_t``: a per-call override; a field left at 0 keeps the communicator's value."""

    _fields_ = [("bits", c_int), ("blockSize", c_int)]


class GradOptions(ctypes.Structure):
    """``zpGradOptions_t``: the options of zpQuantReduceScatterA2AEx2 and zpQuantAllReduceEx (bits, block size,
    rounding, seed, error-feedback residuals)."""

    _fields_ = [
        ("size", c_size_t),
        ("magic", c_uint),
        ("version", c_uint),
        ("bits", c_int),
        ("blockSize", c_int),
        ("rounding", c_int),
        ("seed", c_int),
        ("residual", c_void_p),
        ("residualCount", c_size_t),
        ("residualType", c_int),
        ("hopResidual", c_void_p),
        ("hopResidualCount", c_size_t),
        ("sequence", c_int),
    ]

    @classmethod
    def initializer(cls) -> "GradOptions":
        """The equivalent of ``zpGradOptions_t o = ZP_GRAD_OPTIONS_INITIALIZER;``."""
        return cls(ctypes.sizeof(cls), GRAD_OPTIONS_MAGIC, VERSION_CODE, CONFIG_UNDEF_INT, CONFIG_UNDEF_INT,
                   CONFIG_UNDEF_INT, CONFIG_UNDEF_INT, None, 0, int(DataType.BFLOAT16), None, 0, CONFIG_UNDEF_INT)


class TransportCall(ctypes.Structure):
    """``zpTransportCall_t``: one exchange as the library asks a transport's callback for it."""

    _fields_ = [("call", c_char_p), ("timeoutMs", c_longlong), ("received", c_size_t),
                ("error", c_char * TRANSPORT_ERROR_BYTES)]


_SIZES_P = POINTER(c_size_t)
#: The callbacks of ``zpTransport_t``.
ALL_GATHER_FN = CFUNCTYPE(c_int, c_void_p, c_void_p, c_void_p, c_size_t, POINTER(TransportCall))
ALL_TO_ALL_FN = CFUNCTYPE(c_int, c_void_p, c_void_p, _SIZES_P, _SIZES_P, c_void_p, _SIZES_P, _SIZES_P,
                          POINTER(TransportCall))
FINALIZE_FN = CFUNCTYPE(None, c_void_p)


class Transport(ctypes.Structure):
    """``zpTransport_t``: a caller's transport for the host backend's ranks as processes (see
    :class:`TransportBridge`, which fills one from a Python object)."""

    _fields_ = [
        ("size", c_size_t),
        ("magic", c_uint),
        ("version", c_uint),
        ("nranks", c_int),
        ("rank", c_int),
        ("context", c_void_p),
        ("allGather", ALL_GATHER_FN),
        ("allToAll", ALL_TO_ALL_FN),
        ("finalize", FINALIZE_FN),
    ]


class TransportBridge:
    """A Python transport as a ``zpTransport_t`` whose callbacks call it (include/zpccl.h, "Host backend across
    processes").

    The transport has ``nranks`` and ``rank`` (ints) and two methods, called on the thread that called zpccl, one at
    a time, each on writable ``memoryview`` objects of the library's own memory (no copy):

    * ``all_gather(send, recv, timeout)``: every rank's ``send`` (equal sizes) into ``recv``, rank r's at
      ``r * len(send)``;
    * ``all_to_all(send, send_counts, send_offsets, recv, recv_counts, recv_offsets, timeout)``: rank r gets
      ``send[send_offsets[r]:][:send_counts[r]]`` and this rank ``recv_counts[r]`` bytes from rank r at
      ``recv_offsets[r]`` (lists of nranks ints; counts may be 0, send regions may overlap).

    ``timeout`` is in seconds (None: no limit): the method returns within it, raising if its peers did not come, and
    is done with the buffers when it returns. It returns the bytes it wrote into ``recv`` (or None: all of them).
    Whatever it raises becomes the callback's error code and message (never an exception through C). The bridge
    holds the callbacks: keep it alive as long as the communicator (``Comm.from_transport`` does).
    """

    def __init__(self, transport: Any, call: str) -> None:
        for name in ("nranks", "rank"):
            value = getattr(transport, name, None)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ZpcclTypeError(f"{call}: transport.{name} must be an int, got {type(value).__name__}", call)
            # A ctypes int field keeps the low 32 bits of what it is given: 2**32 + 1 ranks would reach C as 1.
            if not CONFIG_UNDEF_INT <= value <= INT_MAX:
                raise ZpcclValueError(f"{call}: transport.{name} {value} does not fit in a C int", call)
        for name in ("all_gather", "all_to_all"):
            if not callable(getattr(transport, name, None)):
                raise ZpcclTypeError(f"{call}: transport has no method {name}()", call)
        self.transport = transport
        self.finalized = False
        self._callbacks = (ALL_GATHER_FN(self._all_gather), ALL_TO_ALL_FN(self._all_to_all),
                           FINALIZE_FN(self._finalize))
        self.struct = Transport(ctypes.sizeof(Transport), TRANSPORT_MAGIC, VERSION_CODE, transport.nranks,
                                transport.rank, None, *self._callbacks)

    @staticmethod
    def _view(address: int | None, nbytes: int) -> memoryview:
        if not nbytes or not address:
            return memoryview(bytearray(0))
        return memoryview((c_ubyte * nbytes).from_address(address)).cast("B")

    @staticmethod
    def _timeout(call: Any) -> float | None:
        return call.timeoutMs / 1000.0 if call.timeoutMs > 0 else None

    @staticmethod
    def _fail(call: Any, exc: BaseException) -> int:
        try:
            text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
            call.error = text.encode("ascii", "replace")[:TRANSPORT_ERROR_BYTES - 1]  # never half a character
        except BaseException:  # noqa: BLE001 - nothing may unwind into C
            pass
        return 1

    def _all_gather(self, _context: int, send: int, recv: int, nbytes: int, call_p: Any) -> int:
        call = call_p.contents
        try:
            nranks = self.transport.nranks
            got = self.transport.all_gather(self._view(send, nbytes), self._view(recv, nbytes * nranks),
                                            self._timeout(call))
            call.received = nbytes * nranks if got is None else int(got)
            return 0
        except BaseException as exc:  # noqa: BLE001 - an error code, never an exception through C
            return self._fail(call, exc)

    def _all_to_all(self, _context: int, send: int, send_counts: Any, send_offsets: Any, recv: int, recv_counts: Any,
                    recv_offsets: Any, call_p: Any) -> int:
        call = call_p.contents
        try:
            n = self.transport.nranks
            sc, so = send_counts[:n], send_offsets[:n]
            rc, ro = recv_counts[:n], recv_offsets[:n]
            send_end = max((o + c for o, c in zip(so, sc) if c), default=0)
            recv_end = max((o + c for o, c in zip(ro, rc) if c), default=0)
            got = self.transport.all_to_all(self._view(send, send_end), sc, so, self._view(recv, recv_end), rc, ro,
                                            self._timeout(call))
            call.received = sum(rc) if got is None else int(got)
            return 0
        except BaseException as exc:  # noqa: BLE001
            return self._fail(call, exc)

    def release(self) -> None:
        """Lets the transport go once the library calls it no more (its communicator freed, or never made). The
        bridge's callbacks hold the bridge (a reference cycle), so without this the transport, and the process group
        it holds, would live until the garbage collector runs; gloo's group, kept past destroy_process_group() until
        the interpreter exits, aborts the process there."""
        self.transport = None

    def _finalize(self, _context: int) -> None:
        self.finalized = True
        self.release()


_INT_P = POINTER(c_int)
_SIZE_P = POINTER(c_size_t)
_COMM_P = POINTER(c_void_p)
_CONFIG_P = POINTER(Config)
_OPTIONS_P = POINTER(QuantOptions)
_QUERIES = ("zpCommCount", "zpCommUserRank", "zpCommCuDevice", "zpCommBackend", "zpCommNodeCount",
            "zpCommNodeRank", "zpCommLocalRank", "zpCommLocalSize", "zpCommHpzRank", "zpCommHpzSize")

#: (restype, argtypes) of every function of zpccl.h. Enums (zpResult_t, zpDataType_t, zpRedOp_t, zpBackend_t)
#: are int-sized; zpComm_t, cudaStream_t, struct ncclComm* and buffers are pointers.
PROTOTYPES: dict[str, tuple[Any, list[Any]]] = {
    # Versions and errors.
    "zpGetVersion": (c_int, [_INT_P]),
    "zpGetErrorString": (c_char_p, [c_int]),
    "zpGetLastError": (c_char_p, [c_void_p]),
    # Communicators.
    "zpGetUniqueId": (c_int, [POINTER(UniqueId)]),
    "zpCommInitRank": (c_int, [_COMM_P, c_int, UniqueId, c_int]),
    "zpCommInitRankConfig": (c_int, [_COMM_P, c_int, UniqueId, c_int, _CONFIG_P]),
    "zpCommInitFromNccl": (c_int, [_COMM_P, c_void_p, _CONFIG_P]),
    "zpCommInitFromTransport": (c_int, [_COMM_P, POINTER(Transport), _CONFIG_P]),
    "zpCommDestroy": (c_int, [c_void_p]),
    "zpCommAbort": (c_int, [c_void_p]),
    "zpCommGetAsyncError": (c_int, [c_void_p, _INT_P]),
    "zpCommReserve": (c_int, [c_void_p, c_size_t]),
    **{name: (c_int, [c_void_p, _INT_P]) for name in _QUERIES},
    # Block quantization format.
    "zpQuantPayloadSize": (c_int, [c_size_t, c_int, c_int, _SIZE_P]),
    "zpQuantize": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, c_int, c_void_p, c_void_p]),
    "zpDequantize": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, c_int, c_void_p, c_void_p]),
    # Collectives.
    "zpQuantAllGather": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_void_p, c_void_p]),
    "zpQuantAllGatherEx": (c_int, [c_void_p, c_void_p, c_size_t, c_int, _OPTIONS_P, c_void_p, c_void_p]),
    "zpHierAllGather": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_void_p, c_void_p]),
    "zpHierAllGatherEx": (c_int, [c_void_p, c_void_p, c_size_t, c_int, _OPTIONS_P, c_void_p, c_void_p]),
    "zpHierSecondaryShard": (c_int, [c_size_t, _SIZE_P, _SIZE_P, c_void_p]),
    "zpQuantReduceScatterA2A": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p]),
    "zpQuantReduceScatterA2AEx": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, _OPTIONS_P, c_void_p,
                                          c_void_p]),
    "zpQuantReduceScatterA2AEx2": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, POINTER(GradOptions),
                                           c_void_p, c_void_p]),
    "zpGradHopResidualCount": (c_int, [c_size_t, _SIZE_P, c_void_p]),
    "zpQuantAllReduce": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p]),
    "zpQuantAllReduceEx": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, POINTER(GradOptions), c_void_p,
                                   c_void_p]),
    "zpQuantAllReduceShardCount": (c_int, [c_size_t, c_int, _SIZE_P, c_void_p]),
}

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_path: str | None = None


def _candidates() -> list[str]:
    """Where to look for the library, in order (see the module docstring)."""
    env = os.environ.get("ZPCCL_LIBRARY")
    if env:
        p = pathlib.Path(env)
        if not p.is_dir():
            return [env]
        versioned = sorted(str(f) for f in p.glob("libzpccl.so.*") if f.name != "libzpccl.so.0")
        return [str(p / "libzpccl.so"), str(p / "libzpccl.so.0")] + versioned
    package = pathlib.Path(__file__).resolve().parent
    out = [str(package / "libzpccl.so")]
    if package.parent.name == "python" and package.parent.parent.name == "tools":  # <repo>/tools/python/zpccl
        out.append(str(package.parents[2] / "build" / "libzpccl.so"))
    found = ctypes.util.find_library("zpccl")
    if found:
        out.append(found)
    out.append("libzpccl.so.0")
    return out


def nccl_wheel_library() -> str | None:
    """The first ``nvidia/nccl/lib/libnccl.so.2`` of the nvidia-nccl-cu13 wheel on ``sys.path``, as torch looks
    for it, or None."""
    for entry in sys.path:
        candidate = os.path.join(entry or os.curdir, "nvidia", "nccl", "lib", "libnccl.so.2")
        if os.path.isfile(candidate):
            return candidate
    return None


def _load(path: str) -> ctypes.CDLL:
    """``ctypes.CDLL(path)``, with the NCCL torch would load. A process holds one library of the soname
    libnccl.so.2, the first loaded: when the nvidia-nccl-cu13 wheel (torch's NCCL) is on ``sys.path`` and no NCCL is
    loaded yet, the wheel's goes first. Otherwise a library found elsewhere (a build folder, the system's) would
    bring the system's NCCL, and a torch imported later would fail on the symbols its newer NCCL has; and the
    installed library's RUNPATH finds the wheel only in its own site-packages, not in another one (a virtual
    environment over the system's torch)."""
    from ._torch import loaded_nccl_libraries

    nccl = nccl_wheel_library()
    if nccl is not None and not loaded_nccl_libraries():
        ctypes.CDLL(nccl)
    return ctypes.CDLL(path)


def _bind(lib: ctypes.CDLL) -> None:
    for name, (restype, argtypes) in PROTOTYPES.items():
        fn = getattr(lib, name)  # AttributeError here means the library predates the header
        fn.restype = restype
        fn.argtypes = argtypes


def lib() -> ctypes.CDLL:
    """The loaded library with every prototype declared (loaded once, on first use)."""
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            tried = []
            for path in _candidates():
                if os.sep in path and not os.path.exists(path):
                    tried.append(f"{path} (no such file)")
                    continue
                try:
                    loaded = _load(path)
                except OSError as e:
                    tried.append(f"{path} ({e})")
                    continue
                try:
                    _bind(loaded)
                except AttributeError as e:
                    tried.append(f"{path} (not a compatible zpccl: {e})")
                    continue
                _path = path
                _lib = loaded
                break
            else:
                raise LibraryNotFoundError(
                    "zpccl: cannot load libzpccl.so; tried:\n  " + "\n  ".join(tried) +
                    "\nInstall the package with the library inside (`pip install .` in the source tree), set "
                    "ZPCCL_LIBRARY to the library file (e.g. <repo>/build/libzpccl.so), build it with "
                    "`ninja -C build`, or install it where the dynamic linker finds it (`meson install`).")
    return _lib


def library_path() -> str:
    """The path the library was loaded from (loading it if needed)."""
    lib()
    assert _path is not None
    return _path


def error_string(code: int) -> str:
    """``zpGetErrorString(code)``."""
    return lib().zpGetErrorString(int(code)).decode()


def last_error(comm: int | None) -> str:
    """``zpGetLastError``: the communicator's message when ``comm`` is live, else this thread's.

    A failed call on a live communicator stores its message there; a call with no valid communicator (an init,
    a destroy, a destroyed handle) stores it for the calling thread, which ``zpGetLastError(NULL)`` returns.
    """
    L = lib()
    if comm:
        msg = L.zpGetLastError(comm).decode(errors="replace")
        if not msg.startswith("zpGetLastError :"):  # that prefix: comm is not live any more
            return msg
    return L.zpGetLastError(None).decode(errors="replace")


def check(result: int, call: str, comm: int | None = None) -> None:
    """Raises :class:`ZpcclError` with the library's message when ``result`` is not ``zpSuccess``."""
    if result == Result.SUCCESS:
        return
    message = last_error(comm) or f"{call} : {error_string(result)}"
    raise ZpcclError(result, message, call)


def make_config(call: str, **fields: Any) -> Config:
    """A :class:`Config` from ``ZP_CONFIG_INITIALIZER`` with the given fields set (``None`` leaves a default).

    Keys are the Python names: ``backend`` (a :class:`Backend`, its name or value), ``ranks_per_node``,
    ``node_id``, ``hpz_size``, ``weight_bits``, ``grad_bits``, ``block_size``, ``blocking``, ``grad_rounding`` (a
    :class:`Rounding`, ``"nearest"``/``"stochastic"`` or its value), ``grad_seed``. Values are checked
    by the library at init; here only their Python type, that they fit a C int, and that none is ``-2**31``
    (``ZP_CONFIG_UNDEF_INT``, which C reads as "unset").
    """
    names = {"backend": "backend", "ranks_per_node": "ranksPerNode", "node_id": "nodeId", "hpz_size": "hpzSize",
             "weight_bits": "weightBits", "grad_bits": "gradBits", "block_size": "blockSize",
             "blocking": "blocking", "grad_rounding": "gradRounding", "grad_seed": "gradSeed"}
    config = Config.initializer()
    for key, value in fields.items():
        if key not in names:
            raise ZpcclTypeError(f"{call}: unknown config field {key!r} (known: {', '.join(names)})", call)
        if value is None:
            continue
        if key == "backend":
            value = parse_backend(value, call)
        elif key == "grad_rounding":
            value = parse_rounding(value, call)
        elif isinstance(value, bool) or not isinstance(value, int):
            raise ZpcclTypeError(f"{call}: {key} must be an int, got {type(value).__name__}", call)
        if not CONFIG_UNDEF_INT <= int(value) <= INT_MAX:  # INT_MIN to INT_MAX
            raise ZpcclValueError(f"{call}: {key} {value} does not fit in a C int", call)
        if int(value) == CONFIG_UNDEF_INT:  # C cannot tell this value from a field left unset
            raise ZpcclValueError(f"{call}: {key} {value} is ZP_CONFIG_UNDEF_INT, which means unset (no field takes "
                                  "it as a value); pass None for the default", call)
        setattr(config, names[key], int(value))
    return config


def parse_rounding(value: Rounding | str | int, call: str) -> int:
    """A :class:`Rounding`, its name (``"nearest"``, ``"stochastic"``, any case) or its int value (checked by C)."""
    if isinstance(value, str):
        try:
            return int(Rounding[value.upper()])
        except KeyError:
            raise ZpcclValueError(f"{call}: rounding {value!r} is not 'nearest' or 'stochastic'", call) from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ZpcclTypeError(f"{call}: rounding must be 'nearest', 'stochastic' or a zpccl.Rounding, got "
                             f"{type(value).__name__}", call)
    return int(value)


def parse_backend(value: Backend | str | int, call: str) -> int:
    """A backend given as :class:`Backend`, ``"cuda"``/``"host"``/``"default"`` or its number."""
    if isinstance(value, str):
        try:
            return int(Backend[value.upper()])
        except KeyError:
            raise ZpcclValueError(f"{call}: backend {value!r} is not one of default, cuda, host", call) from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ZpcclTypeError(f"{call}: backend must be a zpccl.Backend, str or int, got {type(value).__name__}",
                             call)
    return int(value)  # an out-of-range number is the library's to refuse, with its message
