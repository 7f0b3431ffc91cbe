"""zpccl.fsdp with ranks as processes, as torchrun starts them on a CPU: four processes on gloo, two nodes of two as
the launcher's LOCAL_WORLD_SIZE says, reshard_after_forward=2 (forward gathers qwZ, backward gathers hpZ inside a
node, gradients two-hop qgZ). The losses equal, bit for bit, those of the same training on thread-ranks (torch's
threaded process group, zpccl's threaded host backend), and FSDP2's own collectives' within the quantization bound.
A rank killed with SIGKILL in the middle of a training step makes every other rank raise ZpcclError (REMOTE_ERROR,
naming the rank and the call) within ZP_HOST_TIMEOUT_MS; the job restarted from its last torch.distributed.checkpoint
ends with the losses of the uninterrupted run. Skipped without torch 2.9 (gloo)."""
from __future__ import annotations

import copy
import os
import signal
import tempfile
import time
import unittest
from typing import Any

import zpccl
import zpccl.fsdp

from ._procs import run_procs, torch_for_procs
from .test_fsdp import BLOCK, WORLD, batches, build_model, shard, train_step

STEPS = 4
KILLED_RANK, KILLED_STEP = 3, 3  # step 3 (from 1) dies in its backward; the checkpoint of step 2 is the last
TIMEOUT_MS = 8000


