"""zpccl.fsdp over FSDP2's parameter groups as users shard them, on the CPU with ranks as threads: hpZ per parameter
group (the README's pattern: blocks with ``reshard_after_forward=k``, a root left at its default; several k over
one shard group), modules sharded together (``fully_shard([m1, m2])``: one parameter group for both), and a second
``enable`` inside a model zpccl already serves. Skipped without torch 2.12 or later (see test_fsdp)."""
from __future__ import annotations

import copy
import logging
import unittest
from typing import Any

import zpccl
from zpccl.enums import Result

from ._threaded import run_threaded
from .test_fsdp import BLOCK, batches, build_model, cpu_mesh, torch_for_threads, train

STEPS = 2


def shard_blocks(torch: Any, model: Any, ks: list[Any], world: int) -> Any:
    """The README's pattern: block i with reshard_after_forward=ks[i], the root with fully_shard's defaults."""
    from torch.distributed.fsdp import fully_shard

    mesh = cpu_mesh((world,))
    for block, k in zip(model.blocks, ks):
        fully_shard(block, mesh=mesh, reshard_after_forward=k)
    fully_shard(model, mesh=mesh)
    return model


def local_params(model: Any) -> list[Any]:
    return [p.to_local().detach().clone() if hasattr(p, "to_local") else p.detach().clone()
            for p in model.parameters()]


