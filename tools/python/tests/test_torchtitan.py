"""zpccl.torchtitan: torchtitan's configs, named on its own command line (``--module zpccl.torchtitan --config
...``), with zpccl.fsdp enabled on every model part by the post_optimizer_build_fn hook. On the CPU, torchtitan's
trainer runs its Llama 3 debug model on four thread-ranks as two nodes of two (what the CPU needs that torchtitan
does not give it: tests/_titan.py), and its losses track torchtitan's own run. The GPU test spawns ranks on two
GPUs. Skipped without torchtitan (0.3), without torch 2.12 or later (ranks as threads), or on a torch that lacks
what torchtitan 0.3 calls (tests/_titan.py)."""
from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
import re
import unittest
from unittest import mock
from typing import Any

from . import _foreign, _titan
from ._threaded import run_threaded
from .test_fsdp import torch_for_threads

TITAN = ["--module", "zpccl.torchtitan", "--config", "llama3_debugmodel"]
STEPS, MICROBATCHES, LAYERS = 3, 2, 6  # SMALL's steps; global batch 8 of 4 ranks x 1: two microbatches a step
ACCUMULATE = ["--training.global_batch_size", "8"]


def _parse(argv: list[str]) -> Any:
    from torchtitan.config import ConfigManager

    with _titan.quiet():
        return ConfigManager().parse_args(list(argv))


