"""zpccl.fsdp on the CPU: FSDP2 on torch's threaded process group (ranks as threads), served by zpccl's host
backend. Four ranks as two nodes of two with reshard_after_forward=2, so that forward gathers are qwZ, backward
gathers hpZ (groups of two inside a node) and gradient reduce-scatters two-hop qgZ. Every collective's result is
checked bit for bit against the NumPy model of the format, with blocks restarting at parameter boundaries;
training steps are compared with FSDP2's own collectives. Skipped without torch 2.9 or later."""
from __future__ import annotations

import copy
import logging
import unittest
from typing import Any

import numpy as np

import zpccl

from . import _reference as ref
from ._threaded import run_threaded, torch_with_fsdp2

WORLD = 4
NODE_OF_RANK = [0, 0, 1, 1]  # ranks_per_node=2
BLOCK = 32  # small, so that every parameter spans several blocks and most boundaries fall inside one


def build_model(torch: Any, d: int = 40, layers: int = 2, vocab: int = 64, dtype: Any = None) -> Any:
    """A small residual MLP language model; sizes chosen so that no parameter's shard is a multiple of BLOCK."""
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln = nn.LayerNorm(d)
            self.fc1, self.fc2 = nn.Linear(d, 3 * d), nn.Linear(3 * d, d)

        def forward(self, x: Any) -> Any:
            return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            self.blocks = nn.ModuleList([Block() for _ in range(layers)])
            self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

        def forward(self, ids: Any) -> Any:
            x = self.emb(ids)
            for b in self.blocks:
                x = b(x)
            return self.head(self.ln(x))

    torch.manual_seed(0)
    model = Net()
    with torch.no_grad():  # LayerNorm weights away from 1 so that their quantization shows
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.1, 0.1)
    return model.to(dtype) if dtype is not None else model


def shard(torch: Any, model: Any, mesh: Any, reshard: Any, mp: Any = None) -> Any:
    from torch.distributed.fsdp import fully_shard

    kw = dict(mesh=mesh, reshard_after_forward=reshard)
    if mp is not None:
        kw["mp_policy"] = mp
    for b in model.blocks:
        fully_shard(b, **kw)
    fully_shard(model, **kw)
    return model


def batches(torch: Any, rank: int, steps: int, vocab: int = 64) -> list[Any]:
    g = torch.Generator().manual_seed(1000 + rank)
    return [torch.randint(0, vocab, (4, 12), generator=g) for _ in range(steps)]


