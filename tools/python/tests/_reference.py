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


def quant_reduce_scatter(sends: list[np.ndarray], dtype: str, op: str, bits: int, block: int,
                         node_of_rank: list[int]) -> list[np.ndarray]:
    """qgZ's result on every rank, following the plan in DESIGN.md: one hop (sum of every rank's quantized
    slice, in rank order) unless there are several nodes of several ranks each, all equal; then two hops: per
    node, the local ranks' quantized slices summed in local order and requantized, then those partials summed in
    node order. fp32 sums; avg divides the fp32 sum by nranks; one rounding to the output type at the end."""
    nranks = len(sends)
    n = sends[0].size // nranks
    slices = [[to_f32(s[d * n:(d + 1) * n], dtype) for d in range(nranks)] for s in sends]
    nodes = node_layout(node_of_rank)
    two_hop = len(nodes) > 1 and len(nodes[0]) > 1 and all(len(g) == len(nodes[0]) for g in nodes)
    results = []
    for dest in range(nranks):
        if not two_hop:
            parts = [round_trip_f32(slices[r][dest], bits, block) for r in range(nranks)]
        else:
            parts = []
            for group in nodes:  # node order
                acc = None
                for r in group:  # local order
                    v = round_trip_f32(slices[r][dest], bits, block)
                    acc = v if acc is None else (acc + v).astype(np.float32)
                parts.append(round_trip_f32(acc, bits, block))
        acc = parts[0]
        for p in parts[1:]:
            acc = (acc + p).astype(np.float32)
        if op == "avg":
            acc = (acc / np.float32(nranks)).astype(np.float32)
        results.append(from_f32(acc, dtype))
    return results


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
