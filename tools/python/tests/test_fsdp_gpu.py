"""zpccl.fsdp on CUDA: FSDP2 in spawned processes, which share the visible GPUs as emulated nodes over sockets
(distinct NCCL_HOSTIDs, NCCL's P2P and shared memory off): two nodes of one rank, and two nodes of two with
reshard_after_forward=2 (hpZ groups of two, two-hop qgZ). Checks that the gathered weights are bit-identical on
every rank, that hpZ equals NCCL's exact all-gather, that every path was taken, and that a short training run
tracks FSDP2 with NCCL. Skipped without a GPU or without torch 2.9 or later."""
from __future__ import annotations

import functools
import os
import pathlib
import sys
import unittest
from typing import Any

import numpy as np

from . import _reference as ref
from ._gpu_runs import GatherChecks, train_checked
from .test_fsdp import bits_of, ref_dtype, split, staged

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def _worker(nodes: int, reshard: Any, grad_bits: int, grad_block: int | None) -> None:
    """One rank (zpccl.launch's rendezvous in the environment)."""
    sys.path.insert(0, str(EXAMPLES))
    _check(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), nodes, reshard, grad_bits, grad_block)


class _Exact:
    """Keeps a copy of every quantized call's input and output (on the call's stream: no host synchronization
    that would change the timing), then checks each against the NumPy model of the format, bit for bit: every
    rank's inputs gathered, the reference computed on each rank, compared with its output."""

    def __init__(self, torch: Any, zp: Any, world: int, node_of_rank: list[int], grad_bits: int) -> None:
        self.torch, self.zp, self.world, self.nodes, self.grad_bits = torch, zp, world, node_of_rank, grad_bits
        self.calls: list[tuple] = []
        self.checked = {"qwz": 0, "qgz": 0}
        self.active = True  # whether calls are kept now
        qwz, rs = zp.collectives.qwz, zp.collectives.reduce_scatter

        def on_qwz(hook: Any, comm: Any, output: Any, input: Any) -> None:
            x = input.clone()
            qwz(hook, comm, output, input)
            if self.active:
                self.calls.append(("qwz", zp.collectives.gather_sizes(hook, x.numel()), x, output.clone(), None))

        def on_rs(hook: Any, output: Any, input: Any, group: Any, op: Any, *rest: Any) -> Any:
            x = input.clone()
            result = rs(hook, output, input, group, op, *rest)
            if self.active:
                self.calls.append(("qgz", zp.collectives.reduce_sizes(hook, output.numel()), x, output.clone(), op))
            return result

        zp.collectives.qwz, zp.collectives.reduce_scatter = on_qwz, on_rs

    def verify(self) -> None:
        """Checks every recorded call; collective (every rank gathers every call's inputs in the same order)."""
        for kind, sizes, x, output, op in self.calls:
            if kind == "qwz":
                self.qwz(sizes, x, output)
            else:
                self.qgz(sizes, x, output, op)

    def inputs(self, x: Any) -> list[Any]:
        every = [self.torch.empty_like(x) for _ in range(self.world)]
        self.torch.distributed.all_gather(every, x)
        return [bits_of(t) for t in every]

    def qwz(self, sizes: list[int], x: Any, output: Any) -> None:
        dt = ref_dtype(x)
        want = np.concatenate([np.concatenate([ref.round_trip(p, dt, self.zp.weight_bits, self.zp.block_size)
                                               for p in split(xs, sizes)]) for xs in self.inputs(x)])
        assert np.array_equal(bits_of(output), want), f"qwZ call {self.checked['qwz']} differs from the model"
        self.checked["qwz"] += 1

    def qgz(self, sizes: list[int], x: Any, output: Any, op: Any) -> None:
        dt, block = ref_dtype(x), self.zp.grad_block_size
        sends = [np.concatenate([staged(split(row, sizes), block) for row in xs.reshape(self.world, -1)])
                 for xs in self.inputs(x)]
        name = "avg" if op == self.torch.distributed.ReduceOp.AVG else "sum"
        mine = ref.quant_reduce_scatter(sends, dt, name, self.grad_bits, block, self.nodes)[
            self.torch.distributed.get_rank()]
        padded = split(mine, [s + (-s % block) for s in sizes[:-1]] + [sizes[-1]])
        want = np.concatenate([p[:s] for p, s in zip(padded, sizes)])
        assert np.array_equal(bits_of(output), want), f"qgZ call {self.checked['qgz']} differs from the model"
        self.checked["qgz"] += 1


