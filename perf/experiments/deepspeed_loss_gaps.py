#!/usr/bin/env python3
"""How far zpccl.deepspeed's quantized runs stray from unpatched ZeRO-3 in tools/python/tests/test_deepspeed.py's
scenarios, per model seed: the measurement behind that test's loss bounds (GAP_INT4, GAP_INT8).

    python perf/experiments/deepspeed_loss_gaps.py --seeds 0,1,2 -J /tmp/deepspeed-loss-gaps.json

Each seed builds the test's model from that seed and shifts its batches (step numbers from 100 x seed), then runs
the test's scenarios on DeepSpeed's CPU accelerator (ranks as processes over gloo, zpccl's host backend): one node
of four ranks (int8 weights and int4 gradients with hpZ 1, 2 and 4, without overlap_comm and contiguous gradients,
each quantization alone, gradient accumulation, the eval loss, int8 weights and gradients) and three nodes of two
(fp32 with two-hop qgZ, an engine built with DeepSpeed's own qgZ). A step's gap is |zpccl - ZeRO-3| / ZeRO-3 of
its loss, the largest over the ranks. The JSON holds the provenance, each scenario's gaps per seed and step, and
its largest. Needs DeepSpeed (``pip install 'deepspeed>=0.19'``) and torch with gloo.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "python"))
sys.path.insert(0, str(ROOT / "perf"))

from provenance import provenance  # noqa: E402  (perf/provenance.py)
from tests import test_deepspeed as td  # noqa: E402  (the test's model, configs, training and scenarios)
from tests._procs import run_procs  # noqa: E402


def gaps(got: list[float], ref: list[float]) -> list[float]:
    return [abs(x - y) / abs(y) for x, y in zip(got, ref)]


def one_node(rank: int, seed: int) -> dict[str, list[float]]:
    """One rank of the one-node world: each scenario's gaps, step by step."""
    torch, deepspeed, _ = td._setup()
    import zpccl.deepspeed

    first, steps = 100 * seed, td.STEPS

    def run(config: dict[str, Any], zp: bool, n: int = steps, enable: dict[str, Any] | None = None) -> Any:
        engine = td.make_engine(torch, deepspeed, config, zp=zp, seed=seed)
        if enable is not None:
            zpccl.deepspeed.enable(engine, **enable)
        return engine, td.train(torch, engine, rank, n, first=first)

    engine, ref = run(td.ds_config(), False)
    eval_ref = td.evaluate(torch, engine, rank)
    _, ref_accum = run(dict(td.ds_config(), gradient_accumulation_steps=2), False, 2 * steps)
    out: dict[str, list[float]] = {}
    for hpz in (1, 2, 4):
        engine, losses = run(td.ds_config(hpz, quantized=True), True)
        out[f"int8/int4 hpz {hpz}"] = gaps(losses, ref)
        if hpz == 2:
            out["int8/int4 eval"] = gaps([td.evaluate(torch, engine, rank)], [eval_ref])
        zpccl.deepspeed.disable(engine)
    plain = td.ds_config(2, True, overlap_comm=False, contiguous_gradients=False)
    for name, config, n, against in (
            ("int8/int4 plain", plain, steps, ref),
            ("int8 weights alone", alone("zero_quantized_weights"), steps, ref),
            ("int4 gradients alone", alone("zero_quantized_gradients"), steps, ref),
            ("int8/int4 accumulation", dict(td.ds_config(2, True), gradient_accumulation_steps=2), 2 * steps,
             ref_accum)):
        engine, losses = run(config, True, n)
        out[name] = gaps(losses, against)
        zpccl.deepspeed.disable(engine)
    engine, losses = run(td.ds_config(), False, enable=dict(weight_bits=8, grad_bits=8, block_size=td.BLOCK))
    out["int8/int8 enable"] = gaps(losses, ref)
    zpccl.deepspeed.disable(engine)
    return out


def alone(switch: str) -> dict[str, Any]:
    """The one-node config with one ZeRO++ quantization switch on."""
    config = td.ds_config()
    return dict(config, zpccl={"block_size": td.BLOCK}, zero_optimization=dict(config["zero_optimization"],
                                                                               **{switch: True}))


def three_nodes(rank: int, seed: int) -> dict[str, list[float]]:
    """One rank of the three-node world (fp32)."""
    torch, deepspeed, _ = td._setup()
    import zpccl.deepspeed

    first = 100 * seed
    ref = td.train(torch, td.make_engine(torch, deepspeed, td.ds_config(bf16=False), zp=False, seed=seed), rank,
                   td.STEPS, first=first)
    out = {}
    engine = td.make_engine(torch, deepspeed, td.ds_config(2, quantized=True, bf16=False), zp=True, seed=seed)
    out["fp32 int8/int4 two hops"] = gaps(td.train(torch, engine, rank, td.STEPS, first=first), ref)
    zpccl.deepspeed.disable(engine)
    engine = td.make_engine(torch, deepspeed, td.ds_config(2, bf16=False, zero_quantized_gradients=True), zp=False,
                            seed=seed)
    zpccl.deepspeed.enable(engine, block_size=td.BLOCK)
    out["fp32 DeepSpeed's qgZ served"] = gaps(td.train(torch, engine, rank, td.STEPS, first=first), ref)
    zpccl.deepspeed.disable(engine)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2", help="comma-separated model seeds")
    p.add_argument("-J", "--json", default="", help="write the gaps here")
    args = p.parse_args()
    td.deepspeed_or_skip()
    record = provenance("cpu-gloo")
    seeds = [int(s) for s in args.seeds.split(",") if s]
    found: dict[str, dict[int, list[float]]] = {}
    for seed in seeds:
        for world, local, fn in ((4, 4, one_node), (6, 2, three_nodes)):
            outcomes = run_procs(world, fn, seed, local=local, env=dict(td.ENV, LOCAL_SIZE=str(local)), timeout=600)
            failed = [o for o in outcomes if o.error is not None or o.value is None]
            if failed:
                raise SystemExit(f"deepspeed_loss_gaps: seed {seed}, rank {failed[0].rank}: {failed[0].error}")
            for name in outcomes[0].value:
                per_step = zip(*(o.value[name] for o in outcomes))
                found.setdefault(name, {})[seed] = [max(step) for step in per_step]
    print(f"{'scenario':30s} {'largest':>8}  per seed, per step")
    for name, by_seed in found.items():
        largest = max(max(g) for g in by_seed.values())
        cells = "  ".join(f"{s}: " + " ".join(f"{g:.4f}" for g in gs) for s, gs in by_seed.items())
        print(f"{name:30s} {largest:8.4f}  {cells}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(dict(
            provenance=record, seeds=seeds, gaps=found,
            largest={name: max(max(g) for g in by_seed.values()) for name, by_seed in found.items()}), indent=1))


if __name__ == "__main__":
    main()
