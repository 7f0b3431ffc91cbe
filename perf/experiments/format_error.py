#!/usr/bin/env python3
"""Each quantized format's error on the 57M model's own weights and gradients, through zpccl's own collectives:
a deterministic measure of what loss runs over a few seeds cannot resolve.

    python3 perf/experiments/format_error.py -J perf/results/format-error.json   # about 80 minutes on one core
    python3 perf/experiments/format_error.py --tensors allreduce -J ...        # DDP's gradient all-reduce only

tools/render_results.py renders its tables (perf/RESULTS.md, perf/notebook/accuracy.md) from the JSON.

1. A real training run, one process on the CPU: the step benchmarks' ``--shape`` (default small: the byte-level
   GPT of ``tools/python/examples/fsdp2_train.py``, 8 layers, d 768, 12 heads, 57.3M parameters, 8 sequences of
   256 bytes), its data (Python's standard library sources, ``fsdp2_train.corpus``) and optimizer
   (``make_optimizer``: AdamW at 6e-4 ramped over a tenth of ``--schedule-steps``, then a cosine to a tenth;
   clipping at norm 1). Compute in bf16 as FSDP2 with ``MixedPrecisionPolicy(bf16, bf16)`` does it: each step
   casts the fp32 master weights to bf16 and differentiates with respect to those, so each gradient is the bf16
   gradient FSDP2 would hand its reduce-scatter. The update uses rank 0's batch only (one process, 8 sequences).
2. Captures at ``--capture`` steps (default 0, 50, 200), each a window of ``--window`` consecutive steps: the bf16
   weights the step's forward uses (and their fp32 masters), and real per-rank gradients: rank r's gradient is the
   one of ``fsdp2_train.Batches(rank=r)``'s batch of that step at those weights (ranks differ in data only).
3. Each format through zpccl's host backend, ranks as threads (``zpccl.run_host_ranks``; the host backend is
   bit-equal to the CUDA kernels), on every ``--layouts`` layout (``NxR``: N nodes of R ranks; ``2x2`` takes qgZ's
   two hops, ``4x1`` and ``2x1`` one), for each kind of ``--tensors``:

   * weights, qwZ (``quant_all_gather``): each rank's shard (FSDP2's dim-0 chunk of every parameter) gathered, the
     gathered tensor compared with the bf16 weights (what FSDP's exact all-gather returns);
   * gradients, qgZ (``quant_reduce_scatter``, ``avg``): every rank's gradients reduce-scattered, the output
     compared with the float64 mean of the ranks' bf16 gradients, over the window's calls in order (a residual
     or a stochastic draw carries from one call to the next, as in training; residuals start at zero);
   * allreduce, DDP's gradient all-reduce (``quant_all_reduce``, ``avg``: zpQuantAllReduce, what the
     ``zpccl.ddp`` comm hook calls): every rank's whole gradient, not a shard, reduced to the same output on every
     rank (checked bit for bit), compared with the same float64 mean, the window's calls in order as for qgZ. Its
     reduce-scatter takes qgZ's hops on the layout (two on ``2x2``) and its gather the same hops back. ``-sr`` is
     the hook's ``grad_rounding="stochastic"``; ``-ef`` is the collective's residual, which ``zpccl.ddp`` does not
     serve (DDP rebuilds its buckets), measured as what it would give.

   Blocks restart at parameter boundaries as ``zpccl.fsdp`` makes them (``param_blocks``, its ``BlockLayout``):
   one collective a call over the whole model, staged so that each parameter's part of each rank's shard starts
   on a block boundary (FSDP2's padded dim-0 chunks, zeros between parts). Grouping parameters into FSDP's units
   changes no block, so the whole model is one unit here. The all-reduce's input is one bucket of every
   parameter's gradient in parameter order, each part starting on a block boundary as ``zpccl.ddp`` stages a
   bucket (``param_blocks``, its default: the same ``BlockLayout`` over the parameters' sizes), one call over the
   whole bucket. Each output element depends only on its block's values on every rank, so DDP's cut of the
   gradients into buckets of its own order changes no bit of rounding to nearest (stochastic draws follow the
   shards, so theirs would differ).

Figures per (kind, the rows' ``tensor``; format; layout; capture step; tensor class): per call, the relative
error ``||q - x|| / ||x||``, the cosine similarity ``<q, x> / (||q|| ||x||)`` and, per quantization block, the
largest error over the block's largest exact value (max and mean over blocks); over the window, the same two for
the sum of the window's outputs against the sum of the exact means (what a residual or an unbiased rounding is
meant to improve). ``zeroed``, per call: the share of the exact's non-zero elements that the output holds as zero
(rounded away in a block whose largest value sets a step above them). For the gradient kinds, from the second
capture on (no moments before the first step), ``adam_rel_err``: the relative error with every element of error and
exact multiplied by what AdamW multiplies it by in its update at the window's first step (1 / (sqrt of the exact
run's bias-corrected second moment + eps); ``window_adam_rel_err`` for the window sum): Adam divides each element by
its own scale, so an error small against the tensor's norm can be large against a small element's. Classes:
attention and MLP weights, embedding (token and position), head, LayerNorm (weights and biases), Linear biases, and
all of them. Rows of format ``bf16`` are no format but the floor: gradients' (and the all-reduce's) exact mean
rounded once to bf16 (the best a bf16 collective returns), and the bf16 weights against their fp32 masters.

JSON (``-J``, rewritten after each capture): provenance (``provenance("cpu-threads")``), the setup, the training
loss of every step, and one row per figure set. ``--tensors`` picks the kinds measured (all three by default);
``--measure-layers`` restricts the measure to some blocks (and the root's parameters) when the whole model is too
slow; the JSON says which.
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import pathlib
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

PERF = pathlib.Path(__file__).resolve().parents[1]
TOP = PERF.parent
for _p in (str(PERF), str(TOP / "tools" / "python"), str(TOP / "tools" / "python" / "examples")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import fsdp2_train as ex  # noqa: E402  (the example's model, data and optimizer)
from step_protocol import SHAPES  # noqa: E402  (the step benchmarks' model shapes)

CLASSES = ("attention", "mlp", "embedding", "head", "norm", "bias")
ALL = "all"
TENSORS = ("weights", "gradients", "allreduce")
DEFAULT_GRAD_FORMATS = {
    "2x2": "int8-b256,int8-b64,int8-b32,int4-b256,int4-b64,int4-b32,int4-b256-sr,int4-b256-ef,int4-b256-sr-ef,"
           "int4-b64-sr,int4-b64-ef,int4-b32-sr,int4-b32-ef,int8-b256-sr,int8-b256-ef",
    "4x1": "int8-b256,int8-b64,int8-b32,int4-b256,int4-b64,int4-b32,int4-b256-sr,int4-b256-ef",
    "2x1": "int8-b256,int8-b64,int8-b32,int4-b256,int4-b64,int4-b32",
}
DEFAULT_WEIGHT_FORMATS = "int8-b256,int4-b256,int8-b64,int4-b64"
#: On every layout: zpccl.ddp's widths in its default blocks, to nearest, with its stochastic rounding and with
#: the collective's error feedback.
DEFAULT_ALLREDUCE_FORMATS = "int8-b256,int4-b256,int8-b256-sr,int4-b256-sr,int8-b256-ef,int4-b256-ef"


def _say(text: str) -> None:
    print(text, flush=True)


def tensor_class(name: str) -> str:
    """The class of a parameter of fsdp2_train's GPT, by its name."""
    leaf = name.rsplit(".", 2)
    module, kind = (leaf[-2] if len(leaf) > 1 else ""), leaf[-1]
    if name.startswith("tok.") or name == "pos":
        return "embedding"
    if module.startswith("ln"):
        return "norm"
    if kind == "bias":
        return "bias"
    if module == "head":
        return "head"
    if module in ("qkv", "proj"):
        return "attention"
    if module in ("fc1", "fc2"):
        return "mlp"
    raise ValueError(f"format_error: parameter {name!r} has no class")


