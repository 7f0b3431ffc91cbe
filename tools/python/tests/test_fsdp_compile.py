"""zpccl.fsdp under torch.compile, with ranks as processes on gloo (dynamo's state is the process's: thread-ranks
would share it). Four ranks as two nodes of two, blocks sharded with reshard_after_forward=True and hpz_size=2, as
torchtitan's --compile runs them: each block compiled before fully_shard (torchtitan's way), or after it with
``block.compile()``. FSDP2's hooks run outside the compiled graphs (torch disables dynamo in them), so zpccl's
collectives run as in eager: the counters and, with a backend that keeps eager's kernels (aot_eager), every loss and
gradient equal the eager zpccl run bit for bit, and no step after the first compiles again. Inductor fuses kernels
and rounds differently, so its bits differ from eager with FSDP's own collectives too. Skipped without torch 2.9
(gloo)."""
from __future__ import annotations

import unittest
from typing import Any

from ._procs import run_procs, torch_for_procs

WORLD, STEPS = 4, 3


def _train(compiled: str) -> dict[str, Any]:
    """One rank's training of the shared model, its blocks compiled ``compiled`` ("before" or "after" fully_shard,
    or "" for eager): losses, sharded gradients, the counters and dynamo's count of graphs after each step."""
    import torch
    import torch._dynamo.utils as dynamo_utils
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import zpccl.fsdp

    from .test_fsdp import BLOCK, batches, build_model, next_token_loss

    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    mesh = init_device_mesh("cpu", (WORLD,))
    model = build_model(torch)
    if compiled == "before":
        for i, block in enumerate(model.blocks):
            model.blocks[i] = torch.compile(block, backend="aot_eager", fullgraph=True)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if compiled == "after":
        for block in model.blocks:
            block.compile(backend="aot_eager", fullgraph=True)
    zp = zpccl.fsdp.enable(model, block_size=BLOCK, hpz_size=2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, grads, graphs = [], [], []
    rank = torch.distributed.get_rank()
    for ids in batches(torch, rank, STEPS):
        loss = next_token_loss(torch, model(ids), ids)
        loss.backward()
        grads.append([p.grad.to_local().numpy().copy() for p in model.parameters()])  # numpy: queued to the parent
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        graphs.append(dynamo_utils.counters["stats"]["unique_graphs"])
    summary = zp.summary()
    zp.disable()
    return dict(losses=losses, grads=grads, summary=summary, graphs=graphs)


def _eager_and_compiled(rank: int) -> dict[str, dict[str, Any]]:
    return {how: _train(how) for how in ("", "before", "after")}


class FsdpCompiled(unittest.TestCase):
    def test_compiled_blocks_equal_eager_bit_for_bit(self) -> None:
        torch_for_procs()
        import numpy as np

        for p in run_procs(WORLD, _eager_and_compiled, local=2):
            self.assertFalse(p.raised, p.error)
            eager = p.value[""]
            self.assertEqual({k: v["calls"] for k, v in eager["summary"].items()},
                             {"qwz": 3 * STEPS, "hpz": 2 * STEPS, "qgz": 3 * STEPS})
            self.assertEqual(eager["graphs"], [0] * STEPS)
            for how in ("before", "after"):
                run = p.value[how]
                with self.subTest(rank=p.rank, compiled=how):
                    self.assertEqual(run["summary"], eager["summary"])
                    self.assertEqual(run["losses"], eager["losses"])
                    for step, (a, b) in enumerate(zip(run["grads"], eager["grads"])):
                        self.assertTrue(all(np.array_equal(x, y) for x, y in zip(a, b)), f"step {step + 1}")
                    # Compiled at the first step, never again: zpccl's hooks cause no recompilation.
                    self.assertGreater(run["graphs"][0], 0)
                    self.assertEqual(run["graphs"], run["graphs"][:1] * STEPS)


if __name__ == "__main__":
    unittest.main()