def _training(torch: Any, rank: int, mesh: Any, *, use_zpccl: bool, steps: range, base: Any = None,
              checkpoints: str | None = None, resume_from: str | None = None, on_step: Any = None,
              **enable: Any) -> list[float]:
    """Trains a copy of `base` (default: the shared model, built here) with FSDP2 (reshard_after_forward=2) for `steps`
    of this rank's data, with zpccl's collectives or FSDP's; saves a checkpoint after every step into `checkpoints`,
    resumes from `resume_from`."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model = shard(torch, copy.deepcopy(base) if base is not None else build_model(torch), mesh, 2)
    zp = zpccl.fsdp.enable(model, block_size=BLOCK, **enable) if use_zpccl else None
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    if resume_from is not None:
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=resume_from)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    data = batches(torch, rank, STEPS)
    losses = []
    for step in steps:  # from 1
        if on_step is not None:
            on_step(step)
        losses.append(train_step(torch, model, opt, data[step - 1]))
        if checkpoints is not None:
            msd, osd = get_state_dict(model, opt)
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(checkpoints, f"step{step}"))
    if zp is not None:
        summary = {k: v["calls"] for k, v in zp.summary().items()}
        zp.disable()
        assert summary == {"qwz": 3 * len(steps), "hpz": 3 * len(steps), "qgz": 3 * len(steps)}, summary
    return losses


def _mesh(torch: Any) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (WORLD,))


def _zpccl_and_fsdp(rank: int) -> tuple[list[float], list[float]]:
    import torch

    mesh = _mesh(torch)
    zp = _training(torch, rank, mesh, use_zpccl=True, steps=range(1, STEPS + 1))
    plain = _training(torch, rank, mesh, use_zpccl=False, steps=range(1, STEPS + 1))
    return zp, plain


def _killed_mid_step(rank: int, checkpoints: str) -> dict[str, Any]:
    """Trains with a checkpoint after every step; rank KILLED_RANK kills itself in the first all-to-all of step
    KILLED_STEP (in its backward: hpZ's gather inside the node, the forward's gathers being all-gathers). The others
    report what they raised, and when."""
    import torch

    from zpccl import _torch as ztorch

    step_now = {"step": 0}
    if rank == KILLED_RANK:
        original = ztorch.TorchTransport.all_to_all

        def all_to_all(self: Any, *args: Any) -> Any:
            if step_now["step"] == KILLED_STEP:
                os.kill(os.getpid(), signal.SIGKILL)
            return original(self, *args)

        ztorch.TorchTransport.all_to_all = all_to_all
    seen: dict[str, Any] = {"losses": []}
    started = [time.monotonic()]

    def on_step(step: int) -> None:
        step_now["step"] = step
        started[0] = time.monotonic()

    try:
        _training(torch, rank, _mesh(torch), use_zpccl=True, steps=range(1, STEPS + 1), checkpoints=checkpoints,
                  on_step=on_step)
    except Exception as exc:  # noqa: BLE001 - what FSDP let through, with its cause
        chain, e = [], exc
        while e is not None:
            chain.append(e)
            e = e.__cause__ or e.__context__
        zp = next((e for e in chain if isinstance(e, zpccl.ZpcclError)), None)
        seen["error"] = (type(exc).__name__, str(zp or exc), int(zp.code) if zp else None,
                         time.monotonic() - started[0], step_now["step"])
    return seen


def _resumed(rank: int, checkpoint: str) -> list[float]:
    import torch

    return _training(torch, rank, _mesh(torch), use_zpccl=True, steps=range(KILLED_STEP, STEPS + 1),
                     resume_from=checkpoint)


class FsdpOverGloo(unittest.TestCase):
    threads: list[list[float]] = []

    @classmethod
    def setUpClass(cls) -> None:
        torch_for_procs()
        from ._threaded import run_threaded
        from .test_fsdp import cpu_mesh, torch_for_threads

        torch = torch_for_threads()
        # The uninterrupted run, on thread-ranks: zpccl's threaded host backend, nodes of two as ranks_per_node says.
        # The model is built once (torch's random generator is the process's, and the ranks' threads share it).
        # One intra-op thread, as in the processes: a reduction split over threads sums in another order.
        base, threads = build_model(torch), torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            cls.threads = run_threaded(WORLD, lambda rank: _training(torch, rank, cpu_mesh(), use_zpccl=True,
                                                                     steps=range(1, STEPS + 1), base=base,
                                                                     ranks_per_node=2))
        finally:
            torch.set_num_threads(threads)

    def test_losses_equal_thread_ranks_and_fsdp_within_the_bound(self) -> None:
        procs = run_procs(WORLD, _zpccl_and_fsdp, local=2)
        for p in procs:
            self.assertFalse(p.raised, p.error)
            zp, plain = p.value
            self.assertEqual(zp, self.threads[p.rank], f"rank {p.rank}: processes and threads")
            for step, (a, b) in enumerate(zip(plain, zp)):
                self.assertLess(abs(a - b) / a, 0.01, f"rank {p.rank} step {step + 1}: {b} vs FSDP's {a}")
            self.assertNotEqual(zp, plain)  # quantized, so not FSDP's bits

    def test_killed_mid_step_then_resumed_from_the_last_checkpoint(self) -> None:
        with tempfile.TemporaryDirectory() as checkpoints:
            env = {"ZP_HOST_TIMEOUT_MS": str(TIMEOUT_MS)}
            procs = run_procs(WORLD, _killed_mid_step, checkpoints, local=2, env=env, timeout=180)
            for p in procs:
                if p.rank == KILLED_RANK:
                    self.assertEqual(p.exitcode, -signal.SIGKILL)
                    continue
                self.assertFalse(p.raised, p.error)
                self.assertIn("error", p.value, f"rank {p.rank} trained on")
                kind, text, code, seconds, step = p.value["error"]
                self.assertEqual(code, int(zpccl.Result.REMOTE_ERROR), f"rank {p.rank}: {kind}: {text}")
                self.assertRegex(text, r"^zp\w+ : rank \d's transport: ")
                self.assertEqual(step, KILLED_STEP)
                self.assertLess(seconds, TIMEOUT_MS / 1000 + 10, text)
            last = max((d for d in os.listdir(checkpoints) if os.path.exists(os.path.join(checkpoints, d, ".metadata"))),
                       key=lambda d: int(d[4:]))
            self.assertEqual(last, f"step{KILLED_STEP - 1}")
            procs = run_procs(WORLD, _resumed, os.path.join(checkpoints, last), local=2)
        for p in procs:
            self.assertFalse(p.raised, p.error)
            self.assertEqual(p.value, self.threads[p.rank][KILLED_STEP - 1:], f"rank {p.rank}")


if __name__ == "__main__":
    unittest.main()
