"""The README's recipes for Accelerate and Lightning, run as written on the CPU with four thread-ranks as two nodes
of two: the framework shards the model with FSDP2 (``reshard_after_forward=True``, all they offer or the user's
choice), zpccl.fsdp.enable is called where the recipe says, and ``hpz_size=2`` gives the blocks hpZ. Each against
the same recipe without zpccl: losses within 1% at every step, every path served. Skipped without the framework
(CI installs it) or without torch 2.12 or later."""
from __future__ import annotations

import contextlib
import copy
import os
import unittest
import warnings
from typing import Any, Callable, Iterator

from . import ci_installs
from ._foreign import quiet_loggers
from ._threaded import run_threaded
from .test_fsdp import BLOCK, batches, build_model, next_token_loss, torch_for_threads

WORLD, STEPS, LAYERS = 4, 3, 2
ZPCCL = dict(ranks_per_node=2, hpz_size=2, block_size=BLOCK)


def lm_loss(torch: Any, model: Any, ids: Any) -> Any:
    return next_token_loss(torch, model(ids), ids)


def fsdp_groups(model: Any) -> int:
    """How many FSDP parameter groups the model holds (each gathered once a forward, reduced once a step)."""
    from zpccl.fsdp._torch_fsdp import fsdp_modules, param_groups

    return sum(len(param_groups(m)) for _name, m in fsdp_modules(model))


@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Recipe(unittest.TestCase):
    def compare(self, run: Callable[[int, bool], tuple[list[float], Any, int]], forwards: int = STEPS) -> None:
        """``run(rank, zpccl_on)`` -> (losses, zpccl's summary, FSDP parameter groups); both ways on WORLD
        thread-ranks. ``forwards``: the forwards each rank runs, STEPS of them training."""
        theirs = run_threaded(WORLD, lambda rank: run(rank, False))
        ours = run_threaded(WORLD, lambda rank: run(rank, True))
        for rank, ((a, none, _), (b, summary, groups)) in enumerate(zip(theirs, ours)):
            self.assertIsNone(none)
            self.assertEqual(len(a), STEPS)
            for step, (x, y) in enumerate(zip(a, b)):
                self.assertLess(abs(x - y) / x, 0.01, f"rank {rank} step {step}: loss {y} vs FSDP's {x}")
            calls = {k: v["calls"] for k, v in summary.items()}
            self.assertEqual(calls, {"qwz": groups * forwards, "hpz": LAYERS * STEPS, "qgz": groups * STEPS},
                             f"rank {rank}")


