"""Arrays in, pointers out: NumPy arrays and torch tensors seen as (pointer, element count, zpDataType_t, device).

Nothing here copies: a buffer must be contiguous, and its data pointer goes to C as it is. torch is never
imported here; a tensor is recognized only when the caller's process has imported torch already.

Data types map by name to ``zpDataType_t`` (``float16`` -> 6, ``float32`` -> 7, ``bfloat16`` -> 9, ``int8`` -> 0,
...). NumPy has no bfloat16 of its own: use ``ml_dtypes.bfloat16`` arrays when ml_dtypes is installed, or hold
the bits in a ``uint16`` array and pass ``dtype="bfloat16"`` to the call. An explicit ``dtype`` never converts:
it reinterprets the bits of an integer array of the same item size (a float array must be of that very type).
Arrays holding Python objects (``dtype=object``, or structured dtypes with an object field) are refused.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from .enums import PAYLOAD_ALIGN, QUANT_TYPES, DataType
from .errors import ZpcclTypeError, ZpcclValueError

#: Element type names (numpy ``dtype.name``, torch ``str(dtype)`` without ``torch.``) with a zpDataType_t.
_TYPE_OF_NAME = {
    "int8": DataType.INT8, "uint8": DataType.UINT8, "int32": DataType.INT32, "uint32": DataType.UINT32,
    "int64": DataType.INT64, "uint64": DataType.UINT64, "float16": DataType.FLOAT16,
    "float32": DataType.FLOAT32, "float64": DataType.FLOAT64, "bfloat16": DataType.BFLOAT16,
    "float8_e4m3fn": DataType.FLOAT8E4M3, "float8_e5m2": DataType.FLOAT8E5M2,
}
#: More spellings accepted for an explicit ``dtype="..."``.
_ALIASES = {"half": "float16", "fp16": "float16", "float": "float32", "fp32": "float32", "double": "float64",
            "fp64": "float64", "bf16": "bfloat16", "char": "int8", "int": "int32", "f8e4m3": "float8_e4m3fn",
            "float8e4m3": "float8_e4m3fn", "f8e5m2": "float8_e5m2", "float8e5m2": "float8_e5m2"}
_NAME_OF_TYPE = {code: name for name, code in _TYPE_OF_NAME.items()}
_FLOAT_TYPES = frozenset({DataType.FLOAT16, DataType.FLOAT32, DataType.FLOAT64, DataType.BFLOAT16,
                          DataType.FLOAT8E4M3, DataType.FLOAT8E5M2})


def torch_module() -> Any | None:
    """torch if this process imported it already, else None (so NumPy-only users never pay for the import)."""
    return sys.modules.get("torch")


def is_tensor(obj: Any) -> bool:
    """Whether ``obj`` is a torch tensor."""
    torch = torch_module()
    return torch is not None and isinstance(obj, torch.Tensor)


def type_name(code: DataType) -> str:
    """The element type's name, as numpy and torch spell it."""
    return _NAME_OF_TYPE[DataType(code)]


def dtype_name(dtype: Any) -> str:
    """A torch or NumPy dtype's name as numpy and torch spell it (``torch.bfloat16`` -> ``bfloat16``), as
    :data:`QUANT_TYPE_NAMES` and the messages name it."""
    return str(dtype).replace("torch.", "")


#: The names of the element types the quantized calls take (QUANT_TYPES), narrowest first, as messages list them.
QUANT_TYPE_NAMES = tuple(type_name(t) for t in sorted(QUANT_TYPES, key=lambda t: (t.itemsize, t)))
#: The same, in words: "float16, bfloat16 and float32".
QUANT_TYPES_IN_WORDS = f"{', '.join(QUANT_TYPE_NAMES[:-1])} and {QUANT_TYPE_NAMES[-1]}"


