// Per-element and per-block arithmetic of the block quantization format (include/zpccl.h), compiled for host
// and device. The host reference (host/quant_ref.cc) and the kernels (device/quantize.cu) both call these
// functions, so that they agree bit for bit by construction.
//
// Rules that keep both sides identical:
// - Every fp32 operation is one IEEE operation rounded to nearest even: explicit __fdiv_rn/__fmul_rn/__fadd_rn
//   on device; plain operators on the host, which must evaluate float in float (SSE, FLT_EVAL_METHOD 0, checked
//   in quant_ref.cc) in the default rounding mode. No expression here has the a * b + c shape, so no compiler
//   can contract one into an fma.
// - No flush to zero: denormal inputs, scales and outputs are kept (nvcc's default -ftz=false).
// - Conversions are exact (fp16/bf16 -> fp32) or round to nearest even (fp32 -> fp16/bf16), bit-level on the
//   host, the hardware conversions on device. They agree on every non-NaN value; NaN payloads may differ, so
//   every NaN this format produces is made explicitly from constant bits (kQuietNaN), never by arithmetic.
// - Rounding to an integer uses the 1.5 * 2^23 trick: v + 1.5 * 2^23 rounds v to the nearest even integer and
//   leaves it, in two's complement, in the low mantissa bits. One fp32 add, no float-to-int conversion.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "host/quant_format.h"
#include "include/zpccl.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace zp {

// ---- fp32 bits and pinned fp32 arithmetic -------------------------------------------------------------------

ZP_HD uint32_t floatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

ZP_HD float bitsFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

ZP_HD float divRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

ZP_HD float mulRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

ZP_HD float addRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

ZP_HD float fmaRn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// divRn(x, scale) without a division, for quantize's hot loop: rcp = divRn(1, scale) (on the device __frcp_rn(scale)
// gives the same correctly rounded value), q0 = x * rcp within an ulp of x / scale, the residual x - q0 * scale
// exact in one fused multiply-add, and one correction step rounded once (Markstein's theorem: the correctly rounded
// quotient). The residual is exact only while it does not underflow, hence the bound on the scale: from
// kQuotientMinScale up, every x of the block whose quotient can round to a non-zero code (|x| >= scale / 2) has a
// residual far above FLT_MIN, and a smaller x gives a code of 0 either way. The codes equal quantizeCode's for
// every pair (x, absmax) of bf16 values and of fp16 values, both widths (bit-equal quotients wherever
// |x / scale| >= 2^-2); the QuantMath tests check a sample of those pairs and random fp32 pairs.
constexpr float kQuotientMinScale = 0x1p-96f;

ZP_HD float quotientRn(float x, float scale, float rcp) {
  const float q0 = mulRn(x, rcp);
  return fmaRn(fmaRn(-q0, scale, x), rcp, q0);
}

// min/max of two non-NaN values (the operands here never are NaN).
ZP_HD float clampFloat(float v, float lo, float hi) {
#if defined(__CUDA_ARCH__)
  return fminf(fmaxf(v, lo), hi);
#else
  v = v < lo ? lo : v;
  return v > hi ? hi : v;
#endif
}

constexpr uint32_t kF32AbsMask = 0x7fffffffu;
constexpr uint32_t kF32Inf = 0x7f800000u;
constexpr uint32_t kF32QuietNaN = 0x7fc00000u;
constexpr uint32_t kF32MinNormal = 0x00800000u;
constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23

ZP_HD bool isFiniteBits(uint32_t bits) { return (bits & kF32AbsMask) < kF32Inf; }

// ---- the element types: bits <-> fp32 ----------------------------------------------------------------------

