"""FSDP2's scheduling and accumulation features with zpccl.fsdp on, ranks as threads (four, two nodes of two): explicit
forward and backward prefetch with asynchronous unshards, gradient accumulation without sync finished by FSDP or by
the caller (``finalize_backward``), recovery with ``reset_iter_state`` after a failed forward or backward,
``CPUOffloadPolicy`` and ``set_unshard_in_backward(False)``. Each changes when FSDP calls its collectives, not what
they hold: the runs equal their plain counterparts bit for bit, hpZ keeps serving the backward gathers, and every
call equals the NumPy model (hpZ: FSDP's exact gather). Parameters of odd sizes, tied weights and ``ignored_params``
change which parameters a call holds: every call still equals the model. Skipped without torch 2.12 or later (see
test_fsdp)."""
from __future__ import annotations

import copy
import unittest
from typing import Any

import zpccl

from ._threaded import run_threaded
from .test_fsdp import BLOCK, WORLD, Recorder, batches, build_model, next_token_loss, torch_for_threads
from .test_fsdp_groups import local_params
from .test_fsdp_hpz_size import shard

STEPS = 3
#: Blocks sharded with reshard_after_forward=2, or with True and hpz_size=2: hpZ either way.
HPZ = (([2, 2], None), ([True, True], 2))