class TorchtitanConfigs(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.torch = torch_for_threads()
        _titan.torchtitan_or_skip()

    def test_the_command_line_wraps_torchtitans_config(self) -> None:
        """``--module zpccl.torchtitan --config llama3_debugmodel``: torchtitan's config with a ``zpccl`` section
        that the command line sets, and a hook that enables zpccl after torchtitan's (none for llama3, the MoE
        load-balancing hook for qwen3). Making the config again (as ``build`` does) does not stack hooks."""
        import zpccl
        import zpccl.torchtitan as zt
        from torchtitan.models.llama3.config_registry import llama3_debugmodel
        from torchtitan.trainer import Trainer

        config = _parse(TITAN + ["--zpccl.hpz_size", "2", "--zpccl.grad_bits", "8", "--training.steps", "7"])
        policy = zpccl.ZeroPlusPlusPolicy(hpz_size=2, grad_bits=8)
        self.assertIsInstance(config, Trainer.Config)
        self.assertEqual((config.zpccl, config.training.steps), (policy, 7))
        self.assertEqual((config.model_spec.name, config.model_spec.flavor), ("llama3", "debugmodel"))
        with _titan.quiet():
            stock = llama3_debugmodel()
        self.assertEqual(config.model_spec.model.to_dict().keys(), stock.model_spec.model.to_dict().keys())
        self.assertEqual(config.model_spec.post_optimizer_build_fn, zt.EnableZpccl(policy, None))
        again = dataclasses.replace(config, zpccl=zpccl.ZeroPlusPlusPolicy(weight_bits=4))
        self.assertEqual(again.model_spec.post_optimizer_build_fn,
                         zt.EnableZpccl(zpccl.ZeroPlusPlusPolicy(weight_bits=4), None))
        self.assertEqual(config.model_spec.post_optimizer_build_fn, zt.EnableZpccl(policy, None))
        self.assertEqual(again.to_dict()["zpccl"], dataclasses.asdict(again.zpccl))

        from torchtitan.models.qwen3.config_registry import qwen3_debugmodel

        with _titan.quiet():
            theirs = qwen3_debugmodel().model_spec.post_optimizer_build_fn
        self.assertIsNotNone(theirs)
        for name in ("qwen3_debugmodel", "qwen3.qwen3_debugmodel"):
            hook = _parse(["--module", "zpccl.torchtitan", "--config", name]).model_spec.post_optimizer_build_fn
            self.assertEqual(hook, zt.EnableZpccl(zpccl.ZeroPlusPlusPolicy(), theirs), name)

    def test_wrong_options_and_names_are_refused(self) -> None:
        err = io.StringIO()
        with self.assertRaises(SystemExit), contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
            _parse(TITAN + ["--zpccl.hpz_size", "1"])
        self.assertIn("hpz_size 1 must be an int of at least 2", " ".join(err.getvalue().split()))
        err = io.StringIO()
        with self.assertRaises(SystemExit), contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
            _parse(TITAN + ["--zpccl.weight_bits", "None", "--zpccl.grad_bits", "None"])
        both = "weight_bits and grad_bits (--zpccl.weight_bits, --zpccl.grad_bits) are both None"
        self.assertIn(both, " ".join(err.getvalue().split()))
        with self.assertLogs("zpccl.torchtitan", logging.ERROR) as logs, self.assertRaises(ValueError):
            _parse(["--module", "zpccl.torchtitan", "--config", "llama3.no_such_config"])
        self.assertIn("no config function 'no_such_config' in torchtitan.models.llama3.config_registry",
                      logs.output[0])
        import zpccl.torchtitan as zt

        with self.assertRaisesRegex(TypeError, "zpccl.torchtitan.wrap: config must be a torchtitan trainer config"):
            zt.wrap(object())
        with self.assertRaisesRegex(ValueError, "zpccl.torchtitan.wrap: block_size 100 must be"):
            zt.wrap(_parse(TITAN), block_size=100)
        with self.assertRaisesRegex(ValueError, re.escape(both)):
            zt.wrap(_parse(TITAN), weight_bits=None, grad_bits=None)

    def test_wrap_leaves_the_config_and_runs_the_hook_it_had_first(self) -> None:
        """wrap() copies the model spec; the hook runs the config's own hook, then enables zpccl on every model
        part that FSDP shards over several ranks, saying why it leaves the others."""
        import torch
        import zpccl
        import zpccl.fsdp
        import zpccl.torchtitan as zt
        from torch.distributed.fsdp import fully_shard
        from torchtitan.models.llama3.config_registry import llama3_debugmodel

        calls: list[Any] = []
        with _titan.quiet():
            plain = llama3_debugmodel()
        plain.model_spec.post_optimizer_build_fn = lambda *args: calls.append(args)
        theirs = plain.model_spec.post_optimizer_build_fn
        wrapped = zt.wrap(plain, block_size=64)
        self.assertIs(plain.model_spec.post_optimizer_build_fn, theirs)
        self.assertEqual(wrapped.zpccl, zpccl.ZeroPlusPlusPolicy(block_size=64))
        self.assertEqual(zt.wrap(wrapped).zpccl, wrapped.zpccl)  # wrapping again keeps the policy, one hook
        self.assertIs(zt.wrap(wrapped, grad_bits=8).model_spec.post_optimizer_build_fn.previous, theirs)
        hook = wrapped.model_spec.post_optimizer_build_fn

        def body(rank: int) -> list[Any]:
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("two", "one"))
            parts = [torch.nn.Linear(64, 64), fully_shard(torch.nn.Linear(64, 64), mesh=mesh["one"]),
                     fully_shard(torch.nn.Linear(64, 64), mesh=mesh["two"])]
            hook("optimizers", parts, "dims")
            handles = [zpccl.fsdp.session_of(p) for p in parts]
            for h in handles:
                if h is not None:
                    h.disable()
            return [h is not None for h in handles]

        with self.assertLogs("zpccl.torchtitan", logging.INFO) as logs:
            served = run_threaded(2, body)
        self.assertEqual(served, [[False, False, True]] * 2)
        self.assertEqual(len(calls), 2)
        self.assertTrue(all(c[0] == "optimizers" and c[2] == "dims" and len(c[1]) == 3 for c in calls))
        said = " ".join(logs.output)
        self.assertEqual(said.count("model part 0 (Linear) has no fully_shard-ed module"), 2, said)
        self.assertEqual(said.count("model part 1 (Linear) is sharded over one rank"), 2, said)

    def test_a_hook_chained_onto_a_wrapped_config_runs_zpccl_once(self) -> None:
        """A user chains a hook of their own onto a wrapped config's post_optimizer_build_fn (calling the one it
        replaces, zpccl's), then torchtitan makes the config again (``build`` does ``replace(self)``), which wraps
        that chain in zpccl's hook once more: the chain reaches zpccl's hook twice. zpccl serves each model part
        once and the user's hook runs once; a second hook with another policy is refused, naming both."""
        import torch
        import zpccl
        import zpccl.fsdp
        from torch.distributed.fsdp import fully_shard

        config = _parse(TITAN + ["--zpccl.block_size", "64"])
        theirs = config.model_spec.post_optimizer_build_fn
        mine: list[int] = []

        def chained(optimizers: Any, model_parts: list[Any], parallel_dims: Any) -> None:
            theirs(optimizers, model_parts, parallel_dims)
            mine.append(1)

        config.model_spec.post_optimizer_build_fn = chained
        built = dataclasses.replace(config)  # what Trainer.Config.build() does before it makes the trainer
        other = dataclasses.replace(config, zpccl=zpccl.ZeroPlusPlusPolicy(block_size=128))

        def body(rank: int) -> list[Any]:
            part = fully_shard(torch.nn.Linear(64, 64))
            built.model_spec.post_optimizer_build_fn(None, [part], None)
            handle = zpccl.fsdp.session_of(part)
            served = (handle.policy.block_size, len(handle._served))
            handle.disable()
            try:
                other.model_spec.post_optimizer_build_fn(None, [part], None)
                refused = ""
            except zpccl.ZpcclError as e:
                refused = e.message
            finally:
                zpccl.fsdp.disable(part)
            return [served, refused]

        with self.assertLogs("zpccl.torchtitan", logging.INFO):
            out = run_threaded(2, body)
        self.assertEqual(len(mine), 4)  # two ranks, two hooks run each
        for served, refused in out:
            self.assertEqual(served, (64, 1))
            self.assertIn("model part 0 (Linear) is already served by zpccl", refused)
            self.assertIn("block_size=64", refused)
            self.assertIn("block_size=128", refused)