class AccelerateRecipe(Recipe):
    @classmethod
    def setUpClass(cls) -> None:
        cls.torch = torch_for_threads()
        try:
            import accelerate  # noqa: F401
        except ImportError:
            raise unittest.SkipTest(f"accelerate is not installed ({ci_installs('accelerate')})") from None

    @contextlib.contextmanager
    def thread_ranks(self) -> Iterator[None]:
        """Accelerate's states are process-wide singletons: their thread-local kind (Accelerate's own, made for
        XLA's thread-ranks) gives each thread-rank its own. Its CPU set-up reads the launch from the environment
        (the ranks themselves come from the process group)."""
        from accelerate.state import AcceleratorState, GradientState, PartialState, ThreadLocalSharedDict

        states = (PartialState, AcceleratorState, GradientState)
        saved = [c.__dict__["_shared_state"] for c in states]
        for c in states:
            c._shared_state = ThreadLocalSharedDict()
        try:
            with environment(WORLD_SIZE=str(WORLD), RANK="0", LOCAL_RANK="0", LOCAL_WORLD_SIZE=str(WORLD),
                             MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", OMP_NUM_THREADS="1"):
                yield
        finally:
            for c, s in zip(states, saved):
                c._shared_state = s

    def test_fsdp2_plugin_then_enable_after_prepare(self) -> None:
        """README's recipe: FullyShardedDataParallelPlugin(fsdp_version=2) shards the blocks (its
        reshard_after_forward is a bool), accelerator.prepare(model, optimizer), then zpccl.fsdp.enable(model,
        hpz_size=2). Accelerate turns its FSDP plugin on only on accelerators (AcceleratorState: MULTI_GPU,
        MULTI_NPU, ...), never on MULTI_CPU; on the CPU the test sets the distributed type Accelerate sets there,
        so that prepare() shards the model as it does on GPUs."""
        torch = self.torch
        import zpccl.fsdp
        from accelerate import Accelerator
        from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

        base = build_model(torch, layers=LAYERS)

        def run(rank: int, on: bool) -> tuple[list[float], Any, int]:
            plugin = FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward=True,
                                                    auto_wrap_policy="transformer_based_wrap",
                                                    transformer_cls_names_to_wrap=["Block"])
            accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
            accelerator.state.distributed_type, accelerator.state.fsdp_plugin = DistributedType.FSDP, plugin
            model = copy.deepcopy(base)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
            model, optimizer = accelerator.prepare(model, optimizer)
            zp = zpccl.fsdp.enable(model, **ZPCCL) if on else None
            losses = []
            for ids in batches(torch, rank, STEPS):
                loss = lm_loss(torch, model, ids)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
                losses.append(loss.item())
            if zp is None:
                return losses, None, 0
            zp.disable()
            return losses, zp.summary(), fsdp_groups(model)

        with self.thread_ranks():
            self.compare(run)

    def test_accumulate_and_save_state_load_state(self) -> None:
        """The recipe with gradient accumulation over two microbatches (``accelerator.accumulate``, which calls
        FSDP2's set_requires_gradient_sync(False) outside the step's last microbatch: no reduce-scatter there),
        ``save_state`` after two optimizer steps, and ``load_state`` into a fresh Accelerator, model and optimizer
        with zpccl enabled again: losses within 1% of the recipe without zpccl, a qgZ call per group and optimizer
        step, and the resumed losses bit for bit those of the uninterrupted run. The FSDP distributed type is set on
        PartialState too: AcceleratorState copies it from there whenever it is made again (prepare does), and
        ``accumulate`` reads it."""
        torch = self.torch
        import tempfile

        import zpccl.fsdp
        from accelerate import Accelerator
        from accelerate.state import PartialState
        from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

        base = build_model(torch, layers=LAYERS)
        folder = tempfile.TemporaryDirectory()
        self.addCleanup(folder.cleanup)

        def prepared(on: bool) -> tuple[Any, Any, Any, Any]:
            plugin = FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward=True,
                                                    auto_wrap_policy="transformer_based_wrap",
                                                    transformer_cls_names_to_wrap=["Block"])
            accelerator = Accelerator(cpu=True, fsdp_plugin=plugin, gradient_accumulation_steps=2)
            accelerator.state.distributed_type, accelerator.state.fsdp_plugin = DistributedType.FSDP, plugin
            PartialState().distributed_type = DistributedType.FSDP
            model = copy.deepcopy(base)
            model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
            return accelerator, model, optimizer, zpccl.fsdp.enable(model, **ZPCCL) if on else None

        def steps(accelerator: Any, model: Any, optimizer: Any, data: list[Any]) -> list[float]:
            losses = []
            for ids in data:
                with accelerator.accumulate(model):
                    loss = lm_loss(torch, model, ids)
                    accelerator.backward(loss)
                    optimizer.step()
                    optimizer.zero_grad()
                losses.append(loss.item())
            return losses

        def run(rank: int, on: bool) -> tuple[list[float], Any, int]:
            data = batches(torch, rank, 2 * STEPS)
            accelerator, model, optimizer, zp = prepared(on)
            losses = steps(accelerator, model, optimizer, data)
            if zp is None:
                return losses, None, 0
            zp.disable()
            return losses, zp.summary(), fsdp_groups(model)

        def resumed(rank: int) -> tuple[list[float], list[float]]:
            data = batches(torch, rank, 2 * STEPS)
            accelerator, model, optimizer, zp = prepared(True)
            whole = steps(accelerator, model, optimizer, data[:4])
            accelerator.save_state(folder.name)
            whole += steps(accelerator, model, optimizer, data[4:])
            zp.disable()
            accelerator, model, optimizer, zp = prepared(True)
            accelerator.load_state(folder.name)
            again = steps(accelerator, model, optimizer, data[4:])
            zp.disable()
            return whole[4:], again

        with self.thread_ranks():
            theirs = run_threaded(WORLD, lambda rank: run(rank, False))
            ours = run_threaded(WORLD, lambda rank: run(rank, True))
            restarts = run_threaded(WORLD, resumed)
        for rank, ((a, _, _), (b, summary, groups), (whole, again)) in enumerate(zip(theirs, ours, restarts)):
            self.assertEqual(len(a), 2 * STEPS)
            for step, (x, y) in enumerate(zip(a, b)):
                self.assertLess(abs(x - y) / x, 0.01, f"rank {rank} microbatch {step}: loss {y} vs FSDP's {x}")
            calls = {k: v["calls"] for k, v in summary.items()}
            self.assertEqual(calls, {"qwz": groups * 2 * STEPS, "hpz": LAYERS * 2 * STEPS, "qgz": groups * STEPS})
            self.assertEqual(again, whole, f"rank {rank}: resumed losses")


