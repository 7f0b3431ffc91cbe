"""zpccl.deepspeed on CUDA: DeepSpeed ZeRO-3 in spawned processes that share the visible GPUs as emulated nodes
over sockets (distinct NCCL_HOSTIDs, NCCL's P2P and shared memory off, as tools/python/examples/fsdp2_train.py
emulates them): two nodes of one rank, and two nodes of two with DeepSpeed's hpZ groups of two (two-hop qgZ), in
bf16 and in fp16 with DeepSpeed's loss scaler. Checks that every qwZ and qgZ call of the first step and the last
five equals the NumPy model bit for bit, that hpZ equals NCCL's exact all-gather over DeepSpeed's hpZ group, that
the gathered weights are bit-identical on every rank, that the persistent parameters' one-call regather equals
torch's own gather of their partitions, that every path was taken, and that a short training run tracks DeepSpeed's
own ZeRO-3. Skipped without a GPU or without DeepSpeed."""
from __future__ import annotations

import functools
import importlib.util
import os
import sys
import unittest
from typing import Any

from . import SOURCE_TREE
from ._gpu_runs import GatherChecks, train_checked
from .test_deepspeed import Exact

EXAMPLES = SOURCE_TREE / "tools" / "python" / "examples"
STEPS = 30


def _worker(nodes: int, hpz: int, dtype: str) -> None:
    """One rank (zpccl.launch's rendezvous in the environment)."""
    sys.path.insert(0, str(EXAMPLES))
    import argparse

    import deepspeed_train as dt
    import torch
    import torch.distributed as dist

    args = argparse.Namespace(cpu=False, nodes=nodes, layers=2, d_model=256, heads=4, seq=128, batch=8, lr=1e-3,
                              hpz=hpz, weight_bits=8, grad_bits=4, block_size=256, grad_block_size=None)
    where = dt.where_am_i(args)
    rank, world = where.rank, where.world
    data = dt.ex.Batches(torch, dt.ex.corpus(4 << 20), args.seq, args.batch, rank, where.device)
    losses: dict[str, float] = {}
    for comm in ("deepspeed", "zpccl"):
        engine, zp = make_engine(dt, torch, args, comm, where, dtype)
        gathers, checker = GatherChecks(torch), None
        if zp is not None:
            checker = Exact(torch, zp, [r // where.ranks_per_node for r in range(world)])
            calls, hpz_group = zp.collectives, zp.collectives.hpz_group
            qwz, hpz_call = calls.qwz, calls.hpz

            def on_qwz(input: Any, output: Any, parts: Any, _call: Any = qwz) -> None:
                _call(input, output, parts)
                gathers.qwz(output)

            def on_hpz(input: Any, output: Any, _call: Any = hpz_call) -> None:
                gathers.hpz(lambda: _call(input, output), input, output, hpz_group)

            calls.qwz, calls.hpz = on_qwz, on_hpz
        step = functools.partial(_engine_step, dt, torch, engine)
        losses[comm] = train_checked(torch, data, STEPS, checker, step)
        if zp is not None:
            summary = zp.summary()
            gathers.verify(world)
            want = {"qwz", "qgz", "persistent_gather"} | ({"hpz"} if hpz > 1 else set())
            assert want <= set(summary) and not [k for k in summary if k.startswith("deepspeed_")], summary
            # One a step that the loss scaler applied (a skipped fp16 step regathers nothing), for all of them.
            assert 1 <= summary["persistent_gather"]["calls"] <= STEPS, summary
            if engine.was_step_applied():
                persistent_exact(torch, engine)
            checked = checker.verify()
            assert min(checked.values()) >= 6, checked
            zp.disable()
        del step, engine  # the step holds it too
        torch.cuda.empty_cache()
    if rank == 0:
        print(f"\n{world} ranks as {nodes} nodes, hpZ {hpz}, {dtype}: last-10 loss DeepSpeed "
              f"{losses['deepspeed']:.4f}, zpccl {losses['zpccl']:.4f}", flush=True)
    gap = abs(losses["zpccl"] - losses["deepspeed"]) / losses["deepspeed"]
    assert gap < 0.02, f"mean loss of the last 10 steps: zpccl {losses['zpccl']:.4f}, DeepSpeed " \
                       f"{losses['deepspeed']:.4f}"
    dist.destroy_process_group()


def persistent_exact(torch: Any, engine: Any) -> None:
    """Every persistent parameter, as zpccl's regather after the last step left it, equals its partitions gathered
    by torch.distributed itself, bit for bit."""
    dist = torch.distributed
    persistent = [p for p in engine.module.parameters() if getattr(p, "ds_persist", False)]
    assert persistent, "no persistent parameter: the check would pass on nothing"
    for p in persistent:
        parts = [torch.empty_like(p.ds_tensor) for _ in range(dist.get_world_size(p.ds_process_group))]
        dist.all_gather(parts, p.ds_tensor, group=p.ds_process_group)
        whole = torch.cat(parts)[:p.ds_numel].view(p.ds_shape)
        assert torch.equal(p.data.view(torch.int16 if p.element_size() == 2 else torch.int32),
                           whole.view(torch.int16 if whole.element_size() == 2 else torch.int32)), p.ds_id


def _engine_step(dt: Any, torch: Any, engine: Any, ids: Any, targets: Any) -> Any:
    loss = dt.loss_of(torch, engine, ids, targets)
    engine.backward(loss)
    engine.step()
    return loss


def make_engine(dt: Any, torch: Any, args: Any, comm: str, where: Any, dtype: str) -> tuple[Any, Any]:
    """The example's engine of ``comm``, in bf16 or in fp16 with DeepSpeed's dynamic loss scaler; every matrix
    fetched per module, so that the backward gathers again (over the hpZ group), and the LayerNorms and biases
    persistent (kept whole, regathered after each step)."""
    import deepspeed

    zpccl = dt.ex.import_zpccl()
    import zpccl.deepspeed

    config = dt.zero_config(args, comm, where.ranks_per_node, args.hpz)
    config["zero_optimization"].update(stage3_param_persistence_threshold=4096, stage3_max_reuse_distance=0)
    if dtype == "fp16":
        del config["bf16"]
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 12}
    model = dt.ex.build_gpt(torch, args.layers, args.d_model, args.heads, args.seq, 0)
    opt, schedule = dt.ex.make_optimizer(torch, model, args.lr, STEPS)
    init = zpccl.deepspeed.initialize if comm == "zpccl" else deepspeed.initialize
    engine, *_ = init(model=model, optimizer=opt, lr_scheduler=schedule, config=config)
    return engine, zpccl.deepspeed.session_of(engine)


class DeepSpeedOnGpus(unittest.TestCase):
    def spawn(self, world: int, nodes: int, hpz: int, dtype: str = "bf16") -> None:
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not installed")
        if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
            self.skipTest("needs a CUDA GPU")
        if importlib.util.find_spec("deepspeed") is None:
            self.skipTest("deepspeed is not installed (pip install 'deepspeed>=0.19')")
        import zpccl
        import zpccl.launch

        zpccl.launch.set_default_env()
        os.environ.setdefault("ZPCCL_LIBRARY", zpccl.library_path())
        try:
            zpccl.launch.spawn(_worker, world, nodes, hpz, dtype)
        except zpccl.launch.RankFailed as e:
            self.fail(str(e))

    def test_two_nodes_of_one(self) -> None:
        self.spawn(2, 2, 1)

    def test_two_nodes_of_one_fp16(self) -> None:
        self.spawn(2, 2, 1, "fp16")

    def test_two_nodes_of_two_with_hpz(self) -> None:
        self.spawn(4, 2, 2)


if __name__ == "__main__":
    unittest.main()
