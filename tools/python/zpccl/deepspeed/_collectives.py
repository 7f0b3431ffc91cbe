"""What the replaced functions run: one of ZeRO-3's parameter gathers or gradient reductions, on zpccl's
communicators where they serve it (qwZ over the data-parallel group, hpZ over DeepSpeed's hpZ group, qgZ for the
reduce-scatters), else on DeepSpeed's own function, which the log says once per kind.

Blocks and padding: a gather's buffer is its parameters' partitions back to back, and a reduce-scatter's tensors
are whole gradients that DeepSpeed splits into ``ceil(numel / n)``-element chunks, one per rank. Both end in
padding nobody initialized (the last ranks' part of a parameter; a rank with none of a small one). Each call copies
only the data into a staging buffer where every parameter's part starts on a block boundary
(:meth:`BlockLayout.fill`), zeros in the rest of its slot, and runs the collective there: whatever DeepSpeed leaves
in its padding (at initialization, after a step, after ``load_checkpoint``) never reaches a block, and blocks
restart at parameters. hpZ moves bits exactly and needs neither.

Memory: the staging is the call's own, sized to it and made by torch's allocator on the stream the call runs on
(on CUDA its work is ordered there, so the memory is free for that stream's next use once the call returns), and
nothing is kept between calls. A gather copies its result back into DeepSpeed's buffer and drops its staging; a
gather whose parts all start on block boundaries needs none. A reduce-scatter returns this rank's chunks as views
of its staging, as DeepSpeed's own ``reduce_scatter_coalesced`` returns views of the flat buffer it allocates for
the call: the staging takes that buffer's place (it is larger only by the zeros up to each chunk's block) and lives
as long as DeepSpeed reads the chunks. A buffer kept for the largest call would stay allocated through the
forward's and backward's peak, where DeepSpeed's own call holds nothing.
"""
from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from .._arrays import QUANT_TYPE_NAMES, QUANT_TYPES_IN_WORDS, dtype_name
from .._policy import ZeroPlusPlusPolicy
from .._report import Report, exact_wire_bytes, quantized_wire_bytes
from .._staging import BlockLayout
from ..comm import Comm
from ._deepspeed import DeepSpeed, EngineFacts


class Done:
    """What DeepSpeed waits on after a gather zpccl ran: on the host backend the gather is over; on CUDA it is
    enqueued on the stream that was current, and ``wait`` orders the stream current then after it, as a
    torch.distributed work's ``wait`` does."""

    def __init__(self, torch: Any, event: Any) -> None:
        self.torch, self.event = torch, event

    def wait(self, *args: Any, **kwargs: Any) -> bool:
        if self.event is not None:
            self.torch.cuda.current_stream().wait_event(self.event)
        return True

    def is_completed(self) -> bool:
        return self.event is None or bool(self.event.query())