class LightningRecipe(Recipe):
    @classmethod
    def setUpClass(cls) -> None:
        cls.torch = torch_for_threads()
        try:
            import lightning  # noqa: F401
        except ImportError:
            raise unittest.SkipTest(f"lightning is not installed ({ci_installs('lightning')})") from None

    def test_model_parallel_strategy_then_enable_on_fit_start(self) -> None:
        """README's recipe: ModelParallelStrategy(data_parallel_size=world, tensor_parallel_size=1), fully_shard in
        configure_model, zpccl.fsdp.enable(self.model, hpz_size=2) in on_fit_start (after Lightning has
        materialized and placed the model), disable in on_fit_end. Thread-ranks tell Lightning their ranks
        through a ClusterEnvironment of their own (Lightning's read the process environment)."""
        self.fit(validate=False)

    def test_the_recipe_with_a_validation_loop(self) -> None:
        """The same recipe with a validation_step and its data: Lightning validates at the end of the epoch, after
        the last training step and before on_fit_end, a forward without gradients that leaves the blocks in their
        shard of hpz_size's group; on_fit_end's disable() takes them back. The validation losses within 1% of the
        recipe's without zpccl."""
        self.fit(validate=True)

    def fit(self, validate: bool) -> None:
        torch = self.torch
        import lightning as L
        import zpccl.fsdp
        from lightning.fabric.plugins.environments import ClusterEnvironment
        from lightning.pytorch.strategies import ModelParallelStrategy
        from torch.distributed.fsdp import fully_shard

        base = build_model(torch, layers=LAYERS)
        dist = torch.distributed

        class ThreadRanks(ClusterEnvironment):
            creates_processes_externally = True
            main_address, main_port = "127.0.0.1", 0

            @staticmethod
            def detect() -> bool:
                return True

            def world_size(self) -> int:
                return dist.get_world_size()

            def set_world_size(self, size: int) -> None:
                pass

            def global_rank(self) -> int:
                return dist.get_rank()

            def set_global_rank(self, rank: int) -> None:
                pass

            def local_rank(self) -> int:
                return dist.get_rank()

            def node_rank(self) -> int:
                return 0

        class Model(L.LightningModule):
            def __init__(self, rank: int, on: bool) -> None:
                super().__init__()
                self.model, self.rank, self.on = copy.deepcopy(base), rank, on
                self.losses: list[float] = []
                self.validated: list[float] = []
                self.zp: Any = None

            def configure_model(self) -> None:
                mesh = self.device_mesh["data_parallel"]
                for block in self.model.blocks:
                    fully_shard(block, mesh=mesh)
                fully_shard(self.model, mesh=mesh)

            def on_fit_start(self) -> None:
                if self.on:
                    self.zp = zpccl.fsdp.enable(self.model, **ZPCCL)

            def on_fit_end(self) -> None:
                if self.zp is not None:
                    self.zp.disable()

            def training_step(self, ids: Any, index: int) -> Any:
                loss = lm_loss(torch, self.model, ids)
                self.losses.append(loss.item())
                return loss

            def validation_step(self, ids: Any, index: int) -> None:
                self.validated.append(lm_loss(torch, self.model, ids).item())

            def configure_optimizers(self) -> Any:
                return torch.optim.AdamW(self.parameters(), lr=1e-2)

            def train_dataloader(self) -> Any:
                return torch.utils.data.DataLoader(torch.cat(batches(torch, self.rank, STEPS)), batch_size=4)

        validated: dict[tuple[int, bool], list[float]] = {}

        def run(rank: int, on: bool) -> tuple[list[float], Any, int]:
            module = Model(rank, on)
            if validate:
                module.val_dataloader = lambda: torch.utils.data.DataLoader(batches(torch, rank + WORLD, 1)[0],
                                                                            batch_size=4)
            trainer = L.Trainer(accelerator="cpu", devices=WORLD, plugins=[ThreadRanks()], max_steps=STEPS,
                                strategy=ModelParallelStrategy(data_parallel_size=WORLD, tensor_parallel_size=1),
                                logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, use_distributed_sampler=False, num_sanity_val_steps=0)
            trainer.fit(module)
            validated[rank, on] = module.validated
            summary = module.zp.summary() if module.zp else None
            return module.losses, summary, fsdp_groups(module.model)

        with quiet_loggers("lightning.pytorch", "lightning.fabric"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Lightning's deprecation notes about torch's pytree
            self.compare(run, forwards=STEPS + validate)
        for rank in range(WORLD):
            theirs, ours = validated[rank, False], validated[rank, True]
            self.assertEqual((len(theirs), len(ours)), (int(validate), int(validate)))
            for x, y in zip(theirs, ours):
                self.assertLess(abs(x - y) / x, 0.01, f"rank {rank}: validation loss {y} vs FSDP's {x}")


if __name__ == "__main__":
    unittest.main()