def resolve_dtype(spec: Any, call: str) -> DataType:
    """A :class:`DataType` from a DataType/int, a name (``"bfloat16"``, ``"bf16"``, ...), a NumPy dtype or a
    torch dtype."""
    if isinstance(spec, DataType):
        return spec
    if isinstance(spec, int) and not isinstance(spec, bool):
        try:
            return DataType(spec)
        except ValueError:
            raise ZpcclValueError(f"{call}: dtype {spec} is not a zpDataType_t", call) from None
    torch = torch_module()
    if torch is not None and isinstance(spec, torch.dtype):
        name = dtype_name(spec)
    elif isinstance(spec, str):
        name = _ALIASES.get(spec.lower(), spec.lower())
    else:
        try:
            name = np.dtype(spec).name
        except TypeError:
            raise ZpcclTypeError(f"{call}: dtype {spec!r} is not a data type", call) from None
    if name not in _TYPE_OF_NAME:
        raise ZpcclValueError(f"{call}: dtype {name} has no zpDataType_t (known: {', '.join(_TYPE_OF_NAME)})", call)
    return _TYPE_OF_NAME[name]


@dataclass(frozen=True)
class Buffer:
    """One array argument as C sees it."""

    obj: Any  # the caller's array (kept alive with the buffer)
    ptr: int  # address of element 0
    count: int  # elements of ``dtype``
    dtype: DataType | None  # None: a type without a zpDataType_t (only hier_all_gather moves those, as bytes)
    itemsize: int
    device: int  # -1: host memory; else the CUDA device index
    kind: str  # "numpy" or "torch"
    type_label: str  # the array's own element type name, for messages

    @property
    def nbytes(self) -> int:
        """Bytes of the buffer."""
        return self.count * self.itemsize

    def where(self) -> str:
        """``host`` or ``cuda:N``, for messages."""
        return "host memory" if self.device < 0 else f"cuda:{self.device}"


def as_buffer(obj: Any, call: str, name: str, *, dtype: Any = None, writable: bool = False) -> Buffer:
    """Checks that ``obj`` is a contiguous NumPy array or torch tensor and returns its :class:`Buffer`.

    ``dtype``, when given, overrides the element type (e.g. ``"bfloat16"`` for a ``uint16`` array of bf16 bits):
    it must have the array's item size, and a floating array must already be of that type. ``writable`` refuses
    read-only NumPy arrays (outputs).
    """
    if isinstance(obj, np.ndarray):
        if not obj.flags.c_contiguous:
            raise ZpcclValueError(f"{call}: {name} is not contiguous (shape {obj.shape}, strides {obj.strides}); "
                                  f"pass numpy.ascontiguousarray({name})", call)
        if writable and not obj.flags.writeable:
            raise ZpcclValueError(f"{call}: {name} is read-only", call)
        if obj.dtype.hasobject:
            # Object arrays hold PyObject pointers: copying their bytes to another array makes references that
            # nobody counts, and the interpreter later frees or reads objects through them.
            raise ZpcclTypeError(f"{call}: {name} has dtype {obj.dtype}, which holds Python objects; zpccl moves "
                                 "raw bytes and cannot move object references", call)
        if not obj.dtype.isnative:
            raise ZpcclValueError(f"{call}: {name} has non-native byte order ({obj.dtype.str})", call)
        label, itemsize = obj.dtype.name, obj.dtype.itemsize
        ptr, count, device, kind = int(obj.__array_interface__["data"][0]), int(obj.size), -1, "numpy"
    elif is_tensor(obj):
        if obj.device.type not in ("cuda", "cpu"):
            raise ZpcclValueError(f"{call}: {name} is on device {obj.device}; zpccl takes cuda or cpu tensors", call)
        if not obj.is_contiguous():
            raise ZpcclValueError(f"{call}: {name} is not contiguous (shape {tuple(obj.shape)}, strides "
                                  f"{tuple(obj.stride())}); pass {name}.contiguous()", call)
        label, itemsize = dtype_name(obj.dtype), int(obj.element_size())
        ptr, count, kind = int(obj.data_ptr()), int(obj.numel()), "torch"
        device = int(obj.device.index if obj.device.index is not None else 0) if obj.device.type == "cuda" else -1
    else:
        raise ZpcclTypeError(f"{call}: {name} must be a numpy.ndarray or a torch.Tensor, got "
                             f"{type(obj).__module__}.{type(obj).__qualname__}", call)
    natural = _TYPE_OF_NAME.get(label)
    code = natural
    if dtype is not None:
        code = resolve_dtype(dtype, call)
        # An integer array may carry any type's bits (bf16 in uint16); a float array is what it says it is.
        if code.itemsize != itemsize or (natural is not None and natural != code and natural in _FLOAT_TYPES):
            raise ZpcclValueError(f"{call}: dtype {type_name(code)} does not match {name}'s element type {label}; "
                                  f"an explicit dtype reinterprets an integer array of the same item size", call)
    return Buffer(obj, ptr, count, code, itemsize, device, kind, label)