# ---- formats and layouts -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Format:
    """A quantized format: ``int<bits>-b<block>[-sr][-ef]``."""

    bits: int
    block: int
    stochastic: bool = False
    feedback: bool = False

    @staticmethod
    def parse(text: str) -> "Format":
        words = text.strip().split("-")
        try:
            if not (words[0].startswith("int") and words[1].startswith("b")):
                raise ValueError
            bits, block = int(words[0][3:]), int(words[1][1:])
        except (ValueError, IndexError):
            raise ValueError(f"format {text!r}: not int<bits>-b<block>[-sr][-ef]") from None
        extra = words[2:]
        if bits not in (4, 8) or block < 32 or block & (block - 1) or any(w not in ("sr", "ef") for w in extra) \
                or len(set(extra)) != len(extra):
            raise ValueError(f"format {text!r}: bits 4 or 8, a power-of-two block >= 32, then -sr and/or -ef")
        return Format(bits, block, "sr" in extra, "ef" in extra)

    @property
    def name(self) -> str:
        return f"int{self.bits}-b{self.block}" + ("-sr" if self.stochastic else "") + ("-ef" if self.feedback else "")


@dataclass(frozen=True)
class Layout:
    """``nodes`` nodes of ``per_node`` ranks (zpccl's ``ranks_per_node``)."""

    nodes: int
    per_node: int

    @staticmethod
    def parse(text: str) -> "Layout":
        try:
            nodes, per_node = (int(x) for x in text.lower().split("x"))
        except ValueError:
            raise ValueError(f"layout {text!r}: NODESxRANKS_PER_NODE, e.g. 2x2") from None
        if nodes < 1 or per_node < 1 or nodes * per_node < 2:
            raise ValueError(f"layout {text!r}: at least two ranks")
        return Layout(nodes, per_node)

    @property
    def name(self) -> str:
        return f"{self.nodes}x{self.per_node}"

    @property
    def ranks(self) -> int:
        return self.nodes * self.per_node

    @property
    def hops(self) -> int:
        """qgZ's hops (DESIGN.md), the all-reduce's too (include/zpccl.h): two with several nodes of several
        ranks each."""
        return 2 if self.nodes > 1 and self.per_node > 1 else 1


