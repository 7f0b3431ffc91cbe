"""zpccl.fsdp.enable(..., hpz_size=k) on the CPU with ranks as threads: modules sharded with
``reshard_after_forward=True`` get FSDP's post-forward groups of k ranks, so that their backward gathers are hpZ,
exactly as if they had been sharded with ``reshard_after_forward=k``. Skipped without torch 2.12 or later (see
test_fsdp)."""
from __future__ import annotations

import copy
import logging
import unittest
from typing import Any

import zpccl

from ._threaded import run_threaded
from .test_fsdp import BLOCK, batches, build_model, cpu_mesh, next_token_loss, torch_for_threads, train
from .test_fsdp_groups import local_params

STEPS = 3


def shard(model: Any, world: int | tuple, blocks: list[Any], root: Any = None) -> Any:
    """Block i sharded with reshard_after_forward=blocks[i], the root with ``root`` (None: fully_shard's default),
    over ``world`` ranks or a 2-D (HSDP) mesh of that shape."""
    from torch.distributed.fsdp import fully_shard

    mesh = cpu_mesh(world, ("replicate", "shard")) if isinstance(world, tuple) else cpu_mesh((world,))
    for block, k in zip(model.blocks, blocks):
        fully_shard(block, mesh=mesh, reshard_after_forward=k)
    fully_shard(model, mesh=mesh, **({} if root is None else {"reshard_after_forward": root}))
    return model


def record_gathers(zp: Any) -> list[Any]:
    """Every all-gather's output, in call order (copies)."""
    outputs: list[Any] = []
    gather = zp.collectives.all_gather

    def on_gather(hook: Any, output: Any, *rest: Any) -> Any:
        result = gather(hook, output, *rest)
        outputs.append(output.clone())
        return result

    zp.collectives.all_gather = on_gather
    return outputs


