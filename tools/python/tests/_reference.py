"""A NumPy model of zpccl's block quantization format and of its collectives, written from include/zpccl.h and
docs/DESIGN.md only (not from the C code): the tests compare the library with it bit for bit.

Format: blocks of ``block`` elements (the last may be partial); in fp32, ``scale = absmax / qmax`` (qmax 127 for
8 bits, 7 for 4 bits), ``q = clamp(rint(x / scale), -qmax, qmax)`` (0 where the scale is 0 or NaN), and
``x' = q * scale`` rounded to the output type to nearest even, saturating at the largest finite value; a block
holding NaN or Inf dequantizes to NaN. Payload: the fp32 scales padded to 16 bytes, then the codes (int8, or
int4 two a byte, element 2i in the low nibble) padded to 16 bytes, padding zero.

bfloat16 arrays are uint16 arrays of bits here, so the model needs nothing beyond NumPy.
"""
from __future__ import annotations

from typing import Any

import numpy as np

QMAX = {8: 127, 4: 7}
F16, F32, BF16 = "float16", "float32", "bfloat16"
_MAX_FINITE = {F16: np.float16(65504.0), F32: np.finfo(np.float32).max}


def align16(n: int) -> int:
    """n rounded up to a multiple of 16."""
    return (n + 15) // 16 * 16