# ---- staging: FSDP2's shards, blocks restarting at parameters --------------------------------------------------


class Staging:
    """Where each parameter's dim-0 chunk of each rank goes in a rank's staged shard of ``count`` elements.

    FSDP2 cuts a parameter into ``n`` chunks of ceil(dim0 / n) rows (the last ones shorter or empty, zero-padded
    to that size); zpccl.fsdp's ``BlockLayout`` then starts each parameter's part on a block boundary.
    """

    def __init__(self, shapes: list[tuple[int, ...]], n: int, block: int) -> None:
        from zpccl.fsdp import BlockLayout

        self.n, self.block = n, block
        self.numels = [math.prod(s) for s in shapes]
        self.chunk = []  # padded elements per rank of each parameter
        for shape, numel in zip(shapes, self.numels):
            rows = shape[0] if shape else 1
            self.chunk.append(-(-rows // n) * (numel // rows if rows else 0))
        self.layout = BlockLayout(tuple(self.chunk), block)
        self.count = self.layout.staged_count
        self.offsets = self.layout.staged_offsets

    def stage(self, torch: Any, tensors: Iterable[Any], dtype: Any) -> Any:
        """(n, count): row d holds every parameter's chunk d at its staged offset, zeros elsewhere."""
        out = torch.zeros(self.n, self.count, dtype=dtype)
        for t, numel, size, off in zip(tensors, self.numels, self.chunk, self.offsets):
            flat = t.reshape(-1).to(dtype)
            if numel == self.n * size:
                out[:, off:off + size] = flat.view(self.n, size)
                continue
            for d in range(self.n):
                piece = flat[d * size:(d + 1) * size]
                out[d, off:off + piece.numel()] = piece
        return out


# ---- the figures -----------------------------------------------------------------------------------------------


@dataclass
class Sums:
    """Sums from which a class's figures follow: squares of error, exact and output, their product, and the
    blocks' error ratios."""

    err2: float = 0.0
    x2: float = 0.0
    q2: float = 0.0
    qx: float = 0.0
    elements: int = 0
    block_max: float = 0.0
    block_sum: float = 0.0
    blocks: int = 0
    err2_adam: float = 0.0  #: squares of error and exact, each element scaled as Adam scales its update
    x2_adam: float = 0.0
    nonzero: float = 0.0  #: exact elements that are not zero, and those of them the output holds as zero
    zeroed: float = 0.0

    def add(self, other: "Sums") -> None:
        for k in ("err2", "x2", "q2", "qx", "elements", "block_sum", "blocks", "err2_adam", "x2_adam", "nonzero",
                  "zeroed"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        self.block_max = max(self.block_max, other.block_max)

    def figures(self) -> dict[str, float]:
        out = dict(rel_err=math.sqrt(self.err2 / self.x2) if self.x2 else float("nan"),
                   cosine=self.qx / math.sqrt(self.x2 * self.q2) if self.x2 and self.q2 else float("nan"),
                   block_err_max=self.block_max, block_err_mean=self.block_sum / self.blocks if self.blocks else 0.0,
                   zeroed=self.zeroed / self.nonzero if self.nonzero else 0.0)
        if self.x2_adam:
            out["adam_rel_err"] = math.sqrt(self.err2_adam / self.x2_adam)
        return out


class Classes:
    """Parameters' classes and their staged ranges, to reduce a staged (n, count) comparison to per-class sums."""

    def __init__(self, names: list[str], staging: Staging, measured: list[bool]) -> None:
        self.staging = staging
        self.of_part = [tensor_class(n) if m else None for n, m in zip(names, measured)]

    def sums(self, torch: Any, q: Any, x: Any, adam: Any = None) -> dict[str, Sums]:
        """Per class (and ``all``): sums of q (output) against x (exact), both (n, count) staged; with ``adam``
        (the same shape: each element's factor in Adam's update, Capture.adam_scale staged), the error and the
        exact scaled by it."""
        st = self.staging
        q = q.double()
        err = q - x

        def running(v: Any) -> Any:  # per staged column, summed over ranks, then running sums (with a leading 0)
            return torch.cat([torch.zeros(1, dtype=torch.float64), v.sum(0).cumsum(0)])

        nonzero = x != 0
        cols = {"err2": running(err * err), "x2": running(x * x), "q2": running(q * q), "qx": running(q * x),
                "nonzero": running(nonzero.double()), "zeroed": running((nonzero & (q == 0)).double())}
        if adam is not None:
            cols.update(err2_adam=running((err * adam) ** 2), x2_adam=running((x * adam) ** 2))
        # Blocks: staged parts start on block boundaries, so block j of a row belongs to the part holding j*block.
        g = st.block
        nb = -(-st.count // g)
        pad = nb * g - st.count
        emax = torch.nn.functional.pad(err.abs(), (0, pad)).view(st.n, nb, g).amax(-1)
        xmax = torch.nn.functional.pad(x.abs(), (0, pad)).view(st.n, nb, g).amax(-1)
        starts = torch.arange(nb, dtype=torch.int64) * g
        part_of_block = torch.searchsorted(torch.tensor(st.offsets, dtype=torch.int64), starts, right=True) - 1
        out = {c: Sums() for c in CLASSES + (ALL,)}
        for p, cls in enumerate(self.of_part):
            if cls is None:
                continue
            lo, hi = st.offsets[p], st.offsets[p] + st.chunk[p]
            s = Sums(**{k: float(c[hi] - c[lo]) for k, c in cols.items()}, elements=st.numels[p])
            sel = part_of_block == p
            e, m = emax[:, sel], xmax[:, sel]
            live = m > 0  # all-zero exact blocks (padding, dead rows) hold no ratio
            if bool(live.any()):
                ratio = e[live] / m[live]
                s.block_max, s.block_sum, s.blocks = float(ratio.max()), float(ratio.sum()), int(live.sum())
            out[cls].add(s)
            out[ALL].add(s)
        return {c: s for c, s in out.items() if s.elements}


# ---- training and captures --------------------------------------------------------------------------------------


@dataclass
class Capture:
    """A window's weights (bf16 and fp32 masters, at its first step) and per-step, per-rank bf16 gradients."""

    step: int
    names: list[str]
    weights_bf16: list[Any]
    weights_fp32: list[Any]
    grads: list[list[list[Any]]] = field(default_factory=list)  #: [call][rank][parameter]
    #: per parameter, what AdamW multiplies a gradient element by in its update at the window's first step,
    #: 1 / (sqrt(v / (1 - beta2^t)) + eps) from the exact run's second moments before that step (None before any
    #: step: no moments yet)
    adam_scale: list[Any] | None = None


def adam_scale(torch: Any, opt: Any, params: list[Any]) -> list[Any] | None:
    """Capture.adam_scale of the parameters ``params`` of the AdamW ``opt`` (None where it has not stepped)."""
    group = opt.param_groups[0]
    beta2, eps = group["betas"][1], group["eps"]
    out = []
    for p in params:
        state = opt.state.get(p)
        if not state:
            return None
        t = float(state["step"])
        v_hat = state["exp_avg_sq"].double() / (1 - beta2 ** t)
        out.append(1.0 / (v_hat.sqrt() + eps))
    return out


def bf16_gradients(torch: Any, model: Any, names: list[str], batch: tuple[Any, Any]) -> tuple[float, list[Any]]:
    """The loss and the bf16 gradients of a bf16 copy of the model's weights on one batch (FSDP2's mixed
    precision: parameters cast to bf16, gradients with respect to the cast)."""
    params = dict(model.named_parameters())
    cast = {n: params[n].detach().to(torch.bfloat16).requires_grad_() for n in names}
    ids, targets = batch
    loss = ex.loss_of(torch, lambda x: torch.func.functional_call(model, cast, (x,)), ids, targets)
    loss.backward()
    return float(loss.detach()), [cast[n].grad for n in names]


def train_and_capture(torch: Any, a: argparse.Namespace, on_capture: Any, say: Any = _say) -> list[float]:
    """Trains the model of ``a`` for max(captures) + window steps, calling ``on_capture(Capture)`` as each window
    ends. Returns the training loss of every step (rank 0's batch)."""
    model = ex.build_gpt(torch, a.layers, a.d_model, a.heads, a.seq, a.seed)
    names = [n for n, _ in model.named_parameters()]
    opt, schedule = ex.make_optimizer(torch, model, a.lr, a.schedule_steps)
    text = ex.corpus()
    data = [ex.Batches(torch, text, a.seq, a.batch, r, "cpu", a.seed) for r in range(a.ranks)]
    losses: list[float] = []
    open_: Capture | None = None
    t0 = time.time()
    for step in range(max(a.captures) + a.window):
        if step in a.captures:
            params = dict(model.named_parameters())
            open_ = Capture(step, names, [params[n].detach().to(torch.bfloat16) for n in names],
                            [params[n].detach().clone() for n in names],
                            adam_scale=adam_scale(torch, opt, [params[n] for n in names]))
        ranks = range(a.ranks) if open_ is not None else range(1)
        per_rank = []
        for r in ranks:
            loss, grads = bf16_gradients(torch, model, names, data[r].step(step))
            if r == 0:
                losses.append(loss)
            per_rank.append(grads)
        for p, g in zip(model.parameters(), per_rank[0]):
            p.grad = g.float()
        ex.optimizer_step(torch, model, opt, schedule)
        if step % a.log_every == 0:
            say(f"step {step:4d}  loss {losses[-1]:.4f}  ({time.time() - t0:.0f} s)")
        if open_ is not None:
            open_.grads.append(per_rank)
            if len(open_.grads) == a.window:
                on_capture(open_)
                open_ = None
    return losses


# ---- the measure ------------------------------------------------------------------------------------------------


def measured_parameters(names: list[str], layers: list[int] | None) -> list[bool]:
    """Which parameters the figures cover: all, or the root's and those of the blocks in ``layers``."""
    if layers is None:
        return [True] * len(names)
    keep = {f"blocks.{i}." for i in layers}
    return [not n.startswith("blocks.") or any(n.startswith(k) for k in keep) for n in names]


def rows_of(sums_per_call: list[dict[str, Sums]], window: dict[str, Sums] | None, base: dict[str, Any]) -> list[dict]:
    rows = []
    for cls in sums_per_call[0]:
        per = [s[cls].figures() for s in sums_per_call]
        row = dict(base, **{"class": cls, "elements": sums_per_call[0][cls].elements, "calls": len(per),
                            "rel_err": sum(f["rel_err"] for f in per) / len(per),
                            "cosine": sum(f["cosine"] for f in per) / len(per),
                            "rel_err_calls": [f["rel_err"] for f in per], "cosine_calls": [f["cosine"] for f in per],
                            "block_err_max": max(f["block_err_max"] for f in per),
                            "block_err_mean": sum(f["block_err_mean"] for f in per) / len(per),
                            "zeroed": sum(f["zeroed"] for f in per) / len(per)})
        if "adam_rel_err" in per[0]:
            row["adam_rel_err"] = sum(f["adam_rel_err"] for f in per) / len(per)
        if window is not None:
            w = window[cls].figures()
            row.update(window_rel_err=w["rel_err"], window_cosine=w["cosine"])
            if "adam_rel_err" in w:
                row["window_adam_rel_err"] = w["adam_rel_err"]
        rows.append(row)
    return rows


def measure_capture(torch: Any, cap: Capture, a: argparse.Namespace, measured: list[bool],
                    say: Any = _say) -> list[dict[str, Any]]:
    """Every format's figures on one capture, for each tensor kind of ``a`` (the module's docstring)."""
    formats = {"gradients": a.grad_map, "allreduce": a.allreduce_map}
    rows: list[dict[str, Any]] = []
    for tensor in a.tensor_list:
        if tensor == "weights":
            rows += measure_weights(torch, cap, a.layout_list, a.weight_list, measured, say)
        else:
            rows += measure_reduction(torch, cap, REDUCTIONS[tensor], a.layout_list, formats[tensor], measured,
                                      a.seed, say)
    return rows


def one_output(torch: Any, outs: list[Any], what: str) -> Any:
    """The output every rank returned; refused where two ranks' bits differ (the collectives promise the same)."""
    for o in outs[1:]:
        if not torch.equal(o.view(torch.int16), outs[0].view(torch.int16)):
            raise RuntimeError(f"format_error: {what} gave ranks different outputs")
    return outs[0]


def measure_weights(torch: Any, cap: Capture, layouts: list[Layout], formats: list[Format], measured: list[bool],
                    say: Any) -> list[dict[str, Any]]:
    """qwZ over each distinct rank count, against the bf16 weights; the floor is bf16 against fp32."""
    import zpccl

    shapes = [tuple(w.shape) for w in cap.weights_bf16]
    rows: list[dict[str, Any]] = []
    counts = sorted({lay.ranks for lay in layouts})
    for n in counts:
        for fmt in ([None] if n == counts[0] else []) + formats:  # the floor does not depend on n
            g = fmt.block if fmt else 256
            st = Staging(shapes, n, g)
            cl = Classes(cap.names, st, measured)
            x = st.stage(torch, cap.weights_bf16, torch.float64)
            t0 = time.time()
            if fmt is None:
                sums = cl.sums(torch, x, st.stage(torch, cap.weights_fp32, torch.float64))
                base = dict(tensor="weights", format="bf16", reference="fp32 master weights", collective=None)
            else:
                sends = st.stage(torch, cap.weights_bf16, torch.bfloat16)

                def gather(rank: int, comm: Any) -> Any:
                    return comm.quant_all_gather(sends[rank], bits=fmt.bits, block_size=fmt.block)

                out = one_output(torch, zpccl.run_host_ranks(n, gather), f"qwZ {fmt.name}")
                sums = cl.sums(torch, out.view(n, st.count), x)
                base = dict(tensor="weights", format=fmt.name, bits=fmt.bits, block=fmt.block,
                            reference="bf16 weights", collective="quant_all_gather")
            rows += rows_of([sums], None, dict(base, step=cap.step, ranks=n))
            say(f"  weights {base['format']:10s} {n} ranks: rel {sums[ALL].figures()['rel_err']:.3e} "
                f"({time.time() - t0:.0f} s)")
    return rows


def exact_mean(torch: Any, per_rank: list[list[Any]], st: Staging, n: int) -> Any:
    """The float64 mean of ranks 0..n-1's gradients of one call, staged as ``st`` stages them."""
    mean = st.stage(torch, per_rank[0], torch.float64)
    for r in range(1, n):
        mean += st.stage(torch, per_rank[r], torch.float64)
    return mean / n


def measure_reduction(torch: Any, cap: Capture, red: "Reduction", layouts: list[Layout],
                      formats: dict[str, list[Format]], measured: list[bool], seed: int,
                      say: Any) -> list[dict[str, Any]]:
    """A gradient collective on each layout, the window's calls in order, against the float64 mean of the ranks'
    inputs; the floor (that mean rounded once to bf16) once per layout."""
    import zpccl

    shapes = [tuple(w.shape) for w in cap.weights_bf16]
    rows: list[dict[str, Any]] = []
    for lay in layouts:
        n = lay.ranks
        on_layout = formats[lay.name]
        for g in sorted({f.block for f in on_layout}, reverse=True):
            st = Staging(shapes, n if red.sharded else 1, g)
            cl = Classes(cap.names, st, measured)
            adam = None if cap.adam_scale is None else st.stage(torch, cap.adam_scale, torch.float64)
            exact = [exact_mean(torch, per_rank, st, n) for per_rank in cap.grads]
            exact_sum = sum(exact)
            todo: list[Format | None] = [f for f in on_layout if f.block == g]
            if g == max(f.block for f in on_layout):
                todo = [None] + todo  # the floor once per layout
            for fmt in todo:
                t0 = time.time()
                if fmt is None:
                    outs = [x.to(torch.bfloat16) for x in exact]
                    base = dict(tensor=red.tensor, format="bf16", reference="float64 mean", collective=None)
                else:
                    outs = red.run(torch, zpccl, cap, st, lay, fmt, seed)
                    base = dict(tensor=red.tensor, format=fmt.name, bits=fmt.bits, block=fmt.block,
                                stochastic=fmt.stochastic, error_feedback=fmt.feedback, reference="float64 mean",
                                collective=red.collective)
                per_call = [cl.sums(torch, o, x, adam) for o, x in zip(outs, exact)]
                window = cl.sums(torch, sum(o.double() for o in outs), exact_sum, adam)
                rows += rows_of(per_call, window, dict(base, step=cap.step, layout=lay.name, ranks=n,
                                                       hops=lay.hops))
                f = rows[-1]  # the class "all" comes last
                adam_err = f" adam {f['adam_rel_err']:.3e}" if "adam_rel_err" in f else ""
                say(f"  {red.tensor} {base['format']:16s} {lay.name}: rel {f['rel_err']:.3e} window "
                    f"{f['window_rel_err']:.3e}{adam_err} zeroed {f['zeroed']:.2e} cos {f['cosine']:.6f} "
                    f"({time.time() - t0:.0f} s)")
    return rows


def grad_residuals(torch: Any, comm: Any, fmt: Format, count: int, shard: int) -> tuple[Any, Any]:
    """Error feedback's residuals of a rank, zero (None, None without ``-ef``): ``count`` elements of the send and
    the intermediate hop's of a ``shard``-element output shard (None on one hop)."""
    if not fmt.feedback:
        return None, None
    hop_count = comm.grad_hop_residual_count(shard)
    return (torch.zeros(count, dtype=torch.bfloat16),
            torch.zeros(hop_count, dtype=torch.bfloat16) if hop_count else None)


def grad_options(fmt: Format) -> dict[str, Any]:
    return dict(bits=fmt.bits, block_size=fmt.block, rounding="stochastic" if fmt.stochastic else "nearest")


def window_calls(torch: Any, zpccl: Any, cap: Capture, st: Staging, lay: Layout, fmt: Format, seed: int,
                 collective: str, send_count: int, shard_count: Callable[[Any], int]) -> list[list[Any]]:
    """The window's calls of ``collective`` (a communicator method: quant_reduce_scatter, quant_all_reduce) on
    every rank, in order, each rank sending its gradients staged by ``st``, with error feedback's residuals (zero
    at the start) carried from call to call; every rank's outputs, by rank then call. ``send_count`` is a send's
    elements, ``shard_count(comm)`` the output shard the intermediate hop's residual serves."""
    n = lay.ranks

    def body(rank: int, comm: Any) -> list[Any]:
        res, hop = grad_residuals(torch, comm, fmt, send_count, shard_count(comm))
        call = getattr(comm, collective)
        return [call(st.stage(torch, grads[rank], torch.bfloat16).view(-1), None, "avg", **grad_options(fmt),
                     residual=res, hop_residual=hop) for grads in cap.grads]

    return zpccl.run_host_ranks(n, body, ranks_per_node=lay.per_node, grad_seed=seed)


def run_qgz(torch: Any, zpccl: Any, cap: Capture, st: Staging, lay: Layout, fmt: Format, seed: int) -> list[Any]:
    """The window's qgZ calls on every rank; per call, the ranks' outputs stacked (n, count) in bf16."""
    n = lay.ranks
    per_rank = window_calls(torch, zpccl, cap, st, lay, fmt, seed, "quant_reduce_scatter", n * st.count,
                            lambda comm: st.count)
    return [torch.stack([per_rank[r][k] for r in range(n)]) for k in range(len(cap.grads))]


def run_all_reduce(torch: Any, zpccl: Any, cap: Capture, st: Staging, lay: Layout, fmt: Format,
                   seed: int) -> list[Any]:
    """The window's all-reduce calls on every rank, each over the rank's whole gradient staged by ``st`` (one
    row); per call, the output every rank returned (checked bit for bit), (1, count) in bf16."""
    per_rank = window_calls(torch, zpccl, cap, st, lay, fmt, seed, "quant_all_reduce", st.count,
                            lambda comm: comm.all_reduce_shard_count(st.count, fmt.block))
    return [one_output(torch, [per_rank[r][k] for r in range(lay.ranks)], f"the all-reduce {fmt.name}")
            .view(1, st.count) for k in range(len(cap.grads))]


@dataclass(frozen=True)
class Reduction:
    """A gradient collective measured against the float64 mean of the ranks' gradients: the rows' ``tensor`` and
    ``collective``, whether each rank's output is its shard (FSDP2's qgZ: inputs staged in FSDP2's chunks) or the
    whole (DDP's all-reduce: every rank's whole gradient, one row), and the function running the window's calls."""

    tensor: str
    collective: str
    sharded: bool
    run: Callable[[Any, Any, Capture, Staging, Layout, Format, int], list[Any]]


REDUCTIONS = {"gradients": Reduction("gradients", "quant_reduce_scatter avg", True, run_qgz),
              "allreduce": Reduction("allreduce", "quant_all_reduce avg", False, run_all_reduce)}


# ---- the run ----------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="small", help="the step benchmarks' model shape")
    p.add_argument("--layers", type=int, help="override the shape's layers (tests)")
    p.add_argument("--d-model", type=int, help="override the shape's width (tests)")
    p.add_argument("--heads", type=int, help="override the shape's heads (tests)")
    p.add_argument("--seq", type=int, help="override the shape's sequence length (tests)")
    p.add_argument("--batch", type=int, help="override the shape's sequences per rank (tests)")
    p.add_argument("--seed", type=int, default=0, help="model initialization, data order, stochastic rounding")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--schedule-steps", type=int, default=400,
                   help="the learning-rate schedule's length (the FSDP2 loss runs'); training stops after the "
                        "last capture's window")
    p.add_argument("--capture", default="0,50,200", help="steps whose window is captured")
    p.add_argument("--window", type=int, default=4, help="consecutive steps per capture")
    p.add_argument("--layouts", default="2x2,4x1,2x1", help="NODESxRANKS_PER_NODE, comma-separated")
    p.add_argument("--tensors", default=",".join(TENSORS),
                   help=f"the kinds measured, comma-separated, of {', '.join(TENSORS)}")
    p.add_argument("--grad-formats", default="",
                   help="int<bits>-b<block>[-sr][-ef], comma-separated, for every layout (default: per layout, "
                        "DEFAULT_GRAD_FORMATS)")
    p.add_argument("--weight-formats", default=DEFAULT_WEIGHT_FORMATS)
    p.add_argument("--allreduce-formats", default=DEFAULT_ALLREDUCE_FORMATS, help="for every layout")
    p.add_argument("--measure-layers", default="", help="blocks whose parameters are measured (default: all)")
    p.add_argument("--threads", type=int, default=1, help="torch's threads")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("-J", "--json", default="", help="write the figures here")
    a = p.parse_args(argv)
    shape = dict(zip(("layers", "d_model", "heads", "seq", "batch"), SHAPES[a.shape]))
    for k, v in shape.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    try:
        a.captures = sorted({int(s) for s in a.capture.split(",") if s.strip()})
        a.layout_list = [Layout.parse(t) for t in a.layouts.split(",") if t.strip()]
        a.weight_list = [Format.parse(t) for t in a.weight_formats.split(",") if t.strip()]
        a.grad_map = {lay.name: [Format.parse(t) for t in (a.grad_formats or DEFAULT_GRAD_FORMATS.get(
            lay.name, DEFAULT_GRAD_FORMATS["2x2"])).split(",") if t.strip()] for lay in a.layout_list}
        a.allreduce_map = {lay.name: [Format.parse(t) for t in a.allreduce_formats.split(",") if t.strip()]
                           for lay in a.layout_list}
        a.layer_list = [int(s) for s in a.measure_layers.split(",") if s.strip()] or None
    except ValueError as e:
        p.error(str(e))
    kinds = {t.strip() for t in a.tensors.split(",") if t.strip()}
    if not kinds or not kinds <= set(TENSORS):
        p.error(f"--tensors {a.tensors!r}: some of {', '.join(TENSORS)}")
    a.tensor_list = [t for t in TENSORS if t in kinds]
    if not a.captures or min(a.captures) < 0 or a.window < 1 or not a.layout_list:
        p.error("--capture needs steps >= 0, --window >= 1, --layouts at least one")
    if a.layer_list and not all(0 <= i < a.layers for i in a.layer_list):
        p.error(f"--measure-layers: blocks are 0..{a.layers - 1}")
    a.ranks = max(lay.ranks for lay in a.layout_list)
    return a


def setup_of(a: argparse.Namespace, parameters: int) -> dict[str, Any]:
    return dict(
        model=dict(shape=a.shape, layers=a.layers, d_model=a.d_model, heads=a.heads, seq=a.seq, batch=a.batch,
                   parameters=parameters),
        seed=a.seed, lr=a.lr, schedule_steps=a.schedule_steps, captures=a.captures, window=a.window,
        layouts=[lay.name for lay in a.layout_list], tensors=a.tensor_list,
        grad_formats={k: [f.name for f in v] for k, v in a.grad_map.items()},
        weight_formats=[f.name for f in a.weight_list],
        allreduce_formats={k: [f.name for f in v] for k, v in a.allreduce_map.items()},
        measured_layers="all" if a.layer_list is None else a.layer_list,
        data="fsdp2_train.corpus (Python's standard library sources), fsdp2_train.Batches per rank",
        training="one process, bf16 compute on fp32 masters, rank 0's batch per update, make_optimizer "
                 "(AdamW, warmup, cosine), clipping at 1",
        gradients="real per-rank gradients: rank r's batch of the step, at the step's weights",
        blocks="restart at parameter boundaries and at each rank's shard (zpccl.fsdp's BlockLayout over FSDP2's "
               "padded dim-0 chunks); one collective per call over the whole model",
        allreduce_bucket="every rank's whole gradient, one bucket of every parameter in parameter order, each "
                         "starting on a block boundary (zpccl.ddp's param_blocks staging: BlockLayout over the "
                         "parameters' sizes); one all-reduce per call over the whole bucket",
        references="weights: the bf16 weights (bf16 row: against the fp32 masters); gradients and allreduce: the "
                   "float64 mean of the ranks' bf16 gradients",
        op="avg")


def run(a: argparse.Namespace, say: Any = _say) -> dict[str, Any]:
    import torch

    from provenance import provenance

    importlib.import_module("zpccl")  # before provenance(), which records the library of an imported zpccl

    torch.set_num_threads(a.threads)
    doc: dict[str, Any] = dict(provenance=provenance("cpu-threads"), rows=[], losses=[])
    probe = ex.build_gpt(torch, a.layers, a.d_model, a.heads, a.seq, a.seed)
    names = [n for n, _ in probe.named_parameters()]
    doc["setup"] = setup_of(a, sum(p.numel() for p in probe.parameters()))
    del probe
    measured = measured_parameters(names, a.layer_list)
    t0 = time.time()

    def on_capture(cap: Capture) -> None:
        say(f"capture at step {cap.step}: measuring")
        doc["rows"] += measure_capture(torch, cap, a, measured, say)
        doc["seconds"] = time.time() - t0
        write(a, doc)

    doc["losses"] = train_and_capture(torch, a, on_capture, say)
    doc["seconds"] = time.time() - t0
    write(a, doc)
    return doc


def write(a: argparse.Namespace, doc: dict[str, Any]) -> None:
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(doc, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    run(a)
    if a.json:
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
