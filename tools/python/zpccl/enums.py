"""The enums and constants of ``include/zpccl.h``, with the same numeric values.

``Result``, ``DataType`` and ``RedOp`` are numerically equal to NCCL's ``ncclResult_t``, ``ncclDataType_t`` and
``ncclRedOp_t``, as in the C header. ``DataType`` keeps the header's aliases (``CHAR``, ``INT``, ``HALF``,
``FLOAT``, ``DOUBLE``) as enum aliases.
"""
from __future__ import annotations

import enum

#: ``ZPCCL_MAJOR``, ``ZPCCL_MINOR``, ``ZPCCL_PATCH`` of the header these bindings were written against.
MAJOR, MINOR, PATCH = 0, 2, 0
#: ``ZPCCL_VERSION_CODE``: what ``Config.version`` carries.
VERSION_CODE = MAJOR * 10000 + MINOR * 100 + PATCH
#: ``ZP_UNIQUE_ID_BYTES``.
UNIQUE_ID_BYTES = 128
#: ``ZP_CONFIG_UNDEF_INT``: an integer config field left at this value takes its default.
CONFIG_UNDEF_INT = -2147483647 - 1
#: ``ZP_CONFIG_MAGIC`` ("zpco").
CONFIG_MAGIC = 0x7A70636F
#: ``ZP_GRAD_OPTIONS_MAGIC`` ("zpgo").
GRAD_OPTIONS_MAGIC = 0x7A70676F
#: ``ZP_TRANSPORT_MAGIC`` ("zptr") and ``ZP_TRANSPORT_ERROR_BYTES``.
TRANSPORT_MAGIC, TRANSPORT_ERROR_BYTES = 0x7A707472, 256
#: ``INT_MAX``: the largest value of a C int (every integer field of ``zpConfig_t``, ``gradSeed`` included).
INT_MAX = 2**31 - 1
#: ``ZP_BITS_INT4``, ``ZP_BITS_INT8``: the code widths the quantized calls take, nothing between.
BITS_INT4, BITS_INT8 = 4, 8
QUANT_BITS = (BITS_INT4, BITS_INT8)
#: ``ZP_MIN_BLOCK_SIZE``, ``ZP_MAX_BLOCK_SIZE``: a quantization block is a power of two between them (inclusive);
#: ``ZP_PAYLOAD_ALIGN``: the alignment of a payload and of its regions, in bytes.
MIN_BLOCK_SIZE, MAX_BLOCK_SIZE, PAYLOAD_ALIGN = 32, 8192, 16
#: The two rules in the words of the library's messages, for Python's own.
BITS_RULE = f"{BITS_INT4} or {BITS_INT8}"
BLOCK_SIZE_RULE = f"a power of two in [{MIN_BLOCK_SIZE}, {MAX_BLOCK_SIZE}]"


def is_bits(value: int) -> bool:
    """Whether ``value`` is a code width the library takes (``BITS_RULE``)."""
    return value in QUANT_BITS


def is_block_size(value: int) -> bool:
    """Whether ``value`` is a block size the library takes (``BLOCK_SIZE_RULE``)."""
    return MIN_BLOCK_SIZE <= value <= MAX_BLOCK_SIZE and value & (value - 1) == 0
#: ``zpNumResults``, ``zpNumTypes``, ``zpNumOps``: one past the last value of each enum.
NUM_RESULTS, NUM_TYPES, NUM_OPS = 8, 12, 5


class Result(enum.IntEnum):
    """``zpResult_t``."""

    SUCCESS = 0
    UNHANDLED_CUDA_ERROR = 1
    SYSTEM_ERROR = 2
    INTERNAL_ERROR = 3
    INVALID_ARGUMENT = 4
    INVALID_USAGE = 5
    REMOTE_ERROR = 6
    IN_PROGRESS = 7

    @property
    def c_name(self) -> str:
        """The C enumerator, e.g. ``zpInvalidArgument``."""
        return "zp" + "".join(word.capitalize() for word in self.name.split("_"))


class Rounding(enum.IntEnum):
    """``zpRounding_t``: how qgZ rounds gradients to codes (``"nearest"`` or ``"stochastic"`` where a name is taken)."""

    NEAREST = 0
    STOCHASTIC = 1


class DataType(enum.IntEnum):
    """``zpDataType_t``."""

    INT8 = 0
    CHAR = 0
    UINT8 = 1
    INT32 = 2
    INT = 2
    UINT32 = 3
    INT64 = 4
    UINT64 = 5
    FLOAT16 = 6
    HALF = 6
    FLOAT32 = 7
    FLOAT = 7
    FLOAT64 = 8
    DOUBLE = 8
    BFLOAT16 = 9
    FLOAT8E4M3 = 10
    FLOAT8E5M2 = 11

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return _ITEMSIZE[self]


_ITEMSIZE = {
    DataType.INT8: 1, DataType.UINT8: 1, DataType.FLOAT8E4M3: 1, DataType.FLOAT8E5M2: 1,
    DataType.FLOAT16: 2, DataType.BFLOAT16: 2,
    DataType.INT32: 4, DataType.UINT32: 4, DataType.FLOAT32: 4,
    DataType.INT64: 8, DataType.UINT64: 8, DataType.FLOAT64: 8,
}

#: The types the quantized calls take natively (qwZ, qgZ, quantize, dequantize).
QUANT_TYPES = frozenset({DataType.FLOAT16, DataType.BFLOAT16, DataType.FLOAT32})


class RedOp(enum.IntEnum):
    """``zpRedOp_t``. ``quant_reduce_scatter`` takes ``SUM`` and ``AVG``."""

    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3
    AVG = 4


class Backend(enum.IntEnum):
    """``zpBackend_t``."""

    DEFAULT = 0  # cuda when a CUDA device is visible, else host (overridden by ZP_BACKEND)
    CUDA = 1  # NCCL and the device kernels; buffers are device memory
    HOST = 2  # ranks are threads of one process; buffers are host memory; no stream