def _check(rank: int, world: int, nodes: int, reshard: Any, grad_bits: int, grad_block: int | None) -> None:
    import copy

    import fsdp2_train as ex
    import torch
    import torch.distributed as dist

    where = ex.Launch(nodes)
    mesh = where.init()
    zpccl = ex.import_zpccl()
    base = ex.build_gpt(torch, 2, 256, 4, 128)
    data = ex.Batches(torch, ex.corpus(4 << 20), 128, 8, rank, where.device)
    steps = 30
    losses = {}
    for comm in ("nccl", "zpccl", "zpccl-synchronized"):
        model = ex.shard_gpt(torch, copy.deepcopy(base).to(where.device), mesh, reshard)
        zp = checker = None
        gathers = GatherChecks(torch)
        if comm == "zpccl-synchronized":
            # The same, with the device synchronized after every collective: a result that differs from the
            # unsynchronized run's by more than noise points at a race.
            zp = zpccl.fsdp.enable(model, grad_bits=grad_bits, ranks_per_node=where.ranks_per_node,
                                   grad_block_size=grad_block)
            for name in ("all_gather", "reduce_scatter"):
                def synchronized(*a: Any, _call: Any = getattr(zp.collectives, name)) -> Any:
                    out = _call(*a)
                    torch.cuda.synchronize()
                    return out
                setattr(zp.collectives, name, synchronized)
        elif comm == "zpccl":
            zp = zpccl.fsdp.enable(model, grad_bits=grad_bits, ranks_per_node=where.ranks_per_node,
                                   grad_block_size=grad_block)
            qwz, hpz = zp.collectives.qwz, zp.collectives.hpz

            def on_qwz(hook: Any, comm: Any, output: Any, input: Any) -> None:
                qwz(hook, comm, output, input)
                gathers.qwz(output)

            def on_hpz(g: Any, output: Any, input: Any) -> None:
                group = next(pg.post_forward_mesh_info.shard_process_group
                             for m in zp.model.modules() if isinstance(m, zp._fsdp.FSDPModule)
                             for pg in zp._fsdp.param_groups(m))
                gathers.hpz(lambda: hpz(g, output, input), input, output, group)

            zp.collectives.qwz, zp.collectives.hpz = on_qwz, on_hpz
            checker = _Exact(torch, zp, world, [r // (world // nodes) for r in range(world)], grad_bits)
        opt, schedule = ex.make_optimizer(torch, model, 1e-3, steps)
        step = functools.partial(_step, ex, torch, model, opt, schedule)
        losses[comm] = train_checked(torch, data, steps, checker, step)
        if comm == "zpccl-synchronized":
            zp.disable()
        elif zp is not None:
            summary = zp.summary()
            gathers.verify(world)
            want = {"qwz", "qgz"} | ({"hpz"} if isinstance(reshard, int) and reshard > 1 else set())
            assert set(summary) == want, f"paths {sorted(summary)}, expected {sorted(want)}"
            checker.verify()
            assert min(checker.checked.values()) >= 6, checker.checked
            zp.disable()
        del step, model, opt  # the step holds them too
    if rank == 0:
        print(f"\n{world} ranks as {nodes} nodes, reshard_after_forward={reshard}, int{grad_bits} gradients"
              f"{f' in blocks of {grad_block}' if grad_block else ''}: "
              f"last-10 loss NCCL {losses['nccl']:.4f}, zpccl {losses['zpccl']:.4f} (synchronized after each "
              f"collective: {losses['zpccl-synchronized']:.4f})", flush=True)
    gap = abs(losses["zpccl"] - losses["nccl"]) / losses["nccl"]
    assert gap < 0.02, f"mean loss of the last 10 steps: zpccl {losses['zpccl']:.4f}, NCCL {losses['nccl']:.4f}"
    dist.destroy_process_group()


def _step(ex: Any, torch: Any, model: Any, opt: Any, schedule: Any, ids: Any, targets: Any) -> Any:
    loss = ex.loss_of(torch, model, ids, targets)
    loss.backward()
    ex.optimizer_step(torch, model, opt, schedule)
    return loss


class FsdpOnGpus(unittest.TestCase):
    def spawn(self, world: int, nodes: int, reshard: Any, grad_bits: int = 4, grad_block: int | None = None) -> None:
        from ._threaded import torch_with_fsdp2

        torch = torch_with_fsdp2()
        if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
            self.skipTest("needs a CUDA GPU")
        import zpccl
        import zpccl.launch

        zpccl.launch.set_default_env()
        os.environ.setdefault("ZPCCL_LIBRARY", zpccl.library_path())
        try:
            zpccl.launch.spawn(_worker, world, nodes, reshard, grad_bits, grad_block)
        except zpccl.launch.RankFailed as e:
            self.fail(str(e))

    def test_two_nodes_of_one(self) -> None:
        self.spawn(2, 2, False)

    def test_two_nodes_of_one_int8_gradients(self) -> None:
        self.spawn(2, 2, False, grad_bits=8)

    def test_two_nodes_of_two_with_hpz(self) -> None:
        self.spawn(4, 2, 2)

    def test_two_nodes_of_two_with_hpz_int8_gradients(self) -> None:
        self.spawn(4, 2, 2, grad_bits=8)

    def test_two_nodes_of_two_with_gradients_in_blocks_of_64(self) -> None:
        self.spawn(4, 2, 2, grad_block=64)


if __name__ == "__main__":
    unittest.main()