class ParameterGroups(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.torch = torch_for_threads()

    def train_with_hpz(self, ks: list[int], world: int, ranks_per_node: int, hpz: bool) -> list[Any]:
        torch = self.torch
        base = build_model(torch, layers=len(ks))

        def body(rank: int) -> Any:
            model = shard_blocks(torch, copy.deepcopy(base), ks, world)
            zp = zpccl.fsdp.enable(model, block_size=BLOCK, ranks_per_node=ranks_per_node, hpz=hpz)
            hpz_comms = {k: (h.comm is g.gather, h.comm.hpz_size) for g in zp._groups.values()
                         for k, h in getattr(g, "hpz", {}).items()}
            losses = train(torch, model, batches(torch, rank, STEPS))
            summary = zp.summary()
            zp.disable()
            return losses, local_params(model), summary, hpz_comms

        return run_threaded(world, body)

    def test_hpz_per_parameter_group(self) -> None:
        """Every block's backward gather is hpZ over its own k, whatever the root (left at its default, so no
        post-forward group) says: losses and weights bit-identical to the same run with that gather left on FSDP's
        own collective (hpz=False; hpZ is exact), nothing left on FSDP's collectives, no warning. Several k over one
        shard group each get an hpZ communicator, the gathers' one where its hpZ group is FSDP's group of that k."""
        cases = (("two nodes of two", [2, 2], 4, 2, {2: (True, 2)}),
                 ("one node of four", [2, 2], 4, 4, {2: (True, 2)}),
                 ("one node of eight, k=2 and k=4", [2, 4], 8, 8, {2: (True, 2), 4: (False, 4)}))
        for name, ks, world, rpn, comms in cases:
            with self.subTest(name):
                with self.assertNoLogs("zpccl.fsdp", logging.WARNING):
                    served = self.train_with_hpz(ks, world, rpn, hpz=True)
                with self.assertLogs("zpccl.fsdp", logging.WARNING) as logs:
                    exact = self.train_with_hpz(ks, world, rpn, hpz=False)
                self.assertTrue(all("hpz=False" in line for line in logs.output), logs.output)
                modules = 1 + len(ks)
                for rank, ((losses, params, summary, hpz_comms), (want, want_params, off, _)) in enumerate(
                        zip(served, exact)):
                    self.assertEqual(losses, want, f"rank {rank}: losses differ from the exact gather's")
                    self.assertTrue(all(self.torch.equal(a, b) for a, b in zip(params, want_params)), f"rank {rank}")
                    calls = {k: v["calls"] for k, v in summary.items()}
                    self.assertEqual(calls, {"qwz": modules * STEPS, "hpz": len(ks) * STEPS,
                                             "qgz": modules * STEPS}, f"rank {rank}")
                    self.assertEqual(off["torch_all_gather_hpz_off"]["calls"], len(ks) * STEPS)
                    self.assertEqual(hpz_comms, comms, f"rank {rank}: hpZ communicators (gathers' own?, size)")

    def test_hpz_impossible_for_some_modules_is_refused_naming_them(self) -> None:
        """Four nodes of two: blocks.0's groups of 2 are hpZ groups, blocks.1's groups of 4 span two nodes."""
        torch = self.torch
        base = build_model(torch)

        def body(rank: int) -> None:
            model = shard_blocks(torch, copy.deepcopy(base), [2, 4], 8)
            with self.assertRaisesRegex(ValueError, r"reshard_after_forward=4 .* ranks \[\d, \d, \d, \d\] .* on nodes "
                                        r".*modules \['blocks\.1'\]"):
                zpccl.fsdp.enable(model, block_size=BLOCK, ranks_per_node=2)
            self.assertIsNone(zpccl.fsdp.session_of(model))

        run_threaded(8, body)

    def test_grouped_modules_attach_once_and_detach_completely(self) -> None:
        """``fully_shard([ln, head])``: one parameter group for two modules. zpccl serves it once (one residual,
        counted once), and after disable() no zpccl hook is left on any group: training goes on FSDP's own
        collectives and zpccl's counters stay still."""
        torch = self.torch
        from torch.distributed.fsdp import fully_shard

        base = build_model(torch)

        def body(rank: int) -> None:
            model = copy.deepcopy(base)
            mesh = cpu_mesh((4,))
            for b in model.blocks:
                fully_shard(b, mesh=mesh, reshard_after_forward=2)
            fully_shard([model.ln, model.head], mesh=mesh)
            fully_shard(model, mesh=mesh)
            zp = zpccl.fsdp.enable(model, block_size=BLOCK, ranks_per_node=2, error_feedback=True)
            groups = {id(pg): pg for m in model.modules() if isinstance(m, zp._fsdp.FSDPModule)
                      for pg in zp._fsdp.param_groups(m)}
            self.assertEqual(len(groups), 4)
            self.assertEqual(len(zp.collectives.residuals), 4)
            self.assertEqual(zp.residual_bytes, 2 * sum(r.numel() for r, _ in zp.collectives.residuals.values()))
            data = batches(torch, rank, 3)
            train(torch, model, data[:2])
            before = {k: v["calls"] for k, v in zp.summary().items()}
            zp.disable()
            for pg in groups.values():
                self.assertTrue(type(pg._all_gather_comm).__name__.startswith("Default"), pg._all_gather_comm)
                self.assertTrue(type(pg._reduce_scatter_comm).__name__.startswith("Default"),
                                pg._reduce_scatter_comm)
            train(torch, model, data[2:])
            self.assertEqual({k: v["calls"] for k, v in zp.summary().items()}, before)

        run_threaded(4, body)

    def test_enable_inside_a_served_model_is_refused(self) -> None:
        """A second enable on an inner module of a served model, or on the model around a served module, would stack
        a second ZeroPlusPlus on the same parameter groups: refused until the first is disabled."""
        torch = self.torch
        base = build_model(torch)

        def body(rank: int) -> None:
            model = shard_blocks(torch, copy.deepcopy(base), [2, 2], 4)
            for outer_first in (True, False):
                first = model if outer_first else model.blocks[1]
                second = model.blocks[1] if outer_first else model
                zp = zpccl.fsdp.enable(first, block_size=BLOCK, ranks_per_node=2)
                words = (r"already serves this model \(Block\), as its module 'blocks\.1' of the Net" if outer_first
                         else r"already serves its module 'blocks\.1' \(Block\), as the Block it was enabled on")
                with self.assertRaisesRegex(zpccl.ZpcclError, words + r".*call disable\(\)") as caught:
                    zpccl.fsdp.enable(second, block_size=BLOCK, ranks_per_node=2)
                self.assertEqual(caught.exception.code, Result.INVALID_USAGE)
                self.assertIs(zpccl.fsdp.session_of(first), zp)
                zp.disable()
                zp2 = zpccl.fsdp.enable(second, block_size=BLOCK, ranks_per_node=2)  # accepted once disabled
                zp2.disable()
            train(torch, model, batches(torch, rank, 1))

        run_threaded(4, body)


    def test_a_module_sharded_after_enable_is_said(self) -> None:
        """enable run between fully_shard on the blocks and on the model: zpccl serves the groups the model had
        then, and the root's (embedding, final norm, head), sharded after, stays on FSDP's collectives; the log
        says so once, at the first collective, naming it and what to change."""
        torch = self.torch
        from torch.distributed.fsdp import fully_shard

        base = build_model(torch)

        def body(rank: int) -> Any:
            model = copy.deepcopy(base)
            mesh = cpu_mesh((4,))
            for b in model.blocks:
                fully_shard(b, mesh=mesh, reshard_after_forward=2)
            zp = zpccl.fsdp.enable(model, block_size=BLOCK, ranks_per_node=2)
            fully_shard(model, mesh=mesh)
            train(torch, model, batches(torch, rank, STEPS))
            zp.disable()
            return {k: v["calls"] for k, v in zp.summary().items()}

        with self.assertLogs("zpccl.fsdp", logging.WARNING) as logs:
            summaries = run_threaded(4, body)
        said = [r.getMessage() for r in logs.records if "sharded after enable" in r.getMessage()]
        self.assertEqual(len(said), 4, logs.output)
        self.assertIn("['the model']", said[0])
        self.assertIn("call enable after fully_shard", said[0])
        self.assertEqual(summaries, [{"qwz": 2 * STEPS, "hpz": 2 * STEPS, "qgz": 2 * STEPS}] * 4)

    def test_a_model_dropped_without_disable_is_freed(self) -> None:
        """A model let go while zpccl serves it (a sweep that builds a model a trial, never calling disable) is
        freed like FSDP's own, not kept alive by zpccl's registry of served groups: while the model lives, zpccl's
        state for it is found from it even when no reference to the ZeroPlusPlus is held; once the model goes, so does
        that state."""
        import gc
        import warnings
        import weakref

        torch = self.torch
        base = build_model(torch)

        def body(rank: int) -> tuple[bool, bool, bool]:
            model = shard_blocks(torch, copy.deepcopy(base), [2, 2], 4)
            zp = zpccl.fsdp.enable(model, block_size=BLOCK, ranks_per_node=2)
            train(torch, model, batches(torch, rank, 1))
            model_ref, zp_ref = weakref.ref(model), weakref.ref(zp)
            del zp
            torch.distributed.barrier()
            gc.collect()
            found = zpccl.fsdp.session_of(model) is zp_ref()
            del model
            torch.distributed.barrier()  # every rank's references dropped before any collects
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ResourceWarning)  # its communicators, never closed
                gc.collect()
            torch.distributed.barrier()
            return found, model_ref() is None, zp_ref() is None

        self.assertEqual(run_threaded(4, body), [(True, True, True)] * 4)

    def test_shard_groups_of_one_rank_are_left_to_fsdp_said_once(self) -> None:
        """A module sharded over a group of one rank has nothing to communicate: enable makes nothing for it,
        leaves its collectives FSDP's and says so once (INFO where it serves other modules, WARNING where it
        serves none), instead of failing or keeping quiet."""
        torch = self.torch
        from torch.distributed.fsdp import fully_shard

        base = build_model(torch)

        def body(rank: int, blocks_alone: bool, root_alone: bool) -> Any:
            model = copy.deepcopy(base)
            alone, world = cpu_mesh((4, 1), ("replicate", "shard"))["shard"], cpu_mesh((4,))
            for b in model.blocks:
                fully_shard(b, mesh=alone if blocks_alone else world)
            fully_shard(model, mesh=alone if root_alone else world)
            theirs = [m._get_fsdp_state()._fsdp_param_groups[0]._all_gather_comm for m in model.blocks]
            zp = zpccl.fsdp.enable(model, block_size=BLOCK)
            served = [s.name for s in zp._served]
            hooked = [m._get_fsdp_state()._fsdp_param_groups[0]._all_gather_comm is not t
                      for m, t in zip(model.blocks, theirs)]
            train(torch, model, batches(torch, rank, STEPS))
            summary = {k: v["calls"] for k, v in zp.summary().items()}
            zp.disable()
            return served, hooked, summary

        for blocks_alone, root_alone, level in ((True, False, logging.INFO), (True, True, logging.WARNING)):
            with self.subTest(root_alone=root_alone), self.assertLogs("zpccl.fsdp", logging.INFO) as logs:
                out = run_threaded(4, lambda rank: body(rank, blocks_alone, root_alone))
            said = [r for r in logs.records if "group of one rank" in r.getMessage()]
            self.assertEqual(len(said), 4, logs.output)  # once a rank
            self.assertTrue(all(r.levelno == level for r in said), logs.output)
            self.assertIn("'blocks.0', 'blocks.1'", said[0].getMessage())
            for served, hooked, summary in out:
                self.assertEqual(hooked, [False, False])  # the blocks keep FSDP's collectives
                if root_alone:
                    self.assertEqual((served, summary), ([], {}))
                    self.assertIn("serves nothing", said[0].getMessage())
                else:  # the root, over the four ranks: its forward gather and its reduce-scatter, each step
                    self.assertEqual(served, [""])
                    self.assertEqual(summary, {"qwz": STEPS, "qgz": STEPS})


    def test_ranks_per_node_numbers_the_worlds_ranks(self) -> None:
        """ranks_per_node lays out the world's ranks, whatever group a communicator spans: HSDP's shard groups of
        two inside one node of four (each group's communicators one node of two), and shard groups that take one
        rank of each of two nodes of two (two nodes of one, so qgZ's two hops become one across them). Both
        train within the bound of FSDP's own run."""
        torch = self.torch
        from torch.distributed.fsdp import fully_shard

        base = build_model(torch)

        def body(rank: int, rpn: int, hsdp: bool) -> Any:
            data = batches(torch, rank, STEPS)
            out = []
            for use_zpccl in (False, True):
                model = copy.deepcopy(base)
                # Shard groups {0, 1} and {2, 3} (HSDP's), or {0, 2} and {1, 3} (a 1-D mesh's first dim).
                mesh = cpu_mesh((2, 2), ("replicate", "shard")) if hsdp else cpu_mesh((2, 2), ("a", "b"))["a"]
                for m in (*model.blocks, model):
                    fully_shard(m, mesh=mesh, reshard_after_forward=True)
                zp = zpccl.fsdp.enable(model, block_size=BLOCK, ranks_per_node=rpn) if use_zpccl else None
                out.append(train(torch, model, data))
                if zp is not None:
                    (g,) = zp._groups.values()
                    out.append([(c.node_count, c.local_size) for c in (g.gather, g.reduce)])
                    zp.disable()
            return out

        for rpn, hsdp, layout in ((4, True, (1, 2)), (2, False, (2, 1))):
            with self.subTest(ranks_per_node=rpn, hsdp=hsdp), self.assertLogs("zpccl.fsdp", logging.INFO) as logs:
                for rank, (plain, losses, nodes) in enumerate(run_threaded(4, lambda r: body(r, rpn, hsdp))):
                    self.assertEqual(nodes, [layout, layout], f"rank {rank}: (nodes, ranks a node)")
                    for a, b in zip(plain, losses):
                        self.assertLess(abs(a - b) / a, 0.01, f"rank {rank}: loss {b} vs FSDP's {a}")
            # The replicate all-reduce stays FSDP's on a 2-D mesh: said once a rank, with the way to zpccl's.
            said = [r.getMessage() for r in logs.records if "replicate dimension" in r.getMessage()]
            self.assertEqual(len(said), 4 if hsdp else 0, logs.output)
            for message in said:
                self.assertIn("over it itself, on the process group's own backend; zpccl.ddp.enable_replicate "
                              "serves it from the 1-D shard mesh", message)


if __name__ == "__main__":
    unittest.main()
