#!/usr/bin/env python3
"""Over sockets on one shared GPU (regime net-on1gpu, two ranks as two nodes), a model of every NCCL call's time by
the NCCL buffers it moves: each call costs ``t0`` plus ``s`` for every buffer (``NCCL_BUFFSIZE``, 4 MiB by default)
that a rank sends, the last one started counted whole. perf/notebook/slow_links.md ("Over sockets on one shared
GPU, a call costs its buffers") explains it and what it predicts.

    python3 perf/experiments/buffer_units.py perf/results/2026-12-05-h100x1-all-reduce-net-2edefb7.json \\
        perf/results/2026-12-05-h200x1-check-1c1aab7.json          # fit t0 and s, each row against the fit
    python3 perf/experiments/buffer_units.py --predict 16M,64M,256M --predict-env ZP_MAX_CHUNKS=1 FILES...

Rows: ``quant_all_reduce`` (two calls a chunk: qgZ's pair all-gather, then the gather of the reduced shards),
``qwz_all_gather`` and ``qgz_reduce_scatter`` (one a chunk), each beside its NCCL baseline (one call: the
all-reduce sends its whole size a rank, the gather and the reduce-scatter half of it). zpccl's chunks follow
host/chunk_plan.h (ZP_CHUNK_BYTES, ZP_MAX_CHUNKS and ZP_CHUNK_ALIGN_BYTES from the row's env), and its payloads
include/zpccl.h's format (fp32 scales and codes, each padded to 16 bytes).
"""
from __future__ import annotations

import argparse
import math
import pathlib
import sys
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tools"))
from perf_files import load, size_of  # noqa: E402

MIB = 1 << 20
OPS = {"quant_all_reduce", "qwz_all_gather", "qgz_reduce_scatter"}


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def payload(count: int, bits: int, block: int) -> int:
    """One payload's bytes (host/quant_format.h's quantPayloadBytes): scales and codes, each padded to 16."""
    if count == 0:
        return 0
    return ceil_div(ceil_div(count, block) * 4, 16) * 16 + ceil_div(ceil_div(count * bits, 8), 16) * 16


