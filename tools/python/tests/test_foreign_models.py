"""zpccl.fsdp on models we did not write: HF transformers' Llama (untied and tied embeddings) and GPT-2 from small
configs (no weights or data downloaded), and torchtitan's Llama 3 debug model, each as its users train it with
FSDP2 on the CPU, four thread-ranks as two nodes of two:

* made on the meta device, sharded (the decoder layers, then the root), moved with ``to_empty`` and loaded;
* activation checkpointing the framework's own way (HF's gradient_checkpointing_enable, torchtitan's FullAC);
* a frozen embedding where the model has one of its own (Llama's untied input embedding, GPT-2's positions,
  torchtitan's token embedding);
* gradient accumulation, two microbatches a step, the first with ``set_requires_gradient_sync(False)``;
* hpZ from ``reshard_after_forward=2`` (HF models) or ``hpz_size=2`` over layers sharded with True (torchtitan).

Each model trains three steps with FSDP's own collectives, and three with ``enable`` then ``disable`` before the
first step (bit-exact to FSDP's: disable leaves nothing behind), re-enabled for the other two (losses within 1%,
every path served: qwZ, hpZ and qgZ, as many calls as the layout makes), saving a DCP checkpoint between them. A
third model, made afresh, loads that checkpoint under zpccl and makes the last step again: the same loss, bit for
bit. Skipped without transformers (or torchtitan, for its model) or without torch 2.12 or later."""
from __future__ import annotations

import shutil
import tempfile
import unittest
from dataclasses import dataclass
from typing import Any, Callable

from . import _foreign, ci_installs
from ._threaded import run_threaded
from .test_fsdp import BLOCK, cpu_mesh, next_token_loss, torch_for_threads

WORLD, STEPS, MICROBATCHES, BATCH, SEQ = 4, 3, 2, 2, 24
ZPCCL = dict(ranks_per_node=2, block_size=BLOCK)


@dataclass
class Foreign:
    """How its users build, checkpoint, freeze, shard and call one model."""

    build: Callable[[], Any]  # the model, on the default device (the meta device for the sharded copies)
    layers: Callable[[Any], list[Any]]  # its decoder layers, activation checkpointing applied
    checkpoint: Callable[[Any], None]  # activation checkpointing, the framework's way
    freeze: Callable[[Any], None]  # a frozen embedding (or nothing)
    logits: Callable[[Any, Any], Any]
    vocab: int
    hpz_size: bool  # hpZ from hpz_size=2 over layers sharded with True, else from reshard_after_forward=2
    optimizer: Callable[[Any], Any] = lambda model: torch_module().optim.AdamW(model.parameters(), lr=3e-3)
    state: Callable[[Any, Any], dict[str, Any]] = lambda model, optimizer: torch_state(model, optimizer)
    load_state: Callable[[Any, Any, dict[str, Any]], None] = lambda m, o, s: load_torch_state(m, o, s)


def hf_llama(tied: bool) -> Foreign:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=tied, use_cache=False)
    return Foreign(
        build=lambda: LlamaForCausalLM(config), layers=lambda m: list(m.model.layers), checkpoint=_hf_checkpoint,
        freeze=(lambda m: None) if tied else (lambda m: m.model.embed_tokens.requires_grad_(False)),
        logits=lambda m, ids: m(input_ids=ids).logits, vocab=config.vocab_size, hpz_size=False)


def hf_gpt2() -> Foreign:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=128, n_positions=64, n_embd=64, n_layer=2, n_head=4, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,  # no dropout: thread-ranks share one RNG
                        bos_token_id=0, eos_token_id=0)
    return Foreign(
        build=lambda: GPT2LMHeadModel(config), layers=lambda m: list(m.transformer.h), checkpoint=_hf_checkpoint,
        freeze=lambda m: m.transformer.wpe.requires_grad_(False),
        logits=lambda m, ids: m(input_ids=ids).logits, vocab=config.vocab_size, hpz_size=False)


def titan_llama3() -> Foreign:
    from torchtitan.components.checkpointer.base import ModelWrapper
    from torchtitan.components.optimizer import default_adamw
    from torchtitan.distributed.activation_checkpoint import FullAC
    from torchtitan.models.llama3 import model_registry

    from . import _titan

    config = model_registry("debugmodel").model
    _titan.use_sdpa(config)  # FlexAttention has no backward on the CPU

    def build() -> Any:
        model = config.build()
        if not any(p.is_meta for p in model.parameters()):
            with torch_module().no_grad():
                model.init_weights(buffer_device=None)
        return model

    def state(model: Any, optimizers: Any) -> dict[str, Any]:  # what torchtitan's checkpointer saves
        return {"model": ModelWrapper(model).state_dict(), "optimizer": optimizers.state_dict()}

    def load_state(model: Any, optimizers: Any, loaded: dict[str, Any]) -> None:
        ModelWrapper(model).load_state_dict(loaded["model"])
        optimizers.load_state_dict(loaded["optimizer"])

    return Foreign(
        build=build, layers=lambda m: list(m.layers.values()),
        checkpoint=lambda m: FullAC.Config().build().apply(m),
        freeze=lambda m: m.tok_embeddings.requires_grad_(False),
        logits=lambda m, ids: m(ids), vocab=config.vocab_size, hpz_size=True,
        optimizer=lambda m: default_adamw(lr=3e-3).build(model_parts=[m]), state=state, load_state=load_state)


def torch_module() -> Any:
    import torch

    return torch


