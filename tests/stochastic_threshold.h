// Stochastic rounding's threshold form, quantizeCodeStochastic's definition (host/quant_math.h) as it reads, for
// the tests that hold stochasticCodeOfQuotient's integer form to it on the host (tests/test_quant_ref.cc) and on the
// GPU (tests/grad_gpu_kernels.cu). Every operation is exact (floor; |v| - floor(|v|) by Sterbenz's lemma; a 17-bit
// integer times 2^-17; an integer plus 1), so it gives the same codes on both.
#pragma once

#include <math.h>

#include <cstdint>

#include "host/quant_math.h"

namespace zptest {

ZP_HD uint32_t stochasticCodeByThreshold(float quotient, float qmax, uint32_t rand16) {
  const float v = zp::clampFloat(quotient, -qmax, qmax);
  const float a = fabsf(v);  // math.h's on the host, CUDA's on the GPU: both exact
  const float whole = floorf(a);
  const float frac = zp::addRn(a, -whole);
  const float threshold = zp::mulRn(static_cast<float>(2u * rand16 + 1u), 0x1p-17f);
  const float q = frac > threshold ? zp::addRn(whole, 1.0f) : whole;
  return zp::floatBits(zp::addRn(v < 0.0f ? -q : q, zp::kRoundMagic));
}

// The draws at which the integer form's rounding of a (>= 0) changes: it rounds up for every draw below
// ceil(2^16 frac(a) - 1/2), down from there. Both forms round up for a set of draws that starts at 0, so they
// agree on every draw if they agree on 0, 0xffff and the two around that step.
ZP_HD void stochasticStepDraws(float a, uint32_t (&draws)[4]) {
  const double f = static_cast<double>(a) - floor(static_cast<double>(a));
  const double c = ceil(f * 65536.0 - 0.5);
  const uint32_t step = c < 0.0 ? 0u : static_cast<uint32_t>(c);
  draws[0] = 0;
  draws[1] = 0xffffu;
  draws[2] = step > 0 ? step - 1 : 0;
  draws[3] = step < 0x10000u ? step : 0xffffu;
}

}  // namespace zptest
