"""The loss cost of qgZ's gradient format on the CPU, with no zpccl and no GPU: the format's NumPy model in FSDP2.

FSDP2 (torch 2.15, CPU, gloo, processes spawned) on fsdp2_train.py's tiny GPT, bf16 params and bf16 reduce,
with FSDP's reduce-scatter replaced through ``set_custom_reduce_scatter`` by: all ranks' inputs all-gathered
(gloo), then this rank's output computed in NumPy as

  exact      fp64 sum (/n for AVG) of the bf16 inputs, one rounding to bf16
  q<B><r|f>  the qgZ format (tests/_reference.py's quant_reduce_scatter, for this rank only), B bits, blocks
             restarting at every parameter part ("r", zpccl.fsdp's default) or running across them ("f");
             two hops when the node layout has several nodes of several ranks each
  noise...   exact plus independent noise: nrel<e>: exact*(1+e*N(0,1));  nq8r: |q8r - exact| with a random
             sign (the int8 error's magnitudes, no correlation with the data)

Optionally the forward all-gather quantizes weights as qwZ does (--qwz 8: each rank's shard round-tripped through
int8 blocks, restarting per parameter like the gradients' layout), and the backward gather over FSDP's
post-forward group stays exact (hpZ), as in the GPU runs, where every zpccl row had qwZ int8.

    python perf/experiments/grad_format_cpu.py --world 4 --nodes 2 --reshard 2 --steps 30 \\
        --variants exact,q8r,q8f,q4r --out x.json

The JSON (``--out``, rewritten after every variant) holds the provenance (perf/provenance.py), the arguments and
each variant's curve.
"""
from __future__ import annotations

import argparse, copy, json, os, pathlib, sys, time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools/python"))
sys.path.insert(0, str(ROOT / "tools/python/examples"))
sys.path.insert(0, str(ROOT / "perf"))

import zpccl.launch  # noqa: E402  (the spawned ranks; loads neither torch nor the library)
from provenance import provenance  # noqa: E402  (perf/provenance.py)
from tests import _reference as ref  # noqa: E402  (pure NumPy, no zpccl)

BLOCK = 256


def f32_of_bf16(t):
    import torch
    return ref.to_f32(t.detach().contiguous().view(torch.int16).numpy().view(np.uint16), ref.BF16)


def bf16_tensor(bits: np.ndarray):
    import torch
    return torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16)


def by_parts(fn, x32: np.ndarray, sizes, bits: int, restart: bool) -> np.ndarray:
    """``fn(x, bits, BLOCK)`` over one rank's slice: per parameter part (restart) or over the whole slice."""
    if not restart:
        return fn(x32, bits, BLOCK)
    out, at = [], 0
    for s in sizes:
        out.append(fn(x32[at:at + s], bits, BLOCK))
        at += s
    return np.concatenate(out)


def rt_parts(x32: np.ndarray, sizes, bits: int, restart: bool) -> np.ndarray:
    """fp32 round trip of one rank's slice, blocks per parameter part (restart) or over the whole slice."""
    return by_parts(ref.round_trip_f32, x32, sizes, bits, restart)


def scales_parts(x32: np.ndarray, sizes, bits: int, restart: bool) -> np.ndarray:
    """Each element's block scale, blocks as rt_parts'."""
    return by_parts(ref.block_scales_per_element, x32, sizes, bits, restart)


def qgz_dest(slices: list[np.ndarray], sizes, bits, restart, node_of_rank) -> np.ndarray:
    """The fp32 SUM qgZ gives one destination (quant_reduce_scatter's loop body for that dest)."""
    nodes = ref.node_layout(node_of_rank)
    two_hop = len(nodes) > 1 and len(nodes[0]) > 1 and all(len(g) == len(nodes[0]) for g in nodes)
    if not two_hop:
        parts = [rt_parts(s, sizes, bits, restart) for s in slices]
    else:
        parts = []
        for group in nodes:
            acc = None
            for r in group:
                v = rt_parts(slices[r], sizes, bits, restart)
                acc = v if acc is None else (acc + v).astype(np.float32)
            parts.append(rt_parts(acc, sizes, bits, restart))
    acc = parts[0]
    for p in parts[1:]:
        acc = (acc + p).astype(np.float32)
    return acc, two_hop


