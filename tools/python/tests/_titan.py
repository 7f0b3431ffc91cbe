"""torchtitan (0.3) on the CPU with ranks as threads, for the tests: what the CPU needs that torchtitan does not
give it, each done here and nowhere in zpccl.

* torchtitan's device helpers pick CUDA when no accelerator is visible: :func:`cpu_devices` points them at the
  CPU while a test runs.
* Its tokenizer and its test data live in its repository, not in its wheel (and the tests download nothing):
  :class:`Tokens` and :class:`Batches` stand in, a tokenizer of no text and a stream of learnable token
  sequences (arithmetic progressions modulo the vocabulary, a different start and step each).
* Its Llama 3 attention is FlexAttention, which has no backward on the CPU: :func:`use_sdpa` swaps in torchtitan's
  own ScaledDotProductAttention (causal, the data being one document a sequence, so the same attention).
* Thread-ranks share one random generator, so torchtitan's initialization differs from run to run: every rank
  loads the same weights (:func:`reference_weights`, made once on one thread; tests/_foreign.py) once the trainer
  is built.
* torch's threaded process group has no PreMulSum, which torchtitan's ``set_gradient_divide_factor(1.0)`` makes
  FSDP ask for: torchtitan's own runs take FSDP's force-sum path (:func:`force_sum`), bit for bit the same
  gradients (zpccl serves PreMulSum itself).
"""
from __future__ import annotations

import contextlib
import copy
import os
import types
import unittest
from dataclasses import dataclass
from typing import Any, Iterator

from . import ci_installs
from ._foreign import load, progressions, reference
from ._threaded import run_threaded

#: A config small enough for two CPU cores, given through torchtitan's own command line.
SMALL = ["--training.seq_len", "32", "--training.local_batch_size", "1", "--training.steps", "3",
         "--training.disable_cuda_graphs", "--validator.no-enable", "--checkpoint.no-enable", "--debug.seed", "0",
         "--metrics.log_freq", "1", "--lr_scheduler.warmup_steps", "1",
         "--optimizer.param_groups.0.optimizer_kwargs.lr", "3e-3"]


def torchtitan_or_skip() -> Any:
    """torchtitan, or SkipTest when it is missing or lacks what 0.3 has (config modules, post_optimizer_build_fn),
    or when torch lacks what torchtitan 0.3 calls."""
    try:
        import torchtitan
        from torchtitan.config import ConfigManager  # noqa: F401
        from torchtitan.protocols.model_spec import ModelSpec
    except ImportError as e:
        raise unittest.SkipTest(f"torchtitan is not installed ({e}); {ci_installs('torchtitan')}") from None
    if "post_optimizer_build_fn" not in getattr(ModelSpec, "__dataclass_fields__", {}):
        raise unittest.SkipTest(f"torchtitan {torchtitan.__version__} has no ModelSpec.post_optimizer_build_fn "
                                "(0.3 has)")
    import torch
    import torch.distributed as dist
    import torch.distributed.fsdp as fsdp

    # torchtitan 0.3's trainer, and so every config registry, imports DataParallelMeshDims when loaded and calls
    # set_timeout after its first step: a torch without either cannot run it, whatever zpccl does.
    needs = {"torch.distributed.fsdp.DataParallelMeshDims": (fsdp, "DataParallelMeshDims"),
             "torch.distributed.set_timeout": (dist, "set_timeout")}
    lacks = [name for name, (module, attr) in needs.items() if not hasattr(module, attr)]
    if lacks:
        raise unittest.SkipTest(f"torchtitan {torchtitan.__version__} needs {' and '.join(lacks)}, which torch "
                                f"{torch.__version__} lacks (torch 2.14 has them)")
    return torchtitan


def _cpu_module(torch: Any) -> Any:
    """What torchtitan asks of a device module (torch.cuda's names), answered for the CPU."""
    return types.SimpleNamespace(
        set_device=lambda device: None, device_count=lambda: 1, current_device=lambda: 0,
        get_device_name=lambda device=None: "cpu", is_available=lambda: True, synchronize=lambda device=None: None,
        get_device_properties=lambda device=None: types.SimpleNamespace(total_memory=1 << 34),
        reset_peak_memory_stats=lambda device=None: None, empty_cache=lambda: None,
        memory_stats=lambda device=None: {})


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """torchtitan's chatter held back below errors while the block runs: it logs on the root logger, and DTensor
    warns that its random numbers on a CPU mesh may be incomplete."""
    import logging
    import warnings

    root, level = logging.getLogger(), logging.getLogger().level
    root.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*may not have complete support on cpu device mesh")
            yield
    finally:
        root.setLevel(level)


@contextlib.contextmanager
def cpu_devices() -> Iterator[None]:
    """torchtitan's device type "cpu" while the block runs (its modules copy it at import), LOCAL_RANK set,
    quietly."""
    import importlib

    import torch

    names = ("torchtitan.tools.utils", "torchtitan.components.metrics", "torchtitan.distributed.parallel_dims",
             "torchtitan.distributed.utils", "torchtitan.models.common.token_dispatcher")
    saved = []
    for name in names:
        module = importlib.import_module(name)
        for attr, value in (("device_type", "cpu"), ("device_module", _cpu_module(torch))):
            if hasattr(module, attr):
                saved.append((module, attr, getattr(module, attr)))
                setattr(module, attr, value)
    local_rank = os.environ.get("LOCAL_RANK")
    os.environ["LOCAL_RANK"] = "0"
    try:
        with quiet():
            yield
    finally:
        for module, attr, value in saved:
            setattr(module, attr, value)
        if local_rank is None:
            os.environ.pop("LOCAL_RANK", None)
        else:
            os.environ["LOCAL_RANK"] = local_rank


