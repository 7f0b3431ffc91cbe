"""The state of one gradient all-reduce served by zpccl: :class:`QuantAllReduce`, made once from a process group
(its communicator, its staging buffer and zero blocks, its counters), then called for every bucket or shard."""
from __future__ import annotations

import logging
from typing import Any, Callable, Iterable

from .._arrays import QUANT_TYPE_NAMES, QUANT_TYPES_IN_WORDS, dtype_name
from .._policy import ZeroPlusPlusPolicy
from .._report import PathStats, Report, all_reduce_wire_bytes
from .._staging import BlockLayout, Staging
from ..comm import Comm
from ..enums import Backend, Result
from ..errors import ZpcclError, ZpcclTypeError, ZpcclValueError

log = logging.getLogger("zpccl.ddp")


class QuantAllReduce:
    """zpQuantAllReduce over one process group: the average of a gradient tensor over the group's ranks, in place,
    bit-identical on every rank (include/zpccl.h, "Quantized all-reduce").

    Made once (by :func:`~zpccl.ddp.enable`, :func:`~zpccl.ddp.make_state` or :func:`~zpccl.ddp.enable_replicate`):
    the communicator over the group (``Comm.from_torch_group``: the host backend on a gloo group of CPU tensors),
    its scratch reserved on CUDA for collectives of ``staging_bytes``, and, where blocks restart at parameter
    boundaries, a staging buffer of that size and a zero block per element type. A call then allocates nothing: a
    tensor larger than ``staging_bytes`` is reduced in pieces (:meth:`all_reduce`). ``summary()`` counts the calls
    and bytes; :meth:`close` destroys the communicator, after which a call raises.
    """

    def __init__(self, group: Any, policy: ZeroPlusPlusPolicy, *, device: Any, dtypes: Iterable[Any],
                 staging_bytes: int, call: str) -> None:
        import torch
        import torch.distributed as dist

        self._torch, self.policy, self.device, self.call = torch, policy, device, call
        self.report = Report(log)
        self.comm: Comm | None = None
        dtypes = tuple(dict.fromkeys(dtypes))
        bad = [name for name in map(dtype_name, dtypes) if name not in QUANT_TYPE_NAMES]
        if bad:
            raise ZpcclValueError(f"{call}: gradients of dtype {', '.join(bad)}: zpQuantAllReduce takes "
                                  f"{QUANT_TYPES_IN_WORDS} (keep torch's own all-reduce for the others)", call)
        # ranks_per_node numbers the world's ranks, whichever group this is (a DDP subgroup, HSDP's replicate one).
        config = policy.comm_config(reduce=True, world_rank=dist.get_rank())
        comm = Comm.from_torch_group(group, device=device, **config)
        try:
            # A call of no elements at set-up: a communicator that cannot run the all-reduce refuses it here, not in
            # the training loop.
            for dtype in dtypes:
                comm.quant_all_reduce(torch.empty(0, dtype=dtype, device=device))
            if comm.backend == Backend.CUDA:
                comm.reserve(max(staging_bytes, 1))
        except ZpcclError as exc:
            comm.close()
            gpu = " (on GPUs keep DDP's all-reduce or torch's bf16_compress_hook; on CPUs use a gloo process group)"
            raise ZpcclError(exc.code, f"{call}: {exc.message}{gpu if comm.backend == Backend.CUDA else ''}",
                             call) from exc
        self.comm = comm
        self.nranks = comm.nranks
        #: The most bytes one zpQuantAllReduce call takes: what the communicator's scratch is reserved for.
        self.call_bytes = max(staging_bytes, 1)
        self.stage = Staging(torch, device, staging_bytes) if policy.param_blocks else None
        self.staging_bytes = staging_bytes if policy.param_blocks else 0
        block = policy.grad_block
        self._zeros = {d: torch.zeros(block, dtype=d, device=device) for d in dtypes} if policy.param_blocks else {}
        self._plans: dict[tuple[tuple[int, ...], Any], list[tuple[int, int, BlockLayout | None]]] = {}
        self._shards: dict[int, int] = {}
        self._at_close: list[Callable[[], None]] = []
        log.info("zpccl.ddp: %s over %d ranks (%s, %d node(s)), int%d in blocks of %d%s, staging %d bytes", call,
                 self.nranks, comm.backend.name.lower(), comm.node_count, policy.grad_bits, block,
                 ", blocks restart at parameters" if policy.param_blocks else "", self.staging_bytes)

    # ---- the call ----

    def all_reduce(self, tensor: Any, sizes: list[int] | None = None, op: str = "avg") -> Any:
        """``tensor`` (contiguous, of any shape, float16/bfloat16/float32) replaced by its ``op`` ("avg" or "sum")
        over the group's ranks, quantized as the policy says; returns it. Its elements are reduced in memory order,
        as one 1-D tensor. ``sizes``: its parts (parameters) in order, whose blocks restart at each boundary when the
        policy's ``param_blocks`` holds (None: one part).

        Parts are staged together as far as the staging buffer holds them; a tensor larger than it (DDP's first
        iteration puts every parameter in one bucket) is reduced in pieces of whole parts, a part alone in place.
        Unstaged (blocks from the tensor's start), a tensor larger than ``call_bytes`` is reduced in pieces of whole
        blocks, so that no call outgrows the scratch reserved for it.
        Every output element depends only on its block's values on every rank (the shards and the gather cut at
        block boundaries), so the pieces give the bits one call would, except for stochastic rounding, whose draws
        follow the shards: deterministic and equal on every rank all the same."""
        comm = self._live()
        if not tensor.is_contiguous():
            raise ZpcclValueError(f"{self.call}: tensor of shape {tuple(tensor.shape)} and strides "
                                  f"{tuple(tensor.stride())} is not contiguous: reduce tensor.contiguous() and copy "
                                  "the result back", self.call)
        if self.nranks == 1:
            # The average (and the sum) over one rank is the tensor itself: nothing travels, and quantizing it would
            # only add error.
            self.report.say_once("one rank", f"{self.call}: a group of one rank: its gradients stay as they are, "
                                 "exact (nothing travels)", logging.INFO)
            self.report.count("quant_all_reduce", tensor.numel() * tensor.element_size(), 0)
            return tensor
        wire, flat = 0, tensor.view(-1)
        for offset, count, layout in self._pieces(sizes, tensor.numel(), tensor.dtype):
            part = flat.narrow(0, offset, count)
            if layout is None:
                comm.quant_all_reduce(part, part, op=op)
                wire += self._wire_bytes(count)
                continue
            self.stage.begin()
            buffer = self.stage.view(layout.staged_count, tensor.dtype)
            layout.stage(self._torch, part, buffer, self._zero_block(tensor.dtype))
            comm.quant_all_reduce(buffer, buffer, op=op)
            layout.unstage(self._torch, buffer, part)
            self.stage.end()
            wire += self._wire_bytes(layout.staged_count)
        self.report.count("quant_all_reduce", tensor.numel() * tensor.element_size(), wire)
        return tensor

    def __call__(self, tensor: Any) -> None:
        """FSDP2's all-reduce hook signature (``FSDPModule.set_all_reduce_hook``): the average over the group, in
        place, blocks from the tensor's start."""
        self.all_reduce(tensor)

    # ---- reporting ----

    @property
    def stats(self) -> dict[str, PathStats]:
        return self.report.stats

    def summary(self) -> dict[str, dict[str, int]]:
        """``{"quant_all_reduce": {"calls": .., "logical_bytes": .., "wire_bytes": ..}}``: logical bytes are the
        tensors', wire bytes what this rank's payloads occupy on the wire (the reduce-scatter's n - 1 payloads of a
        shard, and its reduced shard's n - 1 copies in the gather)."""
        return self.report.summary()

    @property
    def staging_grown(self) -> bool:
        """Whether a call found the staging buffer too small and allocated a larger one (nothing should allocate
        per call: a defect of the reservation)."""
        return self.stage is not None and self.stage.grown

    # ---- lifecycle ----

    @property
    def closed(self) -> bool:
        return self.comm is None

    def close(self) -> None:
        """Destroys the communicator and drops the buffers. Idempotent; a later call raises."""
        comm, self.comm = self.comm, None
        self.stage, self._zeros = None, {}
        at_close, self._at_close = self._at_close, []
        for undo in at_close:
            undo()
        if comm is not None:
            comm.close()

    def on_close(self, undo: Callable[[], None]) -> None:
        """Runs ``undo`` at :meth:`close` (what a hook of this state set up on the framework's objects)."""
        self._at_close.append(undo)

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Refused: the communicator, its buffers and its peers live in this process. ``torch.save`` or
        ``copy.deepcopy`` of the DDP model that the hook serves reaches here through DDP's list of hooks."""
        raise ZpcclTypeError(f"{self.call}: a zpccl.ddp state holds a communicator and cannot be pickled or copied: "
                             "save or copy the module (model.module, or its state_dict()) instead, and call "
                             "zpccl.ddp.enable on the DistributedDataParallel that wraps the copy", self.call)

    def __enter__(self) -> "QuantAllReduce":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- helpers ----

    def _live(self) -> Comm:
        if self.comm is None:
            raise ZpcclError(Result.INVALID_USAGE, f"{self.call}: this zpccl.ddp state is closed; make a new one "
                             "(and register its hook) to reduce gradients with zpccl again", self.call)
        return self.comm

    def _pieces(self, sizes: list[int] | None, count: int, dtype: Any) -> list[tuple[int, int, BlockLayout | None]]:
        """(offset, count, staged layout or None: in place) of each call that reduces a tensor of parts of these
        sizes; made once per shape."""
        if self.stage is None or not sizes or len(sizes) == 1:
            return self._block_pieces(count, dtype)
        if sum(sizes) != count:
            self.report.say_once("sizes", f"a tensor of {count} elements whose parameters hold {sum(sizes)}: its "
                                 "blocks run across parameters", logging.INFO)
            return self._block_pieces(count, dtype)
        key = (tuple(sizes), dtype)
        pieces = self._plans.get(key)
        if pieces is not None:
            return pieces
        block, capacity = self.policy.grad_block, self.stage.buffer.numel() // dtype.itemsize
        padded = [-(-n // block) * block for n in sizes]
        pieces, i, offset = [], 0, 0
        while i < len(sizes):
            j, before = i + 1, padded[i]  # before: the padded parts ahead of part j
            while j < len(sizes) and before + sizes[j] <= capacity:
                before += padded[j]
                j += 1
            layout = BlockLayout(tuple(sizes[i:j]), block) if j - i > 1 else None
            pieces.append((offset, sum(sizes[i:j]), None if layout is None or layout.identity else layout))
            offset += sum(sizes[i:j])
            i = j
        self._plans[key] = pieces
        return pieces

    def _block_pieces(self, count: int, dtype: Any) -> list[tuple[int, int, BlockLayout | None]]:
        """In-place calls over a tensor of ``count`` elements whose blocks run from its start: one, or pieces of
        whole blocks of at most ``call_bytes`` (a block's outputs depend on that block alone, so the pieces give one
        call's bits); made once per shape."""
        key = ((count,), dtype)
        pieces = self._plans.get(key)
        if pieces is None:
            block = self.policy.grad_block
            piece = max(self.call_bytes // dtype.itemsize // block, 1) * block
            pieces = [(offset, min(piece, count - offset), None) for offset in range(0, count, piece)] or [(0, 0, None)]
            self._plans[key] = pieces
        return pieces

    def _zero_block(self, dtype: Any) -> Any:
        zeros = self._zeros.get(dtype)
        if zeros is None:  # a type not seen at set-up: made once
            zeros = self._zeros[dtype] = self._torch.zeros(self.policy.grad_block, dtype=dtype, device=self.device)
        return zeros

    def _wire_bytes(self, count: int) -> int:
        shard = self._shards.get(count)
        if shard is None:
            shard = self._shards[count] = self._live().all_reduce_shard_count(count)
        return all_reduce_wire_bytes(self.nranks, shard, self.policy.grad_bits, self.policy.grad_block)