def worker(a: argparse.Namespace) -> None:
    """One rank (zpccl.launch's rendezvous in the environment)."""
    rank = int(os.environ["RANK"])
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
    import fsdp2_train as ex

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    record = provenance("cpu-gloo") if rank == 0 else None
    mesh = init_device_mesh("cpu", (a.world,))
    world = a.world
    node_of_rank = [r // (world // a.nodes) for r in range(world)]
    base = ex.build_gpt(torch, a.layers, a.d, a.heads, a.seq)
    text = ex.corpus(4 << 20)
    reshard = {"true": True, "false": False}.get(a.reshard.lower()) if a.reshard.lower() in ("true", "false") \
        else int(a.reshard)
    results = {}
    for variant in a.variants.split(","):
        # variant[@key=val...]: dseed (data seed offset), warm (warmup steps), clip, qwz, nseed
        name, *opts = variant.split("@")
        o = dict(kv.split("=") for kv in opts)
        dseed, warm = int(o.get("dseed", 0)), int(o.get("warm", 0))
        clip, qwz, nseed = float(o.get("clip", 0)), int(o.get("qwz", a.qwz)), int(o.get("nseed", 0))
        data = ex.Batches(torch, text, a.seq, a.batch, rank, "cpu")
        model = ex.shard_gpt(torch, copy.deepcopy(base), mesh, reshard)
        step_now = [0]
        stats = []  # per call on this rank
        calls = [0]
        opt_ref = [None]

        def reduce_fn(pg, output, inp, group, op):
            n = group.size()
            count = output.numel()
            sizes = [p.padded_sharded_param_size.numel() for p in pg.fsdp_params if p.sharded_param.requires_grad]
            assert sum(sizes) == count, (sizes, count)
            every = [torch.empty_like(inp) for _ in range(n)]
            dist.all_gather(every, inp.contiguous(), group=group)
            me = dist.get_rank(group)
            slices = [f32_of_bf16(t[me * count:(me + 1) * count]) for t in every]
            avg = op == dist.ReduceOp.AVG
            assert avg or op == dist.ReduceOp.SUM, op
            exact = sum(s.astype(np.float64) for s in slices)
            if avg:
                exact = exact / n
            rng = np.random.default_rng([nseed, step_now[0], calls[0], rank])
            calls[0] += 1
            st = {}
            if name == "exact":
                res32 = exact.astype(np.float32)
            elif name == "adiag":  # exact training; what each format's error does to this step's Adam update
                res32 = exact.astype(np.float32)
                b1, b2, eps = 0.9, 0.999, 1e-8
                st = {"adam": {}}
                for fmt in ("q8r", "q8f", "q4r", "q4f"):
                    bits, restart = int(fmt[1]), fmt[2] == "r"
                    s32, _ = qgz_dest(slices, sizes, bits, restart, node_of_rank)
                    q = (s32 / np.float32(n)).astype(np.float32) if avg else s32
                    e = ref.to_f32(ref.from_f32(q, ref.BF16), ref.BF16).astype(np.float64) - exact
                    du2 = u2 = dumax = 0.0
                    at = 0
                    for p, size in zip(pg.fsdp_params, sizes):
                        sp = p.sharded_param
                        k = sp._local_tensor.numel()
                        g = exact[at:at + k]
                        state = opt_ref[0].state.get(sp, {})
                        t = int(state["step"]) + 1 if "step" in state else 1
                        m = state["exp_avg"].to_local().reshape(-1).double().numpy() if "exp_avg" in state else 0.0
                        v = state["exp_avg_sq"].to_local().reshape(-1).double().numpy() if state else 0.0
                        m1 = b1 * m + (1 - b1) * g
                        v1 = b2 * v + (1 - b2) * g * g
                        den = np.sqrt(v1 / (1 - b2 ** t)) + eps
                        u = m1 / (1 - b1 ** t) / den
                        gq = g + e[at:at + k]  # the whole update with the quantized gradient (not linearized)
                        mq = b1 * m + (1 - b1) * gq
                        vq = b2 * v + (1 - b2) * gq * gq
                        du = mq / (1 - b1 ** t) / (np.sqrt(vq / (1 - b2 ** t)) + eps) - u
                        du2 += float((du ** 2).sum()); u2 += float((u ** 2).sum())
                        dumax = max(dumax, float(np.abs(du).max()) if k else 0.0)
                        at += size
                    st["adam"][fmt] = dict(du2=du2, u2=u2, dumax=dumax)
            elif name.startswith("nrel"):
                e = float(name[4:])
                res32 = (exact * (1 + e * rng.standard_normal(count))).astype(np.float32)
            elif name.startswith("q") or name.startswith("nq"):
                qn = name[1:] if name.startswith("q") else name[2:]
                bits, restart = int(qn[:-1]), qn[-1] == "r"
                s32, two_hop = qgz_dest(slices, sizes, bits, restart, node_of_rank)
                q = (s32 / np.float32(n)).astype(np.float32) if avg else s32
                if name.startswith("nq"):  # same error magnitudes, random signs
                    err = np.abs(q.astype(np.float64) - exact)
                    res32 = (exact + err * rng.choice([-1.0, 1.0], count)).astype(np.float32)
                else:
                    res32 = q
                if a.stats:
                    qb = ref.to_f32(ref.from_f32(q, ref.BF16), ref.BF16).astype(np.float64)
                    err = qb - exact
                    qmax = ref.QMAX[bits]
                    scale_sum = sum(scales_parts(s, sizes, bits, restart) for s in slices)
                    mag = sum(np.abs(s.astype(np.float64)) for s in slices)
                    hops = 0.5 + (0.5 * (1 + 1 / (2 * qmax)) if two_hop else 0.0)
                    bound = scale_sum * hops + mag * 2.0 ** -20 + 1e-30
                    if avg:
                        bound = bound / n
                    bound = bound * (1 + 2.0 ** -8) + np.abs(exact) * 2.0 ** -8  # the final bf16 rounding
                    ratio = np.abs(err) / bound
                    st = dict(viol=int((ratio > 1).sum()), max_ratio=float(ratio.max()),
                              zero_exact_nonzero=int(((exact == 0) & (qb != 0)).sum()),
                              # elements whose block scale is an fp32 denormal (0 < scale < 2^-126)
                              tiny_scales=int(sum(((sc > 0) & (sc < 2.0 ** -126)).sum() for sc in
                                                  (scales_parts(s, sizes, bits, restart) for s in slices))),
                              parts=[])
                    at = 0
                    for fp, s in zip(pg.fsdp_params, sizes):
                        e = err[at:at + s]
                        x = exact[at:at + s]
                        sd = float(e.std()) + 1e-300
                        st["parts"].append(dict(
                            name=str(fp._param_fqn), zero_nz=int(((x == 0) & (qb[at:at + s] != 0)).sum()),
                            size=s, absmax=float(np.abs(x).max()), rms=float(np.sqrt((x ** 2).mean())),
                            err_rms=float(np.sqrt((e ** 2).mean())), err_max=float(np.abs(e).max()),
                            bias_z=float(e.mean() / (sd / np.sqrt(s))),
                            # error correlated with the gradient itself (shrinkage: rounding small values to 0)
                            corr=float(np.dot(e, x) / (np.linalg.norm(e) * np.linalg.norm(x) + 1e-300)),
                            zeroed=float(((qb[at:at + s] == 0) & (x != 0)).mean()),
                            flipped=float((qb[at:at + s] * x < 0).mean()),
                            # elements whose error exceeds their own exact value (what Adam normalizes)
                            swamped=float((np.abs(e) > np.abs(x)).mean())))
                        at += s
            else:
                raise SystemExit(f"unknown variant {name}")
            if (a.stats or name == "adiag") and st:
                st["step"] = step_now[0]
                stats.append(st)
            output.copy_(bf16_tensor(ref.from_f32(res32, ref.BF16)).view(output.shape))

        def gather_fn(pg, output, inp, group):
            n = group.size()
            x = inp
            if qwz and n == world:  # qwZ over the shard group; the post-forward (hpZ) gather stays exact
                sizes = [p._sharded_param_data.numel() for p in pg.fsdp_params]
                assert sum(sizes) == inp.numel()
                x32 = f32_of_bf16(inp) if inp.dtype == torch.bfloat16 else inp.numpy()
                rt = rt_parts(x32, sizes, qwz, name.endswith("r") or not name.startswith("q"))
                x = bf16_tensor(ref.from_f32(rt, ref.BF16)) if inp.dtype == torch.bfloat16 \
                    else torch.from_numpy(rt)
            dist.all_gather(list(output.view(n, -1).unbind(0)), x.contiguous(), group=group)

        class RS(ReduceScatter):
            def __init__(self, pg): self.pg = pg
            def allocate(self, size, *, dtype, device): return torch.empty(size, dtype=dtype, device=device)
            def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
                reduce_fn(self.pg, output_tensor, input_tensor, group, op)
                return None

        class AG(AllGather):
            def __init__(self, pg): self.pg = pg
            def allocate(self, size, *, dtype, device): return torch.empty(size, dtype=dtype, device=device)
            def __call__(self, output_tensor, input_tensor, group, async_op=False):
                gather_fn(self.pg, output_tensor, input_tensor, group)
                return None

        for m in list(model.blocks) + [model]:
            pgs = m._get_fsdp_state()._fsdp_param_groups
            pgs = pgs if isinstance(pgs, list) else [pgs]
            for pg in pgs:
                m.set_custom_reduce_scatter(RS(pg))
                m.set_custom_all_gather(AG(pg))
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=a.wd)
        opt_ref[0] = opt
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
        curve, gnorms = [], []
        t0 = time.time()
        for s in range(a.steps):
            step_now[0] = s
            calls[0] = 0
            ids, targets = data.step(s + 1000 * dseed)
            loss = ex.loss_of(torch, model, ids, targets)
            loss.backward()
            if clip:
                gn = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            else:
                gn = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
            gnorms.append(float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn))
            opt.step()
            sched.step()
            opt.zero_grad()
            mean = loss.detach().clone()
            dist.all_reduce(mean, op=dist.ReduceOp.SUM)
            curve.append(float(mean) / world)
        valid = None
        if a.valid:
            with torch.no_grad():
                tot = sum(ex.loss_of(torch, model, i, t).detach() for i, t in data.validation(4)) / 4
            dist.all_reduce(tot, op=dist.ReduceOp.SUM)
            valid = float(tot) / world
        allstats = [None] * world
        dist.all_gather_object(allstats, stats)
        results[variant] = dict(curve=curve, gnorm=gnorms, valid=valid, last10=float(np.mean(curve[-10:])),
                                stats=allstats if (a.stats or name == "adiag") else None)
        if rank == 0:
            print(f"{world}r/{a.nodes}n {variant:28s} last10 {results[variant]['last10']:.4f} valid {valid} "
                  f"({time.time() - t0:.0f} s)  " + " ".join(f"{x:.3f}" for x in curve), flush=True)
            with open(a.out, "w") as f:
                json.dump(dict(provenance=record, args=vars(a), results=results), f)
        del model, opt
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--reshard", default="2")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--wd", type=float, default=0.01)  # int8_bisect.py's AdamW(lr=1e-3): torch's default 0.01
    p.add_argument("--qwz", type=int, default=0)
    p.add_argument("--stats", action="store_true")
    p.add_argument("--valid", action="store_true")
    p.add_argument("--variants", default="exact,q8r,q8f,q4r")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    zpccl.launch.spawn(worker, a.world, a)


if __name__ == "__main__":
    main()