def next_token_loss(torch: Any, logits: Any, ids: Any) -> Any:
    """The language model's loss: each position's logits (in fp32) against the next token."""
    return torch.nn.functional.cross_entropy(logits[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten())


def train_step(torch: Any, model: Any, opt: Any, ids: Any) -> float:
    """One optimizer step on one batch; its loss."""
    loss = next_token_loss(torch, model(ids), ids)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()


def train(torch: Any, model: Any, data: list[Any], lr: float = 1e-2) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    return [train_step(torch, model, opt, ids) for ids in data]


def bits_of(t: Any) -> np.ndarray:
    """A tensor's elements as NumPy, bf16 as its uint16 bits (the reference's convention)."""
    import torch

    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def ref_dtype(t: Any) -> str:
    return {"torch.bfloat16": ref.BF16, "torch.float32": ref.F32, "torch.float16": ref.F16}[str(t.dtype)]


def staged(parts: list[np.ndarray], block: int) -> np.ndarray:
    """The parts laid out as blocks restarting at each: every part but the last padded with zeros to a block
    multiple (an independent statement of zpccl.fsdp.BlockLayout)."""
    out = []
    for i, p in enumerate(parts):
        out.append(p)
        if i < len(parts) - 1 and p.size % block:
            out.append(np.zeros(block - p.size % block, p.dtype))
    return np.concatenate(out)


def torch_avg(torch: Any) -> Any:
    return torch.distributed.ReduceOp.AVG


def split(x: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    return np.split(x, np.cumsum(sizes)[:-1])


class Recorder:
    """Wraps a ZeroPlusPlus's qwZ, hpZ and qgZ paths to keep each call's inputs and outputs (copies, on this rank)."""

    def __init__(self, torch: Any, zp: Any) -> None:
        self.calls: list[tuple] = []
        paths = zp.collectives  # what the hooks call
        qwz, hpz, rs = paths.qwz, paths.hpz, paths.reduce_scatter

        def on_qwz(hook: Any, comm: Any, output: Any, input: Any) -> None:
            x = input.clone()
            qwz(hook, comm, output, input)
            self.calls.append(("qwz", x, output.clone(), paths.gather_sizes(hook, x.numel())))

        def on_hpz(g: Any, output: Any, input: Any) -> None:
            x = input.clone()
            hpz(g, output, input)
            exact = torch.empty_like(output)
            torch.distributed.all_gather_into_tensor(exact, x, group=self.pf_group(zp, g))
            self.calls.append(("hpz", x, output.clone(), exact))

        def on_rs(hook: Any, output: Any, input: Any, group: Any, op: Any, *rest: Any) -> Any:
            x = input.clone()
            result = rs(hook, output, input, group, op, *rest)
            self.calls.append(("qgz", x, output.clone(), paths.reduce_sizes(hook, output.numel()), op))
            return result

        paths.qwz, paths.hpz, paths.reduce_scatter = on_qwz, on_hpz, on_rs

    @staticmethod
    def pf_group(zp: Any, g: Any) -> Any:
        import torch.distributed as dist

        for m in zp.model.modules():
            for pg in zp._fsdp.param_groups(m) if isinstance(m, zp._fsdp.FSDPModule) else ():
                info = pg.post_forward_mesh_info
                if info is not None and tuple(dist.get_process_group_ranks(info.shard_process_group)) == g.ranks:
                    return info.shard_process_group
        raise AssertionError("no post-forward group")


def torch_for_threads() -> Any:
    """torch, when it runs FSDP2 with ranks as threads; else SkipTest."""
    torch = torch_with_fsdp2()
    version = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    if version < (2, 12):
        # DTensor's sharding propagation there enters a FakeTensorMode whose global state ranks run as threads
        # corrupt (a segfault in fully_shard, with or without a lock around the propagation).
        raise unittest.SkipTest(f"torch {torch.__version__} crashes with FSDP2 ranks as threads; the "
                                "spawned-process tests (test_fsdp_gpu) run zpccl.fsdp on this torch")
    return torch


def cpu_mesh(shape: tuple = (WORLD,), names: Any = None) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", shape, mesh_dim_names=names)


class StagingLayouts(unittest.TestCase):
    """BlockLayout's stage and unstage against ``staged`` above, on poisoned buffers: parts of every kind (empty,
    smaller than a block, whole blocks, the last one partial), one row and several."""

    def test_stage_and_unstage_move_every_part_and_zero_every_gap(self) -> None:
        torch = torch_with_fsdp2()
        from zpccl._staging import BlockLayout

        rng = np.random.default_rng(7)
        for sizes, block in (((5, 3, 4), 4), ((8, 4), 4), ((0, 7, 0, 9), 4), ((300, 1, 513, 256, 77), 256),
                             ((11,), 8)):
            layout = BlockLayout(sizes, block)
            for rows in (1, 3):
                with self.subTest(sizes=sizes, rows=rows):
                    src = rng.standard_normal((rows, layout.count)).astype(np.float32)
                    want = np.stack([staged(split(r, list(sizes)), block) for r in src])
                    self.assertEqual(want.shape[1], layout.staged_count)
                    dst = torch.full((rows, layout.staged_count), float("nan"))
                    layout.stage(torch, torch.from_numpy(src), dst, torch.zeros(rows, block))
                    np.testing.assert_array_equal(dst.numpy(), want)
                    back = torch.full((rows, layout.count), float("nan"))
                    layout.unstage(torch, dst, back)
                    np.testing.assert_array_equal(back.numpy(), src)


class FsdpOnThreads(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.torch = torch_for_threads()

    def mesh(self, shape: tuple = (WORLD,), names: Any = None) -> Any:
        return cpu_mesh(shape, names)

    def run_pair(self, *, mp_dtype: Any, steps: int, weight_bits: int = 8, grad_bits: int = 4,
                 grad_block: int | None = None, as_policy: bool = False) -> list[Any]:
        """Each rank trains a copy of one model twice, with FSDP's collectives and with zpccl's (told through keyword
        arguments, or ``as_policy`` through a ZeroPlusPlusPolicy)."""
        torch = self.torch
        from torch.distributed.fsdp import MixedPrecisionPolicy

        base = build_model(torch)
        mp = MixedPrecisionPolicy(param_dtype=mp_dtype, reduce_dtype=torch.float32) if mp_dtype else None

        def body(rank: int) -> Any:
            data = batches(torch, rank, steps)
            plain = train(torch, shard(torch, copy.deepcopy(base), self.mesh(), 2, mp), data)
            model = shard(torch, copy.deepcopy(base), self.mesh(), 2, mp)
            options = dict(weight_bits=weight_bits, grad_bits=grad_bits, block_size=BLOCK, ranks_per_node=2,
                           grad_block_size=grad_block)
            if as_policy:
                policy = zpccl.ZeroPlusPlusPolicy(**options)
                zp = zpccl.fsdp.enable(model, policy)
                assert zp.policy is policy
            else:
                zp = zpccl.fsdp.enable(model, **options)
                assert zp.policy == zpccl.ZeroPlusPlusPolicy(**options)
            rec = Recorder(torch, zp)
            losses = train(torch, model, data)
            summary = zp.summary()
            zp.disable()
            return plain, losses, summary, rec.calls

        return run_threaded(WORLD, body)

    def check_calls(self, results: list[Any], weight_bits: int, grad_bits: int,
                    grad_block: int = BLOCK) -> dict[str, int]:
        """Every recorded call: outputs identical on every rank and equal to the NumPy model bit for bit (qgZ's in
        blocks of grad_block, qwZ's of BLOCK)."""
        calls = [r[3] for r in results]
        self.assertTrue(all(len(c) == len(calls[0]) for c in calls), "ranks made different numbers of calls")
        seen: dict[str, int] = {}
        for i, kind in enumerate(c[0] for c in calls[0]):
            seen[kind] = seen.get(kind, 0) + 1
            per_rank = [c[i] for c in calls]
            if kind == "qwz":
                sizes = per_rank[0][3]
                self.assertIsNotNone(sizes, "qwZ did not know its parameters' boundaries")
                dt = ref_dtype(per_rank[0][1])
                expected = np.concatenate([
                    np.concatenate([ref.round_trip(p, dt, weight_bits, BLOCK) for p in split(bits_of(x), sizes)])
                    for _, x, _, _ in per_rank])
                for rank, (_, _, out, _) in enumerate(per_rank):
                    self.assertTrue(np.array_equal(bits_of(out), expected), f"qwZ call {i} rank {rank}")
            elif kind == "hpz":
                for rank, (_, _, out, exact) in enumerate(per_rank):
                    self.assertTrue(np.array_equal(bits_of(out), bits_of(exact)), f"hpZ call {i} rank {rank} inexact")
            else:
                sizes, op = per_rank[0][3], per_rank[0][4]
                self.assertIsNotNone(sizes, "qgZ did not know its parameters' boundaries")
                dt = ref_dtype(per_rank[0][1])
                sends = [np.concatenate([staged(split(row, sizes), grad_block)
                                         for row in bits_of(x).reshape(WORLD, -1)]) for _, x, _, _, _ in per_rank]
                name = "avg" if op == self.torch.distributed.ReduceOp.AVG else "sum"
                want = ref.quant_reduce_scatter(sends, dt, name, grad_bits, grad_block, NODE_OF_RANK)
                for rank, (_, _, out, _, _) in enumerate(per_rank):
                    padded = split(want[rank], [s + (-s % grad_block) for s in sizes[:-1]] + [sizes[-1]])
                    expected = np.concatenate([p[:s] for p, s in zip(padded, sizes)])
                    self.assertTrue(np.array_equal(bits_of(out), expected), f"qgZ call {i} rank {rank}")
        return seen

    def check_training(self, mp_dtype: Any, weight_bits: int, grad_bits: int, bound: float,
                       grad_block: int | None = None, as_policy: bool = False) -> list[Any]:
        results = self.run_pair(mp_dtype=mp_dtype, steps=4, weight_bits=weight_bits, grad_bits=grad_bits,
                                grad_block=grad_block, as_policy=as_policy)
        seen = self.check_calls(results, weight_bits, grad_bits, grad_block or BLOCK)
        # 3 FSDP modules and 4 steps: each gathers forward (qwZ) and backward (hpZ), and reduces once (qgZ); a
        # collective whose bits are None stays on FSDP's own and zpccl makes none of its calls.
        want = dict({"qwz": 12, "hpz": 12} if weight_bits else {}, **({"qgz": 12} if grad_bits else {}))
        self.assertEqual(seen, want)
        for rank, (plain, losses, summary, _) in enumerate(results):
            self.assertEqual({k: v["calls"] for k, v in summary.items()}, seen, f"rank {rank} counters")
            if weight_bits:
                self.assertLess(summary["qwz"]["wire_bytes"], summary["qwz"]["logical_bytes"])
            if grad_bits:
                self.assertLess(summary["qgz"]["wire_bytes"], summary["qgz"]["logical_bytes"] / 4)
            for step, (a, b) in enumerate(zip(plain, losses)):
                self.assertLess(abs(a - b) / a, bound, f"rank {rank} step {step}: loss {b} vs FSDP's {a}")
        return results

    def test_fp32_training_matches_fsdp_within_the_quantization_bounds(self) -> None:
        self.check_training(None, 8, 4, bound=0.01)

    def test_bf16_mixed_precision_training_matches_fsdp(self) -> None:
        """The policy given as a ZeroPlusPlusPolicy (every other test gives its fields as keyword arguments)."""
        self.check_training(self.torch.bfloat16, 8, 4, bound=0.01, as_policy=True)

    def test_int4_weights_int8_gradients(self) -> None:
        self.check_training(self.torch.bfloat16, 4, 8, bound=0.03)

    def test_gradients_in_blocks_of_their_own(self) -> None:
        """grad_block_size: qgZ quantizes in its blocks (bit-exact to the model in them, restarting at parameters
        as the weights' do in theirs), qwZ keeps block_size, and the wire counts the gradients' scales."""
        grad_block = 2 * BLOCK
        results = self.check_training(self.torch.bfloat16, 8, 4, bound=0.01, grad_block=grad_block)

        def wire(calls: list[tuple], kind: str, bits: int, block: int) -> int:
            """(n - 1) payloads a call of each parameter part padded to the block, but the last."""
            return sum((WORLD - 1) * zpccl.payload_size(sum(-(-n // block) * block for n in c[3][:-1]) + c[3][-1],
                                                        bits, block) for c in calls if c[0] == kind)

        for rank, (_, _, summary, calls) in enumerate(results):
            self.assertEqual(summary["qgz"]["wire_bytes"], wire(calls, "qgz", 4, grad_block), f"rank {rank}")
            self.assertEqual(summary["qwz"]["wire_bytes"], wire(calls, "qwz", 8, BLOCK), f"rank {rank}")

    def test_one_collective_left_on_fsdp(self) -> None:
        """weight_bits=None: FSDP's own all-gathers (forward and backward), zpccl's qgZ; grad_bits=None: the
        reverse. Losses then stay closer to FSDP's than with both quantized."""
        self.check_training(self.torch.bfloat16, None, 4, bound=0.01)
        self.check_training(self.torch.bfloat16, 8, None, bound=0.01)
        torch, base = self.torch, build_model(self.torch)

        def communicators(rank: int) -> list[tuple[bool, bool]]:  # (gathers' made, reduce-scatters' made)
            made = []
            for bits in (dict(weight_bits=None), dict(grad_bits=None)):
                model = shard(torch, copy.deepcopy(base), self.mesh(), 2)
                zp = zpccl.fsdp.enable(model, block_size=BLOCK, ranks_per_node=2, **bits)
                made += [(g.gather is not None, g.reduce is not None) for g in zp._groups.values()]
                zp.disable()
            return made

        for made in run_threaded(WORLD, communicators):
            self.assertEqual(made, [(False, True), (True, False)])

    def test_staging_is_reserved_before_the_first_call(self) -> None:
        """enable reserves the staging buffers that blocks restarting at parameters need, so that no call
        allocates in the training loop (staging_grown stays False); a buffer found too small grows and says so."""
        torch, base = self.torch, build_model(self.torch)

        def body(rank: int) -> tuple[int, bool, bool]:
            model = shard(torch, copy.deepcopy(base), self.mesh(), 2)
            zp = zpccl.fsdp.enable(model, block_size=BLOCK, ranks_per_node=2)
            data = batches(torch, rank, 3)
            train(torch, model, data[:2])
            reserved, grown = zp.reserved_bytes, zp.staging_grown
            zp.collectives.gather_stage.buffer = torch.empty(0, dtype=torch.uint8)  # as if reserved too little
            train(torch, model, data[2:])
            grown_after = zp.staging_grown
            zp.disable()
            return reserved, grown, grown_after

        for rank, (reserved, grown, grown_after) in enumerate(run_threaded(WORLD, body)):
            self.assertGreater(reserved, 0, f"rank {rank}: the model's layouts need staging")
            self.assertFalse(grown, f"rank {rank}: a call allocated staging in the loop")
            self.assertTrue(grown_after, f"rank {rank}")

    def test_a_group_reduced_in_parts(self) -> None:
        """A parameter group whose gradients come in two backward passes, as torchtitan's chunked loss makes them
        (lm_head's backward apart from the decoder's, lm_head sharded with the final norm): FSDP reduces the group
        in two reduce-scatters, one a pass. qgZ serves each with blocks restarting at its own parameters, bit-exact
        to the model; with error feedback, those two run without it and the log says once, naming the
        parameters and what to change."""
        torch, base = self.torch, build_model(self.torch)
        from torch.distributed.fsdp import fully_shard

        def body(rank: int, error_feedback: bool) -> Any:
            model, mesh = copy.deepcopy(base), self.mesh()
            for m in [model.emb, *model.blocks]:
                fully_shard(m, mesh=mesh)
            fully_shard([model.ln, model.head], mesh=mesh, reshard_after_forward=False)
            fully_shard(model, mesh=mesh)
            zp = zpccl.fsdp.enable(model, block_size=BLOCK, ranks_per_node=2, error_feedback=error_feedback)
            rec = Recorder(torch, zp)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            for ids in batches(torch, rank, 2):
                model.head.set_reshard_after_backward(False)  # the final norm's parameters wait for pass two
                kept: dict[str, Any] = {}
                cut = model.ln.register_forward_hook(
                    lambda m, a, out: kept.setdefault("h", out).detach().requires_grad_())
                head_in = model.head.register_forward_pre_hook(lambda m, a: kept.setdefault("x", a[0]))
                logits = model(ids)
                cut.remove()
                head_in.remove()
                next_token_loss(torch, logits, ids).backward()  # pass one: the head's gradients
                kept["h"].backward(kept["x"].grad)  # pass two: the final norm's and the decoder's
                opt.step()
                opt.zero_grad()
            summary = zp.summary()
            zp.disable()
            return None, None, summary, rec.calls

        head = [p.numel() // WORLD for p in base.head.parameters()]
        norm = [p.numel() // WORLD for p in base.ln.parameters()]
        results = run_threaded(WORLD, lambda rank: body(rank, False))
        self.check_calls(results, 8, 4)
        parts = [c[3] for c in results[0][3] if c[0] == "qgz"][:2]  # each step's first two: the [ln, head] group
        self.assertEqual(parts, [head, norm])
        with self.assertLogs("zpccl.fsdp", logging.WARNING) as logs:
            results = run_threaded(WORLD, lambda rank: body(rank, True))
        said = [r for r in logs.records if "runs without error feedback" in r.getMessage()]
        self.assertEqual(len(said), WORLD, logs.output)  # once a rank
        self.assertIn("only ['head.weight', 'head.bias']", said[0].getMessage())
        self.assertIn("fully_shard each on its own", said[0].getMessage())
        for _, _, summary, _ in results:  # two steps, two reduce-scatters of the group each without feedback
            self.assertEqual(summary["grad_residuals"]["calls"], summary["qgz"]["calls"] - 4)

    def test_a_parameter_without_gradient_inside_its_group(self) -> None:
        """A branch left out of a step: its parameter, between others of its group, gets no gradient, and FSDP
        reduces the group's other parameters only. Their shard sizes (10, 20, 10) also match a run of the group
        that holds the unused one (10, 30), so sizes alone cannot tell them: qgZ's blocks restart at the
        parameters FSDP really reduces (bit-exact to the model), and with error feedback the log names them and
        says what keeps the whole group reduced (set_reduce_scatter_unused_params), which then feeds back."""
        torch, nn = self.torch, self.torch.nn
        from torch.distributed.fsdp import fully_shard

        class Branchy(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.a = nn.Parameter(1 + 0.1 * torch.randn(40))
                self.b = nn.Parameter(0.02 * torch.randn(120))  # the branch's, unused here
                self.c = nn.Parameter(0.02 * torch.randn(80))
                self.d = nn.Parameter(0.02 * torch.randn(40))

            def forward(self, x: Any) -> Any:
                return x * self.a + self.d + self.c[:40] * self.c[40:]

        torch.manual_seed(0)
        base = Branchy()

        def body(rank: int, error_feedback: bool, unused_reduced: bool) -> Any:
            model = fully_shard(copy.deepcopy(base), mesh=self.mesh())
            model.set_reduce_scatter_unused_params(unused_reduced)
            zp = zpccl.fsdp.enable(model, block_size=BLOCK, ranks_per_node=2, error_feedback=error_feedback)
            rec = Recorder(torch, zp)
            for step in range(2):
                x = torch.randn(4, 40, generator=torch.Generator().manual_seed(10 * rank + step))
                model(x).square().sum().backward()
                model.zero_grad()
            summary = zp.summary()
            zp.disable()
            return None, None, summary, rec.calls

        results = run_threaded(WORLD, lambda rank: body(rank, False, False))
        self.check_calls(results, 8, 4)
        self.assertEqual([c[3] for c in results[0][3] if c[0] == "qgz"], [[10, 20, 10]] * 2)
        with self.assertLogs("zpccl.fsdp", logging.WARNING) as logs:
            results = run_threaded(WORLD, lambda rank: body(rank, True, False))
        said = [r.getMessage() for r in logs.records if "runs without error feedback" in r.getMessage()]
        self.assertEqual(len(said), WORLD, logs.output)
        self.assertIn("only ['a', 'c', 'd']", said[0])
        self.assertIn("set_reduce_scatter_unused_params(True)", said[0])
        self.assertTrue(all(r[2]["grad_residuals"]["calls"] == 0 for r in results))
        results = run_threaded(WORLD, lambda rank: body(rank, True, True))
        self.assertTrue(all(r[2]["grad_residuals"]["calls"] == r[2]["qgz"]["calls"] == 2 for r in results))

    def test_blocks_restart_at_parameter_boundaries(self) -> None:
        """A small parameter after a large one in the flat shard: its worst relative error, with and without
        blocks restarting at parameter boundaries (the numbers are printed for perf/RESULTS.md)."""
        torch = self.torch
        nn = torch.nn
        d = 40

        class Pair(nn.Module):  # registration order puts the LayerNorm weight (~1) before the linear one (~0.02)
            def __init__(self) -> None:
                super().__init__()
                self.norm = nn.Parameter(torch.empty(d).uniform_(0.9, 1.1))
                self.small = nn.Parameter(torch.randn(d, d) * 0.02)

            def forward(self, x: Any) -> Any:
                return (x * self.norm) @ self.small

        torch.manual_seed(1)
        base = Pair()
        worst: dict[tuple, float] = {}
        for bits in (8, 4):
            for restart in (True, False):
                def body(rank: int) -> float:
                    from torch.distributed.fsdp import fully_shard

                    model = fully_shard(copy.deepcopy(base), mesh=self.mesh(), reshard_after_forward=True)
                    zp = zpccl.fsdp.enable(model, weight_bits=bits, block_size=BLOCK, param_blocks=restart)
                    got = {}
                    handle = model.register_forward_pre_hook(
                        lambda m, a: got.update(small=m.small.detach().clone()))
                    model(torch.ones(1, d))
                    handle.remove()
                    zp.disable()
                    exact = base.small.detach()
                    return float((got["small"] - exact).abs().max() / exact.abs().max())

                worst[bits, restart] = max(run_threaded(WORLD, body))
        print(f"\nworst relative error of a 0.02-scale parameter after a 1-scale one (blocks of {BLOCK}): "
              + ", ".join(f"int{b} {'restart' if r else 'shared'} {e:.4f}" for (b, r), e in sorted(worst.items())))
        for bits, qmax in ((8, 127), (4, 7)):
            self.assertLessEqual(worst[bits, True], 1 / (2 * qmax) + 1e-6)  # its own scale: half a step
            self.assertGreater(worst[bits, False], 5 * worst[bits, True])

    def test_stochastic_rounding_and_error_feedback_equal_the_model(self) -> None:
        """grad_rounding='stochastic' with error feedback: every qgZ call (two hops) equals the NumPy model of
        include/zpccl.h's gradient rounding, its sequence number the call's place on the reduce communicator and
        each parameter group's residuals carried from step to step; the session's residuals end equal to the
        model's; the summary reports their memory; training stays close to FSDP's."""
        torch, steps, seed = self.torch, 3, 17
        base = build_model(torch)

        def body(rank: int) -> Any:
            data = batches(torch, rank, steps)
            plain = train(torch, shard(torch, copy.deepcopy(base), self.mesh(), 2), data)
            model = shard(torch, copy.deepcopy(base), self.mesh(), 2)
            zp = zpccl.fsdp.enable(model, block_size=BLOCK, ranks_per_node=2, grad_rounding="stochastic",
                                   seed=seed, error_feedback=True)
            calls: list[tuple] = []
            rs = zp.collectives.reduce_scatter

            def on_rs(hook: Any, output: Any, input: Any, group: Any, op: Any, *rest: Any) -> Any:
                x = input.clone()
                result = rs(hook, output, input, group, op, *rest)
                sizes = zp.collectives.reduce_sizes(hook, output.numel())
                calls.append((id(hook.param_group), x, output.clone(), sizes, op))
                return result

            zp.collectives.reduce_scatter = on_rs
            losses = train(torch, model, data)
            residuals = {k: (bits_of(r), bits_of(h) if h is not None else None)
                         for k, (r, h) in zp.collectives.residuals.items()}
            summary = zp.summary()
            zp.disable()
            return plain, losses, summary, calls, residuals

        results = run_threaded(WORLD, body)
        model_res: dict[Any, list[np.ndarray]] = {}
        model_hop: dict[Any, list[np.ndarray]] = {}
        for seq, per_rank in enumerate(zip(*[r[3] for r in results])):
            sizes, op = per_rank[0][3], per_rank[0][4]
            dt = ref_dtype(per_rank[0][1])
            sends = [np.concatenate([staged(split(row, sizes), BLOCK) for row in bits_of(x).reshape(WORLD, -1)])
                     for _, x, _, _, _ in per_rank]
            per = sends[0].size // WORLD
            keys = [c[0] for c in per_rank]  # each rank's own param group object
            res = [model_res.setdefault((r, keys[r]), np.zeros(WORLD * per, np.uint16)) for r in range(WORLD)]
            hop = [model_hop.setdefault((r, keys[r]), np.zeros(2 * per, np.uint16)) for r in range(WORLD)]
            name = "avg" if op == torch_avg(self.torch) else "sum"
            want = ref.quant_reduce_scatter_grad(sends, dt, name, 4, BLOCK, NODE_OF_RANK, True, seed, seq, res, hop)
            for rank, (_, _, out, _, _) in enumerate(per_rank):
                padded = split(want[rank], [s + (-s % BLOCK) for s in sizes[:-1]] + [sizes[-1]])
                expected = np.concatenate([p[:s] for p, s in zip(padded, sizes)])
                self.assertTrue(np.array_equal(bits_of(out), expected), f"qgZ call {seq} rank {rank}")
        self.assertEqual(len(results[0][3]), 3 * steps)
        for rank, (plain, losses, summary, _, residuals) in enumerate(results):
            self.assertEqual(len(residuals), 3)
            for key, (r, h) in residuals.items():
                self.assertTrue(np.array_equal(r, model_res[(rank, key)]), f"rank {rank} residual")
                self.assertTrue(np.array_equal(h, model_hop[(rank, key)]), f"rank {rank} hop residual")
                self.assertTrue(np.any(r != 0))
            g = summary["grad_residuals"]
            self.assertEqual((g["calls"], g["tensors"], g["wire_bytes"]), (3 * steps, 3, 0))
            self.assertEqual(g["residual_bytes"], 2 * sum(r.size for r, _ in residuals.values()))
            self.assertEqual(g["hop_residual_bytes"], 2 * sum(h.size for _, h in residuals.values()))
            for step, (a, b) in enumerate(zip(plain, losses)):
                self.assertLess(abs(a - b) / a, 0.01, f"rank {rank} step {step}: loss {b} vs FSDP's {a}")

    def test_fallbacks_stay_on_fsdp_collectives_and_say_so_once(self) -> None:
        torch = self.torch
        from torch.distributed.fsdp import fully_shard

        base = build_model(torch)

        def frozen_bf16(rank: int) -> Any:
            # A frozen bf16 parameter in an fp32 module: FSDP gathers the group as uint8 bytes.
            model = copy.deepcopy(base)
            model.blocks[0].register_parameter("table", torch.nn.Parameter(torch.ones(8, dtype=torch.bfloat16),
                                                                           requires_grad=False))
            zp = zpccl.fsdp.enable(shard(torch, model, self.mesh(), True), block_size=BLOCK, ranks_per_node=2)
            train(torch, model, batches(torch, rank, 2))
            zp.disable()
            return zp.summary()

        def float64(rank: int) -> Any:
            model = shard(torch, build_model(torch, dtype=torch.float64), self.mesh(), True)
            zp = zpccl.fsdp.enable(model, block_size=BLOCK)
            train(torch, model, batches(torch, rank, 1))
            zp.disable()
            return zp.summary()

        def hpz_off(rank: int) -> Any:
            model = shard(torch, copy.deepcopy(base), self.mesh(), 2)
            zp = zpccl.fsdp.enable(model, block_size=BLOCK, ranks_per_node=2, hpz=False)
            train(torch, model, batches(torch, rank, 2))
            zp.disable()
            return zp.summary()

        def hsdp(rank: int) -> Any:
            model = copy.deepcopy(base)
            mesh = self.mesh((2, 2), ("replicate", "shard"))
            for b in model.blocks:
                fully_shard(b, mesh=mesh)
            fully_shard(model, mesh=mesh)
            zp = zpccl.fsdp.enable(model, block_size=BLOCK)
            train(torch, model, batches(torch, rank, 1))
            zp.disable()
            return zp.summary()

        cases = ((frozen_bf16, "torch_all_gather_uint8", "mix dtypes", logging.WARNING, {"qwz", "qgz"}),
                 (float64, "torch_all_gather_dtype", "float64 parameters", logging.WARNING, set()),
                 (hpz_off, "torch_all_gather_hpz_off", "hpz=False", logging.WARNING, {"qwz", "qgz"}),
                 (hsdp, None, "replicate dimension", logging.INFO, {"qwz", "qgz"}))
        for body, kind, words, level, served in cases:
            with self.subTest(body.__name__), self.assertLogs("zpccl.fsdp", level) as logs:
                summaries = run_threaded(WORLD, body)
            said = [r for r in logs.records if words in r.getMessage()]
            self.assertEqual(len(said), WORLD, f"{body.__name__}: said once a rank: {logs.output}")
            for s in summaries:
                self.assertTrue(served <= set(s), f"{body.__name__}: {s}")
                if kind:
                    self.assertGreater(s[kind]["calls"], 0, f"{body.__name__}: {s}")
            if body is float64:
                self.assertGreater(summaries[0]["torch_reduce_scatter_dtype"]["calls"], 0)
                self.assertNotIn("qwz", summaries[0])

    def divide_factor_runs(self, mesh_shape: tuple, names: Any, factor: float, mp_dtype: Any,
                           factor_after_enable: bool) -> list[Any]:
        """Each rank trains one model twice with zpccl and set_gradient_divide_factor(factor): FSDP asking for
        PreMulSum(1/factor), and with set_force_sum_reduction_for_comms(True); the sharded gradients of every step,
        the losses, the reduce ops FSDP asked for and the counters of each run."""
        torch = self.torch
        from torch.distributed.fsdp import MixedPrecisionPolicy

        base = build_model(torch)
        mp = MixedPrecisionPolicy(param_dtype=mp_dtype, reduce_dtype=mp_dtype) if mp_dtype else None

        def run(rank: int, force_sum: bool) -> dict[str, Any]:
            model = shard(torch, copy.deepcopy(base), self.mesh(mesh_shape, names), True, mp)
            modules = [m for m in model.modules() if isinstance(m, torch.distributed.fsdp.FSDPModule)]
            for m in modules:  # both setters act on one module's state, so every module (as torchtitan does)
                m.set_force_sum_reduction_for_comms(force_sum)
                if not factor_after_enable:
                    m.set_gradient_divide_factor(factor)
            zp = zpccl.fsdp.enable(model, block_size=BLOCK)
            for m in modules if factor_after_enable else ():
                m.set_gradient_divide_factor(factor)
            ops: list[str] = []
            rs = zp.collectives.reduce_scatter

            def on_rs(hook: Any, output: Any, input: Any, group: Any, op: Any, *rest: Any) -> Any:
                ops.append(zpccl.fsdp._op_name(torch.distributed, op))
                return rs(hook, output, input, group, op, *rest)

            zp.collectives.reduce_scatter = on_rs
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            losses, grads = [], []
            for ids in batches(torch, rank, 3):
                loss = torch.nn.functional.cross_entropy(model(ids).float()[:, :-1].flatten(0, 1),
                                                         ids[:, 1:].flatten())
                loss.backward()
                grads.append([p.grad.to_local().clone() for p in model.parameters()])
                losses.append(loss.item())
                opt.step()
                opt.zero_grad()
            zp.disable()
            return dict(losses=losses, grads=grads, ops=ops, summary=zp.summary())

        return run_threaded(int(np.prod(mesh_shape)), lambda rank: (run(rank, False), run(rank, True)))

    def test_gradient_divide_factor_equals_force_sum(self) -> None:
        """set_gradient_divide_factor(f) with f not the shard group's size makes FSDP ask for PreMulSum(1/f):
        zpccl serves it with qgZ's sum and the force-sum path's division, so every step's gradients and losses are
        bit-identical to set_force_sum_reduction_for_comms(True) (zpccl on in both). f = 1.0 is torchtitan's (a
        plain sum); fp32 and bf16 reduce dtypes; the factor set before or after enable."""
        torch = self.torch
        for factor, mp_dtype, after in ((1.0, None, True), (3.0, None, False), (3.0, torch.bfloat16, True),
                                        (0.5, torch.bfloat16, False)):
            with self.subTest(factor=factor, reduce_dtype=mp_dtype, after_enable=after):
                for rank, (premul, force) in enumerate(self.divide_factor_runs((WORLD,), None, factor, mp_dtype,
                                                                               after)):
                    self.assertEqual(set(premul["ops"]), {"premul_sum"})
                    self.assertEqual(set(force["ops"]), {"sum"})
                    self.assertEqual(premul["summary"], force["summary"])
                    self.assertEqual({k: v["calls"] for k, v in premul["summary"].items()}, {"qwz": 18, "qgz": 9})
                    self.assertEqual(premul["losses"], force["losses"], f"rank {rank}")
                    for step, (a, b) in enumerate(zip(premul["grads"], force["grads"])):
                        self.assertTrue(all(torch.equal(x, y) for x, y in zip(a, b)), f"rank {rank} step {step}")

    def test_gradient_divide_factor_with_hsdp(self) -> None:
        """HSDP (2 replicas x 2 shards): FSDP asks for PreMulSum over the shard dimension, then sums over the
        replicate one; its force-sum path divides after that sum, PreMulSum (and zpccl) before it. Bit-identical
        where the division is exact (1.0, 4.0), equal up to rounding otherwise (3.0)."""
        torch = self.torch
        for factor in (1.0, 4.0, 3.0):
            with self.subTest(factor=factor):
                runs = self.divide_factor_runs((2, 2), ("replicate", "shard"), factor, None, False)
                for rank, (premul, force) in enumerate(runs):
                    self.assertEqual((set(premul["ops"]), set(force["ops"])), ({"premul_sum"}, {"sum"}))
                    self.assertEqual(premul["summary"]["qgz"]["calls"], 9)
                    first = zip(premul["grads"][0], force["grads"][0])  # the same weights: the same gradients
                    if factor != 3.0:
                        self.assertTrue(all(torch.equal(x, y) for x, y in first), f"rank {rank}")
                        self.assertEqual(premul["losses"], force["losses"])
                    else:
                        for x, y in first:
                            torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-9)

    def test_refusals_say_what_to_change(self) -> None:
        torch = self.torch
        base = build_model(torch)

        def mismatched_hpz(rank: int) -> None:
            # Four nodes of one rank: FSDP's post-forward groups of 2 span two nodes.
            model = shard(torch, copy.deepcopy(base), self.mesh(), 2)
            with self.assertRaisesRegex(ValueError, r"reshard_after_forward=2 .* ranks \[\d, \d\] .* on nodes"):
                zpccl.fsdp.enable(model, ranks_per_node=1)

        def arguments(rank: int) -> None:
            with self.assertRaisesRegex(ValueError, "has no fully_shard-ed module"):
                zpccl.fsdp.enable(copy.deepcopy(base))
            model = shard(torch, copy.deepcopy(base), self.mesh(), True)
            for kw, words in (({"weight_bits": 6}, "weight_bits 6 must be 4 or 8"),
                              ({"grad_bits": 2}, "grad_bits 2 must be 4 or 8"),
                              ({"block_size": 100}, "block_size 100 must be a power of two"),
                              ({"grad_block_size": 16}, "grad_block_size 16 must be a power of two"),
                              ({"grad_bits": None, "grad_block_size": 64}, "grad_block_size applies to qgZ"),
                              ({"weight_bits": None, "grad_bits": None}, "both None, so zpccl would serve nothing"),
                              ({"grad_bits": None, "error_feedback": True}, "grad_bits=None leaves"),
                              ({"grad_bits": None, "grad_rounding": "stochastic"}, "grad_bits=None leaves")):
                with self.assertRaisesRegex(ValueError, words):
                    zpccl.fsdp.enable(model, **kw)
            policy = zpccl.ZeroPlusPlusPolicy(block_size=BLOCK)
            with self.assertRaisesRegex(ValueError, "zpccl.fsdp.enable: give policy or keyword arguments, not both: "
                                                    "policy= and block_size="):
                zpccl.fsdp.enable(model, policy, block_size=BLOCK)
            with self.assertRaisesRegex(TypeError, "zpccl.fsdp.enable: unknown argument"):
                zpccl.fsdp.enable(model, blocksize=BLOCK)
            self.assertIsNone(zpccl.fsdp.session_of(model))
            zp = zpccl.fsdp.enable(model, policy)
            with self.assertRaisesRegex(zpccl.ZpcclError, "already serves this model"):
                zpccl.fsdp.enable(model)
            zp.disable()

        run_threaded(WORLD, mismatched_hpz)
        run_threaded(WORLD, arguments)

    def test_older_torch_is_refused_with_the_version_needed(self) -> None:
        torch = self.torch
        saved = torch.__version__
        try:
            torch.__version__ = "2.8.0"
            with self.assertRaisesRegex(zpccl.ZpcclError, r"needs torch 2\.9 or later .* this is torch 2\.8\.0"):
                zpccl.fsdp.enable(torch.nn.Linear(2, 2))
        finally:
            torch.__version__ = saved

    def test_checkpoint_round_trip_and_disable(self) -> None:
        torch = self.torch
        base = build_model(torch)

        def body(rank: int) -> None:
            data = batches(torch, rank, 3)
            model = shard(torch, copy.deepcopy(base), self.mesh(), 2)
            zp = zpccl.fsdp.enable(model, block_size=BLOCK, ranks_per_node=2)
            train(torch, model, data[:2])
            state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            # A fresh model, loaded from the checkpoint, computes the same forward through zpccl.
            other = shard(torch, build_model(torch), self.mesh(), 2)
            zp2 = zpccl.fsdp.enable(other, block_size=BLOCK, ranks_per_node=2)
            other.load_state_dict(state)
            with torch.no_grad():
                self.assertTrue(torch.equal(model(data[2]), other(data[2])))
            zp2.disable()
            # disable: FSDP's own collectives again, zpccl's counters stay still.
            before = zp.summary()
            groups = [pg for m in model.modules() if isinstance(m, zp._fsdp.FSDPModule)
                      for pg in zp._fsdp.param_groups(m)]
            zp.disable()
            self.assertTrue(all(type(pg._all_gather_comm).__name__.startswith("Default") for pg in groups))
            self.assertIsNone(zpccl.fsdp.session_of(model))
            train(torch, model, data[2:])
            self.assertEqual(zp.summary(), before)
            zp.disable()  # idempotent

        run_threaded(WORLD, body)


if __name__ == "__main__":
    unittest.main()