def chunks(count: int, block: int, logical: int, env: dict[str, Any], bits: int) -> list[int]:
    """Elements of each chunk of one call (host/chunk_plan.h, across nodes: no ramp)."""
    chunk_bytes = int(env.get("ZP_CHUNK_BYTES") or 0) or 64 * MIB
    wanted = min(max(1, logical // chunk_bytes), min(int(env.get("ZP_MAX_CHUNKS") or 8), 16))
    blocks = ceil_div(count, block)
    unit = max(1, ceil_div(blocks, wanted))
    align = int(env.get("ZP_CHUNK_ALIGN_BYTES") or 0)
    per_buffer = (align - 16) // (block * bits // 8 + 4) if align > 16 else 0
    if wanted > 1 and per_buffer > 0:
        unit = ceil_div(unit, per_buffer) * per_buffer
    out, start = [], 0
    while start < count:
        out.append(min(unit * block, count - start))
        start += out[-1]
    return out


def calls(op: str, size: int, bits: int, block: int, env: dict[str, Any]) -> tuple[list[int], list[int]]:
    """Bytes a rank sends in each NCCL call: zpccl's, NCCL's (bf16, two ranks)."""
    count = size // 2
    if op == "quant_all_reduce":
        shard = ceil_div(ceil_div(count, 2), block) * block  # host/all_reduce_shards.h
        per_call = [payload(c, bits, block) for c in chunks(shard, block, shard * 4, env, bits)]
        return [b for b in per_call for _ in range(2)], [size]
    return [payload(c, bits, block) for c in chunks(count // 2, block, size, env, bits)], [size // 2]


def units(sent: list[int], buffer: int) -> int:
    return sum(ceil_div(b, buffer) for b in sent)


def fit(points: list[tuple[int, int, float]]) -> tuple[float, float]:
    """t0 and s minimizing the squared relative error of t0 x calls + s x buffers against each time."""
    a11 = a12 = a22 = b1 = b2 = 0.0
    for n, u, t in points:
        x1, x2 = n / t, u / t
        a11, a12, a22, b1, b2 = a11 + x1 * x1, a12 + x1 * x2, a22 + x2 * x2, b1 + x1, b2 + x2
    det = a11 * a22 - a12 * a12
    return (b1 * a22 - b2 * a12) / det, (a11 * b2 - a12 * b1) / det


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--predict", default="", help="sizes to predict, e.g. 15872K,16M,63M,64M,256M")
    ap.add_argument("--predict-env", nargs="*", default=[], help="VAR=value for the predicted zpccl plans")
    ap.add_argument("--buffer", type=int, default=4 * MIB, help="zpccl's NCCL buffer in predictions (4 MiB)")
    ap.add_argument("--nccl-buffer", type=int, default=0, help="the baseline's buffer in predictions (--buffer's)")
    args = ap.parse_args()

    rows = []
    for f in args.files:
        prov, file_rows = load(f)
        buffer = int(((prov or {}).get("env") or {}).get("NCCL_BUFFSIZE") or 4 * MIB)  # the files' own
        for r in file_rows:
            if r.get("op") in OPS and r.get("regime") == "net-on1gpu" and r.get("ranks") == 2 and r.get("nccl"):
                rows.append((pathlib.Path(f).name, r, buffer))
    points, table = [], []
    for name, r, buffer in rows:
        zp, nc = calls(r["op"], r["size"], r["bits"], r["block"], r.get("env") or {})
        for who, sent, t in (("zpccl", zp, r["oop"]["time_us"]), ("nccl", nc, r["nccl"]["time_us"])):
            points.append((len(sent), units(sent, buffer), t / 1e3))
            table.append((f"{r['op']} int{r['bits']} {r['size'] >> 20}M {who}", name) + points[-1])
    if not points:
        print("no net-on1gpu rows of two ranks in these files")
        return 1
    t0, s = fit(points)
    print(f"fit over {len(points)} times: {t0:.3f} ms a call + {s:.3f} ms a buffer started")
    errors = []
    for what, name, n, u, t in table:
        pred = t0 * n + s * u
        errors.append(pred / t - 1)
        print(f"  {what:36s} {u:3d} buffers  {pred:8.2f} ms  measured {t:8.2f}  {100 * errors[-1]:+6.1f}%  {name}")
    print(f"rms error {100 * math.sqrt(sum(e * e for e in errors) / len(errors)):.1f}%")

    if args.predict:
        env = dict(kv.split("=", 1) for kv in args.predict_env)
        buffer, nccl_buffer = args.buffer, args.nccl_buffer or args.buffer
        print(f"predicted (buffers a rank, ms, speedup over NCCL's all-reduce or gather), buffers of {buffer} bytes "
              f"(NCCL's {nccl_buffer}), zpccl env {env or 'none'}:")
        for size in (size_of(x) for x in args.predict.split(",")):
            _, nc = calls("quant_all_reduce", size, 8, 256, env)
            nccl = t0 + s * units(nc, nccl_buffer)
            cells = []
            for op in ("quant_all_reduce", "qwz_all_gather"):
                base = nccl if op == "quant_all_reduce" else t0 + s * units([size // 2], nccl_buffer)
                for bits in (8, 4):
                    zp, _ = calls(op, size, bits, 256, env)
                    ms = t0 * len(zp) + s * units(zp, buffer)
                    label = "all-reduce" if op == "quant_all_reduce" else "qwZ"
                    cells.append(f"{label} int{bits} {units(zp, buffer):3d} {ms:7.1f} ms {base / ms:4.2f}x")
            print(f"  {size / MIB:8.2f}M  ncclAllReduce {nccl:7.1f} ms | " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
