#include "host/reduce_ref.h"

#include "host/dtype.h"
#include "host/reduce_math.h"

// As in quant_ref.cc: float expressions must be evaluated in float, as on the device.
#if !defined(__FLT_EVAL_METHOD__) || __FLT_EVAL_METHOD__ != 0
#error "reduce_ref.cc needs FLT_EVAL_METHOD == 0 (SSE floating point, not x87)"
#endif

namespace zp {
namespace {

// Whole blocks at a time, those that [begin, end) touches, so that a block's verdict (blockSumsFinite) holds for
// any range.
template <int Bits>
void sumPayloadsBits(const std::vector<const unsigned char*>& payloads, size_t count, int blockSize, size_t begin,
                     size_t end, float* sum) {
  std::vector<float> block(blockSize);
  for (size_t first = begin / blockSize * blockSize; first < end; first += blockSize) {
    const size_t last = first + blockSize < count ? first + blockSize : count;
    bool finite = true;
    for (size_t i = first; i < last; ++i) {
      float acc = payloadElement<Bits>(payloads[0], count, blockSize, i);
      for (size_t s = 1; s < payloads.size(); ++s)
        acc = addRn(acc, payloadElement<Bits>(payloads[s], count, blockSize, i));
      block[i - first] = acc;
      finite = finite && isFiniteBits(floatBits(acc));
    }
    for (size_t i = first < begin ? begin : first; i < last && i < end; ++i) {
      sum[i] = finite ? block[i - first] : bitsFloat(kF32QuietNaN);
    }
  }
}

template <class Type>
void finishTyped(const float* sum, float divisor, size_t begin, size_t end, void* out) {
  auto* dst = static_cast<typename Type::Bits*>(out);
  for (size_t i = begin; i < end; ++i) dst[i] = finishReduction<Type>(sum[i], divisor);
}

}  // namespace

void sumPayloadsRef(const std::vector<const unsigned char*>& payloads, size_t count, int bits, int blockSize,
                    size_t begin, size_t end, float* sum) {
  if (payloads.empty()) {  // the sum of nothing
    for (size_t i = begin; i < end; ++i) sum[i] = 0.0f;
  } else if (bits == 8) {
    sumPayloadsBits<8>(payloads, count, blockSize, begin, end, sum);
  } else {
    sumPayloadsBits<4>(payloads, count, blockSize, begin, end, sum);
  }
}

void finishRef(const float* sum, zpDataType_t type, float divisor, size_t begin, size_t end, void* out) {
  switch (type) {
    case zpFloat16:
      finishTyped<Fp16Type>(sum, divisor, begin, end, out);
      break;
    case zpBfloat16:
      finishTyped<Bf16Type>(sum, divisor, begin, end, out);
      break;
    default:
      finishTyped<Fp32Type>(sum, divisor, begin, end, out);
      break;
  }
}

}  // namespace zp
