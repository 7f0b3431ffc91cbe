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

// The last step of a reduction: Avg divides the fp32 sum by the rank count (IEEE division), then the value is
// rounded to the output type (to nearest even; Inf stays Inf, as an NCCL reduction would give).
template <class Type>
ZP_HD typename Type::Bits finishReduction(float sum, float divisor) {
  return Type::fromFloat(divisor == 1.0f ? sum : divRn(sum, divisor));
}

}  // namespace zp
