"""zpccl from Python: ZeRO++ collectives (qwZ quantized all-gather, hpZ hierarchical all-gather, qgZ quantized
reduce-scatter) on PyTorch CUDA tensors and, on the host backend, NumPy arrays.

    import numpy as np, zpccl

    def body(rank, comm):
        shard = np.full(1000, rank, np.float32)
        return comm.quant_all_gather(shard)          # 4 * 1000 elements, identical on every rank

    outs = zpccl.run_host_ranks(4, body)              # 4 thread-ranks, host backend

With torch (one process per GPU, after torch.distributed.init_process_group and torch.cuda.set_device):

    comm = zpccl.Comm.from_torch_group()
    full = comm.quant_all_gather(shard_bf16)         # enqueued on torch's current stream

The shared library is found through ``$ZPCCL_LIBRARY``, then inside this package (``pip install .``), then
``<repo>/build/libzpccl.so``, then the system path. ``python -m zpccl`` says which one loaded, and its NCCL.
"""
from __future__ import annotations

from . import enums
from ._arrays import resolve_dtype
from ._lib import Config, GradOptions, QuantOptions, UniqueId, library_path
from ._policy import ZeroPlusPlusPolicy
from .comm import Comm, get_unique_id, loaded_nccl_libraries, payload_size, version
from .enums import Backend, DataType, RedOp, Result, Rounding
from .errors import LibraryNotFoundError, ZpcclError, ZpcclTypeError, ZpcclValueError
from .host import run_host_ranks

__version__ = "0.2.0"

__all__ = [
    "Backend", "Comm", "Config", "DataType", "GradOptions", "LibraryNotFoundError", "QuantOptions", "RedOp",
    "Result", "Rounding", "UniqueId", "ZeroPlusPlusPolicy", "ZpcclError", "ZpcclTypeError", "ZpcclValueError", "enums",
    "get_unique_id", "library_path", "loaded_nccl_libraries", "payload_size", "resolve_dtype", "run_host_ranks",
    "version",
]