def _components() -> tuple[type, type]:
    """The tokenizer and data loader, made on first use (their bases are torchtitan's)."""
    import torch
    from torchtitan.components.dataloader import BaseDataLoader
    from torchtitan.components.tokenizer import BaseTokenizer

    class Tokens(BaseTokenizer):
        @dataclass(kw_only=True, slots=True)
        class Config(BaseTokenizer.Config):
            vocab_size: int = 2048

        def __init__(self, config: Any, **_: Any) -> None:
            super().__init__()
            self.vocab_size = config.vocab_size

        def encode(self, *args: Any, **kwargs: Any) -> list[int]:
            return []

        def decode(self, *args: Any, **kwargs: Any) -> str:
            return ""

        def get_vocab_size(self) -> int:
            return self.vocab_size

    class Batches(BaseDataLoader):
        @dataclass(kw_only=True, slots=True)
        class Config(BaseDataLoader.Config):
            vocab_size: int = 2048

        def __init__(self, config: Any, *, dp_rank: int, seq_len: int, local_batch_size: int, **_: Any) -> None:
            self.vocab, self.rank, self.seq_len, self.batch = config.vocab_size, dp_rank, seq_len, local_batch_size
            self.served = 0

        def __iter__(self) -> Iterator[tuple[dict[str, Any], Any]]:
            while True:
                ids = progressions(torch, self.vocab, self.batch, self.seq_len + 1, 1000 * self.rank + self.served)
                self.served += 1
                positions = torch.arange(self.seq_len).expand(self.batch, -1)  # one document a sequence
                yield {"input": ids[:, :-1], "positions": positions}, ids[:, 1:]

        def state_dict(self) -> dict[str, Any]:
            return {"served": self.served}

        def load_state_dict(self, state: dict[str, Any]) -> None:
            self.served = state["served"]

    return Tokens, Batches


def use_sdpa(model_config: Any) -> None:
    """Every masked attention of a torchtitan model config (FlexAttention, VarlenAttention) becomes torchtitan's
    causal ScaledDotProductAttention."""
    from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention, VarlenAttention

    for kind in (FlexAttention.Config, VarlenAttention.Config):
        for _fqn, _cfg, parent, attr in list(model_config.traverse(kind)):
            if parent is None:
                raise AssertionError("the model config is itself an attention")
            if isinstance(parent, list):
                parent[attr] = ScaledDotProductAttention.Config()
            else:
                setattr(parent, attr, ScaledDotProductAttention.Config())


def parse(argv: list[str], sdpa: bool = True) -> Any:
    """A config from torchtitan's own command line (``--module ... --config ...`` and overrides), given the
    stand-in tokenizer and data, and (``sdpa``, for the CPU) SDPA."""
    from torchtitan.config import ConfigManager

    with quiet():
        config = ConfigManager().parse_args(list(argv))
    Tokens, Batches = _components()
    vocab = config.model_spec.model.vocab_size
    config.tokenizer = Tokens.Config(vocab_size=vocab)
    config.dataloader = Batches.Config(vocab_size=vocab)
    if sdpa:
        use_sdpa(config.model_spec.model)
    return config


def force_sum(config: Any) -> None:
    """torchtitan's run on the threaded group: FSDP's force-sum path in place of the PreMulSum that group lacks,
    set by a hook chained before the config's own post_optimizer_build_fn."""
    from torch.distributed.fsdp import FSDPModule

    spec, previous = config.model_spec, config.model_spec.post_optimizer_build_fn

    def hook(optimizers: Any, model_parts: list[Any], parallel_dims: Any) -> None:
        for part in model_parts:
            for m in part.modules():
                if isinstance(m, FSDPModule):
                    m.set_force_sum_reduction_for_comms(True)
        if previous is not None:
            previous(optimizers, model_parts, parallel_dims)

    spec.post_optimizer_build_fn = hook


def reference_weights(config: Any, seed: int = 0) -> dict[str, Any]:
    """The parameters of the config's model as torchtitan initializes them, made on this thread from ``seed``."""
    import torch

    def build() -> Any:
        model = copy.deepcopy(config.model_spec.model).build()
        with torch.no_grad():
            model.init_weights(buffer_device=None)
        return model

    with cpu_devices():
        return reference(build, seed)[0]


def train(config: Any, world: int, weights: dict[str, Any]) -> list[dict[str, Any]]:
    """torchtitan's trainer from ``config`` on ``world`` thread-ranks, every model part given ``weights`` (see
    :func:`reference_weights`) once built: each rank's logged losses and zpccl's summary of each model part (None
    where zpccl does not serve it). zpccl is disabled before a rank returns."""
    import zpccl.fsdp

    def body(rank: int) -> dict[str, Any]:
        trainer = copy.deepcopy(config).build()
        for part in trainer.model_parts:
            load(part, weights)
        losses: list[float] = []
        log = trainer.metrics_processor.log

        def record(step: int, loss: float, *args: Any, **kwargs: Any) -> Any:
            losses.append(loss)
            return log(step, loss, *args, **kwargs)

        trainer.metrics_processor.log = record
        try:
            trainer.train()
            handles = [zpccl.fsdp.session_of(p) for p in trainer.model_parts]
            out = dict(losses=losses, summaries=[h.summary() if h else None for h in handles])
            for h in handles:
                if h is not None:
                    h.disable()
            return out
        finally:
            trainer.close()

    with cpu_devices():
        return run_threaded(world, body)