// fp16 -> fp32, exact. A NaN stays NaN (made quiet, sign and top payload kept on the host).
ZP_HD float halfBitsToFloat(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bitsFloat(sign | kF32Inf | (mant << 13) | (mant ? 0x00400000u : 0u));
  if (exp != 0) return bitsFloat(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return bitsFloat(sign);
  // Subnormal half (mant * 2^-24): normalize; the fp32 result is a normal number.
  uint32_t e = 113;
  while ((mant & 0x400u) == 0) {
    mant <<= 1;
    --e;
  }
  return bitsFloat(sign | (e << 23) | ((mant & 0x3ffu) << 13));
#endif
}

// fp32 -> fp16, round to nearest even; overflow gives +-Inf (IEEE), subnormal results are kept.
ZP_HD uint16_t floatToHalfBitsRn(float f) {
#if defined(__CUDA_ARCH__)
  return __half_as_ushort(__float2half_rn(f));
#else
  const uint32_t x = floatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & kF32AbsMask;
  if (ax > kF32Inf) return static_cast<uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));  // quiet NaN
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);                     // >= 65520 rounds to Inf
  if (ax >= 0x38800000u) {  // normal half (>= 2^-14): round at mantissa bit 13, then rebias the exponent
    const uint32_t rounded = ax + 0xfffu + ((ax >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((rounded - (112u << 23)) >> 13));
  }
  if (ax <= 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25 (a tie at 2^-25) rounds to +-0
  // Subnormal half: the result is round(value / 2^-24); value = (1.mant) * 2^(e-150) with e in [102, 112].
  const uint32_t e = ax >> 23;
  const uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e;  // 14..24
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  uint32_t m = mant >> shift;
  if (rem > half || (rem == half && (m & 1u))) ++m;  // m == 0x400 becomes the smallest normal, as it should
  return static_cast<uint16_t>(sign | m);
#endif
}

// bf16 -> fp32, exact.
ZP_HD float bf16BitsToFloat(uint16_t b) { return bitsFloat(static_cast<uint32_t>(b) << 16); }

// fp32 -> bf16, round to nearest even; overflow gives +-Inf, subnormal results are kept.
ZP_HD uint16_t floatToBf16BitsRn(float f) {
#if defined(__CUDA_ARCH__)
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#else
  const uint32_t x = floatBits(f);
  if ((x & kF32AbsMask) > kF32Inf) return static_cast<uint16_t>((x >> 16) | 0x0040u);  // quiet NaN
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
#endif
}

// Traits of the quantizable types: raw bits, conversions and the constants of the saturation and NaN rules.
struct Fp32Type {
  using Bits = uint32_t;
  static constexpr zpDataType_t kType = zpFloat32;
  static constexpr Bits kSign = 0x80000000u, kInf = 0x7f800000u, kMaxFinite = 0x7f7fffffu, kQuietNaN = 0x7fc00000u;
  static ZP_HD float toFloat(Bits b) { return bitsFloat(b); }
  static ZP_HD Bits fromFloat(float f) { return floatBits(f); }
};

struct Fp16Type {
  using Bits = uint16_t;
  static constexpr zpDataType_t kType = zpFloat16;
  static constexpr Bits kSign = 0x8000u, kInf = 0x7c00u, kMaxFinite = 0x7bffu, kQuietNaN = 0x7e00u;
  static ZP_HD float toFloat(Bits b) { return halfBitsToFloat(b); }
  static ZP_HD Bits fromFloat(float f) { return floatToHalfBitsRn(f); }
};

struct Bf16Type {
  using Bits = uint16_t;
  static constexpr zpDataType_t kType = zpBfloat16;
  static constexpr Bits kSign = 0x8000u, kInf = 0x7f80u, kMaxFinite = 0x7f7fu, kQuietNaN = 0x7fc0u;
  static ZP_HD float toFloat(Bits b) { return bf16BitsToFloat(b); }
  static ZP_HD Bits fromFloat(float f) { return floatToBf16BitsRn(f); }
};

// ---- per block: absmax and scale ---------------------------------------------------------------------------

// |x| as fp32 bits. Non-negative floats order as their bits do, and every NaN or Inf is >= kF32Inf, so the
// unsigned max of these is the block's absmax, or says that the block holds a NaN or an Inf.
ZP_HD uint32_t absBits(float x) { return floatBits(x) & kF32AbsMask; }

// Scale of a block from the unsigned max of absBits over its elements: absmax / qmax (IEEE), or a quiet NaN
// for a block holding NaN or Inf. 0 for an all-zero block; 0 too when absmax > 0 is so small (< qmax * 2^-150)
// that the division underflows. Never negative, never Inf.
ZP_HD float blockScale(uint32_t absMaxBits, int bits) {
  if (absMaxBits >= kF32Inf) return bitsFloat(kF32QuietNaN);
  return divRn(bitsFloat(absMaxBits), static_cast<float>(quantMax(bits)));
}

// ---- per element: quantize and dequantize ------------------------------------------------------------------

// clamp(rint(x / scale), -qmax, qmax), returned as a word whose low 8 bits hold the code in two's complement
// (higher bits are not zero: mask them). A block whose scale is 0 (all zero, or underflowed) or NaN (NaN/Inf
// inside) gets code 0 for every element: no 0/0, no NaN code. Clamping before rounding equals clamping after
// it because the bounds are integers.
ZP_HD uint32_t quantizeCode(float x, float scale, float qmax) {
  if (!(scale > 0.0f)) return 0;
  const float v = clampFloat(divRn(x, scale), -qmax, qmax);
  return floatBits(addRn(v, kRoundMagic));
}

// Exact fp32 value of the Bits-wide two's complement code in the low bits of `code` (higher bits ignored):
// 2^23 + (code ^ sign bit), minus 2^23 + 2^(Bits-1), both exact. No int-to-float conversion.
template <int Bits>
ZP_HD float decodeCode(uint32_t code) {
  constexpr uint32_t kMask = (1u << Bits) - 1u;
  constexpr uint32_t kBias = 1u << (Bits - 1);
  return addRn(bitsFloat(0x4b000000u | ((code & kMask) ^ kBias)), -(8388608.0f + static_cast<float>(kBias)));
}

// q * scale in the output type. A non-finite scale (a block that held NaN or Inf) gives the type's quiet NaN
// for every element, whatever its code. A product that rounds to +-Inf in the output type (only possible with
// scale near the type's max) saturates to the largest finite value of that sign. q * +0 is +0 for q >= 0.
template <class Type>
ZP_HD typename Type::Bits dequantizeValue(float q, float scale) {
  using Bits = typename Type::Bits;
  if (!isFiniteBits(floatBits(scale))) return Type::kQuietNaN;
  Bits b = Type::fromFloat(mulRn(q, scale));
  if (static_cast<Bits>(b & ~Type::kSign) == Type::kInf) b = static_cast<Bits>((b & Type::kSign) | Type::kMaxFinite);
  return b;
}

// True when no code of the block can overflow the output type (|code| <= 2^(Bits-1) even in a corrupt payload),
// so that dequantizeValue reduces to the product and the conversion. Monotone rounding makes one check enough.
template <class Type, int Bits>
ZP_HD bool dequantIsPlain(float scale) {
  if (!isFiniteBits(floatBits(scale))) return false;
  const typename Type::Bits b = Type::fromFloat(mulRn(static_cast<float>(1 << (Bits - 1)), scale));
  return static_cast<typename Type::Bits>(b & ~Type::kSign) != Type::kInf;
}

// ---- qgZ's gradient rounding: stochastic rounding and error feedback ----------------------------------------

// quantizeCodeStochastic's rounding of the quotient x / scale (below), in integers. With a = min(|quotient|, qmax) =
// n + f (n = floor(a)) and the rounding's condition f > (2 rand16 + 1) / 2^17, that is 2^16 f - 1/2 > rand16:
// for C = ceil(2^16 a - 1/2) = 2^16 n + c, c = ceil(2^16 f - 1/2) in [0, 2^16], the condition is c > rand16, and
// the magnitude n + [c > rand16] is (C + 0xffff - rand16) >> 16 (the sum stays under 2^32). The code word is the
// magnitude, with the quotient's sign, in kRoundMagic's low bits, as floatBits(addRn(+-m, kRoundMagic)) has it.
// C itself: on the GPU, a + (128 - 2^-17) rounded up (a <= 127, so the sum is in [128 - 2^-17, 255)) lies on the
// grid of [128, 256), whose step is 2^-16, and has the bits 0x43000000 + C; only a = 0 stays at 128 - 2^-17, below
// 0x43000000, hence the max. On the host, in double, where 2^16 a - 1/2 is exact for a >= 2^-17 (and C = 0 below).
// Both are the threshold form bit for bit over every float a in [0, 127] and every rand16 (QuantMath tests, on the
// host and on the GPU); the form saves the GPU a floor, an integer conversion and a compare and select an element.
ZP_HD uint32_t stochasticCodeOfQuotient(float quotient, float qmax, uint32_t rand16) {
#if defined(__CUDA_ARCH__)
  const float a = fminf(fabsf(quotient), qmax);
  const uint32_t c = max(__float_as_uint(__fadd_ru(a, 0x1.fffffep6f)), 0x43000000u) - 0x43000000u;
#else
  const float a = std::fmin(std::fabs(quotient), qmax);
  const uint32_t c = a < 0x1p-17f ? 0u : static_cast<uint32_t>(std::ceil(static_cast<double>(a) * 65536.0 - 0.5));
#endif
  const uint32_t m = (c + 0xffffu - rand16) >> 16;
  return floatBits(kRoundMagic) + (quotient < 0.0f ? 0u - m : m);
}

// quantizeCode with stochastic rounding: the quotient v = clamp(x / scale, -qmax, qmax) (IEEE division, as
// quantizeCode) rounds away from zero, to floor(|v|) + 1 in magnitude, with probability frac(|v|), else toward it.
// rand16 (16 random bits, host/philox.h) sets the threshold t = (2 rand16 + 1) / 2^17, the midpoints of 2^16 equal
// steps of [0, 1): |v| rounds up when frac(|v|) > t, a decision stochasticCodeOfQuotient takes in integers.
// Unbiased up to the threshold grid: E[q] - v = (round(frac * 2^16) / 2^16 - frac) * sign(v), at most 2^-17 of a
// quantization step in magnitude, and 0 whenever frac is a multiple of 2^-16. Integers (frac 0) never move; the
// result stays in [-qmax, qmax]. Scale 0 or NaN gives code 0, as quantizeCode.
ZP_HD uint32_t quantizeCodeStochastic(float x, float scale, float qmax, uint32_t rand16) {
  if (!(scale > 0.0f)) return 0;
  return stochasticCodeOfQuotient(divRn(x, scale), qmax, rand16);
}

// The bound on the scale from which stochastic rounding may take quotientRn(x, scale, rcp) (rcp = divRn(1, scale))
// for the division's quotient, as the kernels' hot loops do. Stochastic rounding gives code 0 to every quotient of at
// most 2^-17 in magnitude (stochasticCodeOfQuotient: no draw rounds it up), so only larger quotients need to be the
// division's. From this bound up, an x whose quotient exceeds 2^-17 has |x| > 2^-96, where quotientRn's residual
// is exact and its quotient the division's (see quotientRn); a quotient under 2^-17 from the reciprocal is within a
// few ulps of the division's, so both are at most 2^-17 and give code 0. Zeros need no case of their own: both
// quotients are +-0. So the codes equal quantizeCodeStochastic's for every x and every draw (QuantMath tests, on
// the pairs that check quotientRn, and on quotients around 2^-17 at the smallest such scales).
constexpr float kStochasticQuotientMinScale = 0x1p-79f;

// Error feedback: the value the sender quantizes is its element plus the residual it kept, in fp32.
ZP_HD float withResidual(float x, uint16_t residualBf16) { return addRn(x, bf16BitsToFloat(residualBf16)); }

// The new residual of an element: what its quantization lost, v - q * scale (the fp32 value a receiver
// dequantizes, payloadElement), rounded to bf16 to nearest even. A block whose scale is not finite (it held NaN or
// Inf, or its sum overflowed) keeps no residual (0): the NaN reaches the output, and feedback restarts from zero
// instead of carrying a NaN into every later call.
template <int Bits>
ZP_HD uint16_t residualAfter(float v, uint32_t code, float scale) {
  if (!isFiniteBits(floatBits(scale))) return 0;
  const float dq = bitsFloat(dequantizeValue<Fp32Type>(decodeCode<Bits>(code), scale));
  return floatToBf16BitsRn(addRn(v, -dq));
}

// ---- int4 / int8 packing -------------------------------------------------------------------------------------

// Two int4 codes a byte: element 2i in the low nibble, element 2i+1 in the high one.
ZP_HD uint32_t packInt4Pair(uint32_t even, uint32_t odd) { return (even & 0xfu) | ((odd & 0xfu) << 4); }
ZP_HD uint32_t unpackInt4(uint32_t byte, int index) { return (byte >> (4 * (index & 1))) & 0xfu; }

}  // namespace zp
