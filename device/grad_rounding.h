// qgZ's gradient rounding (stochastic rounding, error feedback; include/zpccl.h) of one group of 8 elements, the
// span of one Philox call (host/philox.h), for the hot loops of the sender's quantize (device/quantize_grad.cu) and the
// requantize (device/reduce.cu). The arithmetic of every element is host/quant_math.h's, as the host reference
// (host/quant_ref.cc) does it, so that codes and residuals stay bit-identical to it.
//
// Why a group at a time, in straight-line code: a kernel that chooses per element between the quotient from the
// reciprocal and the division (and, for error feedback, between the plain product and the saturating one) makes
// each element a branch region of its own, so that no element's latency overlaps another's, and its Philox words
// indexed by the element's counter (a run-time index) go through local memory. Here the choices that depend on
// the block's scale are taken once per block (gradScaleIsFast), a block that passes it needs no division at all
// (gradGroupCodes), and each element's random bits are a word and half known at compile time.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "host/philox.h"
#include "host/quant_math.h"

namespace zp {

constexpr int kGradGroup = 8;  // elements of one Philox call

// Whether a block of this scale takes gradGroupCodes and gradGroupResiduals: the scale is at least the bound from
// which the quotient from the reciprocal is the division's (kQuotientMinScale, kStochasticQuotientMinScale: it is
// then finite and positive), and with a residual no code's product can round to Inf (dequantIsPlain), so that
// dequantizeValue is the product alone. Blocks of a smaller, zero or NaN scale, or near FLT_MAX, take the element
// by element path of the kernel.
template <int Bits, bool kStochastic, bool kResidual>
__device__ __forceinline__ bool gradScaleIsFast(float scale) {
  const bool quotient = scale >= (kStochastic ? kStochasticQuotientMinScale : kQuotientMinScale);
  return quotient && (!kResidual || dequantIsPlain<Fp32Type, Bits>(scale));
}

// The code word of one element of a block that fails gradScaleIsFast (a zero, tiny or NaN scale, or one near FLT_MAX),
// as the host reference rounds it: quantizeCode's, or quantizeCodeStochastic's with the element's 16 random bits
// (unused for nearest rounding), from the quotient by the reciprocal where `fast` (the scale passes the quotient's
// bound) and by the division otherwise.
template <bool kStochastic>
__device__ __forceinline__ uint32_t gradElementCode(float x, float scale, float rcp, float qmax, bool fast,
                                                    uint32_t rand16) {
  if constexpr (kStochastic) {
    return fast ? stochasticCodeOfQuotient(quotientRn(x, scale, rcp), qmax, rand16)
                : quantizeCodeStochastic(x, scale, qmax, rand16);
  } else {
    return fast ? floatBits(addRn(quotientRn(x, scale, rcp), kRoundMagic)) : quantizeCode(x, scale, qmax);
  }
}

// The code words of a group (code k in the low bits of c[k], higher bits not zero) whose block passed
// gradScaleIsFast: quantizeCode's (kStochastic false) or quantizeCodeStochastic's, element k drawing the bits k of
// the group's Philox output r (the group starts at a multiple of 8, so gradRandom16(r, j) takes them for element
// j). The quotients are quotientRn's (scale, rcp = divRn(1, scale)), which give the division's codes wherever the
// rounding can tell: near 1/2 and above for the nearest rounding (kQuotientMinScale), above 2^-17 for stochastic
// rounding (kStochasticQuotientMinScale; host/quant_math.h). So a group is straight-line code with no division.
template <bool kStochastic>
__device__ __forceinline__ void gradGroupCodes(const float (&x)[kGradGroup], float scale, float rcp, float qmax,
                                               const Philox4x32& r, uint32_t (&c)[kGradGroup]) {
  if constexpr (!kStochastic) {
#pragma unroll
    for (int k = 0; k < kGradGroup; ++k) c[k] = floatBits(addRn(quotientRn(x[k], scale, rcp), kRoundMagic));
  } else {
#pragma unroll
    for (int k = 0; k < kGradGroup; ++k)
      c[k] = stochasticCodeOfQuotient(quotientRn(x[k], scale, rcp), qmax, gradRandom16(r, k));
  }
}

// residualAfter's new residuals of a group whose block passed gradScaleIsFast with a residual (finite, plain scale:
// dequantizeValue is the product alone), from its values x and code words c, as bf16 pairs (element 2i in the low
// half of w[i]). Two at a time: the paired conversion rounds each half to nearest even as floatToBf16BitsRn does.
template <int Bits>
__device__ __forceinline__ void gradGroupResiduals(const float (&x)[kGradGroup], const uint32_t (&c)[kGradGroup],
                                                   float scale, uint32_t (&w)[kGradGroup / 2]) {
#pragma unroll
  for (int i = 0; i < kGradGroup / 2; ++i) {
    const float lo = addRn(x[2 * i], -mulRn(decodeCode<Bits>(c[2 * i]), scale));
    const float hi = addRn(x[2 * i + 1], -mulRn(decodeCode<Bits>(c[2 * i + 1]), scale));
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);  // .x: the low half
    w[i] = *reinterpret_cast<const uint32_t*>(&h);
  }
}

}  // namespace zp
