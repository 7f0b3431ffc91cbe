"""What the hooks run: one of FSDP's all-gathers or reduce-scatters of a served parameter group, on zpccl's
communicators where they serve it (qwZ, hpZ, qgZ; staged where blocks restart at parameters), else on FSDP's own
collective, which the log says once per kind. :class:`Collectives` also holds what the calls use, made before
the first (staging buffers, zero blocks, error feedback's residuals), so that nothing allocates in the training
loop."""
from __future__ import annotations

import logging
from typing import Any, Callable

from .._policy import ZeroPlusPlusPolicy
from .._arrays import QUANT_TYPE_NAMES, QUANT_TYPES_IN_WORDS, dtype_name
from .._report import exact_wire_bytes, quantized_wire_bytes
from .._staging import BlockLayout, Staging
from ..comm import Comm
from ._report import Report, log
from ._torch_fsdp import TorchFsdp, post_forward_group


class Collectives:
    """zpccl's side of one session's FSDP collectives: :meth:`all_gather` and :meth:`reduce_scatter` are what
    the hooks call; :meth:`reserve` and :meth:`allocate_residuals` make what they use, once, before the first."""

    def __init__(self, fsdp: TorchFsdp, policy: ZeroPlusPlusPolicy, device: Any, report: Report,
                 ranks: Callable[[Any], tuple[int, ...]]) -> None:
        self.fsdp, self.policy, self.device, self.report, self.ranks = fsdp, policy, device, report, ranks
        self.gather_stage: Staging | None = None
        self.reduce_stage: Staging | None = None
        #: Bytes of the two staging buffers (torch's caching allocator).
        self.reserved_bytes = 0
        #: id(param group) -> (residual, hop residual or None): error feedback's bf16 buffers.
        self.residuals: dict[int, tuple[Any, Any]] = {}
        #: Bytes the error-feedback residuals hold (sender's, and the intermediate hop's).
        self.residual_bytes = 0
        self.hop_residual_bytes = 0
        self._layouts: dict[tuple[Any, ...], BlockLayout] = {}
        self._zeros: dict[tuple[Any, int], Any] = {}
        #: Called once, at the first collective of either kind (the session's check of the model then).
        self.first_call: Callable[[], None] | None = None

    # ---- what the hooks call ----

    def all_gather(self, served: Any, output: Any, input: Any, group: Any, async_op: bool, fallback: Any) -> Any:
        """One of FSDP's all-gathers of ``served``'s parameter group: qwZ over its shard group, hpZ over its
        post-forward group, FSDP's own otherwise."""
        def nccl() -> Any:
            return fallback(output_tensor=output, input_tensor=input, group=group, async_op=async_op)

        self._first()
        ranks = self.ranks(group)
        if served.group is not None and ranks == served.group.ranks:
            dtype = dtype_name(output.dtype)
            if dtype not in QUANT_TYPE_NAMES:
                kind = "uint8" if dtype == "uint8" else "dtype"
                why = ("a module whose parameters mix dtypes is gathered as uint8 bytes" if kind == "uint8"
                       else f"{dtype} parameters are not quantized (qwZ takes {QUANT_TYPES_IN_WORDS})")
                return self._fallback("all_gather_" + kind, why, nccl)
            return self.qwz(served, served.group.gather, output, input)
        if served.hpz is not None and ranks == served.hpz.ranks:
            return self.hpz(served.hpz, output, input)
        pf = post_forward_group(served.param_group)
        if pf is None or self.ranks(pf) != ranks:
            return self._fallback("all_gather_group", f"an all-gather over group {list(ranks)}, which zpccl has no "
                                  "communicator for", nccl)
        if not self.policy.hpz:
            return self._fallback("all_gather_hpz_off", f"an all-gather over FSDP's post-forward group "
                                  f"{list(ranks)} (the backward's, or a forward's after one without backward; "
                                  "hpz=False)", nccl)
        return self._fallback("all_gather_post_forward", f"an all-gather over FSDP's post-forward group "
                              f"{list(ranks)}, which {served.module_label} did not have when enable ran (call enable "
                              "after setting reshard_after_forward)", nccl)

    def reduce_scatter(self, served: Any, output: Any, input: Any, group: Any, op: Any, async_op: bool,
                       fallback: Any) -> Any:
        """One of FSDP's reduce-scatters of ``served``'s parameter group: qgZ over its shard group (Sum, Avg, and
        PreMulSum as a sum then FSDP's force-sum division), FSDP's own otherwise."""
        def nccl() -> Any:
            return fallback(output_tensor=output, input_tensor=input, group=group, op=op, async_op=async_op)

        self._first()
        ranks = self.ranks(group)
        g = served.group
        if g is None or g.reduce is None or ranks != g.ranks:
            return self._fallback("reduce_scatter_group", f"a reduce-scatter over group {list(ranks)}, which zpccl "
                                  "has no communicator for", nccl)
        dtype = dtype_name(output.dtype)
        if dtype not in QUANT_TYPE_NAMES:
            return self._fallback("reduce_scatter_dtype", f"{dtype} gradients are not quantized (qgZ takes "
                                  f"{QUANT_TYPES_IN_WORDS})", nccl)
        name = op_name(self.fsdp.dist, op)
        if name is None:
            return self._fallback("reduce_scatter_op", f"a reduce-scatter with {op}, which qgZ does not do", nccl)
        factor = served.param_group.gradient_divide_factor if name == "premul_sum" else None
        if name == "premul_sum":
            if not isinstance(factor, (int, float)):
                return self._fallback("reduce_scatter_premul", f"a PreMulSum reduce-scatter whose parameter group "
                                      f"holds no divide factor ({factor!r})", nccl)
            name = "sum"  # then divided as FSDP's force-sum path does
        return self.qgz(served, g.reduce, output, input, name, factor)

    # ---- zpccl's paths ----

    def qwz(self, served: Any, comm: Comm, output: Any, input: Any) -> None:
        """qwZ: the shard group's all-gather of block-quantized weights, staged where the layout needs it."""
        torch = self.fsdp.torch
        n, r, count = comm.nranks, comm.rank, input.numel()
        layout = self.layout(self.gather_sizes(served, count), count, reduce=False)
        if layout.identity:
            comm.quant_all_gather(input, output)
        else:
            sp = layout.staged_count
            with self.gather_stage.rows(n, r, sp, output.dtype) as (staged, own):
                layout.stage(torch, input, own, self.zeros(1, output.dtype, reduce=False)[0])
                comm.quant_all_gather(own, staged)
                layout.unstage(torch, staged.view(n, sp), output.view(n, count))
        wire = quantized_wire_bytes(n, layout.staged_count, self.policy.weight_bits, self.policy.block_size)
        self.report.count("qwz", output.numel() * output.element_size(), wire)

    def hpz(self, hpz: Any, output: Any, input: Any) -> None:
        """hpZ: the exact backward all-gather inside one node's post-forward group."""
        hpz.comm.hier_all_gather(input, output)
        wire = exact_wire_bytes(hpz.k, input.numel() * input.element_size())
        self.report.count("hpz", output.numel() * output.element_size(), wire)

    def qgz(self, served: Any, comm: Comm, output: Any, input: Any, op: str, factor: float | None) -> None:
        """qgZ: the shard group's reduce-scatter of block-quantized gradients (op "sum" or "avg"), staged where
        the layout needs it, then divided by ``factor`` (PreMulSum's; None: not)."""
        torch = self.fsdp.torch
        n, count = comm.nranks, output.numel()
        layout = self.layout(self.reduce_sizes(served, count), count, reduce=True)
        grad = self._grad_kwargs(served, count, n * layout.staged_count)
        if layout.identity:
            comm.quant_reduce_scatter(input, output, op=op, **grad)
        else:
            # In place in the staging buffer (the result over this rank's own slice, NCCL's rule): it holds the
            # staged input only, no second buffer for the output.
            sp = layout.staged_count
            with self.reduce_stage.rows(n, comm.rank, sp, output.dtype) as (staged, own):
                layout.stage(torch, input.view(n, count), staged.view(n, sp), self.zeros(n, output.dtype, reduce=True))
                comm.quant_reduce_scatter(staged, own, op=op, **grad)
                layout.unstage(torch, own, output)
        divide(output, factor)
        wire = quantized_wire_bytes(n, layout.staged_count, self.policy.grad_bits, self.policy.grad_block)
        self.report.count("qgz", input.numel() * output.element_size(), wire)
        if grad:
            self.report.count("grad_residuals", 0, 0)

    def _first(self) -> None:
        if self.first_call is not None:
            call, self.first_call = self.first_call, None
            call()

    def _fallback(self, kind: str, message: str, call: Callable[[], Any]) -> Any:
        return self.report.fallback(kind, message, call)

    def _grad_kwargs(self, served: Any, count: int, elements: int) -> dict[str, Any]:
        """The residuals of this parameter group's reduce-scatter of ``elements`` (staged) elements, ``count`` a
        rank, or {} (no error feedback, or a reduce-scatter of part of the group, which the log names once)."""
        if not self.policy.error_feedback:
            return {}
        res, hop = self.residuals.get(id(served.param_group), (None, None))
        if res is None or res.numel() != elements:
            part = self._reduced_params(served, count)
            names = [getattr(p, "_param_fqn", None) for p in part[1]] if part and part[1] else None
            which = f"only {names}" if names and None not in names else "part"
            self.report.say_once(
                "residual_size " + served.label,
                f"{served.label}: a gradient reduce-scatter holds {which} of its FSDP parameter group, whose "
                "error-feedback residual is made for the whole group: it runs without error feedback. FSDP reduces "
                "part of a group when some of its parameters get no gradient in a backward (an unused branch: "
                "set_reduce_scatter_unused_params(True) makes FSDP reduce zeros for them, the whole group) or get "
                "theirs in separate backward passes (torchtitan's chunked loss, ChunkedLossWrapper, runs lm_head's "
                "backward apart from the final norm it is sharded with: shard those modules apart, fully_shard each "
                "on its own, or give them their gradients in one backward, torchtitan: a loss that is not chunked, "
                "CrossEntropyLoss)")
            return {}
        return dict(residual=res, hop_residual=hop)

    # ---- block layouts ----

    def gather_sizes(self, served: Any, count: int) -> list[int] | None:
        """Each parameter's part of the flat shard being gathered, or None when it cannot be told."""
        if not self.policy.param_blocks:
            return None
        sizes = []
        for p in getattr(served.param_group, "fsdp_params", ()):
            data = getattr(p, "_sharded_param_data", None)
            if data is None:
                return self._unknown_sizes("all-gather")
            sizes.append(data.numel())
        return sizes if sum(sizes) == count else self._unknown_sizes("all-gather")

    def reduce_sizes(self, served: Any, count: int) -> list[int] | None:
        """Each parameter's part of one rank's slice of the reduce-scatter input, or None when it cannot be told
        (see :meth:`_reduced_params`)."""
        if not self.policy.param_blocks:
            return None
        part = self._reduced_params(served, count)
        if part is None:
            return self._unknown_sizes("reduce-scatter")
        return part[0]

    def _reduced_params(self, served: Any, count: int) -> tuple[list[int], list[Any] | None] | None:
        """The padded shard sizes of the parameters a reduce-scatter of ``count`` elements a rank holds, and the
        parameters (None where several runs of them have those sizes), or None when they cannot be told. FSDP
        reduces the parameters that got a gradient, in order; where FSDP tells them (``served.reduced``), those.
        Else, by their sizes: the group's trainable ones, all of them, or, when their gradients come in separate
        backward passes, a run of them per pass (a parameter without a gradient inside the group can pass for
        another run of the same total)."""
        params = list(getattr(served.param_group, "fsdp_params", ()))
        try:
            sizes = [p.padded_sharded_param_size.numel() for p in params]
            told = [p.padded_sharded_param_size.numel() for p in served.reduced or ()]
        except AttributeError:
            return None
        if served.reduced and sum(told) == count:  # FSDP told them (torch's watch_reduced_params)
            return told, list(served.reduced)
        trainable = [i for i, p in enumerate(params) if p.sharded_param.requires_grad]
        for subset in (trainable, list(range(len(params)))):
            if sum(sizes[i] for i in subset) == count:
                return [sizes[i] for i in subset], [params[i] for i in subset]
        runs = []
        for first in range(len(params)):
            total = 0
            for last in range(first, len(params)):
                total += sizes[last]
                if total == count:
                    runs.append(range(first, last + 1))
                if total >= count:
                    break
        if len({tuple(sizes[i] for i in run) for run in runs}) != 1:
            return None
        return [sizes[i] for i in runs[0]], [params[i] for i in runs[0]] if len(runs) == 1 else None

    def _unknown_sizes(self, what: str) -> None:
        self.report.say_once("sizes_" + what, f"the parameter boundaries of a {what} input are not what FSDP's "
                             "parameters say (an all-gather extension, or unused parameters): its blocks run across "
                             "parameters", logging.INFO)
        return None

    def layout(self, sizes: list[int] | None, count: int, reduce: bool) -> BlockLayout:
        """The block layout of parts of these sizes (None: one part of ``count``) in the reduce-scatters' blocks
        or the all-gathers'; made once per shape."""
        key = (tuple(sizes) if sizes else (count,), self.policy.block(reduce))
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._layouts[key] = BlockLayout(*key)
        return layout

    def zeros(self, rows: int, dtype: Any, reduce: bool) -> Any:
        """``rows`` zero blocks of the collective's block size, that staging pads with; made once per shape."""
        key = (dtype, rows, self.policy.block(reduce))
        z = self._zeros.get(key)
        if z is None:
            z = self._zeros[key] = self.fsdp.torch.zeros(rows, key[2], dtype=dtype, device=self.device)
        return z

    def group_layout(self, pg: Any, reduce: bool) -> BlockLayout:
        """The block layout of one rank's part of a parameter group's all-gathers or reduce-scatters: each
        parameter's padded shard, in the blocks of that collective."""
        sizes = [p.padded_sharded_param_size.numel() for p in pg.fsdp_params]
        return self.layout(sizes, sum(sizes), reduce)

    # ---- made before the first call ----

    def reserve(self, served: list[Any], reserve_scratch: bool) -> None:
        """What the calls use, made before the first so that nothing allocates in the training loop: the staging
        buffers (the largest parameter group's), the zero blocks that staging pads with, and (``reserve_scratch``:
        on CUDA) each communicator's scratch for the largest collective it makes, in the element types the groups
        use."""
        torch = self.fsdp.torch
        gather_bytes = max((self._staged_bytes(s.param_group, len(s.group.ranks), reduce=False) for s in served),
                           default=0)
        reduce_bytes = max((self._staged_bytes(s.param_group, len(s.group.ranks), reduce=True) for s in served),
                           default=0)
        self.gather_stage = Staging(torch, self.device, gather_bytes)
        self.reduce_stage = Staging(torch, self.device, reduce_bytes)
        self.reserved_bytes = gather_bytes + reduce_bytes
        largest: dict[Comm, int] = {}  # communicator -> the logical bytes of its largest collective
        for s in served:
            pg, n = s.param_group, len(s.group.ranks)
            # On the default stream now: made at a first call, on one of FSDP's streams, each would cost that
            # stream a segment of the caching allocator's small pool.
            if self._staged_bytes(pg, n, reduce=False):
                self.zeros(1, _collective_dtype(pg, reduce=False), reduce=False)
            if self._staged_bytes(pg, n, reduce=True):
                self.zeros(n, _collective_dtype(pg, reduce=True), reduce=True)
            # An hpZ gather's output is the whole of the group's gathered parameters, as a qwZ gather's is.
            for comm, reduce in ((s.group.gather, False), (s.hpz.comm if s.hpz else None, False),
                                 (s.group.reduce, True)):
                if comm is not None:
                    largest[comm] = max(largest.get(comm, 0), self._collective_bytes(pg, n, reduce))
        if reserve_scratch:
            for comm, nbytes in largest.items():
                comm.reserve(nbytes)
        log.debug("zpccl.fsdp: staging %d bytes for gathers and %d for reduce-scatters (torch's allocator); "
                  "communicators' scratch reserved for collectives of %s logical bytes (allocated by the library "
                  "outside torch's allocator)", gather_bytes, reduce_bytes, ", ".join(map(str, largest.values())))

    def allocate_residuals(self, served: Any) -> None:
        """Error feedback's zeroed bf16 residuals for one parameter group: its reduce-scatter input's elements (in
        the staged layout when blocks restart at parameters), and the intermediate hop's on two-hop layouts."""
        torch, pg, comm = self.fsdp.torch, served.param_group, served.group.reduce
        layout = self.group_layout(pg, reduce=True)
        per_rank = layout.staged_count if self.policy.param_blocks else layout.count
        res = torch.zeros(comm.nranks * per_rank, dtype=torch.bfloat16, device=self.device)
        hop_count = comm.grad_hop_residual_count(per_rank)
        hop = torch.zeros(hop_count, dtype=torch.bfloat16, device=self.device) if hop_count else None
        self.residuals[id(pg)] = (res, hop)
        self.residual_bytes += res.numel() * 2
        self.hop_residual_bytes += hop_count * 2

    def release(self) -> None:
        """Drops the buffers (the session is disabled)."""
        self.residuals.clear()
        self.gather_stage = self.reduce_stage = None

    def _staged_bytes(self, pg: Any, n: int, reduce: bool) -> int:
        """Bytes of staging one collective of this parameter group needs (0 when its parts need none): its
        all-gather output or reduce-scatter input in the staged layout (the reduce-scatter runs in place there)."""
        if not self.policy.param_blocks or self.policy.bits(reduce) is None:
            return 0
        try:
            layout = self.group_layout(pg, reduce)
            dtype = _collective_dtype(pg, reduce)
        except AttributeError:
            return 0
        return 0 if layout.identity else n * layout.staged_count * dtype.itemsize

    def _collective_bytes(self, pg: Any, n: int, reduce: bool) -> int:
        """Logical bytes of this parameter group's all-gather output or reduce-scatter input, staged or not."""
        layout = self.group_layout(pg, reduce)
        return n * max(layout.count, layout.staged_count) * _collective_dtype(pg, reduce).itemsize


def _collective_dtype(pg: Any, reduce: bool) -> Any:
    """The element type of a parameter group's all-gather (param_dtype, else the parameters' own) or reduce-scatter
    (reduce_dtype, else that); the widest where parameters differ (FSDP then gathers bytes, which stay on NCCL)."""
    def of(p: Any) -> Any:
        dtype = (getattr(p, "reduce_dtype", None) if reduce else None) or getattr(p, "param_dtype", None)
        return dtype or p.sharded_param.dtype

    return max((of(p) for p in pg.fsdp_params), key=lambda d: d.itemsize)


def op_name(dist: Any, op: Any) -> str | None:
    """"sum", "avg" or "premul_sum" for FSDP's reduce op, None for anything else."""
    for name, value in (("sum", dist.ReduceOp.SUM), ("avg", dist.ReduceOp.AVG),
                        ("premul_sum", dist.ReduceOp.PREMUL_SUM)):
        try:
            if op == value:
                return name
        except (TypeError, RuntimeError):
            continue
    return None


def divide(output: Any, factor: float | None) -> None:
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
