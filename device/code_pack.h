// Packing of quantization codes into payload bytes (int8: one a byte; int4: two a byte, element 2i in the low
// nibble), for the block quantize and the gradient-rounding quantize. Host versions too, so that a host program
// can check the kernels' codes against host/quant_math.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#define ZP_QHD __host__ __device__ __forceinline__
#if defined(__CUDA_ARCH__)
#define ZP_UNROLL _Pragma("unroll")
#else
#define ZP_UNROLL
#endif

namespace zp {

ZP_QHD uint32_t bytePerm(uint32_t a, uint32_t b, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(a, b, sel);
#else
  const uint64_t ab = (static_cast<uint64_t>(b) << 32) | a;
  uint32_t r = 0;
  for (int k = 0; k < 4; ++k) r |= static_cast<uint32_t>((ab >> (8 * ((sel >> (4 * k)) & 7))) & 0xffu) << (8 * k);
  return r;
#endif
}

// The V codes of one vector, packed (int8: V bytes; int4: V / 2 bytes, element 2i in the low nibble; bits past
// them are not zero), from words whose low byte holds each code in two's complement (higher bits ignored).
template <int Bits, int V>
ZP_QHD uint2 packCodes(const uint32_t (&c)[V]) {
  uint32_t words[2] = {0, 0};
  if constexpr (Bits == 8) {
    ZP_UNROLL
    for (int k = 0; k < V / 4; ++k) {
      words[k] =
          bytePerm(bytePerm(c[4 * k], c[4 * k + 1], 0x0040), bytePerm(c[4 * k + 2], c[4 * k + 3], 0x0040), 0x5410);
    }
  } else {
    // The low bytes of the even elements (byte k: element 2k) and of the odd ones (byte k: element 2k + 1), then
    // the even codes' low nibbles beside the odd ones moved up.
    uint32_t even, odd;
    if constexpr (V == 8) {
      even = bytePerm(bytePerm(c[0], c[2], 0x0040), bytePerm(c[4], c[6], 0x0040), 0x5410);
      odd = bytePerm(bytePerm(c[1], c[3], 0x0040), bytePerm(c[5], c[7], 0x0040), 0x5410);
    } else {
      even = bytePerm(c[0], c[2], 0x0040);
      odd = bytePerm(c[1], c[3], 0x0040);
    }
    words[0] = (even & 0x0f0f0f0fu) | ((odd << 4) & 0xf0f0f0f0u);
  }
  return make_uint2(words[0], words[1]);
}

}  // namespace zp