class TorchtitanTraining(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.torch = torch_for_threads()
        _titan.torchtitan_or_skip()

    def test_llama3_debugmodel_tracks_torchtitans_own_run(self) -> None:
        """torchtitan's trainer, its Llama 3 debug model (SDPA), two microbatches a step, 4 ranks as 2 nodes of 2:
        torchtitan's own run, and two with ``--module zpccl.torchtitan --zpccl.hpz_size 2``. Under torchtitan's
        default SPMD backend FSDP reshards to no smaller group, so the backward gathers are qwZ and the log says
        why; under ``--parallelism.spmd_backend partial_dtensor`` they are hpZ, a call per resharded module
        (the embedding and the layers) and microbatch, and hpZ moves the very bits qwZ gathered: the same losses.
        Losses within 1% of torchtitan's at every step; torchtitan's divide factor 1.0 served by qgZ."""
        base = _titan.parse(["--module", "llama3", "--config", "llama3_debugmodel", *_titan.SMALL, *ACCUMULATE])
        _titan.force_sum(base)
        weights = _titan.reference_weights(base)
        theirs = _titan.train(base, 4, weights)
        ours = TITAN + _titan.SMALL + ACCUMULATE + ["--zpccl.hpz_size", "2", "--zpccl.ranks_per_node", "2"]
        with self.assertLogs("zpccl", logging.WARNING) as logs:
            spmd = _titan.train(_titan.parse(ours), 4, weights)
        said = [line for line in logs.output if "SPMD mesh (dp_mesh_dims)" in line]
        self.assertEqual(len(said), 4, logs.output)
        said = [line for line in logs.output if "--parallelism.spmd_backend partial_dtensor shards it" in line]
        self.assertEqual(len(said), 4, logs.output)
        hpz = _titan.train(_titan.parse(ours + ["--parallelism.spmd_backend", "partial_dtensor"]), 4, weights)
        for rank in range(4):
            base_losses = theirs[rank]["losses"]
            self.assertEqual(len(base_losses), STEPS)
            self.assertEqual(theirs[rank]["summaries"], [None])
            self.assertEqual(spmd[rank]["losses"], hpz[rank]["losses"], f"rank {rank}")
            for step, (a, b) in enumerate(zip(base_losses, hpz[rank]["losses"])):
                self.assertLess(abs(a - b) / a, 0.01, f"rank {rank} step {step}: loss {b} vs torchtitan's {a}")
            (s,), (h,) = spmd[rank]["summaries"], hpz[rank]["summaries"]
            self.assertEqual(set(s), {"qwz", "qgz"})
            self.assertEqual(set(h), {"qwz", "hpz", "qgz"})
            self.assertEqual(h["hpz"]["calls"], (1 + LAYERS) * MICROBATCHES * STEPS)
            self.assertEqual(s["qwz"]["calls"], h["qwz"]["calls"] + h["hpz"]["calls"])
            self.assertEqual(s["qgz"], h["qgz"])
            self.assertGreaterEqual(h["qgz"]["calls"], (2 + LAYERS) * MICROBATCHES * STEPS)
        self.assertTrue(all(r["summaries"] == hpz[0]["summaries"] for r in hpz))

    def test_the_readme_command_warns_of_nothing_the_user_cannot_change(self) -> None:
        """README's command (``--parallelism.spmd_backend partial_dtensor --zpccl.hpz_size 2``, torchtitan's
        default resharding; 4 ranks as 2 nodes of 2) warns of nothing: hpz_size serves every module torchtitan
        reshards. torchtitan's chunked loss calls ``set_reshard_after_forward(False)``, ``unshard()``, then
        ``set_reshard_after_forward(True)`` and ``reshard()`` on its ``[norm, lm_head]`` group inside every step,
        outside any forward, so that group's backward gather is over the whole shard group whatever its
        post-forward group: nothing is lost to hpZ there, and no call the user makes could change it (zpccl.fsdp
        warns that set_reshard_after_forward(True) cost the module hpZ and asks for enable after it)."""
        argv = TITAN + _titan.SMALL + ["--training.steps", "2", "--parallelism.spmd_backend", "partial_dtensor",
                                        "--zpccl.hpz_size", "2", "--zpccl.ranks_per_node", "2"]
        config = _titan.parse(argv)
        with self.assertLogs("zpccl", logging.INFO) as logs:
            out = _titan.train(config, 4, _titan.reference_weights(config))
        warned = [line for line in logs.output if line.startswith("WARNING")]
        self.assertEqual(warned, [])
        for rank in out:
            (s,) = rank["summaries"]
            self.assertEqual(s["hpz"]["calls"], (1 + LAYERS) * 2)

    def test_hpz_size_under_always_survives_the_chunked_loss(self) -> None:
        """``--parallelism.fsdp_reshard_after_forward always --zpccl.hpz_size 2`` (partial_dtensor, 4 ranks as 2
        nodes of 2): every module, the ``[norm, lm_head]`` group too, is sharded with True, so hpz_size gives each
        a post-forward group of 2. torchtitan's chunked loss runs lm_head apart from the model's forward: the
        root's post-forward reshards the group to its post-forward shard (norm ran, lm_head did not), then the loss
        calls ``lm_head.set_reshard_after_forward(False)`` and ``lm_head.unshard()``, which FSDP gathers over the
        post-forward mesh it has just dropped (AssertionError in FSDP: "Expected mesh_info to be FSDPMeshInfo").
        After its chunks the loss sets True again, which is FSDP's whole-group mesh, not hpz_size's. What must hold:
        the run trains, its losses within 1% of torchtitan's own run under ``always``, and no post-forward reshard
        of any step is to the whole shard group (no silent loss of hpZ: hpz_size puts k back before FSDP reads it)."""
        always = ["--parallelism.spmd_backend", "partial_dtensor", "--parallelism.fsdp_reshard_after_forward",
                  "always"]
        base = _titan.parse(["--module", "llama3", "--config", "llama3_debugmodel", *_titan.SMALL, *always])
        _titan.force_sum(base)
        weights = _titan.reference_weights(base)
        theirs = _titan.train(base, 4, weights)
        ours = TITAN + _titan.SMALL + always + ["--zpccl.hpz_size", "2", "--zpccl.ranks_per_node", "2"]
        given, lost = [0] * 4, [0] * 4  # per rank: groups given hpz_size's mesh; post-forward reshards to the whole
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

        from zpccl.fsdp._state import ZeroPlusPlus

        disable, reshard = ZeroPlusPlus.disable, FSDPParamGroup.reshard

        def count_then_disable(handle: Any) -> None:  # _titan.train disables zpccl, which puts FSDP's meshes back
            given[self.torch.distributed.get_rank()] = sum(s.post_forward is not None for s in handle._served)
            disable(handle)

        def counted_reshard(pg: Any) -> None:
            info = pg.post_forward_mesh_info
            if pg._training_state.name == "FORWARD" and info is not None and info == pg.mesh_info:
                lost[self.torch.distributed.get_rank()] += 1
            reshard(pg)

        with mock.patch.object(ZeroPlusPlus, "disable", count_then_disable), \
                mock.patch.object(FSDPParamGroup, "reshard", counted_reshard):
            hpz = _titan.train(_titan.parse(ours), 4, weights)
        for rank in range(4):
            self.assertEqual(given[rank], 1 + LAYERS + 1, f"rank {rank}: groups given hpz_size's post-forward mesh")
            self.assertEqual(lost[rank], 0, f"rank {rank}: post-forward reshards to the whole shard group")
            for step, (a, b) in enumerate(zip(theirs[rank]["losses"], hpz[rank]["losses"])):
                self.assertLess(abs(a - b) / a, 0.01, f"rank {rank} step {step}: loss {b} vs torchtitan's {a}")
            (h,) = hpz[rank]["summaries"]
            self.assertGreaterEqual(h["hpz"]["calls"], (1 + LAYERS) * STEPS)


def _gpu_worker(argv: list[str], weights: dict[str, Any]) -> list[float]:
    """One rank on its own GPU (zpccl.launch's rendezvous in the environment): torchtitan's trainer from the
    command line, the stand-in data of tests/_titan.py, the reference weights; its logged losses."""
    import torch.distributed as dist

    import zpccl.fsdp

    config = _titan.parse(argv, sdpa=False)
    trainer = config.build()
    for part in trainer.model_parts:
        _foreign.load(part, {k: v.cuda() for k, v in weights.items()})
    losses: list[float] = []
    log = trainer.metrics_processor.log
    trainer.metrics_processor.log = lambda step, loss, *a, **k: (losses.append(loss), log(step, loss, *a, **k))[1]
    trainer.train()
    for part in trainer.model_parts:
        zpccl.fsdp.disable(part)
    trainer.close()
    dist.destroy_process_group()
    return losses


class TorchtitanOnGpus(unittest.TestCase):
    def test_llama3_debugmodel_tracks_torchtitans_own_run_on_two_gpus(self) -> None:
        """torchtitan's trainer in two spawned ranks on two GPUs (FlexAttention as torchtitan configures it), with
        and without zpccl: the same losses within 1% at every step."""
        from ._threaded import torch_with_fsdp2

        torch = torch_with_fsdp2()
        if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
            self.skipTest("needs two CUDA GPUs")
        _titan.torchtitan_or_skip()
        import zpccl
        import zpccl.launch

        zpccl.launch.set_default_env()
        os.environ.setdefault("ZPCCL_LIBRARY", zpccl.library_path())
        small = _titan.SMALL + ["--training.seq_len", "256"]
        base = ["--module", "llama3", "--config", "llama3_debugmodel", *small]
        weights = _titan.reference_weights(_titan.parse(base, sdpa=False))
        try:
            theirs = zpccl.launch.spawn(_gpu_worker, 2, base, weights)
            ours = zpccl.launch.spawn(_gpu_worker, 2, TITAN + small, weights)
        except zpccl.launch.RankFailed as e:
            self.fail(str(e))
        for rank, (a, b) in enumerate(zip(theirs, ours)):
            self.assertEqual(len(a), STEPS)
            for step, (x, y) in enumerate(zip(a, b)):
                self.assertLess(abs(x - y) / x, 0.01, f"rank {rank} step {step}: loss {y} vs torchtitan's {x}")


if __name__ == "__main__":
    unittest.main()
