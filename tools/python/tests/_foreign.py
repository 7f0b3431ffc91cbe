"""Models we did not write, for the tests: their weights made once on one thread and loaded into every rank's
sharded copy (thread-ranks share one random generator, so each rank initializing its own would differ from run to
run), and token data they can learn in a few steps."""
from __future__ import annotations

import contextlib
from typing import Any, Callable

CHECKPOINT_PREFIX = "_checkpoint_wrapped_module."  # what torch's checkpoint_wrapper puts in parameter names


def reference(build: Callable[[], Any], seed: int = 0) -> tuple[dict[str, Any], dict[str, Any]]:
    """The parameters and buffers of ``build()`` (made on the CPU from ``seed``), as the model holds them (a
    state_dict may rename or split them)."""
    import torch

    with torch.random.fork_rng(), torch.device("cpu"):
        torch.manual_seed(seed)
        model = build()
    return ({k: v.detach().clone() for k, v in model.named_parameters()},
            {k: v.detach().clone() for k, v in model.named_buffers()})


def load(model: Any, params: dict[str, Any], buffers: dict[str, Any] | None = None) -> None:
    """Every parameter of a sharded model (its DTensor shards) set from the full tensors of ``params``, and its
    buffers from ``buffers`` (a model made on the meta device and moved with ``to_empty`` holds none)."""
    import torch
    from torch.distributed.tensor import DTensor, distribute_tensor

    with torch.no_grad():
        for name, p in model.named_parameters():
            full = params[name.replace(CHECKPOINT_PREFIX, "")].to(p.dtype)
            if isinstance(p, DTensor):
                p.to_local().copy_(distribute_tensor(full, p.device_mesh, p.placements).to_local())
            else:
                p.copy_(full)
        for name, b in model.named_buffers() if buffers is not None else ():
            b.copy_(buffers[name.replace(CHECKPOINT_PREFIX, "")])


def progressions(torch: Any, vocab: int, batch: int, length: int, seed: int) -> Any:
    """``batch`` sequences of ``length`` tokens, each an arithmetic progression modulo ``vocab`` with a step from
    a few: learnable in a few steps, and different for every seed."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab, (batch, 1), generator=g)
    step = torch.randint(1, 4, (batch, 1), generator=g)
    return (start + step * torch.arange(length)) % vocab


@contextlib.contextmanager
def quiet_loggers(*names: str) -> Any:
    """The named loggers held back below errors while the block runs (frameworks that chat on every run)."""
    import logging

    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
