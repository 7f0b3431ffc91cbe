// qgZ's reduction kernels. Summation order and arithmetic are those of host/reduce_math.h (and, for the
// requantization, of host/quant_math.h): the results are bit-identical to the host backend's.
//
// Mapping: a CTA of 256 threads takes a tile of 8192 consecutive elements of one segment, and thread t of the
// CTA owns elements [32t, 32t + 32) of it, for every block size G. Its codes are one 16-byte vector per source
// (int4) or two (int8), 16-byte aligned because payload code regions are and 32 elements of codes are 16 or 32
// bytes. Since G >= 32 is a power of two, a thread's elements lie in one quantization block, and block b of the
// tile is held whole, as fp32 sums in registers, by the G / 32 consecutive threads of its group (1 thread for
// G = 32, 8 for G = 256, a warp for G = 1024, the whole CTA for G = 8192). A block's absmax is a shuffle
// reduction inside the group, with one exchange through shared memory when the group spans several warps.
// int8 takes 32 elements a thread too (two vectors, not one) so that one mapping serves every G: an 8192-element
// block still fits the registers of one CTA, and even G = 32 keeps 16-byte loads.
//
// Loads: each thread issues the codes and scales of a batch of two sources before summing them (in source order),
// so that the requantize kernel and the finish of more sources fit three CTAs an SM (kBatch). A finish of at most
// two sources (two ranks, or two nodes: the common jobs) keeps only 8 sums a thread live, not 32, and fits four
// CTAs an SM without spilling (finishFewSources). Codes are decoded with one byte permute an element into an
// operand like decodeCode's (prepareCodes), and a block whose scale cannot overflow skips dequantizeValue's
// saturation check (dequantIsPlain), so an element costs 4 instructions per source.
// Stores: the requantized codes leave as 16-byte vectors. Finished outputs pass through a per-warp staging
// buffer in shared memory, so that the warp writes its 1024 contiguous elements as lane-consecutive aligned
// 16-byte stores whatever the element alignment of the output (a misaligned output shifts each 16-byte window
// out of two staged chunks; element stores only at both ends of the warp's range). Even for an aligned output the
// stage pays: each thread storing its own 64 or 128 contiguous bytes (16-byte stores 64 or 128 bytes apart across
// the warp) makes the finish much slower (reduce_perf; perf/RESULTS.md, Kernels).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <cstdint>

#include "device/grad_rounding.h"
#include "device/launch_geometry.h"
#include "device/reduce.h"
#include "device/warp_reduce.h"
#include "host/base/check.h"
#include "host/quant_format.h"
#include "host/quant_math.h"
#include "host/reduce_math.h"

