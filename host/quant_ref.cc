#include "host/quant_ref.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "host/quant_format.h"
#include "host/quant_math.h"

// The reference must evaluate float expressions in float (no x87 excess precision), as the device does.
#if !defined(__FLT_EVAL_METHOD__) || __FLT_EVAL_METHOD__ != 0
#error "quant_ref.cc needs FLT_EVAL_METHOD == 0 (SSE floating point, not x87)"
#endif

namespace zp {
namespace {

// Elements are read and written through memcpy: the buffers may start at any element alignment.
template <class Type>
typename Type::Bits loadBits(const unsigned char* base, size_t i) {
  typename Type::Bits b;
  std::memcpy(&b, base + i * sizeof(b), sizeof(b));
  return b;
}

template <class Type>
void quantizeTyped(const unsigned char* in, size_t count, int bits, int blockSize, unsigned char* payload) {
  // Padding (after the scales and after the codes) must read as zero: clear everything first.
  std::memset(payload, 0, quantPayloadBytes(count, bits, blockSize));
  unsigned char* codes = payload + quantScaleBytes(count, blockSize);
  const float qmax = static_cast<float>(quantMax(bits));
  const size_t blocks = quantBlockCount(count, blockSize);
  for (size_t b = 0; b < blocks; ++b) {
    const size_t begin = b * blockSize;
    const size_t end = begin + blockSize < count ? begin + blockSize : count;
    uint32_t absMax = 0;
    for (size_t i = begin; i < end; ++i) {
      const uint32_t a = absBits(Type::toFloat(loadBits<Type>(in, i)));
      absMax = a > absMax ? a : absMax;
    }
    const float scale = blockScale(absMax, bits);
    std::memcpy(payload + b * sizeof(float), &scale, sizeof(float));
    for (size_t i = begin; i < end; ++i) {
      const uint32_t code = quantizeCode(Type::toFloat(loadBits<Type>(in, i)), scale, qmax);
      if (bits == 8) {
        codes[i] = static_cast<unsigned char>(code);
      } else {
        codes[i / 2] |= static_cast<unsigned char>((code & 0xfu) << (4 * (i & 1)));
      }
    }
  }
}

// Blocks start at multiples of blockSize from element 0; a chunk of a slice starts at a whole block, so its blocks
// are the slice's.
template <class Type, int Bits>
void quantizeGradTyped(const unsigned char* in, size_t count, int blockSize, const GradQuant& g,
                       unsigned char* payload) {
  std::memset(payload, 0, quantPayloadBytes(count, Bits, blockSize));
  unsigned char* codes = payload + quantScaleBytes(count, blockSize);
  const float qmax = static_cast<float>(quantMax(Bits));
  std::vector<float> v(blockSize);
  for (size_t first = 0; first < count; first += blockSize) {
    const size_t end = first + blockSize < count ? first + blockSize : count;
    uint32_t absMax = 0;
    for (size_t i = first; i < end; ++i) {
      float x = Type::toFloat(loadBits<Type>(in, i));
      if (g.residual != nullptr) x = withResidual(x, g.residual[i]);
      v[i - first] = x;
      const uint32_t a = absBits(x);
      absMax = a > absMax ? a : absMax;
    }
    const float scale = blockScale(absMax, Bits);
    std::memcpy(payload + first / blockSize * sizeof(float), &scale, sizeof(float));
    Philox4x32 bits{};
    for (size_t i = first; i < end; ++i) {
      const float x = v[i - first];
      uint32_t code;
      if (g.stochastic) {
        const size_t j = g.firstElem + i;
        if (i == first || (j & 7) == 0) bits = gradRandomGroup(g.key, g.slice, j >> 3);
        code = quantizeCodeStochastic(x, scale, qmax, gradRandom16(bits, j));
      } else {
        code = quantizeCode(x, scale, qmax);
      }
      if (g.residual != nullptr) g.residual[i] = residualAfter<Bits>(x, code, scale);
      if (Bits == 8) {
        codes[i] = static_cast<unsigned char>(code);
      } else {
        codes[i / 2] |= static_cast<unsigned char>((code & 0xfu) << (4 * (i & 1)));
      }
    }
  }
}

template <class Type>
void quantizeGradBits(const unsigned char* in, size_t count, int bits, int blockSize, const GradQuant& g,
                      unsigned char* out) {
  if (bits == 8) {
    quantizeGradTyped<Type, 8>(in, count, blockSize, g, out);
  } else {
    quantizeGradTyped<Type, 4>(in, count, blockSize, g, out);
  }
}

template <class Type, int Bits>
void dequantizeTyped(const unsigned char* payload, size_t count, int blockSize, unsigned char* out) {
  const unsigned char* codes = payload + quantScaleBytes(count, blockSize);
  for (size_t i = 0; i < count; ++i) {
    float scale;
    std::memcpy(&scale, payload + (i / blockSize) * sizeof(float), sizeof(float));
    const uint32_t code = Bits == 8 ? codes[i] : unpackInt4(codes[i / 2], static_cast<int>(i & 1));
    const typename Type::Bits v = dequantizeValue<Type>(decodeCode<Bits>(code), scale);
    std::memcpy(out + i * sizeof(v), &v, sizeof(v));
  }
}

template <class Type>
void dequantizeBits(const unsigned char* payload, size_t count, int bits, int blockSize, unsigned char* out) {
  if (bits == 8) {
    dequantizeTyped<Type, 8>(payload, count, blockSize, out);
  } else {
    dequantizeTyped<Type, 4>(payload, count, blockSize, out);
  }
}

}  // namespace

void quantizeRef(const void* input, zpDataType_t type, size_t count, int bits, int blockSize, void* payload) {
  if (count == 0) return;
  const auto* in = static_cast<const unsigned char*>(input);
  auto* out = static_cast<unsigned char*>(payload);
  switch (type) {
    case zpFloat16:
      quantizeTyped<Fp16Type>(in, count, bits, blockSize, out);
      break;
    case zpBfloat16:
      quantizeTyped<Bf16Type>(in, count, bits, blockSize, out);
      break;
    case zpFloat32:
      quantizeTyped<Fp32Type>(in, count, bits, blockSize, out);
      break;
    default:
      break;  // the caller's argument checks admit no other type
  }
}

void quantizeGradRef(const void* input, zpDataType_t type, size_t count, int bits, int blockSize, const GradQuant& g,
                     void* payload) {
  if (count == 0) return;
  const auto* in = static_cast<const unsigned char*>(input);
  auto* out = static_cast<unsigned char*>(payload);
  switch (type) {
    case zpFloat16:
      quantizeGradBits<Fp16Type>(in, count, bits, blockSize, g, out);
      break;
    case zpBfloat16:
      quantizeGradBits<Bf16Type>(in, count, bits, blockSize, g, out);
      break;
    case zpFloat32:
      quantizeGradBits<Fp32Type>(in, count, bits, blockSize, g, out);
      break;
    default:
      break;
  }
}

void dequantizeRef(const void* payload, zpDataType_t type, size_t count, int bits, int blockSize, void* output) {
  if (count == 0) return;
  const auto* in = static_cast<const unsigned char*>(payload);
  auto* out = static_cast<unsigned char*>(output);
  switch (type) {
    case zpFloat16:
      dequantizeBits<Fp16Type>(in, count, bits, blockSize, out);
      break;
    case zpBfloat16:
      dequantizeBits<Bf16Type>(in, count, bits, blockSize, out);
      break;
    case zpFloat32:
      dequantizeBits<Fp32Type>(in, count, bits, blockSize, out);
      break;
    default:
      break;
  }
}

}  // namespace zp
