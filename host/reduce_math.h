// Arithmetic of the quantized reductions (qgZ), compiled for host and device: reading one element of a payload
// back as fp32, and the fixed-order fp32 sums. The host reference and the kernels share these functions, so
// their results agree bit for bit.
#pragma once

#include "host/quant_format.h"
#include "host/quant_math.h"

namespace zp {

// Element i of a payload of `count` elements, dequantized to fp32 (a block that held NaN or Inf gives NaN).
template <int Bits>
ZP_HD float payloadElement(const unsigned char* payload, size_t count, int blockSize, size_t i) {
  const float* scales = reinterpret_cast<const float*>(payload);
  const unsigned char* codes = payload + quantScaleBytes(count, blockSize);
  const uint32_t code = Bits == 8 ? codes[i] : unpackInt4(codes[i / 2], static_cast<int>(i & 1));
  return bitsFloat(dequantizeValue<Fp32Type>(decodeCode<Bits>(code), scales[i / blockSize]));
}

// The block rule of qgZ's sums: a block of which some fp32 sum is not finite is NaN in every element. A sum is
// not finite when a source block held NaN or Inf (then every sum of the block is NaN already) or when the sum
// overflows fp32. The rule makes an overflow give the same on every layout: with two hops an overflowing partial
// sum requantizes to a NaN block (its scale is NaN), and with one hop the finished block is made NaN likewise, so
// a loss scaler sees the overflow either way. A sum that is finite in fp32 but beyond the output type's range
// (fp16, bf16) rounds to +-Inf in finishReduction, after the last hop, on every layout alike.
//
// The last step of a reduction: Avg divides the fp32 sum by the rank count (IEEE division), then the value is
// rounded to the output type (to nearest even; Inf stays Inf, as an NCCL reduction would give). Every NaN leaves
// as the type's quiet NaN: the bits of a NaN made by arithmetic differ between host and GPU (x86 keeps an
// operand's payload, or makes a negative NaN from Inf - Inf; the GPU makes 0x7fffffff), and outputs must agree.
template <class Type>
ZP_HD typename Type::Bits finishReduction(float sum, float divisor) {
  const float v = divisor == 1.0f ? sum : divRn(sum, divisor);
  if ((floatBits(v) & kF32AbsMask) > kF32Inf) return Type::kQuietNaN;
  return Type::fromFloat(v);
}

}  // namespace zp