class FsdpFeatures(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.torch = torch_for_threads()
        cls.base = build_model(cls.torch)

    def train(self, rank: int, blocks: Any, hpz_size: int | None, step: Any = None, before: Any = None,
              micro: int = 1) -> tuple[Any, ...]:
        """A copy of the model sharded with ``blocks`` (the blocks' reshard_after_forward, or a function that shards
        the model), served by zpccl, trained STEPS optimizer steps of ``micro`` batches each (``step(model,
        batches)``: forward and backward of one; default, each batch's loss backward in turn); ``before(model)``
        after enable. What FsdpOnThreads.check_calls reads, and the trained shards."""
        torch = self.torch
        model = copy.deepcopy(self.base)
        model = blocks(model) if callable(blocks) else shard(model, WORLD, blocks)
        zp = zpccl.fsdp.enable(model, block_size=BLOCK, ranks_per_node=2, hpz_size=hpz_size)
        if before is not None:
            before(model)
        rec = Recorder(torch, zp)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        data = batches(torch, rank, STEPS * micro)
        losses: list[float] = []
        for i in range(STEPS):
            part = data[i * micro:(i + 1) * micro]
            if step is None:
                for ids in part:
                    loss = next_token_loss(torch, model(ids), ids)
                    loss.backward()
                    losses.append(loss.item())
            else:
                losses += step(model, part)
            opt.step()
            opt.zero_grad()
        summary = zp.summary()
        zp.disable()
        return None, losses, summary, rec.calls, local_params(model)

    def check_calls(self, runs: list[Any]) -> dict[str, int]:
        """test_fsdp's check of every recorded call against the NumPy model (int8 weights, int4 gradients); the
        calls of each kind."""
        from .test_fsdp import FsdpOnThreads  # here: imported at the top, its tests would run again in this module

        checker = FsdpOnThreads("test_fp32_training_matches_fsdp_within_the_quantization_bounds")
        checker.torch = self.torch
        return checker.check_calls(runs, 8, 4)

    def assert_same(self, runs: list[Any], reference: list[Any], calls: dict[str, int], counters: bool = True) -> None:
        """Losses, trained shards and (with ``counters``) counters equal the reference's on every rank; the calls
        counted as ``calls`` and every one equal to the NumPy model."""
        self.assertEqual(self.check_calls(runs), calls)
        for rank, (got, want) in enumerate(zip(runs, reference)):
            self.assertEqual(got[1], want[1], f"rank {rank}: losses")
            self.assertTrue(all(self.torch.equal(a, b) for a, b in zip(got[4], want[4])), f"rank {rank}: shards")
            if counters:
                self.assertEqual(got[2], want[2], f"rank {rank}: counters")

    def test_explicit_prefetch_and_async_unshard_equal_implicit(self) -> None:
        """Each block prefetching the next in forward and the previous in backward, unshards asynchronous, and
        every module unsharded by hand (``unshard(async_op=True)``, then ``wait()``) before each forward."""
        def prefetch(model: Any) -> None:
            blocks = list(model.blocks)
            model.set_modules_to_forward_prefetch(blocks[:1])
            for a, b in zip(blocks, blocks[1:]):
                a.set_modules_to_forward_prefetch([b])
                b.set_modules_to_backward_prefetch([a])
            for m in (*blocks, model):
                m._set_unshard_async_op(True)

        def by_hand(model: Any, part: list[Any]) -> list[float]:
            handles = [m.unshard(async_op=True) for m in (model, *model.blocks)]
            for h in handles:
                h.wait()
            loss = next_token_loss(self.torch, model(part[0]), part[0])
            loss.backward()
            return [loss.item()]

        for blocks, hpz_size in HPZ:
            with self.subTest(blocks=blocks, hpz_size=hpz_size):
                plain = run_threaded(WORLD, lambda r: self.train(r, blocks, hpz_size))
                runs = run_threaded(WORLD, lambda r: self.train(r, blocks, hpz_size, by_hand, prefetch))
                self.assert_same(runs, plain, {"qwz": 3 * STEPS, "hpz": 2 * STEPS, "qgz": 3 * STEPS})

    def test_accumulation_finished_by_fsdp_or_by_the_caller(self) -> None:
        """Two batches a step without gradient sync but the last (``set_requires_gradient_sync``): one qgZ call
        per group a step, on the accumulated gradients; the same with ``set_manual_backward_finalization`` and
        ``finalize_backward(async_op=True)`` after both batches, bit for bit."""
        torch = self.torch

        def no_sync(model: Any, part: list[Any]) -> list[float]:
            losses = []
            for i, ids in enumerate(part):
                model.set_requires_gradient_sync(i == len(part) - 1)
                loss = next_token_loss(torch, model(ids), ids)
                loss.backward()
                losses.append(loss.item())
            return losses

        def by_the_caller(model: Any, part: list[Any]) -> list[float]:
            model.set_requires_gradient_sync(False)
            losses = []
            for ids in part:
                loss = next_token_loss(torch, model(ids), ids)
                loss.backward()
                losses.append(loss.item())
            model.set_requires_gradient_sync(True)
            model.finalize_backward(async_op=True).wait()
            return losses

        blocks, hpz_size = HPZ[1]
        auto = run_threaded(WORLD, lambda r: self.train(r, blocks, hpz_size, no_sync, micro=2))
        manual = run_threaded(WORLD, lambda r: self.train(r, blocks, hpz_size, by_the_caller,
                                                          lambda m: m.set_manual_backward_finalization(True), 2))
        calls = {"qwz": 6 * STEPS, "hpz": 4 * STEPS, "qgz": 3 * STEPS}
        self.assert_same(manual, auto, calls)

    def test_reset_iter_state_after_a_failed_forward_or_backward(self) -> None:
        """A step that fails in the middle of its forward (a block raises) or of its backward, then
        ``reset_iter_state()``: the steps after it equal those of the run that never failed."""
        torch = self.torch

        def fail(where: str) -> Any:
            def step(model: Any, part: list[Any]) -> list[float]:
                ids = part[0]
                if not getattr(model, "failed", False):
                    model.failed = True
                    if where == "forward":
                        hook = model.blocks[1].register_forward_pre_hook(lambda m, a: 1 / 0)
                    else:
                        hook = model.blocks[0].register_full_backward_pre_hook(lambda m, g: 1 / 0)
                    with self.assertRaises(ZeroDivisionError):
                        next_token_loss(torch, model(ids), ids).backward()
                    hook.remove()
                    model.reset_iter_state()
                loss = next_token_loss(torch, model(ids), ids)
                loss.backward()
                return [loss.item()]
            return step

        for blocks, hpz_size in HPZ:
            plain = run_threaded(WORLD, lambda r: self.train(r, blocks, hpz_size))
            for where, extra in (("forward", dict(qwz=3)), ("backward", dict(qwz=3, hpz=2, qgz=1))):
                with self.subTest(blocks=blocks, hpz_size=hpz_size, failed_in=where):
                    runs = run_threaded(WORLD, lambda r: self.train(r, blocks, hpz_size, fail(where)))
                    want = {"qwz": 3 * STEPS, "hpz": 2 * STEPS, "qgz": 3 * STEPS}
                    self.assert_same(runs, plain, {k: v + extra.get(k, 0) for k, v in want.items()}, counters=False)

    def test_cpu_offload_and_no_unshard_in_backward(self) -> None:
        """``CPUOffloadPolicy`` (unpinned: no CUDA here) on every module equals no offload bit for bit, its gathers
        and reduce-scatters zpccl's; an embedding sharded on its own with ``set_unshard_in_backward(False)`` is
        gathered in forward only (qwZ), no hpZ gather in backward, and its gradients are qgZ's."""
        from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

        from .test_fsdp import cpu_mesh

        def sharded(offload: bool, embedding: bool) -> Any:
            def shard_all(model: Any) -> Any:
                kw = dict(mesh=cpu_mesh(), reshard_after_forward=2)
                if offload:
                    kw["offload_policy"] = CPUOffloadPolicy(pin_memory=False)
                for m in ([model.emb] if embedding else []) + list(model.blocks):
                    fully_shard(m, **kw)
                fully_shard(model, **kw)
                if embedding:
                    model.emb.set_unshard_in_backward(False)
                return model
            return shard_all

        plain = run_threaded(WORLD, lambda r: self.train(r, sharded(False, False), None))
        with self.subTest("CPUOffloadPolicy"):
            offloaded = run_threaded(WORLD, lambda r: self.train(r, sharded(True, False), None))
            self.assert_same(offloaded, plain, {"qwz": 3 * STEPS, "hpz": 3 * STEPS, "qgz": 3 * STEPS})
        with self.subTest("set_unshard_in_backward(False)"):
            runs = run_threaded(WORLD, lambda r: self.train(r, sharded(False, True), None))
            self.assertEqual(self.check_calls(runs), {"qwz": 4 * STEPS, "hpz": 3 * STEPS, "qgz": 4 * STEPS})

    def test_odd_sizes_tied_weights_and_ignored_params(self) -> None:
        """Parameters whose shards are one element or a prime count (most ranks' shards of a one-element parameter
        are padding only), an embedding tied to the head (one parameter of the root's group), and ignored_params
        (parameters FSDP leaves out of a group): every call's blocks restart at the parameters FSDP really
        gathers and reduces, bit-exact to the NumPy model, and none falls back to FSDP's collectives."""
        torch, nn = self.torch, self.torch.nn
        from torch.distributed.fsdp import fully_shard

        from .test_fsdp import cpu_mesh

        class Odd(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.one = nn.Parameter(torch.tensor([1.5]))
                self.p7, self.p13 = nn.Parameter(0.02 * torch.randn(7)), nn.Parameter(3 * torch.randn(13, 3))
                self.emb = nn.Embedding(64, 37)

            def forward(self, ids: Any) -> Any:
                x = self.emb(ids) * self.one + self.p7.sum() + self.p13.sum()
                return x @ self.emb.weight.t()  # the head tied to the embedding

        def odd(model: Any) -> Any:
            torch.manual_seed(0)
            return fully_shard(Odd(), mesh=cpu_mesh(), reshard_after_forward=2)

        def ignored(model: Any) -> Any:
            mesh = cpu_mesh()
            for b in model.blocks:
                fully_shard(b, mesh=mesh, reshard_after_forward=2, ignored_params={b.ln.weight})
            return fully_shard(model, mesh=mesh, reshard_after_forward=2, ignored_params={model.ln.bias})

        for shard_model, calls in ((odd, {"qwz": STEPS, "hpz": STEPS, "qgz": STEPS}),
                                   (ignored, {"qwz": 3 * STEPS, "hpz": 3 * STEPS, "qgz": 3 * STEPS})):
            with self.subTest(shard_model.__name__):
                runs = run_threaded(WORLD, lambda r: self.train(r, shard_model, None))
                self.assertEqual(self.check_calls(runs), calls)
                for rank, run in enumerate(runs):
                    self.assertEqual({k: v["calls"] for k, v in run[2].items()}, calls, f"rank {rank}: counters")


if __name__ == "__main__":
    unittest.main()