def _hf_checkpoint(model: Any) -> None:
    """HF's activation checkpointing of every decoder layer (its older name where the newer is missing)."""
    model.train()
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def shard(spec: Foreign, params: dict[str, Any], buffers: dict[str, Any]) -> Any:
    """The model as its users shard it: made on the meta device, checkpointed, a frozen embedding, its layers
    sharded (reshard_after_forward=2, or True for hpz_size), then the root; moved with to_empty and loaded."""
    torch = torch_module()
    from torch.distributed.fsdp import fully_shard

    with torch.device("meta"):
        model = spec.build()
    spec.checkpoint(model)
    spec.freeze(model)
    mesh = cpu_mesh((WORLD,))
    for layer in spec.layers(model):
        fully_shard(layer, mesh=mesh, reshard_after_forward=True if spec.hpz_size else 2)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    _foreign.load(model, params, buffers)
    return model


def step(spec: Foreign, model: Any, optimizer: Any, microbatches: list[Any]) -> float:
    """One optimizer step over the microbatches, reducing gradients after the last only; the mean loss."""
    torch = torch_module()
    total = 0.0
    for i, ids in enumerate(microbatches):
        model.set_requires_gradient_sync(i == len(microbatches) - 1)
        loss = next_token_loss(torch, spec.logits(model, ids), ids)
        (loss / len(microbatches)).backward()
        total += loss.item() / len(microbatches)
    optimizer.step()
    optimizer.zero_grad()
    return total


def torch_state(model: Any, optimizer: Any) -> dict[str, Any]:
    """The model's and optimizer's state as torch.distributed.checkpoint saves it."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optim_state}


def load_torch_state(model: Any, optimizer: Any, loaded: dict[str, Any]) -> None:
    from torch.distributed.checkpoint.state_dict import set_state_dict

    set_state_dict(model, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"])


class ForeignModels(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.torch = torch_for_threads()

    def setUp(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="zpccl-dcp-")
        self.addCleanup(shutil.rmtree, self.folder, ignore_errors=True)

    def check(self, spec: Foreign) -> None:
        torch = self.torch
        import torch.distributed.checkpoint as dcp

        import zpccl.fsdp

        params, buffers = _foreign.reference(spec.build)
        options = dict(ZPCCL, hpz_size=2) if spec.hpz_size else ZPCCL
        folder = self.folder

        def body(rank: int) -> dict[str, Any]:
            data = [[_foreign.progressions(torch, spec.vocab, BATCH, SEQ, 1000 * rank + 10 * s + m)
                     for m in range(MICROBATCHES)] for s in range(STEPS)]
            out: dict[str, Any] = {}

            model = shard(spec, params, buffers)  # FSDP's own collectives throughout
            optimizer = spec.optimizer(model)
            out["fsdp"] = [step(spec, model, optimizer, data[0])]
            first = [p.detach().to_local().clone() for p in model.parameters()]
            out["fsdp"] += [step(spec, model, optimizer, batch) for batch in data[1:]]

            model = shard(spec, params, buffers)
            optimizer = spec.optimizer(model)
            zpccl.fsdp.enable(model, **options).disable()
            out["zpccl"] = [step(spec, model, optimizer, data[0])]
            out["exact"] = all(torch.equal(p.detach().to_local(), q) for p, q in zip(model.parameters(), first))
            zp = zpccl.fsdp.enable(model, **options)
            out["zpccl"].append(step(spec, model, optimizer, data[1]))
            dcp.save(spec.state(model, optimizer), checkpoint_id=folder)
            out["zpccl"].append(step(spec, model, optimizer, data[2]))
            out["groups"] = len(zp._served)
            zp.disable()
            out["summary"] = zp.summary()

            model = shard(spec, {k: torch.zeros_like(v) for k, v in params.items()}, buffers)
            optimizer = spec.optimizer(model)
            zp = zpccl.fsdp.enable(model, **options)
            resumed = spec.state(model, optimizer)
            dcp.load(resumed, checkpoint_id=folder)
            spec.load_state(model, optimizer, resumed)
            out["resumed"] = step(spec, model, optimizer, data[2])
            zp.disable()
            return out

        results = run_threaded(WORLD, body)
        with torch.device("meta"):
            layers = len(spec.layers(spec.build()))
        for rank, r in enumerate(results):
            self.assertEqual(r["zpccl"][0], r["fsdp"][0], f"rank {rank}: zpccl enabled then disabled")
            self.assertTrue(r["exact"], f"rank {rank}: parameters after a step with zpccl disabled")
            for i, (a, b) in enumerate(zip(r["fsdp"][1:], r["zpccl"][1:])):
                self.assertLess(abs(a - b) / a, 0.01, f"rank {rank} step {i + 1}: loss {b} vs FSDP's {a}")
            self.assertEqual(r["resumed"], r["zpccl"][2], f"rank {rank}: resumed from the checkpoint")
            calls = {k: v["calls"] for k, v in r["summary"].items()}
            steps = STEPS - 1
            self.assertEqual(calls, {"qwz": r["groups"] * MICROBATCHES * steps,
                                     "hpz": layers * MICROBATCHES * steps,
                                     "qgz": r["groups"] * steps}, f"rank {rank}")

    def transformers(self) -> None:
        try:
            import transformers  # noqa: F401
        except ImportError:
            self.skipTest(f"transformers is not installed ({ci_installs('transformers')})")

    def test_hf_llama_untied_embeddings(self) -> None:
        self.transformers()
        self.check(hf_llama(tied=False))

    def test_hf_llama_tied_embeddings(self) -> None:
        self.transformers()
        self.check(hf_llama(tied=True))

    def test_hf_gpt2(self) -> None:
        self.transformers()
        self.check(hf_gpt2())

    def test_torchtitan_llama3_debugmodel(self) -> None:
        from . import _titan

        _titan.torchtitan_or_skip()
        self.check(titan_llama3())


if __name__ == "__main__":
    unittest.main()