class Collectives:
    """zpccl's side of one engine's ZeRO-3 collectives: :meth:`all_gather`, :meth:`reduce_scatter` and
    :meth:`quant_reduce` are what the replaced functions call, :meth:`fetching` what the wrapped
    ``all_gather_coalesced`` does around DeepSpeed's own."""

    def __init__(self, ds: DeepSpeed, policy: ZeroPlusPlusPolicy, facts: EngineFacts, report: Report) -> None:
        self.ds, self.policy, self.device, self.report = ds, policy, facts.device, report
        self.dp_group, self.hpz_group = facts.dp_group, facts.hpz_group
        self.dp_ranks = ds.group_ranks(facts.dp_group)
        # The most elements one persistent_gather call gathers: what ZeRO-3 gathers in one fetch, or one persistent
        # parameter's gather at its largest (n partitions under the threshold), whichever is more.
        self.bucket_numel = max(facts.prefetch_bucket, len(self.dp_ranks) * facts.persistence_threshold, 1)
        self.gather: Comm | None = None  # qwZ, and hpZ when it serves DeepSpeed's hpZ group
        self.reduce: Comm | None = None  # qgZ
        self.hpz_comm: Comm | None = None  # the communicator whose hpZ group is DeepSpeed's (the gathers' one)
        self._cuda = self.device.type == "cuda"
        self._layouts: dict[tuple[Any, ...], BlockLayout] = {}
        self._zeros: dict[Any, Any] = {}
        self._ranks: dict[int, tuple[int, ...]] = {}
        # .params: the parameters of the served engine's fetch in progress, not yet gathered (None: outside one);
        # .reducing: inside one of the served engine's gradient reductions.
        self._local = threading.local()

    # ---- what the replaced functions call ----

    def all_gather(self, input: Any, output: Any, group: Any, theirs: Callable[[], Any]) -> Any:
        """One of ZeRO-3's parameter gathers: hpZ over DeepSpeed's hpZ group, qwZ over the data-parallel group,
        DeepSpeed's own otherwise."""
        if self.hpz_group is not None and group is self.hpz_group:
            if self.hpz_comm is None:
                return self._fallback("all_gather_hpz", "the gathers over DeepSpeed's hpZ group, from the secondary "
                                      "partitions (hpz=False)", theirs, logging.INFO)
            if not self._in_fetch():
                return self._unserved_gather(theirs)
            self.hpz(input, output)
            return self._done()
        if self.ranks(group) != self.dp_ranks:
            return self._fallback("all_gather_group", f"an all-gather over group {list(self.ranks(group))}, which "
                                  "zpccl has no communicator for", theirs)
        if self.policy.weight_bits is None:
            return self._fallback("all_gather_off", "the parameter gathers over the data-parallel group "
                                  "(weight_bits=None)", theirs, logging.INFO)
        dtype = dtype_name(input.dtype)
        if dtype not in QUANT_TYPE_NAMES or output.dtype != input.dtype:
            return self._fallback("all_gather_dtype", f"{dtype} parameters are not quantized (qwZ takes "
                                  f"{QUANT_TYPES_IN_WORDS})", theirs)
        if not self._in_fetch():
            return self._unserved_gather(theirs)
        parts = self._gathered_parts(input)
        if parts is None:
            return self._fallback("all_gather_params", "a parameter gather of the served engine's fetch that zpccl "
                                  "cannot map to the fetch's parameters", theirs)
        self.qwz(input, output, parts)
        return self._done()

    def reduce_scatter(self, tensors: list[Any], group: Any, theirs: Callable[[], Any]) -> list[Any]:
        """ZeRO-3's gradient reduce-scatter: qgZ over the data-parallel group, DeepSpeed's own otherwise."""
        if self.reduce is None:
            return self._fallback("reduce_scatter_off", "the gradient reduce-scatters (grad_bits=None)", theirs,
                                  logging.INFO)
        if self.ranks(group) != self.dp_ranks:
            return self._fallback("reduce_scatter_group", f"a reduce-scatter over group {list(self.ranks(group))}, "
                                  "which zpccl has no communicator for", theirs)
        if not self._in_reduction():
            return self._unserved_reduction(theirs)
        return self._reduce(tensors, theirs)

    def quant_reduce(self, tensors: list[Any], theirs: Callable[[], Any]) -> list[Any]:
        """The reduction DeepSpeed's own qgZ would run (``zero_quantized_gradients``): the same average over the
        data-parallel group, as qgZ."""
        if self.reduce is None:
            return self._fallback("quant_reduce_off", "DeepSpeed's quantized gradient reduction (grad_bits=None)",
                                  theirs, logging.INFO)
        if not self._in_reduction():
            return self._unserved_reduction(theirs)
        return self._reduce(tensors, theirs)

    def exact_gather(self, params: list[Any], alone: bool, blocking: bool, theirs: Callable[[], Any]) -> Any:
        """DeepSpeed's own exact gather of parameters (``param.all_gather``, which calls torch.distributed itself, not
        the function zpccl replaces), which DeepSpeed's own ZeRO++ leaves exact too. ZeRO-3 runs it by itself in two
        places. After each step (and after a checkpoint load) it gathers the persistent parameters again, one
        all-gather per parameter: :meth:`persistent_gather` makes that one call per bucket, exact. And it gathers a
        parameter alone the first time it meets one used outside its module's forward, then registers it with the
        module that used it, whose fetches zpccl serves: counted, with qwZ. A user's GatheredParameters and the
        16-bit checkpoint gathers are exact by contract and stay DeepSpeed's, uncounted."""
        gathered = pending(params)
        if gathered and alone:
            if self.policy.weight_bits is None:
                return theirs()
            return self._fallback("all_gather_external", "a parameter used outside its module's forward is gathered "
                                  "by DeepSpeed itself (param.all_gather) the first time DeepSpeed meets it so, "
                                  "exact, then fetched with the module that used it", theirs, logging.INFO)
        if all_persistent(gathered):
            if blocking and self._coalescible(gathered):
                self.persistent_gather(gathered)
                return None  # what DeepSpeed's blocking gather returns
            self.report.count("deepspeed_all_gather_persistent", 0, 0)
        return theirs()

    def persistent_gather(self, params: list[Any]) -> None:
        """The persistent parameters' gather as DeepSpeed runs it, bit for bit, in one all-gather per bucket rather
        than one per parameter: their partitions packed back to back, gathered over the data-parallel group on
        DeepSpeed's own process group (so in DeepSpeed's precision and on its transport), and each parameter's
        whole tensor copied out in DeepSpeed's layout (the ranks' partitions in rank order, then its padding) into
        storage of its own, as DeepSpeed gives each. Persistent parameters are small by definition, so each of
        DeepSpeed's calls costs a network latency and barely any bandwidth: the calls are the cost. A bucket holds
        as many gathered elements as ZeRO-3 gathers in one fetch, or as one persistent parameter's gather may
        have, whichever is more (``bucket_numel``), so that the packed copy adds no more memory while it runs than
        DeepSpeed's own gathers take."""
        torch, n = self.ds.torch, len(self.dp_ranks)
        by_dtype: dict[Any, list[Any]] = {}
        for p in params:
            by_dtype.setdefault(p.ds_tensor.dtype, []).append(p)
        for dtype, same in by_dtype.items():
            for bucket in _buckets(same, lambda p: n * p.ds_tensor.ds_numel, self.bucket_numel):
                sizes = [p.ds_tensor.ds_numel for p in bucket]
                total = sum(sizes)
                mine = torch.cat([p.ds_tensor.reshape(-1).to(self.device) for p in bucket])
                gathered = torch.empty(n * total, dtype=dtype, device=self.device)
                self.ds.dist.all_gather_into_tensor(gathered, mine, group=self.dp_group)
                for p, rows in zip(bucket, gathered.view(n, total).split(sizes, dim=1)):
                    whole = rows.reshape(-1)  # a copy of its own, unless the bucket is this one parameter
                    p.data = whole.narrow(0, 0, p.ds_numel).view(p.ds_shape)
                    p.ds_status = type(p.ds_status).AVAILABLE
                self.report.count("persistent_gather", gathered.nbytes, exact_wire_bytes(n, mine.nbytes))

    def _coalescible(self, params: list[Any]) -> bool:
        """Whether DeepSpeed's gather of these parameters is a plain exact all-gather of partitions in memory over
        the data-parallel group (not NVMe-swapped, not DeepSpeed-quantized, over more than one rank), which
        :meth:`persistent_gather` does in fewer calls."""
        if len(self.dp_ranks) < 2:
            return False
        for p in params:
            part = p.ds_tensor
            if (self.ranks(p.ds_process_group) != self.dp_ranks or hasattr(part, "ds_quant_scale")
                    or getattr(getattr(part, "status", None), "name", "AVAILABLE") != "AVAILABLE"):
                return False
        return True

    @contextmanager
    def fetching(self, params: list[Any]) -> Iterator[None]:
        """Around one of the served engine's fetches: its parameters in ds_id order (the order DeepSpeed lays them
        out in), for the gathers it runs to take theirs from."""
        outer = getattr(self._local, "params", None)
        self._local.params = sorted(params, key=lambda p: p.ds_id)
        try:
            yield
        finally:
            self._local.params = outer

    @contextmanager
    def reducing(self) -> Iterator[None]:
        """Around one of the served engine's gradient reductions (its ZeRO-3 optimizer's): the reduce-scatters it
        runs are the engine's. The replaced functions are module-level, so another engine of the process (one
        zpccl was not enabled on) calls them too, outside any of these."""
        outer = getattr(self._local, "reducing", False)
        self._local.reducing = True
        try:
            yield
        finally:
            self._local.reducing = outer

    def _in_fetch(self) -> bool:
        return getattr(self._local, "params", None) is not None

    def _in_reduction(self) -> bool:
        return getattr(self._local, "reducing", False)

    def _unserved_gather(self, theirs: Callable[[], Any]) -> Any:
        return self._fallback("all_gather_unserved", "a parameter gather outside the served engine's fetches "
                              "(another engine's, which zpccl was not enabled on, or of parameters made after "
                              "enable)", theirs, logging.INFO)

    def _unserved_reduction(self, theirs: Callable[[], Any]) -> Any:
        return self._fallback("reduce_scatter_unserved", "a gradient reduction outside the served engine's "
                              "optimizer (another engine's, which zpccl was not enabled on)", theirs, logging.INFO)

    # ---- zpccl's paths ----

    def hpz(self, input: Any, output: Any) -> None:
        """hpZ: the exact gather of the secondary partitions inside DeepSpeed's hpZ group (in place or not)."""
        self.hpz_comm.hier_all_gather(input, output)
        k = self.hpz_comm.hpz_size
        self.report.count("hpz", output.numel() * output.element_size(), exact_wire_bytes(k, input.nbytes))

    def qwz(self, input: Any, output: Any, parts: list[tuple[int, int]]) -> None:
        """qwZ: the data-parallel gather of block-quantized partitions, staged unless every part is whole data
        already on its block boundary."""
        torch, comm = self.ds.torch, self.gather
        n, r, count = comm.nranks, comm.rank, input.numel()
        layout = self.layout(tuple(size for size, _ in parts), reduce=False)
        if layout.identity and all(size == data for size, data in parts):
            comm.quant_all_gather(input, output)
        else:
            sp = layout.staged_count
            row, at = [], 0
            for size, data in parts:
                row.append(input.narrow(0, at, data))
                at += size
            gap = max(layout.slot(i) - data for i, (_, data) in enumerate(parts))
            staged = self.staging(n * sp, input.dtype)
            own = staged.narrow(0, r * sp, sp)
            layout.fill(torch, [row], own, self.zeros(input.dtype, gap))
            comm.quant_all_gather(own, staged)
            layout.unstage(torch, staged.view(n, sp), output.view(n, count))
        wire = quantized_wire_bytes(n, layout.staged_count, self.policy.weight_bits, self.policy.block_size)
        self.report.count("qwz", output.numel() * output.element_size(), wire)

    def _reduce(self, tensors: list[Any], theirs: Callable[[], Any]) -> list[Any]:
        dtypes = {t.dtype for t in tensors}
        name = dtype_name(next(iter(dtypes))) if len(dtypes) == 1 else "mixed"
        if name not in QUANT_TYPE_NAMES:
            return self._fallback("reduce_scatter_dtype", f"{name} gradients are not quantized (qgZ takes "
                                  f"{QUANT_TYPES_IN_WORDS} of one type a call)", theirs)
        return self.qgz(tensors)

    def qgz(self, tensors: list[Any]) -> list[Any]:
        """qgZ: each gradient's rank-r chunk of ceil(numel / n) elements to rank r, averaged over the group, staged
        so that each chunk starts on a block boundary with zeros after its data; this rank's chunks returned as
        DeepSpeed's reduce_scatter_coalesced returns them (each as long as its data, a view of the call's staging)."""
        torch, comm = self.ds.torch, self.reduce
        n, r = comm.nranks, comm.rank
        flats = [t.reshape(-1) for t in tensors]
        chunks = tuple(-(-f.numel() // n) for f in flats)
        layout = self.layout(chunks, reduce=True)
        sp, dtype = layout.staged_count, flats[0].dtype
        rows = [[f.narrow(0, min(q * c, f.numel()), _data(f.numel(), c, q)) for f, c in zip(flats, chunks)]
                for q in range(n)]
        gap = max(layout.slot(i) - _data(f.numel(), c, n - 1) for i, (f, c) in enumerate(zip(flats, chunks)))
        mine = [_data(f.numel(), c, r) for f, c in zip(flats, chunks)]
        staged = self.staging(n * sp, dtype)
        own = staged.narrow(0, r * sp, sp)
        layout.fill(torch, rows, staged, self.zeros(dtype, gap))
        comm.quant_reduce_scatter(staged, own, op="avg")  # in place, over its own row (NCCL's rule)
        wire = quantized_wire_bytes(n, sp, self.policy.grad_bits, self.policy.grad_block)
        self.report.count("qgz", sum(f.numel() for f in flats) * flats[0].element_size(), wire)
        return [own.narrow(0, o, m) for o, m in zip(layout.staged_offsets, mine)]

    def _fallback(self, kind: str, message: str, call: Callable[[], Any], level: int = logging.WARNING) -> Any:
        return self.report.fallback(kind, message, call, level)

    def _done(self) -> Done:
        event = None
        if self._cuda:
            event = self.ds.torch.cuda.Event()
            event.record()
        return Done(self.ds.torch, event)

    # ---- parameters, layouts, zeros ----

    def ranks(self, group: Any) -> tuple[int, ...]:
        """The global ranks of a process group (None: the world), looked up once a group."""
        key = id(group)
        ranks = self._ranks.get(key)
        if ranks is None:
            ranks = self._ranks[key] = self.ds.group_ranks(group)
        return ranks

    def _gathered_parts(self, input: Any) -> list[tuple[int, int]] | None:
        """(partition size, elements of data on this rank) of each parameter whose partition ``input`` holds, in
        order: the first of the fetch's parameters not yet gathered that ZeRO-3 gathers in ``input``'s dtype over
        the data-parallel group, as many as fill it (one, when DeepSpeed gathers them one by one). None when the
        fetch's parameters do not fill it exactly."""
        pending = getattr(self._local, "params", None)
        if not pending:
            return None
        want, total, taken = input.numel(), 0, []
        for p in pending:
            if self.ds.gather_dtype(p) != input.dtype or self.ranks(p.ds_process_group) != self.dp_ranks:
                continue
            taken.append(p)
            total += p.ds_tensor.ds_numel
            if total >= want:
                break
        if total != want:
            return None
        gone = {id(p) for p in taken}
        self._local.params = [p for p in pending if id(p) not in gone]
        r = self.gather.rank
        return [(p.ds_tensor.ds_numel, _data(p.ds_numel, p.ds_tensor.ds_numel, r)) for p in taken]

    def layout(self, sizes: tuple[int, ...], reduce: bool) -> BlockLayout:
        """Parts of these sizes in the reduce-scatters' blocks or the gathers' (blocks of 1, no alignment, with
        param_blocks=False); made once per shape."""
        key = (sizes, self.policy.block(reduce) if self.policy.param_blocks else 1)
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._layouts[key] = BlockLayout(*key)
        return layout

    def staging(self, count: int, dtype: Any) -> Any:
        """One call's staging: ``count`` elements of ``dtype`` on the device, from torch's allocator on the current
        stream (the call's)."""
        return self.ds.torch.empty(count, dtype=dtype, device=self.device)

    def zeros(self, dtype: Any, need: int) -> Any:
        """At least ``need`` zeros of ``dtype``, for :meth:`BlockLayout.fill` (the largest gap of a call: a part's
        slot beyond its data); made once per dtype, longer when a call needs more."""
        z = self._zeros.get(dtype)
        if z is None or z.numel() < need:
            z = self._zeros[dtype] = self.ds.torch.zeros(max(need, 2 * (z.numel() if z is not None else 0)),
                                                         dtype=dtype, device=self.device)
        return z

    def prepare(self, dtypes: set[Any], nranks: int) -> None:
        """Zeros made before the first call, on the stream current at enable (on CUDA, a first call on one of
        DeepSpeed's side streams would give that stream its own segment of the caching allocator)."""
        need = nranks + max(self.policy.block(False), self.policy.block(True))
        for dtype in dtypes:
            if dtype not in self._zeros:
                self._zeros[dtype] = self.ds.torch.zeros(need, dtype=dtype, device=self.device)

    def release(self) -> None:
        self._zeros.clear()
        self._layouts.clear()


def pending(params: Any) -> list[Any]:
    """The parameters of a ``param.all_gather`` call that are not gathered yet (the ones it gathers)."""
    return [p for p in params if getattr(p.ds_status, "name", None) == "NOT_AVAILABLE"]


def all_persistent(params: list[Any]) -> bool:
    """Whether ``params`` (a call's :func:`pending` ones) are ZeRO-3's persistent parameters, all of them: its
    regather after a step or a checkpoint."""
    return bool(params) and all(getattr(p, "ds_persist", False) for p in params)


def _buckets(items: list[Any], size: Callable[[Any], int], most: int) -> Iterator[list[Any]]:
    """``items`` in order, in runs whose sizes add up to at most ``most`` (a larger item alone)."""
    run: list[Any] = []
    total = 0
    for item in items:
        if run and total + size(item) > most:
            yield run
            run, total = [], 0
        run.append(item)
        total += size(item)
    if run:
        yield run


def _data(numel: int, chunk: int, rank: int) -> int:
    """Elements of data in rank ``rank``'s chunk of ``chunk`` elements of a tensor of ``numel`` (the rest is
    padding)."""
    return max(0, min(numel - rank * chunk, chunk))