def require_quant_type(buf: Buffer, call: str, name: str) -> DataType:
    """The buffer's type if the quantized calls take it (float16, bfloat16, float32), else a clear error."""
    if buf.dtype not in QUANT_TYPES:
        hint = "; for bfloat16 bits held in uint16 pass dtype='bfloat16'" if buf.type_label in ("uint16",
                                                                                               "int16") else ""
        raise ZpcclValueError(f"{call}: {name} dtype {buf.type_label} is not supported ({QUANT_TYPES_IN_WORDS} "
                              f"are){hint}", call)
    assert buf.dtype is not None
    return buf.dtype


def check_same_type(a: Buffer, b: Buffer, call: str, a_name: str, b_name: str) -> None:
    """Both buffers hold the same element type and live in the same memory."""
    if (a.dtype, a.itemsize) != (b.dtype, b.itemsize) or (a.dtype is None and a.type_label != b.type_label):
        raise ZpcclValueError(f"{call}: {b_name} dtype {b.type_label} differs from {a_name} dtype {a.type_label}",
                              call)
    if a.device != b.device:
        raise ZpcclValueError(f"{call}: {b_name} is in {b.where()}, {a_name} in {a.where()}", call)


def check_count(buf: Buffer, expected: int, call: str, name: str) -> None:
    """``buf`` holds exactly ``expected`` elements."""
    if buf.count != expected:
        raise ZpcclValueError(f"{call}: {name} has {buf.count} elements, expected {expected}", call)


def empty_like(like: Buffer, count: int) -> Any:
    """A new 1-D array of ``count`` elements of ``like``'s own type, in ``like``'s memory."""
    if like.kind == "torch":
        torch = torch_module()
        assert torch is not None
        return torch.empty(count, dtype=like.obj.dtype, device=like.obj.device)
    return np.empty(count, dtype=like.obj.dtype)


def empty_typed(like: Buffer, count: int, code: DataType) -> Any:
    """A new 1-D array of ``count`` elements of type ``code`` in ``like``'s memory and library (NumPy bfloat16:
    ml_dtypes.bfloat16 when installed, else uint16 holding the bits)."""
    name = type_name(code)
    if like.kind == "torch":
        torch = torch_module()
        assert torch is not None
        return torch.empty(count, dtype=getattr(torch, name), device=like.obj.device)
    return np.empty(count, dtype=numpy_dtype(code))


def numpy_dtype(code: DataType) -> np.dtype:
    """The NumPy dtype that holds ``code``: its own, ml_dtypes' for bfloat16/float8, else an unsigned int of the
    same size holding the bits."""
    name = type_name(code)
    try:
        return np.dtype(name)
    except TypeError:
        pass
    try:
        import ml_dtypes  # noqa: F401  (registers bfloat16 and float8 with NumPy)

        return np.dtype(getattr(ml_dtypes, name))
    except (ImportError, AttributeError):
        return np.dtype(f"uint{8 * code.itemsize}")


def empty_payload(like: Buffer, nbytes: int) -> Any:
    """A new uint8 array of ``nbytes`` bytes, 16-byte aligned, in ``like``'s memory."""
    if like.kind == "torch":
        torch = torch_module()
        assert torch is not None
        return torch.empty(nbytes, dtype=torch.uint8, device=like.obj.device)  # allocators align to >= 64 bytes
    raw = np.empty(nbytes + PAYLOAD_ALIGN, dtype=np.uint8)
    skip = -raw.__array_interface__["data"][0] % PAYLOAD_ALIGN
    return raw[skip:skip + nbytes]
