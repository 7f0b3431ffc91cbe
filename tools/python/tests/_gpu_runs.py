"""What the GPU suites share (test_fsdp_gpu, test_deepspeed_gpu): the short training run whose quantized calls
they check, and the checks of its gathers."""
from __future__ import annotations

from typing import Any, Callable


class GatherChecks:
    """qwZ's gathered weights must be bit-identical on every rank (each call's output hashed here, the hashes
    compared across ranks in :meth:`verify`), and hpZ's output equal to NCCL's exact all-gather of the same input
    over the same group."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.hashes: list[int] = []
        self.inexact = 0  # hpZ calls whose output differs from NCCL's

    def qwz(self, output: Any) -> None:
        """After a qwZ call: a position-weighted sum of its output's bits (reordered words change it too)."""
        torch = self.torch
        weights = torch.arange(1, output.numel() + 1, device=output.device)
        self.hashes.append(int(output.view(torch.int16).to(torch.int64).mul(weights).sum()))

    def hpz(self, call: Callable[[], None], input: Any, output: Any, group: Any) -> None:
        """Runs one hpZ ``call`` (from ``input`` into ``output``), then NCCL's all-gather of the same input over
        ``group``, and compares the two bit for bit."""
        torch = self.torch
        x = input.clone()  # the call may gather in place, over its input
        call()
        exact = torch.empty_like(output)
        torch.distributed.all_gather_into_tensor(exact, x, group=group)
        self.inexact += int(not torch.equal(exact.view(torch.int16), output.view(torch.int16)))

    def verify(self, world: int) -> None:
        """Collective over the world: every rank's hashes equal, and no hpZ call inexact."""
        everyone: list[Any] = [None] * world
        self.torch.distributed.all_gather_object(everyone, self.hashes)
        assert all(h == self.hashes for h in everyone), "qwZ's gathered weights differ between ranks"
        assert not self.inexact, f"hpZ differs from NCCL's all-gather in {self.inexact} calls"


def train_checked(torch: Any, data: Any, steps: int, checker: Any, step: Callable[[Any, Any], Any]) -> float:
    """``steps`` training steps, ``step(ids, targets)`` each (it returns the loss), with ``checker`` (None, or one
    whose ``active`` says whether it keeps calls) keeping those of the first step and the last five; the mean loss
    of the last 10 steps, averaged over the ranks."""
    curve = []
    for s in range(steps):
        if checker is not None:
            checker.active = s == 0 or s >= steps - 5
        ids, targets = data.step(s)
        curve.append(step(ids, targets).detach().float())
    mean = torch.stack(curve[-10:]).mean()
    torch.distributed.all_reduce(mean, op=torch.distributed.ReduceOp.AVG)
    return float(mean)