def payload_size(count: int, bits: int, block: int) -> int:
    """Bytes of a payload: scales padded to 16, then codes padded to 16 (0 for no elements)."""
    if count == 0:
        return 0
    return align16(-(-count // block) * 4) + align16((count * bits + 7) // 8)


def to_f32(x: np.ndarray, dtype: str) -> np.ndarray:
    """Exact fp32 values of an array of ``dtype`` (bfloat16: uint16 bits)."""
    if dtype == BF16:
        return (x.astype(np.uint32) << 16).view(np.float32)
    return x.astype(np.float32)


def from_f32(v: np.ndarray, dtype: str) -> np.ndarray:
    """fp32 values rounded to ``dtype`` to nearest even (bfloat16: uint16 bits); Inf stays Inf."""
    v = np.asarray(v, dtype=np.float32)
    if dtype == BF16:
        bits = v.view(np.uint32).astype(np.uint64)
        out = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        nan = np.isnan(v)
        out[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)
        return out
    with np.errstate(over="ignore"):
        return v.astype(np.dtype(dtype))


def random_data(rng: np.random.Generator, count: int, dtype: str, scale: float = 1.0) -> np.ndarray:
    """Normal values of ``dtype`` with varied block magnitudes (bfloat16 as uint16 bits)."""
    v = rng.standard_normal(count).astype(np.float32) * np.float32(scale)
    v *= np.float32(2.0) ** rng.integers(-3, 4, size=count // 64 + 1).repeat(64)[:count].astype(np.float32)
    return from_f32(v, dtype)


def quantize(x32: np.ndarray, bits: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """(fp32 scales per block, int32 codes per element) of fp32 values."""
    qmax = QMAX[bits]
    n = x32.size
    nb = -(-n // block)
    padded = np.zeros(nb * block, np.float32)
    padded[:n] = x32
    absmax = np.max(np.abs(padded.reshape(nb, block)), axis=1)
    with np.errstate(all="ignore"):
        scales = np.where(np.isfinite(absmax), absmax / np.float32(qmax), np.float32(np.nan)).astype(np.float32)
        s = np.repeat(scales, block)[:n]
        q = np.rint(np.clip(x32 / s, -qmax, qmax))
    q[~(s > 0)] = 0
    return scales, q.astype(np.int32)


def dequantize(scales: np.ndarray, codes: np.ndarray, block: int, dtype: str) -> np.ndarray:
    """Values of ``dtype`` of (scales, codes): q * scale rounded, saturated, NaN for a non-finite scale."""
    n = codes.size
    s = np.repeat(scales, block)[:n]
    prod = codes.astype(np.float32) * s
    out = from_f32(prod, dtype)
    if dtype == BF16:
        inf = (out & 0x7FFF) == 0x7F80
        out[inf] = (out[inf] & 0x8000) | 0x7F7F
        out[~np.isfinite(s)] = 0x7FC0
        return out
    out[np.isinf(out)] = np.copysign(_MAX_FINITE[dtype], out[np.isinf(out)])
    out[~np.isfinite(s)] = np.nan
    return out


def round_trip(x: np.ndarray, dtype: str, bits: int, block: int) -> np.ndarray:
    """x quantized then dequantized to its own type."""
    scales, codes = quantize(to_f32(x, dtype), bits, block)
    return dequantize(scales, codes, block, dtype)


def round_trip_f32(x32: np.ndarray, bits: int, block: int) -> np.ndarray:
    """fp32 values quantized then dequantized to fp32 (what a reduction adds up)."""
    scales, codes = quantize(x32, bits, block)
    return dequantize(scales, codes, block, F32)


def payload(x: np.ndarray, dtype: str, bits: int, block: int) -> np.ndarray:
    """The payload bytes of x, padding included."""
    n = x.size
    scales, codes = quantize(to_f32(x, dtype), bits, block)
    out = np.zeros(payload_size(n, bits, block), np.uint8)
    out[:scales.size * 4] = scales.view(np.uint8)
    start = align16(scales.size * 4)
    nibbles = (codes & (0xFF if bits == 8 else 0xF)).astype(np.uint8)
    if bits == 4:
        if n % 2:
            nibbles = np.append(nibbles, np.uint8(0))
        nibbles = nibbles[0::2] | (nibbles[1::2] << 4)
    out[start:start + nibbles.size] = nibbles
    return out


def block_scales_per_element(x32: np.ndarray, bits: int, block: int) -> np.ndarray:
    """Each element's block scale (absmax / qmax) as float64."""
    scales, _ = quantize(x32, bits, block)
    return np.repeat(scales.astype(np.float64), block)[:x32.size]


def node_layout(node_of_rank: list[int]) -> list[list[int]]:
    """Ranks of each node, ascending, nodes numbered in order of their lowest rank (as zpccl numbers them)."""
    order: list[int] = []
    for node in node_of_rank:
        if node not in order:
            order.append(node)
    return [[r for r, n in enumerate(node_of_rank) if n == key] for key in order]


def finish(parts: list[np.ndarray], op: str, nranks: int, dtype: str) -> np.ndarray:
    """qgZ's last step: the fp32 parts summed in order, avg divided by nranks, rounded once to the output type."""
    acc = parts[0]
    for p in parts[1:]:
        acc = (acc + p).astype(np.float32)
    if op == "avg":
        acc = (acc / np.float32(nranks)).astype(np.float32)
    return from_f32(acc, dtype)


def quant_reduce_scatter(sends: list[np.ndarray], dtype: str, op: str, bits: int, block: int,
                         node_of_rank: list[int]) -> list[np.ndarray]:
    """qgZ's result on every rank, following the plan in DESIGN.md: one hop (sum of every rank's quantized
    slice, in rank order) unless there are several nodes of several ranks each, all equal; then two hops: per
    node, the local ranks' quantized slices summed in local order and requantized, then those partials summed in
    node order. fp32 sums; avg divides the fp32 sum by nranks; one rounding to the output type at the end."""
    nranks = len(sends)
    n = sends[0].size // nranks
    return [reduce_slice([s[d * n:(d + 1) * n] for s in sends], dtype, op, bits, block, node_of_rank)
            for d in range(nranks)]


def reduce_slice(parts: list[np.ndarray], dtype: str, op: str, bits: int, block: int,
                 node_of_rank: list[int]) -> np.ndarray:
    """qgZ's reduction of one destination's slice, ``parts[r]`` being rank r's (see :func:`quant_reduce_scatter`)."""
    nranks = len(parts)
    slices = [to_f32(p, dtype) for p in parts]
    nodes = node_layout(node_of_rank)
    two_hop = len(nodes) > 1 and len(nodes[0]) > 1 and all(len(g) == len(nodes[0]) for g in nodes)
    if not two_hop:
        sums = [round_trip_f32(slices[r], bits, block) for r in range(nranks)]
    else:
        sums = []
        for group in nodes:  # node order
            acc = None
            for r in group:  # local order
                v = round_trip_f32(slices[r], bits, block)
                acc = v if acc is None else (acc + v).astype(np.float32)
            sums.append(round_trip_f32(acc, bits, block))
    return finish(sums, op, nranks, dtype)


def all_reduce_shard(count: int, nranks: int, block: int) -> int:
    """Elements of a full shard of the quantized all-reduce: ceil(ceil(count / nranks) / block) * block."""
    return -(-(-(-count // nranks)) // block) * block


def quant_all_reduce(sends: list[np.ndarray], dtype: str, op: str, bits: int, block: int,
                     node_of_rank: list[int]) -> np.ndarray:
    """The quantized all-reduce's output (the same on every rank), from include/zpccl.h's "Quantized all-reduce":
    the tensor cut into shards of whole blocks (the last non-empty one shorter, later ones empty), each reduced as
    qgZ reduces a slice, then quantized and dequantized once more, as qwZ's gather moves it."""
    nranks, count = len(sends), sends[0].size
    shard = all_reduce_shard(count, nranks, block)
    out = np.empty_like(sends[0])
    for d in range(nranks):
        lo, hi = min(d * shard, count), min((d + 1) * shard, count)
        if hi > lo:
            reduced = reduce_slice([s[lo:hi] for s in sends], dtype, op, bits, block, node_of_rank)
            out[lo:hi] = round_trip(reduced, dtype, bits, block)
    return out


def reduce_scatter_bound(sends: list[np.ndarray], dtype: str, bits: int, block: int, two_hop: bool) -> np.ndarray:
    """Per element of rank r's output, an upper bound of |qgZ - exact sum| for a sum, from the quantization steps.

    Hop 1 errs by at most scale/2 per rank's slice; a second hop requantizes partial sums whose absmax is at most
    the sum of the parts' absmax (plus their errors), so its error is at most sum(scale) * (1 + 1/(2 qmax)) / 2.
    Accumulation in fp32 adds a few ulps of the magnitude: 2^-20 of sum(|x|) covers it.
    """
    nranks = len(sends)
    n = sends[0].size // nranks
    qmax = QMAX[bits]
    bounds = []
    for dest in range(nranks):
        parts = [to_f32(s[dest * n:(dest + 1) * n], dtype) for s in sends]
        scale_sum = sum(block_scales_per_element(p, bits, block) for p in parts)
        mag = sum(np.abs(p.astype(np.float64)) for p in parts)
        hops = 0.5 + (0.5 * (1 + 1 / (2 * qmax)) if two_hop else 0.0)
        bounds.append(scale_sum * hops + mag * 2.0**-20 + 1e-30)
    return bounds



#: Unit roundoff of each output type.
UNIT_ROUNDOFF = {F32: 2.0**-24, F16: 2.0**-11, BF16: 2.0**-8}
#: Half the smallest subnormal: what one rounding to the type costs below its smallest normal, where u does not apply.
HALF_SUBNORMAL = {F32: 2.0**-150, F16: 2.0**-25, BF16: 2.0**-134}


def all_reduce_bound(sends: list[np.ndarray], dtype: str, op: str, bits: int, block: int, two_hop: bool,
                     stochastic: bool) -> tuple[np.ndarray, np.ndarray]:
    """(the float64 sum, or mean, of the inputs; include/zpccl.h's bound on |all-reduce - it|) per element, block by
    block: with A the sum of the ranks' block maxima and M the largest |exact sum| of the block,
    E = A / (2q) (two hops: (A / (2q)) (2 + 1/(2q))), doubled in q's place by stochastic rounding, and
    E + (M + E) (1/(2q) + 3u) + (n + 1) 2^-16 A, divided by n for avg; plus half the type's smallest subnormal for
    each of the two roundings to the output type (what they cost below its smallest normal)."""
    q = QMAX[bits]
    qe = q / 2 if stochastic else q  # stochastic rounding: a whole step, A / q
    n, count = len(sends), sends[0].size
    xs = [to_f32(s, dtype).astype(np.float64) for s in sends]
    exact = sum(xs)
    bound = np.zeros(count)
    for b0 in range(0, count, block):
        blk = slice(b0, min(count, b0 + block))
        a = sum(float(np.abs(x[blk]).max()) for x in xs)
        m = float(np.abs(exact[blk]).max())
        e = a / (2 * qe) * (2 + 1 / (2 * qe)) if two_hop else a / (2 * qe)
        bound[blk] = e + (m + e) * (1 / (2 * q) + 3 * UNIT_ROUNDOFF[dtype]) + (n + 1) * 2.0**-16 * a
    below_normal = 2 * HALF_SUBNORMAL[dtype]
    if op == "avg":
        return exact / n, bound / n + below_normal
    return exact, bound + below_normal

# ---- gradient rounding (include/zpccl.h, "Gradient rounding"): stochastic rounding and error feedback -------------

_M32 = np.uint64(0xFFFFFFFF)


def philox4x32_10(ctr: list[Any], key: tuple[int, int]) -> list[np.ndarray]:
    """Philox4x32-10 (Random123) of counters given as four uint32 arrays (or scalars) under one key."""
    c = [np.asarray(x, dtype=np.uint64) & _M32 for x in ctr]
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    m0, m1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
    for _ in range(10):
        p0, p1 = m0 * c[0], m1 * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & _M32, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & _M32]
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & _M32, (k1 + np.uint64(0xBB67AE85)) & _M32
    return [x.astype(np.uint32) for x in c]


def grad_random16(n: int, seed: int, seq: int, rank: int, hop: int, slice_: int) -> np.ndarray:
    """The 16 random bits of elements 0..n-1 of a slice: one Philox call per 8 elements, counter
    (j / 8 low, j / 8 high | hop << 31, slice, rank), key (seed, sequence); element j takes bits 16 (j % 2) of word
    (j % 8) / 2."""
    groups = np.arange(-(-n // 8), dtype=np.uint64)
    words = philox4x32_10([groups & _M32, (groups >> np.uint64(32)) | np.uint64(hop << 31),
                           np.full(groups.size, slice_, np.uint64), np.full(groups.size, rank, np.uint64)],
                          (seed, seq & 0xFFFFFFFF))
    j = np.arange(n)
    w = np.stack(words, axis=1)[j // 8, (j % 8) // 2]
    return ((w >> (16 * (j % 2)).astype(np.uint32)) & 0xFFFF).astype(np.uint32)


def grad_quantize(x32: np.ndarray, bits: int, block: int, rand16: np.ndarray | None,
                  residual: np.ndarray | None) -> np.ndarray:
    """fp32 values as qgZ's quantization with gradient rounding sends them (dequantized to fp32): x plus the bf16
    residual (fp32 add), block scales of those sums, codes rounded to nearest (rand16 None) or stochastically:
    |v| up when frac(|v|) > (2u + 1) / 2^17. The residual (uint16 bf16 bits) is rewritten in place with
    bf16(v - dequantized), 0 in blocks whose scale is not finite."""
    if residual is not None:
        x32 = (x32 + to_f32(residual, BF16)).astype(np.float32)
    qmax = QMAX[bits]
    if rand16 is None:
        scales, codes = quantize(x32, bits, block)
    else:
        scales, _ = quantize(x32, bits, block)
        s = np.repeat(scales, block)[:x32.size]
        with np.errstate(all="ignore"):
            v = np.clip((x32 / s).astype(np.float32), -qmax, qmax).astype(np.float32)
            a = np.abs(v)
            whole = np.floor(a)
            frac = (a - whole).astype(np.float32)
            thr = (2 * rand16.astype(np.float32) + 1).astype(np.float32) * np.float32(2.0**-17)
            q = np.where(frac > thr, whole + np.float32(1), whole)
            q = np.where(v < 0, -q, q)
        q[~(s > 0)] = 0
        codes = q.astype(np.int32)
    dq = dequantize(scales, codes, block, F32)
    if residual is not None:
        with np.errstate(all="ignore"):
            new = from_f32((x32 - dq).astype(np.float32), BF16)
        new[~np.isfinite(np.repeat(scales, block)[:x32.size])] = 0
        residual[:] = new
    return dq


def quant_reduce_scatter_grad(sends: list[np.ndarray], dtype: str, op: str, bits: int, block: int,
                              node_of_rank: list[int], stochastic: bool | list[bool], seed: int | list[int],
                              seq: int, residuals: list[np.ndarray] | None, hop_residuals: list[np.ndarray] | None
                              ) -> list[np.ndarray]:
    """quant_reduce_scatter with gradient rounding: the sender's quantization of slice d on rank r draws as
    (rank r, hop 0, slice d) and keeps its residual in residuals[r][d n:(d + 1) n]; on two hops the intermediate
    rank (a, m) requantizes destination node b's partial drawing as (rank (a, m), hop 1, slice b), its residual in
    hop_residuals[(a, m)][b n:(b + 1) n]. ``stochastic`` and ``seed`` may be given per rank (both may differ between
    ranks): each quantizing rank rounds and draws by its own."""
    nranks = len(sends)
    n = sends[0].size // nranks
    stochastic_of = list(stochastic) if isinstance(stochastic, (list, tuple)) else [stochastic] * nranks
    seed_of = list(seed) if isinstance(seed, (list, tuple)) else [seed] * nranks

    def rnd(rank: int, hop: int, slice_: int) -> np.ndarray | None:
        return grad_random16(n, seed_of[rank], seq, rank, hop, slice_) if stochastic_of[rank] else None

    def res(arrays: list[np.ndarray] | None, rank: int, index: int) -> np.ndarray | None:
        return None if arrays is None or arrays[rank].size == 0 else arrays[rank][index * n:(index + 1) * n]

    sent = [[grad_quantize(to_f32(s[d * n:(d + 1) * n], dtype), bits, block, rnd(r, 0, d), res(residuals, r, d))
             for d in range(nranks)] for r, s in enumerate(sends)]
    nodes = node_layout(node_of_rank)
    two_hop = len(nodes) > 1 and len(nodes[0]) > 1 and all(len(g) == len(nodes[0]) for g in nodes)
    results = []
    for dest in range(nranks):
        if not two_hop:
            parts = [sent[r][dest] for r in range(nranks)]
        else:
            b = next(i for i, g in enumerate(nodes) if dest in g)
            m = nodes[b].index(dest)
            parts = []
            for group in nodes:
                acc = sent[group[0]][dest]
                for r in group[1:]:
                    acc = (acc + sent[r][dest]).astype(np.float32)
                inter = group[m]
                parts.append(grad_quantize(acc, bits, block, rnd(inter, 1, b), res(hop_residuals, inter, b)))
        results.append(finish(parts, op, nranks, dtype))
    return results


def quant_all_reduce_grad(sends: list[np.ndarray], dtype: str, op: str, bits: int, block: int,
                          node_of_rank: list[int], stochastic: bool | list[bool], seed: int | list[int], seq: int,
                          residuals: list[np.ndarray] | None, hop_residuals: list[np.ndarray] | None) -> np.ndarray:
    """The quantized all-reduce with gradient rounding (include/zpccl.h): qgZ's reduce-scatter with rounding
    (:func:`quant_reduce_scatter_grad`) over every rank's input padded with zeros to nranks shards, recvcount the
    shard, then the gather's round trip to nearest of each reduced shard, cut back to count. residuals (count
    elements a rank) and hop_residuals are rewritten as the call rewrites them."""
    nranks, count = len(sends), sends[0].size
    shard = all_reduce_shard(count, nranks, block)
    padded = []
    for s in sends:
        p = np.zeros(nranks * shard, s.dtype)
        p[:count] = s
        padded.append(p)
    padded_res = None
    if residuals is not None:
        padded_res = []
        for r in residuals:
            p = np.zeros(nranks * shard, np.uint16)
            p[:count] = r
            padded_res.append(p)
    reduced = quant_reduce_scatter_grad(padded, dtype, op, bits, block, node_of_rank, stochastic, seed, seq,
                                        padded_res, hop_residuals)
    if residuals is not None:
        for r, p in zip(residuals, padded_res):
            r[:] = p[:count]
    out = np.empty_like(sends[0])
    for d in range(nranks):
        lo, hi = min(d * shard, count), min((d + 1) * shard, count)
        if hi > lo:
            out[lo:hi] = round_trip(reduced[d][:hi - lo], dtype, bits, block)
    return out