namespace zp {
namespace {

constexpr int kThreads = 256;                  // CTA size
constexpr int kElems = 32;                     // elements a thread owns (a block holds G / kElems threads)
constexpr int kTileElems = kThreads * kElems;  // elements a CTA takes at a time
constexpr int kWarpElems = 32 * kElems;        // elements a warp owns, contiguous
constexpr int kWaves = 8;                      // grid: resident CTAs times this, grid-stride beyond (gridFor)

// Code words a thread reads per source (int4: one 16-byte vector; int8: two).
template <int Bits>
constexpr int codeWords() {
  return kElems * Bits / 32;
}

// Words of decodeCode operands a thread prepares from one source's code words (prepareCodes).
template <int Bits>
constexpr int preparedWords() {
  return codeWords<Bits>() * (Bits == 4 ? 2 : 1);
}

// Sources whose loads are in flight together when a thread keeps all its kElems sums (sumSources: the requantize
// kernel, and the finish of more than kFewSources sources): two, so that three CTAs share an SM (registers and
// spills: perf/KERNELS.md). Three CTAs an SM hide the loads' latency better than four sources in flight on two CTAs
// an SM, for the requantize and the finish alike, at both code widths (reduce_perf; perf/RESULTS.md, Kernels).
constexpr int kBatch = 2;
// Sources of a segment up to which the finish keeps 8 sums a thread live (finishFewSources).
constexpr int kFewSources = 2;
// CTAs an SM for the finish kernel of at most kFewSources sources (finishFewSources), which keeps kFewGroup sums a
// thread live instead of kElems: four fit its registers, five spill (perf/KERNELS.md).
constexpr int kFewSourcesCtas = 4;

// The constants of the code decoding (prepareCodes, codeValue), passed at run time so that the compiler keeps them
// in registers: a byte permute then takes its selector as the immediate (with both as constants it moves the
// selector into a register, one extra instruction an element), and a flip and a mask of int4 codes make one LOP3.
// That is fewer instructions for int4 than a mask and a flip for each even nibble and a shift more for each odd
// one; int8's decoding is the same either way, and its register allocation may differ (reduce_perf).
struct DecodeConstants {
  // Bytes 3 and 2: the high bytes of 2^23 (0x4b000000, decodeCode's operand) and of 2^19 (0x49000000, the operand
  // of an odd int4 code, left in bits 4 - 7 of its byte); bytes 1 and 0: zero.
  uint32_t magic;
  uint32_t int4Flips;  // 0x88888888: the sign bits of both int4 codes of every byte
};

struct ReduceArgs {
  const unsigned char* base;  // segment 0's source 0
  size_t sourceStride;        // bytes between the sources of a segment
  size_t segmentStride;       // bytes between segments
  size_t count;               // elements per payload
  size_t blocks;              // quantization blocks per payload
  size_t scaleBytes;          // where the codes start in a payload (scales plus padding)
  size_t tiles;               // tiles per segment
  size_t work;                // tiles of all segments
  int sources;                // payloads summed per segment, >= 1
  int blockShift;             // log2(G)
  int groupShift;             // log2(G / kElems): threads per block
  DecodeConstants decode;
  PeerSync sync;  // KernelStream::sync
};

// The segment of tile `work`: a 64-bit division is a software routine, called each tile, and most launches have
// one segment (every tile of it below `tiles`).
__device__ __forceinline__ size_t segmentOf(size_t work, size_t tiles) { return work < tiles ? 0 : work / tiles; }

// ---- summing the sources ---------------------------------------------------------------------------------------

// Operands of decodeCode, prepared once per word, one logic instruction each: int8 keeps the four codes of a word
// with their sign bits flipped ((code ^ 0x80) per byte); int4 splits each word into its even codes, in place and
// flipped ((code ^ 8) per byte), and its odd codes, in place (bits 4 - 7 of each byte) and flipped ((code ^ 8) << 4).
// Element k's operand is then one byte permute away: 0x4b000000 | (code ^ bias), that is 2^23 + (code ^ bias), or
// for an odd int4 code 0x49000000 | ((code ^ 8) << 4), that is 2^19 + (code ^ 8) (fp32 spaces 2^19 by 2^-4).
template <int Bits>
__device__ __forceinline__ void prepareCodes(const uint32_t (&w)[codeWords<Bits>()], const DecodeConstants& d,
                                             uint32_t (&x)[preparedWords<Bits>()]) {
#pragma unroll
  for (int i = 0; i < codeWords<Bits>(); ++i) {
    if constexpr (Bits == 8) {
      x[i] = w[i] ^ 0x80808080u;
    } else {
      x[2 * i] = (w[i] ^ d.int4Flips) & 0x0f0f0f0fu;
      x[2 * i + 1] = (w[i] ^ d.int4Flips) & 0xf0f0f0f0u;
    }
  }
}

// decodeCode<Bits> of the thread's element k (a constant after unrolling), from the prepared words: the same value,
// code ^ bias less the bias, exact in fp32 either way (both operands and their difference are exact).
template <int Bits>
__device__ __forceinline__ float codeValue(const uint32_t (&x)[preparedWords<Bits>()], int k,
                                           const DecodeConstants& d) {
  constexpr float kBias = static_cast<float>(1 << (Bits - 1));
  const bool odd = Bits == 4 && (k & 1);
  // Byte 0: the prepared code byte; bytes 1, 2: zero (byte 4 of the permute's input, magic's byte 0); byte 3:
  // the exponent's byte (byte 7 or 6 of the input: magic's byte 3 or 2).
  const uint32_t word = Bits == 8 ? x[k >> 2] : x[2 * (k >> 3) + (k & 1)];
  const uint32_t byte = Bits == 8 ? (k & 3) : ((k >> 1) & 3);
  const float magic = odd ? 524288.0f : 8388608.0f;
  return addRn(bitsFloat(__byte_perm(word, d.magic, (odd ? 0x6440u : 0x7440u) | byte)), -(magic + kBias));
}

// Element k's value in one source: the plain product when the block's scale is plain (dequantIsPlain: no code can
// overflow, so dequantizeValue is the product alone), else dequantizeValue (NaN block, or a scale near FLT_MAX).
template <int Bits, bool Plain>
__device__ __forceinline__ float sourceValue(const uint32_t (&x)[preparedWords<Bits>()], int k, float scale,
                                             const DecodeConstants& d) {
  const float code = codeValue<Bits>(x, k, d);
  return Plain ? mulRn(code, scale) : bitsFloat(dequantizeValue<Fp32Type>(code, scale));
}

// Adds one source (codes w, block scale) to the thread's sums, or starts them (First): acc = v for the first
// source, acc + v after, as the host reference does. True when the block's scale is plain (every product finite).
template <int Bits, bool First>
__device__ __forceinline__ bool addSource(const uint32_t (&w)[codeWords<Bits>()], float scale, const DecodeConstants& d,
                                          float (&acc)[kElems]) {
  uint32_t x[preparedWords<Bits>()];
  prepareCodes<Bits>(w, d, x);
  if (dequantIsPlain<Fp32Type, Bits>(scale)) {  // each case its own loop
#pragma unroll
    for (int k = 0; k < kElems; ++k) {
      const float v = sourceValue<Bits, true>(x, k, scale, d);
      acc[k] = First ? v : addRn(acc[k], v);
    }
    return true;
  }
#pragma unroll
  for (int k = 0; k < kElems; ++k) {
    const float v = sourceValue<Bits, false>(x, k, scale, d);
    acc[k] = First ? v : addRn(acc[k], v);
  }
  return false;
}

// The codes of the thread's elements [elem, elem + valid) in one payload (codeOffset: where the first one is): 16-byte
// vectors when all kElems exist, else only the bytes that hold elements < count (the payload's last, partial
// group), zeros after.
template <int Bits>
__device__ __forceinline__ void loadCodes(const unsigned char* payload, size_t codeOffset, int valid,
                                          uint32_t (&w)[codeWords<Bits>()]) {
  if (valid == kElems) {
#pragma unroll
    for (int v = 0; v < codeWords<Bits>() / 4; ++v) {
      const uint4 c = __ldg(reinterpret_cast<const uint4*>(payload + codeOffset) + v);
      w[4 * v] = c.x, w[4 * v + 1] = c.y, w[4 * v + 2] = c.z, w[4 * v + 3] = c.w;
    }
    return;
  }
  const int bytes = (valid * Bits + 7) / 8;
#pragma unroll
  for (int i = 0; i < codeWords<Bits>(); ++i) w[i] = 0;
#pragma unroll
  for (int b = 0; b < 4 * codeWords<Bits>(); ++b) {
    if (b < bytes) w[b >> 2] |= static_cast<uint32_t>(__ldg(payload + codeOffset + b)) << (8 * (b & 3));
  }
}

// Source s of a segment (seg: its source 0): the scale of the thread's block (returned) and, into w, the codes of
// the thread's elements as loadCodes reads them (codeOffset: where the first is; valid: how many exist).
template <int Bits>
__device__ __forceinline__ float loadSource(const ReduceArgs& a, const unsigned char* seg, int s, size_t block,
                                            size_t codeOffset, int valid, uint32_t (&w)[codeWords<Bits>()]) {
  const unsigned char* payload = seg + static_cast<size_t>(s) * a.sourceStride;
  const float scale = __ldg(reinterpret_cast<const float*>(payload) + block);
  loadCodes<Bits>(payload, codeOffset, valid, w);
  return scale;
}

// Sources [s0, s0 + kBatch) (those that exist; s0 itself does): all loads first, then the sums in order. True
// when every one was plain.
template <int Bits, bool First>
__device__ __forceinline__ bool addSourceBatch(const ReduceArgs& a, const unsigned char* seg, size_t block,
                                               size_t codeOffset, int s0, float (&acc)[kElems]) {
  uint32_t w[kBatch][codeWords<Bits>()];
  float scale[kBatch];
#pragma unroll
  for (int u = 0; u < kBatch; ++u) {
    if (u == 0 || s0 + u < a.sources) scale[u] = loadSource<Bits>(a, seg, s0 + u, block, codeOffset, kElems, w[u]);
  }
  bool plain = addSource<Bits, First>(w[0], scale[0], a.decode, acc);
#pragma unroll
  for (int u = 1; u < kBatch; ++u) {
    if (s0 + u < a.sources) plain &= addSource<Bits, false>(w[u], scale[u], a.decode, acc);
  }
  return plain;
}

// Fixed-order fp32 sums over the segment's sources of the thread's elements [elem, elem + kElems), of which the
// first `valid` (1..kElems) exist. Sums past `valid` are left over from zero codes and must not be used. True
// when every source's block was plain: the sums are then finite or +-Inf, never NaN (no addend is infinite).
template <int Bits>
__device__ __forceinline__ bool sumSources(const ReduceArgs& a, const unsigned char* seg, size_t elem, int valid,
                                           float (&acc)[kElems]) {
  const size_t block = elem >> a.blockShift;
  const size_t codeOffset = a.scaleBytes + elem * Bits / 8;
  bool plain = true;
  if (valid == kElems) {
    plain = addSourceBatch<Bits, true>(a, seg, block, codeOffset, 0, acc);
#pragma unroll 1
    for (int s0 = kBatch; s0 < a.sources; s0 += kBatch) {
      plain &= addSourceBatch<Bits, false>(a, seg, block, codeOffset, s0, acc);
    }
    return plain;
  }
  // The last, partial group of codes of the payload.
#pragma unroll 1
  for (int s = 0; s < a.sources; ++s) {
    uint32_t w[codeWords<Bits>()];
    const float scale = loadSource<Bits>(a, seg, s, block, codeOffset, valid, w);
    if (s == 0) {
      plain = addSource<Bits, true>(w, scale, a.decode, acc);
    } else {
      plain &= addSource<Bits, false>(w, scale, a.decode, acc);
    }
  }
  return plain;
}

// ---- requantize --------------------------------------------------------------------------------------------------

// One word of packed codes: 4 int8 codes (element i in byte i) or 8 int4 codes (element 2i in the low nibble of
// byte i), from their code words (higher bits ignored).
template <int Bits>
__device__ __forceinline__ uint32_t packWord(const uint32_t (&c)[32 / Bits]) {
  if constexpr (Bits == 8) {
    return __byte_perm(__byte_perm(c[0], c[1], 0x0040), __byte_perm(c[2], c[3], 0x0040), 0x5410);
  } else {
    const uint32_t b0 = packInt4Pair(c[0], c[1]), b1 = packInt4Pair(c[2], c[3]);
    const uint32_t b2 = packInt4Pair(c[4], c[5]), b3 = packInt4Pair(c[6], c[7]);
    return __byte_perm(__byte_perm(b0, b1, 0x0040), __byte_perm(b2, b3, 0x0040), 0x5410);
  }
}

// packWord of quantizeCode (the division) over 4 or 8 sums (x1 unused for int8). Out of line: the rare path (tiny
// scales), whose division calls would otherwise cost the hot loop registers.
template <int Bits>
__device__ __noinline__ uint32_t quantizeWordExact(float4 x0, float4 x1, float scale) {
  const float qmax = static_cast<float>(quantMax(Bits));
  const float x[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
  uint32_t c[32 / Bits];
#pragma unroll
  for (int k = 0; k < 32 / Bits; ++k) c[k] = quantizeCode(x[k], scale, qmax);
  return packWord<Bits>(c);
}

// The codes of the thread's 32 sums, packed (int4: 4 words; int8: 8 words). Elements >= valid get code 0: that
// is the codes' zero padding.
template <int Bits>
__device__ __forceinline__ void quantizeThread(const float (&acc)[kElems], int valid, float scale,
                                               uint32_t (&packed)[codeWords<Bits>()]) {
  constexpr int kPerWord = 32 / Bits;
  // From kQuotientMinScale up, quotientRn gives the division's codes (host/quant_math.h); scales that are 0,
  // tiny or NaN take the division.
  if (scale >= kQuotientMinScale) {
    const float rcp = divRn(1.0f, scale);
#pragma unroll
    for (int i = 0; i < codeWords<Bits>(); ++i) {
      uint32_t c[kPerWord];
#pragma unroll
      for (int k = 0; k < kPerWord; ++k)
        c[k] = floatBits(addRn(quotientRn(acc[kPerWord * i + k], scale, rcp), kRoundMagic));
      packed[i] = packWord<Bits>(c);
    }
  } else {
#pragma unroll
    for (int i = 0; i < codeWords<Bits>(); ++i) {
      const float* x = acc + kPerWord * i;
      float4 x1 = {};
      if constexpr (Bits == 4) x1 = make_float4(x[4], x[5], x[6], x[7]);
      packed[i] = quantizeWordExact<Bits>(make_float4(x[0], x[1], x[2], x[3]), x1, scale);
    }
  }
  if (valid < kElems) {
#pragma unroll
    for (int i = 0; i < codeWords<Bits>(); ++i) {
      const int keep = min(max(valid - kPerWord * i, 0), kPerWord) * Bits;  // code bits of elements < valid
      packed[i] &= keep == 32 ? ~0u : (1u << keep) - 1u;
    }
  }
}

// ---- gradient rounding: stochastic rounding, error feedback -----------------------------------------------------

constexpr int kResidualWords = kElems / 2;  // a thread's 32 bf16 residuals, two a word (element 2i in the low half)

// The residual of element k of the thread's words.
__device__ __forceinline__ uint16_t residualOf(const uint32_t (&w)[kResidualWords], int k) {
  return static_cast<uint16_t>(w[k >> 1] >> (16 * (k & 1)));
}

// A thread's residuals move as four 16-byte vectors when all 32 are there and aligned: the residual of a hop
// starts at slice * count + offset elements, so an odd count misaligns it and those threads move elements one by
// one (the residual is 2 bytes an element against the payload's 0.5 or 1: element accesses would make it the
// kernel's largest cost).
__device__ __forceinline__ bool residualVectors(const uint16_t* res, int valid) {
  return valid == kElems && (reinterpret_cast<uintptr_t>(res) & 15) == 0;
}

// Brings the 128-byte line at p (a thread's 64 bytes of residuals) into L2, holding no register.
__device__ __forceinline__ void prefetchL2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

__device__ __forceinline__ void loadResiduals(const uint16_t* res, int valid, uint32_t (&w)[kResidualWords]) {
  if (residualVectors(res, valid)) {
#pragma unroll
    for (int v = 0; v < kResidualWords / 4; ++v) {
      const uint4 x = reinterpret_cast<const uint4*>(res)[v];
      w[4 * v] = x.x, w[4 * v + 1] = x.y, w[4 * v + 2] = x.z, w[4 * v + 3] = x.w;
    }
  } else {
#pragma unroll
    for (int k = 0; k < kElems; k += 2) {
      const uint32_t lo = k < valid ? res[k] : 0u, hi = k + 1 < valid ? res[k + 1] : 0u;
      w[k >> 1] = lo | hi << 16;
    }
  }
}

__device__ __forceinline__ void storeResiduals(const uint32_t (&w)[kResidualWords], int valid, uint16_t* res) {
  if (residualVectors(res, valid)) {
#pragma unroll
    for (int v = 0; v < kResidualWords / 4; ++v) {
      reinterpret_cast<uint4*>(res)[v] = make_uint4(w[4 * v], w[4 * v + 1], w[4 * v + 2], w[4 * v + 3]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < kElems; ++k) {
      if (k < valid) res[k] = residualOf(w, k);
    }
  }
}

// quantizeThread with gradient rounding: the codes of quantizeCode (kStochastic false) or quantizeCodeStochastic
// (element j = grad.firstElem + elem + k of slice `slice` drawing its bits), and with kResidual each element's new
// residual into res (whole words, so that the old residuals, added into acc, need no registers past that). The
// quotients are quotientRn's, whose codes are the division's (host/quant_math.h), so the codes are
// host/quant_ref.cc's. Elements >= valid get code 0. A block whose scale passes gradScaleIsFast (almost every one)
// takes device/grad_rounding.h's straight-line groups; the others the element by element path, which holds every
// case (zero, tiny or NaN scales, scales near FLT_MAX).
template <int Bits, bool kStochastic, bool kResidual>
__device__ __forceinline__ void quantizeThreadGrad(const float (&acc)[kElems], int valid, float scale,
                                                   const GradQuantLaunch& grad, uint32_t slice, size_t elem,
                                                   uint32_t (&res)[kResidualWords],
                                                   uint32_t (&packed)[codeWords<Bits>()]) {
  constexpr int kPerWord = 32 / Bits;
  const float qmax = static_cast<float>(quantMax(Bits));
  const size_t j0 = grad.firstElem + elem;  // a multiple of 32: group g of the thread is Philox group j0 / 8 + g
  if (gradScaleIsFast<Bits, kStochastic, kResidual>(scale)) {
    const float rcp = divRn(1.0f, scale);
#pragma unroll
    for (int g = 0; g < kElems / kGradGroup; ++g) {
      float x[kGradGroup];
#pragma unroll
      for (int k = 0; k < kGradGroup; ++k) x[k] = acc[kGradGroup * g + k];
      Philox4x32 r{};
      if constexpr (kStochastic) r = gradRandomGroup(grad.key, slice, (j0 >> 3) + g);
      uint32_t c[kGradGroup];
      gradGroupCodes<kStochastic>(x, scale, rcp, qmax, r, c);
      if constexpr (kResidual) {  // the residuals past `valid` are not stored: their codes need not be 0
        uint32_t w[kGradGroup / 2];
        gradGroupResiduals<Bits>(x, c, scale, w);
#pragma unroll
        for (int i = 0; i < kGradGroup / 2; ++i) res[kGradGroup / 2 * g + i] = w[i];
      }
#pragma unroll
      for (int i = 0; i < kGradGroup / kPerWord; ++i) {
        uint32_t word[kPerWord];
#pragma unroll
        for (int k = 0; k < kPerWord; ++k) word[k] = c[kPerWord * i + k];
        packed[kGradGroup / kPerWord * g + i] = packWord<Bits>(word);
      }
    }
    if (valid < kElems) {  // the codes' zero padding, as quantizeThread's
#pragma unroll
      for (int i = 0; i < codeWords<Bits>(); ++i) {
        const int keep = min(max(valid - kPerWord * i, 0), kPerWord) * Bits;
        packed[i] &= keep == 32 ? ~0u : (1u << keep) - 1u;
      }
    }
    return;
  }
  const bool fast = scale >= (kStochastic ? kStochasticQuotientMinScale : kQuotientMinScale);
  const float rcp = fast ? divRn(1.0f, scale) : 0.0f;
  Philox4x32 r{};     // group (j0 + e) / 8's bits: int8 packs 4 codes a word, so a group spans two words
  uint32_t even = 0;  // the residual of the word's even element
#pragma unroll
  for (int i = 0; i < codeWords<Bits>(); ++i) {
    uint32_t c[kPerWord];
#pragma unroll
    for (int k = 0; k < kPerWord; ++k) {
      const int e = kPerWord * i + k;
      if constexpr (kStochastic) {
        if ((e & 7) == 0) r = gradRandomGroup(grad.key, slice, (j0 >> 3) + (e >> 3));
      }
      c[k] = gradElementCode<kStochastic>(acc[e], scale, rcp, qmax, fast, gradRandom16(r, e));
      if (e >= valid) c[k] = 0;
      if constexpr (kResidual) {
        const uint32_t after = residualAfter<Bits>(acc[e], c[k], scale);
        if (e & 1) {
          res[e >> 1] = even | after << 16;
        } else {
          even = after;
        }
      }
    }
    packed[i] = packWord<Bits>(c);
  }
}

// Plain requantize (round to nearest, no residual) and its gradient-rounding variants: one kernel each, so that
// the plain one carries nothing of theirs.
template <int Bits, bool kStochastic, bool kResidual>
__global__ void __launch_bounds__(kThreads, 3)
    reduceRequantizeKernel(const ReduceArgs a, unsigned char* out, size_t payloadStride, const GradQuantLaunch grad) {
  constexpr bool kGrad = kStochastic || kResidual;
  __shared__ uint32_t warpMax[2][kThreads / 32];  // groups of several warps; two sets, so one barrier a tile
  const int groupThreads = 1 << a.groupShift;
  const int lane = threadIdx.x & (groupThreads - 1);  // in the group
  if (!peerEnter(a.sync)) return;
  int parity = 0;
#pragma unroll 1
  for (size_t work = blockIdx.x; work < a.work; work += gridDim.x) {
    const size_t seg = segmentOf(work, a.tiles);
    const size_t elem = (work - seg * a.tiles) * kTileElems + threadIdx.x * kElems;
    const int valid = elem < a.count ? static_cast<int>(min(static_cast<size_t>(kElems), a.count - elem)) : 0;
    const size_t block = elem >> a.blockShift;
    uint16_t* res = kResidual ? grad.residual + seg * grad.residualStrideElems + elem : nullptr;

    // step 1: the sums (plus the residuals), and their absmax (bits of |x|: NaN and Inf order above every finite
    // value).
    float acc[kElems];
    uint32_t resWords[kResidualWords];
    uint32_t absMax = 0;
    if (valid > 0) {
      // The residuals come to L2 while the sources load and sum (their registers would spill if loaded first).
      if constexpr (kResidual) prefetchL2(res);
      sumSources<Bits>(a, a.base + seg * a.segmentStride, elem, valid, acc);
      if constexpr (kResidual) {
        loadResiduals(res, valid, resWords);
#pragma unroll
        for (int k = 0; k < kElems; ++k) {
          if (k < valid) acc[k] = withResidual(acc[k], residualOf(resWords, k));
        }
      }
#pragma unroll
      for (int k = 0; k < kElems; ++k) {
        if (k < valid) absMax = max(absMax, absBits(acc[k]));
      }
    }
    // step 2: absmax over the group: shuffles in the warp, then across the group's warps. Every thread of the
    // CTA gets here, those without elements too.
    absMax = logicalWarpMax(absMax, min(groupThreads, 32));
    if (groupThreads > 32) {
      if ((threadIdx.x & 31) == 0) warpMax[parity][threadIdx.x >> 5] = absMax;
      __syncthreads();
      const int first = (threadIdx.x >> 5) & ~((groupThreads >> 5) - 1);
      for (int k = 0; k < (groupThreads >> 5); ++k) absMax = max(absMax, warpMax[parity][first + k]);
      parity ^= 1;  // the next tile writes the other set; this one is rewritten only after the next barrier
    }
    if (valid == 0) continue;

    // step 3: the scale (and the zeros after the last one), from the group's first thread.
    unsigned char* payload = out + seg * payloadStride;
    const float scale = blockScale(absMax, Bits);
    if (lane == 0) {
      float* scales = reinterpret_cast<float*>(payload);
      scales[block] = scale;
      if (block == a.blocks - 1) {
        for (size_t k = a.blocks; k < a.scaleBytes / sizeof(float); ++k) scales[k] = 0.0f;
      }
    }

    // step 4: the codes, as 16-byte vectors. A vector that holds the last code also holds the zero padding up to
    // the end of the code region (a multiple of 16 bytes); vectors wholly past the last code are not written.
    uint32_t packed[codeWords<Bits>()];
    if constexpr (kGrad) {
      quantizeThreadGrad<Bits, kStochastic, kResidual>(
          acc, valid, scale, grad, grad.slice0 + static_cast<uint32_t>(seg * grad.sliceStride), elem, resWords, packed);
      if constexpr (kResidual) storeResiduals(resWords, valid, res);
    } else {
      quantizeThread<Bits>(acc, valid, scale, packed);
    }
    uint4* codes = reinterpret_cast<uint4*>(payload + a.scaleBytes + elem * Bits / 8);
#pragma unroll
    for (int v = 0; v < codeWords<Bits>() / 4; ++v) {
      if (v * 16 * 8 / Bits < valid) {
        codes[v] = make_uint4(packed[4 * v], packed[4 * v + 1], packed[4 * v + 2], packed[4 * v + 3]);
      }
    }
  }
  peerLeave(a.sync);
}

// ---- finish ------------------------------------------------------------------------------------------------------

// Chunk c of a warp's staging buffer sits at stagePos(c): one 16-byte pad after every row of eight chunks (128
// bytes), so that neither the threads writing their 64 or 128 contiguous bytes (one row or half of one) nor the
// lanes reading consecutive chunks hit the same banks. Unlike a permutation of each row, it keeps a thread's
// chunks, and each lane's reads (chunk lane + 32 k at stagePos(lane) + 36 k), at constant offsets from one
// address, which saves address arithmetic each tile (perf/KERNELS.md); the finish is as fast as with a
// permutation, or faster (reduce_perf).
constexpr int kRowChunks = 8;
__host__ __device__ constexpr int stagePos(int c) { return c + c / kRowChunks; }

// Words [Q, Q + 4) of w, each shifted right by `bits` (0 to 24) with the next word's low bytes coming in.
template <int Q>
__device__ __forceinline__ uint4 shiftedWords(const uint32_t (&w)[8], uint32_t bits) {
  return make_uint4(__funnelshift_r(w[Q], w[Q + 1], bits), __funnelshift_r(w[Q + 1], w[Q + 2], bits),
                    __funnelshift_r(w[Q + 2], w[Q + 3], bits), __funnelshift_r(w[Q + 3], w[Q + 4], bits));
}

// Bytes [o, o + 16) of the 32 bytes lo || hi (0 <= o < 16; o is the same for the whole warp).
__device__ __forceinline__ uint4 byteWindow(const uint4& lo, const uint4& hi, int o) {
  const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  const uint32_t bits = 8 * (o & 3);
  switch (o >> 2) {  // constant register indices in each case
    case 0:
      return shiftedWords<0>(w, bits);
    case 1:
      return shiftedWords<1>(w, bits);
    case 2:
      return shiftedWords<2>(w, bits);
    default:
      return shiftedWords<3>(w, bits);
  }
}

// Bytes [r, r + size) of a 16-byte chunk (r a multiple of size, 2 or 4).
template <class Out>
__device__ __forceinline__ Out chunkElement(const uint4& v, int r) {
  const uint32_t word = (r & 8) ? ((r & 4) ? v.w : v.z) : ((r & 4) ? v.y : v.x);
  return static_cast<Out>(sizeof(Out) == 4 ? word : word >> (8 * (r & 2)));
}

// Word i of finished outputs from the fp32 sums `acc` when every sum is finite or +-Inf and the divisor is 1:
// finishReduction is then Type::fromFloat alone, which the paired conversions round the same way.
template <class Type, int N>
__device__ __forceinline__ uint32_t finishedWord(const float (&acc)[N], int i) {
  if constexpr (sizeof(typename Type::Bits) == 4) {
    return floatBits(acc[i]);
  } else if constexpr (Type::kType == zpBfloat16) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);  // .x: the low half
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __half2 h = __floats2half2_rn(acc[2 * i], acc[2 * i + 1]);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}

// N finished outputs (finishReduction of each sum), packed into consecutive 16-byte chunks of the warp's stage
// from `at` on (all in one row). `paired`: every sum is finite or +-Inf and the divisor is 1 (finishedWord).
template <class Type, int N>
__device__ __forceinline__ void stageFinished(const float (&acc)[N], bool paired, float divisor, uint4* at) {
  using Out = typename Type::Bits;
  constexpr int kSize = sizeof(Out);
  constexpr int kWords = N * kSize / 4;
  uint32_t word[kWords];
  if (paired) {
    // The common case: no NaN to replace by the quiet one, and the conversions two at a time.
#pragma unroll
    for (int i = 0; i < kWords; ++i) word[i] = finishedWord<Type>(acc, i);
  } else {
    Out o[N];
#pragma unroll
    for (int k = 0; k < N; ++k) o[k] = finishReduction<Type>(acc[k], divisor);
#pragma unroll
    for (int i = 0; i < kWords; ++i)
      word[i] = kSize == 4 ? o[i] : (o[2 * i] | (static_cast<uint32_t>(o[2 * i + 1]) << 16));
  }
#pragma unroll
  for (int i = 0; i < kWords / 4; ++i) {
    at[i] = make_uint4(word[4 * i], word[4 * i + 1], word[4 * i + 2], word[4 * i + 3]);
  }
}

// ---- the block rule of host/reduce_math.h: a block of which some sum is not finite (an fp32 overflow) is NaN in
// every element. The sums are not kept for it (the finish stages them as it goes, and its registers are spent):
// a thread whose block scales let its sums overflow at all (sumsMayOverflow, rare: scales near FLT_MAX / 2^Bits)
// sums its elements again to see (sumsNotFinite), and the threads of the block vote (blockAny).

// Whether the sums of the thread's block in this segment may be beyond fp32: an addend is at most 2^(Bits-1) times
// its block's |scale| (the largest code, a corrupt payload's -128 or -8 included; a corrupt scale may be negative),
// so sources whose bounds total less than 2^127 (half of FLT_MAX's order: a margin far above this estimate's
// rounding) give finite sums. A NaN scale (a source block that held NaN or Inf) says yes too: its sums are NaN.
template <int Bits>
__device__ __forceinline__ bool sumsMayOverflow(const ReduceArgs& a, const unsigned char* seg, size_t block) {
  constexpr float kMaxCode = static_cast<float>(1 << (Bits - 1));
  float bound = 0.0f;
  for (int s = 0; s < a.sources; ++s) {
    const float* scales = reinterpret_cast<const float*>(seg + static_cast<size_t>(s) * a.sourceStride);
    bound = fmaRn(kMaxCode, fabsf(__ldg(scales + block)), bound);
  }
  return !(bound < 0x1p127f);
}

// Whether some of the thread's sums [elem, elem + valid) is not finite, summed again element by element in the
// finish's order (host/reduce_math.h's payloadElement: few registers, for the rare path). x * 0 is +-0 for a finite
// x and NaN for NaN or +-Inf.
template <int Bits>
__device__ __noinline__ bool sumsNotFinite(const unsigned char* seg, size_t sourceStride, int sources, size_t count,
                                           int blockSize, size_t elem, int valid) {
  float probe = 0.0f;
#pragma unroll 1
  for (int k = 0; k < valid; ++k) {
    float acc = payloadElement<Bits>(seg, count, blockSize, elem + k);
#pragma unroll 1
    for (int s = 1; s < sources; ++s) {
      acc = addRn(acc, payloadElement<Bits>(seg + static_cast<size_t>(s) * sourceStride, count, blockSize, elem + k));
    }
    probe = fmaRn(acc, 0.0f, probe);
  }
  return !isFiniteBits(floatBits(probe));
}

// Whether any of the `threads` (a power of two) threads of this thread's aligned group said `mine`. Every thread
// of the CTA calls it, with the same `threads`. Groups of up to a warp vote by shuffles, only in a warp where some
// thread said yes; larger ones at a barrier of the CTA, and through `warps` (a flag per warp) only in a CTA where
// some thread said yes.
__device__ __forceinline__ bool blockAny(bool mine, int threads, int* warps) {
  if (threads <= 32) {
    if (!__any_sync(kFullMask, mine)) return false;
    if (threads == 32) return true;
    return logicalWarpReduce(mine ? 1u : 0u, threads, OrOp{}) != 0;
  }
  if (!__syncthreads_or(mine)) return false;
  const bool warp = __any_sync(kFullMask, mine);
  if ((threadIdx.x & 31) == 0) warps[threadIdx.x >> 5] = warp ? 1 : 0;
  __syncthreads();
  const int first = (threadIdx.x >> 5) & ~((threads >> 5) - 1);
  int any = 0;
  for (int k = 0; k < (threads >> 5); ++k) any |= warps[first + k];
  __syncthreads();  // read before a later vote rewrites them
  return any != 0;
}

// Elements a thread finishes at a time when a segment has few sources (finishFewSources): one 16-byte chunk of
// fp16 or bf16 outputs, two of fp32.
constexpr int kFewGroup = 8;

// Sums over the (at most kFewSources) sources of elements [g * kFewGroup, (g + 1) * kFewGroup) of the thread's, in
// source order, from the prepared codes x; Plain: every source's scale is plain (the product alone).
template <int Bits, bool Plain>
__device__ __forceinline__ void sumFewSources(const ReduceArgs& a,
                                              const uint32_t (&x)[kFewSources][preparedWords<Bits>()],
                                              const float (&scale)[kFewSources], int g, float (&acc)[kFewGroup]) {
#pragma unroll
  for (int s = 0; s < kFewSources; ++s) {
    if (s > 0 && s >= a.sources) break;
#pragma unroll
    for (int k = 0; k < kFewGroup; ++k) {
      const float v = sourceValue<Bits, Plain>(x[s], g * kFewGroup + k, scale[s], a.decode);
      acc[k] = s == 0 ? v : addRn(acc[k], v);
    }
  }
}

// The thread's kElems sums, kFewGroup at a time, finished into its chunks of the warp's stage, from `at` on.
template <int Bits, class Type, bool Plain>
__device__ __forceinline__ void finishGroups(const ReduceArgs& a,
                                             const uint32_t (&x)[kFewSources][preparedWords<Bits>()],
                                             const float (&scale)[kFewSources], bool paired, float divisor, uint4* at) {
  constexpr int kSize = sizeof(typename Type::Bits);
#pragma unroll
  for (int g = 0; g < kElems / kFewGroup; ++g) {
    float acc[kFewGroup];
    sumFewSources<Bits, Plain>(a, x, scale, g, acc);
    stageFinished<Type>(acc, paired, divisor, at + g * kFewGroup * kSize / 16);
  }
}

// The finish of the thread's elements [elem, elem + valid) of a segment of at most kFewSources sources (two ranks,
// or two nodes): every source's codes and scale are loaded first, then the sums are made, finished and staged
// kFewGroup elements at a time, in source order per element as sumSources does. Only kFewGroup sums are live, not
// kElems, so the kernel fits more CTAs an SM to hide its loads' latency.
template <int Bits, class Type>
__device__ __forceinline__ void finishFewSources(const ReduceArgs& a, const unsigned char* seg, size_t elem, int valid,
                                                 float divisor, uint4* at) {
  const size_t block = elem >> a.blockShift;
  const size_t codeOffset = a.scaleBytes + elem * Bits / 8;
  uint32_t w[kFewSources][codeWords<Bits>()];
  float scale[kFewSources];
#pragma unroll
  for (int s = 0; s < kFewSources; ++s) {  // every load in flight before the first is used
    if (s == 0 || s < a.sources) scale[s] = loadSource<Bits>(a, seg, s, block, codeOffset, valid, w[s]);
  }
  uint32_t x[kFewSources][preparedWords<Bits>()];
  bool allPlain = true;
#pragma unroll
  for (int s = 0; s < kFewSources; ++s) {
    if (s == 0 || s < a.sources) {
      prepareCodes<Bits>(w[s], a.decode, x[s]);
      allPlain = allPlain && dequantIsPlain<Fp32Type, Bits>(scale[s]);
    }
  }
  // Each case its own loop, as addSource's: the plain one without dequantizeValue's saturation check (both give
  // the same values), the paired conversions when there is no NaN to replace and nothing to divide.
  if (allPlain && divisor == 1.0f) {
    finishGroups<Bits, Type, true>(a, x, scale, true, divisor, at);
  } else if (allPlain) {
    finishGroups<Bits, Type, true>(a, x, scale, false, divisor, at);
  } else {
    finishGroups<Bits, Type, false>(a, x, scale, false, divisor, at);
  }
}

// FewSources: the segments have at most kFewSources sources (finishFewSources); otherwise any number, summed
// into kElems registers a thread (sumSources), which bounds the kernel to three CTAs an SM.
template <int Bits, class Type, bool FewSources>
__global__ void __launch_bounds__(kThreads, FewSources ? kFewSourcesCtas : 3)
    reduceFinishKernel(const ReduceArgs a, typename Type::Bits* out, size_t outputStride, float divisor) {
  using Out = typename Type::Bits;
  constexpr int kSize = sizeof(Out);
  constexpr int kThreadChunks = kElems * kSize / 16;
  constexpr int kWarpChunks = kWarpElems * kSize / 16;
  static_assert(kThreadChunks <= kRowChunks && kRowChunks % kThreadChunks == 0, "a thread's chunks share a row");
  // Each warp's finished elements, in order, a pad after every row (stagePos).
  __shared__ uint4 stage[kThreads / 32][stagePos(kWarpChunks)];
  __shared__ int warpVotes[kThreads / 32];  // blockAny's, for blocks held by several warps
  uint4* mine = stage[threadIdx.x >> 5];
  const int lane = threadIdx.x & 31;
  if (!peerEnter(a.sync)) return;
#pragma unroll 1
  for (size_t work = blockIdx.x; work < a.work; work += gridDim.x) {
    const size_t seg = segmentOf(work, a.tiles);
    const size_t warpElem = (work - seg * a.tiles) * kTileElems + (threadIdx.x - lane) * kElems;
    // A warp with nothing of the payload left skips the tile, unless its block spans several warps, which vote at a
    // barrier of the CTA (step 3) where every warp must be.
    const bool warpHas = warpElem < a.count;
    if (!warpHas && a.groupShift <= 5) continue;
    const size_t elem = warpElem + lane * kElems;
    const int valid = elem < a.count ? static_cast<int>(min(static_cast<size_t>(kElems), a.count - elem)) : 0;
    if (warpHas) {
      // step 1: sums, finished values (per element, as the host does), into the warp's stage.
      if (valid > 0) {
        const unsigned char* segment = a.base + seg * a.segmentStride;
        uint4* const staged = mine + stagePos(lane * kThreadChunks);  // this thread's chunks
        if constexpr (FewSources) {
          finishFewSources<Bits, Type>(a, segment, elem, valid, divisor, staged);
        } else {
          float acc[kElems];
          const bool plain = sumSources<Bits>(a, segment, elem, valid, acc);
          stageFinished<Type>(acc, plain && divisor == 1.0f, divisor, staged);
        }
      }
      __syncwarp();

      // step 2: the warp's n elements, as the aligned 16-byte chunks c of the output that they touch (bytes
      // [shift, end) from the 16-byte boundary `base` below the first one). Chunk c is stage bytes
      // [16c - shift, 16c - shift + 16): the end of stage chunk c - 1 and the start of chunk c; clamping c - 1 and c
      // to the stage only ever replaces bytes outside [shift, end). A first or last chunk that is only partly the
      // warp's is written element by element.
      Out* dst = out + seg * outputStride + warpElem;
      const int shift = static_cast<int>(reinterpret_cast<uintptr_t>(dst) & 15);
      const int n = static_cast<int>(min(static_cast<size_t>(kWarpElems), a.count - warpElem));
      // The common case, a whole aligned range, without the per-chunk bounds: a fraction of the instructions
      // (perf/KERNELS.md), which the finish's time shows (reduce_perf).
      if (shift == 0 && n == kWarpElems) {
        const uint4* const lanes = mine + stagePos(lane);  // chunk lane + 32 k at lanes[k * stagePos(32)]
#pragma unroll
        for (int k = 0; k < kWarpChunks / 32; ++k)
          reinterpret_cast<uint4*>(dst)[lane + 32 * k] = lanes[k * stagePos(32)];
      } else {
        const int end = shift + n * kSize;
        char* base = reinterpret_cast<char*>(dst) - shift;
        for (int c = lane; 16 * c < end; c += 32) {
          uint4 v;
          if (shift == 0) {
            v = mine[stagePos(c)];
          } else {
            v = byteWindow(mine[stagePos(max(c - 1, 0))], mine[stagePos(min(c, kWarpChunks - 1))], 16 - shift);
          }
          const int lo = max(16 * c, shift), hi = min(16 * c + 16, end);
          if (hi - lo == 16) {
            *reinterpret_cast<uint4*>(base + 16 * c) = v;
          } else {
            for (int b = lo; b < hi; b += kSize) *reinterpret_cast<Out*>(base + b) = chunkElement<Out>(v, b - 16 * c);
          }
        }
      }
      __syncwarp();  // the stage is rewritten by the next tile; the stores are ordered before step 3's
    }

    // step 3: the block rule (see sumsMayOverflow): the outputs of a block of which some sum is not finite become
    // NaN, each thread its own. Sums past the payload's end are not the block's: they are left out. The thread's
    // range is derived again (fewer registers live through steps 1 and 2).
    const size_t first = warpElem + lane * kElems;
    const int have = first < a.count ? static_cast<int>(min(static_cast<size_t>(kElems), a.count - first)) : 0;
    bool notFinite = false;
    if (have > 0) {
      const unsigned char* segment = a.base + seg * a.segmentStride;
      notFinite = sumsMayOverflow<Bits>(a, segment, first >> a.blockShift) &&
                  sumsNotFinite<Bits>(segment, a.sourceStride, a.sources, a.count, 1 << a.blockShift, first, have);
    }
    if (blockAny(notFinite, 1 << a.groupShift, warpVotes) && have > 0) {
      Out* const mineOut = out + seg * outputStride + first;
      for (int k = 0; k < have; ++k) mineOut[k] = Type::kQuietNaN;
    }
  }
  peerLeave(a.sync);
}

// ---- launchers ---------------------------------------------------------------------------------------------------

zpResult_t checkSources(const ReduceSources& s, int bits, int blockSize, const char* what) {
  auto aligned = [](size_t v) { return v % kPayloadAlign == 0; };
  if (s.base == nullptr || !aligned(reinterpret_cast<uintptr_t>(s.base)) || !aligned(s.sourceStride) ||
      !aligned(s.segmentStride) || s.sources < 1 || s.batch < 0 || !isValidBits(bits) || !isValidBlockSize(blockSize)) {
    return ZP_ERR(zpInternalError, "%s : bad reduction sources", what);
  }
  return zpSuccess;
}

ReduceArgs reduceArgs(const ReduceSources& s, size_t count, int blockSize, const PeerSync& sync) {
  ReduceArgs a;
  a.base = static_cast<const unsigned char*>(s.base);
  a.sourceStride = s.sourceStride;
  a.segmentStride = s.segmentStride;
  a.count = count;
  a.blocks = quantBlockCount(count, blockSize);
  a.scaleBytes = quantScaleBytes(count, blockSize);
  a.tiles = (count + kTileElems - 1) / kTileElems;
  a.work = a.tiles * static_cast<size_t>(s.batch);
  a.sources = s.sources;
  a.blockShift = log2Int(blockSize);
  a.groupShift = a.blockShift - log2Int(kElems);
  a.decode = DecodeConstants{0x4b490000u, 0x88888888u};
  a.sync = sync;
  return a;
}

// Waves of resident CTAs for a grid on `stream` (gridFor, device/launch_geometry.h): a few (the hardware
// balances CTAs that finish at different times, and a pipeline's finish kernel shares the SMs with NCCL's). A
// direct-load kernel gets one wave: each of its CTAs ends with a system-scope fence and an arrival (peerLeave),
// which more waves multiply (perf/RESULTS.md, qgZ over nvlink); its CTAs that wait for the peers inside
// (PeerSync::waitInKernel) must all be resident anyway.
int wavesFor(const KernelStream& stream) {
  const bool oneWave = stream.sync.waitInKernel || stream.sync.raise != PeerSync::kNone;
  return oneWave ? 1 : kWaves;
}

template <int Bits, bool kStochastic = false, bool kResidual = false>
zpResult_t launchRequantize(const ReduceArgs& a, unsigned char* out, size_t payloadStride, const GradQuantLaunch& grad,
                            KernelStream stream) {
  constexpr auto kKernel = reduceRequantizeKernel<Bits, kStochastic, kResidual>;
  if (stream.loadOnly) return loadKernel<kKernel>();
  unsigned grid = 0;
  ZPCHECK(gridFor<kKernel>(a.work, kThreads, wavesFor(stream), stream, &grid));
  kKernel<<<grid, kThreads, 0, stream.stream>>>(a, out, payloadStride, grad);
  return zpSuccess;
}

// Round to nearest without a residual is the plain requantize: quantizeCode's codes either way.
template <int Bits>
zpResult_t launchRequantizeGrad(const ReduceArgs& a, unsigned char* out, size_t payloadStride,
                                const GradQuantLaunch& grad, KernelStream stream) {
  if (stream.loadOnly) {  // every variant, whatever the options
    ZPCHECK((launchRequantize<Bits, true, true>(a, out, payloadStride, grad, stream)));
    ZPCHECK((launchRequantize<Bits, true, false>(a, out, payloadStride, grad, stream)));
    return launchRequantize<Bits, false, true>(a, out, payloadStride, grad, stream);
  }
  const bool residual = grad.residual != nullptr;
  if (grad.stochastic) {
    return residual ? launchRequantize<Bits, true, true>(a, out, payloadStride, grad, stream)
                    : launchRequantize<Bits, true, false>(a, out, payloadStride, grad, stream);
  }
  return residual ? launchRequantize<Bits, false, true>(a, out, payloadStride, grad, stream)
                  : launchRequantize<Bits>(a, out, payloadStride, grad, stream);
}

template <int Bits, class Type, bool FewSources>
zpResult_t launchFinishKernel(const ReduceArgs& a, void* output, size_t stride, float divisor, KernelStream stream) {
  constexpr auto kKernel = reduceFinishKernel<Bits, Type, FewSources>;
  if (stream.loadOnly) return loadKernel<kKernel>();
  unsigned grid = 0;
  ZPCHECK(gridFor<kKernel>(a.work, kThreads, wavesFor(stream), stream, &grid));
  kKernel<<<grid, kThreads, 0, stream.stream>>>(a, static_cast<typename Type::Bits*>(output), stride, divisor);
  return zpSuccess;
}

template <int Bits, class Type>
zpResult_t launchFinish(const ReduceArgs& a, void* output, size_t stride, float divisor, KernelStream stream) {
  return a.sources <= kFewSources ? launchFinishKernel<Bits, Type, true>(a, output, stride, divisor, stream)
                                  : launchFinishKernel<Bits, Type, false>(a, output, stride, divisor, stream);
}

template <class Type>
zpResult_t launchFinishBits(const ReduceArgs& a, int bits, void* output, size_t stride, float divisor,
                            KernelStream stream) {
  return bits == 8 ? launchFinish<8, Type>(a, output, stride, divisor, stream)
                   : launchFinish<4, Type>(a, output, stride, divisor, stream);
}

}  // namespace

zpResult_t launchReduceRequantize(const ReduceSources& src, size_t count, int bits, int blockSize, void* payload,
                                  size_t payloadStride, KernelStream stream) {
  if (count == 0 || src.batch == 0) return zpSuccess;
  ZPCHECK(checkSources(src, bits, blockSize, "launchReduceRequantize"));
  if (reinterpret_cast<uintptr_t>(payload) % kPayloadAlign != 0 || payloadStride % kPayloadAlign != 0) {
    return ZP_ERR(zpInternalError, "launchReduceRequantize : payload %p or stride %zu not %zu-byte aligned", payload,
                  payloadStride, kPayloadAlign);
  }
  const ReduceArgs a = reduceArgs(src, count, blockSize, stream.sync);
  auto* out = static_cast<unsigned char*>(payload);
  const GradQuantLaunch none;
  ZPCHECK((bits == 8 ? launchRequantize<8>(a, out, payloadStride, none, stream)
                     : launchRequantize<4>(a, out, payloadStride, none, stream)));
  CUDACHECK(cudaGetLastError());
  return zpSuccess;
}

zpResult_t launchReduceRequantizeGrad(const ReduceSources& src, size_t count, int bits, int blockSize, void* payload,
                                      size_t payloadStride, const GradQuantLaunch& grad, KernelStream stream) {
  if (count == 0 || src.batch == 0) return zpSuccess;
  ZPCHECK(checkSources(src, bits, blockSize, "launchReduceRequantizeGrad"));
  if (reinterpret_cast<uintptr_t>(payload) % kPayloadAlign != 0 || payloadStride % kPayloadAlign != 0 ||
      grad.firstElem % kElems != 0 || reinterpret_cast<uintptr_t>(grad.residual) % 2 != 0) {
    return ZP_ERR(zpInternalError,
                  "launchReduceRequantizeGrad : payload %p, stride %zu, first element %zu or residual %p misaligned",
                  payload, payloadStride, grad.firstElem, static_cast<const void*>(grad.residual));
  }
  const ReduceArgs a = reduceArgs(src, count, blockSize, stream.sync);
  auto* out = static_cast<unsigned char*>(payload);
  ZPCHECK((bits == 8 ? launchRequantizeGrad<8>(a, out, payloadStride, grad, stream)
                     : launchRequantizeGrad<4>(a, out, payloadStride, grad, stream)));
  CUDACHECK(cudaGetLastError());
  return zpSuccess;
}

zpResult_t launchReduceFinish(const ReduceSources& src, size_t count, int bits, int blockSize, zpDataType_t type,
                              float divisor, void* output, size_t outputStrideElems, KernelStream stream) {
  if (count == 0 || src.batch == 0) return zpSuccess;
  ZPCHECK(checkSources(src, bits, blockSize, "launchReduceFinish"));
  const ReduceArgs a = reduceArgs(src, count, blockSize, stream.sync);
  const size_t stride = outputStrideElems ? outputStrideElems : count;
  switch (type) {
    case zpFloat16:
      ZPCHECK(launchFinishBits<Fp16Type>(a, bits, output, stride, divisor, stream));
      break;
    case zpBfloat16:
      ZPCHECK(launchFinishBits<Bf16Type>(a, bits, output, stride, divisor, stream));
      break;
    case zpFloat32:
      ZPCHECK(launchFinishBits<Fp32Type>(a, bits, output, stride, divisor, stream));
      break;
    default:
      return ZP_ERR(zpInternalError, "launchReduceFinish : type %d", static_cast<int>(type));
  }
  CUDACHECK(cudaGetLastError());
  return zpSuccess;
}

}  // namespace zp