class HpzSize(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.torch = torch_for_threads()

    def said_by_every_rank(self, level: int, words: str, body: Any) -> tuple[list[str], list[Any]]:
        """``body`` run on 4 thread-ranks: the zpccl.fsdp log lines at ``level`` or above holding ``words``, one a
        rank (checked), and what each rank returned."""
        with self.assertLogs("zpccl.fsdp", level) as logs:
            results = run_threaded(4, body)
        said = [line for line in logs.output if words in line]
        self.assertEqual(len(said), 4, logs.output)
        return said, results

    def test_equals_resharding_with_k(self) -> None:
        """Blocks sharded with True under hpz_size=k, and the same blocks sharded with reshard_after_forward=k
        (zpccl on in both): every gathered weight, every loss and the trained parameters bit-identical; the
        backward gathers are hpZ calls in both. Two nodes of two, two nodes of four with k=2 and k=4, and HSDP
        (two replicas of four shards)."""
        torch = self.torch
        base = build_model(torch, layers=3)
        for world, rpn, k in ((4, 2, 2), (8, 4, 2), (8, 4, 4), ((2, 4), 4, 2)):
            def body(rank: int) -> Any:
                data = batches(torch, rank, STEPS)
                out = []
                for blocks, hpz_size in (([True] * 3, k), ([k] * 3, None)):
                    model = shard(copy.deepcopy(base), world, blocks)
                    zp = zpccl.fsdp.enable(model, block_size=BLOCK, ranks_per_node=rpn, hpz_size=hpz_size)
                    gathered = record_gathers(zp)
                    losses = train(torch, model, data)
                    out.append((losses, gathered, local_params(model), zp.summary()))
                    zp.disable()
                return out

            with self.subTest(world=world, ranks_per_node=rpn, k=k):
                ranks = world[0] * world[1] if isinstance(world, tuple) else world
                for rank, (given, direct) in enumerate(run_threaded(ranks, body)):
                    self.assertEqual(given[0], direct[0], f"rank {rank}: losses")
                    self.assertEqual(len(given[1]), len(direct[1]))
                    for i, (a, b) in enumerate(zip(given[1], direct[1])):
                        self.assertTrue(torch.equal(a, b), f"rank {rank}: gather {i}")
                    self.assertTrue(all(torch.equal(a, b) for a, b in zip(given[2], direct[2])), f"rank {rank}")
                    self.assertEqual(given[3], direct[3])
                    self.assertEqual({n: v["calls"] for n, v in given[3].items()},
                                     {"qwz": 4 * STEPS, "hpz": 3 * STEPS, "qgz": 4 * STEPS})

    def test_applies_to_true_only_shares_one_mesh_and_disable_restores(self) -> None:
        """hpz_size=2 over blocks sharded with 2, True and False under a root left at its default: the block with
        True gets a post-forward group of 2 (its own parameters' too), the one with 2 keeps FSDP's, the one with
        False and the root keep none; two blocks with True share one mesh. disable() puts back every object FSDP
        had, and the model trains on FSDP's collectives after it."""
        torch = self.torch
        base = build_model(torch, layers=4)

        def body(rank: int) -> None:
            model = shard(copy.deepcopy(base), 4, [2, True, False, True])
            groups = [m._get_fsdp_state()._fsdp_param_groups[0] for m in (*model.blocks, model)]
            before = [(pg.post_forward_mesh_info, [(p.post_forward_mesh_info,
                                                    getattr(p, "sharded_post_forward_size", None),
                                                    getattr(p, "contiguous_sharded_post_forward_stride", None))
                                                   for p in pg.fsdp_params]) for pg in groups]
            zp = zpccl.fsdp.enable(model, block_size=BLOCK, ranks_per_node=2, hpz_size=2)
            after = [pg.post_forward_mesh_info for pg in groups]
            self.assertIs(after[0], before[0][0])  # an int: FSDP's own
            self.assertIs(after[2], None)  # False
            self.assertIs(after[4], before[4][0])  # the root, set to None by FSDP's first forward
            self.assertIsNot(after[1], before[1][0])
            self.assertIs(after[1], after[3])  # one mesh for the shard mesh
            self.assertEqual(after[1].shard_mesh_size, 2)
            # Blocks of one shape: each parameter's post-forward sizes as FSDP made them for the block with 2.
            for p, q, (_, size, _) in zip(groups[1].fsdp_params, groups[0].fsdp_params, before[1][1]):
                self.assertIs(p.post_forward_mesh_info, after[1])
                self.assertEqual((p.sharded_post_forward_size, p.contiguous_sharded_post_forward_stride),
                                 (q.sharded_post_forward_size, q.contiguous_sharded_post_forward_stride))
                self.assertNotEqual(p.sharded_post_forward_size, size)
            train(torch, model, batches(torch, rank, 2))
            self.assertIsNone(groups[4].post_forward_mesh_info)
            self.assertEqual(zp.summary()["hpz"]["calls"], 3 * 2)
            # Between a forward and its backward the block holds its parameters resharded to hpz_size's groups.
            loss = model(batches(torch, rank, 1)[0]).float().mean()
            with self.assertRaisesRegex(zpccl.ZpcclError, r"modules \['blocks\.1', 'blocks\.3'\] hold their "
                                        r"parameters resharded .* call disable\(\) after the backward"):
                zp.disable()
            loss.backward()
            model.zero_grad()
            zp.disable()
            for pg, (info, params) in zip(groups[:4], before[:4]):
                self.assertIs(pg.post_forward_mesh_info, info)
                for p, (p_info, size, stride) in zip(pg.fsdp_params, params):
                    self.assertIs(p.post_forward_mesh_info, p_info)
                    self.assertEqual((getattr(p, "sharded_post_forward_size", None),
                                      getattr(p, "contiguous_sharded_post_forward_stride", None)), (size, stride))
            train(torch, model, batches(torch, rank, 1))
            self.assertEqual(zp.summary()["hpz"]["calls"], 3 * 3)

        run_threaded(4, body)

    def test_disable_after_an_evaluation_forward(self) -> None:
        """A forward without gradients (an evaluation: torch.no_grad, torch.inference_mode) leaves the blocks in
        their post-forward shard of k with no backward to follow, as Lightning's validation at the end of fit does
        before on_fit_end. disable() then takes them back to their shard of the shard group (nothing gathered) and
        the model trains on FSDP's collectives, with the very losses and parameters of a run that disabled
        without that forward (the root resharded too, so that every weight after disable is FSDP's gather). A
        forward with gradients is still refused until its backward."""
        torch = self.torch
        base = build_model(torch, layers=2)

        def body(rank: int) -> list[Any]:
            data = batches(torch, rank, STEPS + 1)
            out = []
            for evaluate in (None, torch.no_grad, torch.inference_mode):
                model = shard(copy.deepcopy(base), 4, [True, True], root=True)
                zp = zpccl.fsdp.enable(model, block_size=BLOCK, ranks_per_node=2, hpz_size=2)
                losses = train(torch, model, data[:STEPS])
                if evaluate is not None:
                    with evaluate():
                        model(data[STEPS])
                    groups = [m._get_fsdp_state()._fsdp_param_groups[0] for m in (*model.blocks, model)]
                    self.assertTrue(all(pg.is_sharded_post_forward for pg in groups))
                zp.disable()
                calls = {k: v["calls"] for k, v in zp.summary().items()}
                losses += train(torch, model, data[STEPS:])
                self.assertEqual({k: v["calls"] for k, v in zp.summary().items()}, calls)
                out.append((losses, local_params(model)))
            model = shard(copy.deepcopy(base), 4, [True, True])
            zp = zpccl.fsdp.enable(model, block_size=BLOCK, ranks_per_node=2, hpz_size=2)
            loss = model(data[0]).float().mean()
            with self.assertRaisesRegex(zpccl.ZpcclError, r"modules \['blocks\.0', 'blocks\.1'\] hold their "
                                        r"parameters resharded .* call disable\(\) after the backward"):
                zp.disable()
            loss.backward()
            zp.disable()
            return out

        for rank, (plain, *evaluated) in enumerate(run_threaded(4, body)):
            for losses, params in evaluated:
                self.assertEqual(losses, plain[0], f"rank {rank}")
                self.assertTrue(all(torch.equal(a, b) for a, b in zip(params, plain[1])), f"rank {rank}")

    def test_refusals_name_hpz_size(self) -> None:
        """Each refusal names what to change, and leaves every module as FSDP had it."""
        torch = self.torch
        from torch.distributed.fsdp import FSDPModule
        base = build_model(torch)

        def body(rank: int) -> None:
            model = shard(copy.deepcopy(base), 4, [True, True])
            for kw, words in (({"hpz_size": 1}, "hpz_size 1 must be an int of at least 2"),
                              ({"hpz_size": True}, "hpz_size True must be an int"),
                              ({"hpz_size": 2.0}, "hpz_size 2.0 must be an int"),
                              ({"hpz_size": 2, "hpz": False}, "hpz_size gives modules .* hpz=False leaves"),
                              ({"hpz_size": 2, "weight_bits": None}, "weight_bits=None leaves"),
                              ({"hpz_size": 4, "ranks_per_node": 2}, "hpz_size 4 must divide ranks_per_node 2"),
                              # Nodes told by label: known only once the communicators exist.
                              ({"hpz_size": 2, "node_id": rank // 3}, r"hpz_size 2 must divide the ranks per node: "
                               r"the shard group of modules \['blocks\.0', 'blocks\.1'\] has nodes of \[1, 3\] "
                               "ranks"),
                              ({"hpz_size": 8, "node_id": 0}, r"hpz_size 8 must divide the ranks of the shard "
                               r"group that modules \['blocks\.0', 'blocks\.1'\] are sharded over, 4")):
                with self.subTest(**{k: repr(v) for k, v in kw.items()}):
                    with self.assertRaisesRegex(ValueError, words):
                        zpccl.fsdp.enable(model, block_size=BLOCK, **kw)
                    self.assertIsNone(zpccl.fsdp.session_of(model))
                    self.assertIs(model.blocks[0]._get_fsdp_state()._fsdp_param_groups[0].post_forward_mesh_info,
                                  model.blocks[0]._get_fsdp_state()._fsdp_param_groups[0].mesh_info)
                    self.assertFalse([m for m in model.modules() if isinstance(m, FSDPModule) for pg in
                                      m._get_fsdp_state()._fsdp_param_groups if "post_forward" in pg.__dict__])

        run_threaded(4, body)

    def test_an_spmd_mesh_keeps_true_and_says_why(self) -> None:
        """Modules sharded over a full SPMD mesh (``dp_mesh_dims``; their parameters DTensors on that mesh, as
        torchtitan's default SPMD backends make them): FSDP reshards those to no smaller group, so hpz_size leaves
        them at True, and the log names the SPMD mesh, not tensor parallelism."""
        torch = self.torch
        from torch.distributed.fsdp import DataParallelMeshDims, fully_shard
        from torch.distributed.tensor import Replicate, distribute_tensor

        base = build_model(torch)

        def body(rank: int) -> Any:
            model = copy.deepcopy(base)
            mesh = cpu_mesh((4,), ("dp",))
            for m in model.modules():
                for name, p in list(m.named_parameters(recurse=False)):
                    m.register_parameter(name, torch.nn.Parameter(distribute_tensor(p.detach(), mesh, [Replicate()])))
            for block in model.blocks:
                fully_shard(block, mesh=mesh, dp_mesh_dims=DataParallelMeshDims(shard="dp"))
            fully_shard(model, mesh=mesh, dp_mesh_dims=DataParallelMeshDims(shard="dp"))
            zp = zpccl.fsdp.enable(model, block_size=BLOCK, ranks_per_node=2, hpz_size=2)
            zp.disable()
            return zp.summary()

        said, _ = self.said_by_every_rank(logging.WARNING, "hpz_size=2 leaves modules ['blocks.0', 'blocks.1']",
                                          body)
        self.assertTrue(all("SPMD mesh (dp_mesh_dims)" in line and "tensor parallel" not in line for line in said),
                        said)

    def test_nothing_to_serve_is_said(self) -> None:
        """hpz_size=2 over a model no module of which reshards after forward (False everywhere: torchtitan's
        "never"): nothing for it to do, which the log says once a rank; hpZ serves nothing."""
        torch = self.torch
        base = build_model(torch)

        def body(rank: int) -> Any:
            model = shard(copy.deepcopy(base), 4, [False, False], root=False)
            zp = zpccl.fsdp.enable(model, block_size=BLOCK, ranks_per_node=2, hpz_size=2)
            train(torch, model, batches(torch, rank, 1))
            zp.disable()
            return zp.summary()

        said, summaries = self.said_by_every_rank(logging.INFO, "hpz_size=2 serves no module", body)
        self.assertTrue(all("hpz" not in s and s["qwz"]["calls"] > 0 for s in summaries), summaries)

    def test_a_shard_group_of_k_ranks_keeps_true_and_says_so(self) -> None:
        """One node of four with hpz_size=4: the post-forward group would be the shard group itself."""
        torch = self.torch
        base = build_model(torch)

        def body(rank: int) -> Any:
            model = shard(copy.deepcopy(base), 4, [True, True])
            zp = zpccl.fsdp.enable(model, block_size=BLOCK, ranks_per_node=4, hpz_size=4)
            train(torch, model, batches(torch, rank, 1))
            zp.disable()
            return zp.summary()

        said, summaries = self.said_by_every_rank(logging.INFO, "hpz_size=4 leaves modules ['blocks.0', 'blocks.1']",
                                                  body)
        self.assertTrue(all("hpz" not in s for s in summaries), summaries)


    def test_enable_on_an_inner_module_before_the_first_forward(self) -> None:
        """Blocks and model sharded with fully_shard's default (True but for the root, which FSDP sets to False at
        the first forward), and enable(hpz_size=2) on one block only: that block is not the root, whether enable
        runs before the first forward or after it, so its backward gathers are hpZ either way."""
        torch = self.torch
        base = build_model(torch)

        def body(rank: int, after_a_step: bool) -> Any:
            model = shard(copy.deepcopy(base), 4, [None, None])
            data = batches(torch, rank, STEPS + 1)
            if after_a_step:
                train(torch, model, data[:1])
            zp = zpccl.fsdp.enable(model.blocks[0], block_size=BLOCK, ranks_per_node=2, hpz_size=2)
            train(torch, model, data[1:])
            zp.disable()
            return {n: v["calls"] for n, v in zp.summary().items()}

        for after_a_step in (False, True):
            with self.subTest(after_a_step=after_a_step):
                for summary in run_threaded(4, lambda rank: body(rank, after_a_step)):
                    self.assertEqual(summary, {"qwz": STEPS, "hpz": STEPS, "qgz": STEPS})

    def test_set_reshard_after_forward_true_keeps_the_groups_of_k(self) -> None:
        """An evaluation between steps the way FSDP's docs show it (set_reshard_after_forward(False), a forward
        under no_grad, set_reshard_after_forward(True)): True after enable means hpz_size's groups of k again, as it
        did at enable, not FSDP's whole shard group. Every step's backward gathers stay hpZ, losses and trained
        weights bit-identical to the run without the evaluations, and the log says so once."""
        torch = self.torch
        base = build_model(torch)

        def body(rank: int, evaluate: bool) -> Any:
            model = shard(copy.deepcopy(base), 4, [True, True])
            zp = zpccl.fsdp.enable(model, block_size=BLOCK, ranks_per_node=2, hpz_size=2)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            losses = []
            for ids in batches(torch, rank, STEPS):
                if evaluate:
                    model.set_reshard_after_forward(False)
                    with torch.no_grad():
                        model(ids)
                    model.set_reshard_after_forward(True)
                loss = next_token_loss(torch, model(ids), ids)
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(loss.item())
            zp.disable()
            return losses, local_params(model), {n: v["calls"] for n, v in zp.summary().items()}

        plain = run_threaded(4, lambda rank: body(rank, False))
        said, evaluated = self.said_by_every_rank(logging.INFO, "hpz_size=2 keeps module",
                                                  lambda rank: body(rank, True))
        for rank, (a, b) in enumerate(zip(plain, evaluated)):
            self.assertEqual(b[2]["hpz"], 2 * STEPS, f"rank {rank}: {b[2]}")
            self.assertEqual(a[0], b[0], f"rank {rank}: losses")
            self.assertTrue(all(torch.equal(x, y) for x, y in zip(a[1], b[1])), f"rank {rank}: weights")

    def test_set_reshard_after_forward_true_over_an_int_is_said(self) -> None:
        """Blocks sharded with reshard_after_forward=2 (no hpz_size), toggled around an evaluation: FSDP's
        set_reshard_after_forward takes only a bool, and its True puts the blocks on the whole shard group, which
        zpccl follows (qwZ backward gathers, as FSDP alone would gather them over the whole group). That loss of
        hpZ is said once, naming the modules and hpz_size, which keeps k through the same toggle."""
        torch = self.torch
        base = build_model(torch)

        def body(rank: int) -> Any:
            model = shard(copy.deepcopy(base), 4, [2, 2])
            zp = zpccl.fsdp.enable(model, block_size=BLOCK, ranks_per_node=2)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            for ids in batches(torch, rank, STEPS):
                model.set_reshard_after_forward(False)
                with torch.no_grad():
                    model(ids)
                model.set_reshard_after_forward(True)
                next_token_loss(torch, model(ids), ids).backward()
                opt.step()
                opt.zero_grad()
            zp.disable()
            return {n: v["calls"] for n, v in zp.summary().items()}

        said, summaries = self.said_by_every_rank(logging.WARNING, "set_reshard_after_forward(True)", body)
        # Said at the first backward gather that follows such a reshard: the last block's.
        self.assertTrue(all("'blocks.1'" in line and "hpz_size=2" in line for line in said), said)
        self.assertTrue(all("hpz" not in s for s in summaries), summaries)

    def test_set_reshard_after_forward_true_on_the_root_is_said(self) -> None:
        """hpz_size=2 over blocks sharded with True and a root left at its default (False: no post-forward group
        when enable runs), then set_reshard_after_forward(True) on the whole model, as FSDP's docs suggest for the
        root: the blocks keep their groups of 2, the root takes FSDP's whole shard group (qwZ backward gathers), and
        the log says so once, naming the root and what gives it hpZ."""
        torch = self.torch
        base = build_model(torch)

        def body(rank: int) -> Any:
            model = shard(copy.deepcopy(base), 4, [True, True])
            zp = zpccl.fsdp.enable(model, block_size=BLOCK, ranks_per_node=2, hpz_size=2)
            data = batches(torch, rank, STEPS)
            train(torch, model, data[:1])
            model.set_reshard_after_forward(True)
            train(torch, model, data[1:])
            zp.disable()
            return {n: v["calls"] for n, v in zp.summary().items()}

        said, summaries = self.said_by_every_rank(logging.WARNING, "set_reshard_after_forward(True)", body)
        self.assertTrue(all("the model" in line and "call enable after" in line for line in said), said)
        # Blocks: hpZ every step; the root: its backward gathers, from the second step on, qwZ.
        self.assertEqual(summaries, [{"qwz": 3 * STEPS + STEPS - 1, "hpz": 2 * STEPS, "qgz": 3 * STEPS}] * 4)

    def test_parameters_sharded_on_another_dim_keep_true_and_say_so(self) -> None:
        """A module whose shard_placement_fn shards a parameter on dim 1: FSDP's reshard to a smaller group fails
        in the backward for it (FSDP alone, with reshard_after_forward=2, raises there), so hpz_size leaves it at
        True and says why; the model trains on qwZ and qgZ, its losses within the bound of FSDP's own run."""
        torch = self.torch
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor import Shard

        base = build_model(torch)

        def dim1(p: Any) -> Any:
            return Shard(1) if p.ndim == 2 and p.shape[1] % 4 == 0 else None

        def body(rank: int) -> Any:
            data = batches(torch, rank, 2)
            out = []
            for use_zpccl in (False, True):
                model = copy.deepcopy(base)
                mesh = cpu_mesh((4,))
                fully_shard(model.blocks[0], mesh=mesh, shard_placement_fn=dim1)
                fully_shard(model.blocks[1], mesh=mesh)
                fully_shard(model, mesh=mesh)
                zp = zpccl.fsdp.enable(model, block_size=BLOCK, ranks_per_node=2, hpz_size=2) if use_zpccl else None
                out.append(train(torch, model, data))
                if zp is not None:
                    zp.disable()
                    out.append(zp.summary())
            return out

        said, results = self.said_by_every_rank(logging.WARNING, "hpz_size=2 leaves modules ['blocks.0']", body)
        self.assertTrue(all("Shard(1)" in line for line in said), said)
        for rank, (plain, losses, summary) in enumerate(results):
            # blocks.1 is hpZ's; blocks.0 gathers forward and backward over the shard group.
            self.assertEqual({n: v["calls"] for n, v in summary.items()}, {"qwz": 8, "hpz": 2, "qgz": 6})
            for a, b in zip(plain, losses):
                self.assertLess(abs(a - b) / a, 0.01, f"rank {rank}: loss {b} vs FSDP's {a}")


if __name__ == "__main__":
    unittest.main()
