// The checks of the quantization launchers' arguments (device/quantize_args.h).
#include "device/quantize_args.h"

#include "host/base/check.h"
#include "host/dtype.h"
#include "host/quant_format.h"

namespace zp {

bool segmentsAligned(const void* base, size_t strideBytes, int batch) {
  return reinterpret_cast<uintptr_t>(base) % kVecBytes == 0 && (batch <= 1 || strideBytes % kVecBytes == 0);
}

zpResult_t checkCommon(const char* call, const void* elems, const void* payload, size_t payloadStride,
                       zpDataType_t type, int bits, int blockSize, int batch) {
  if (!isQuantType(type)) return ZP_ERR(zpInvalidArgument, "%s : invalid type %d", call, static_cast<int>(type));
  if (!isValidBits(bits)) return ZP_ERR(zpInvalidArgument, "%s : invalid bits %d (%s)", call, bits, kBitsRule);
  if (!isValidBlockSize(blockSize)) {
    return ZP_ERR(zpInvalidArgument, "%s : invalid blockSize %d (%s)", call, blockSize, kBlockSizeRule);
  }
  if (batch < 0) return ZP_ERR(zpInvalidArgument, "%s : invalid batch %d", call, batch);
  if (reinterpret_cast<uintptr_t>(payload) % kPayloadAlign != 0) {
    return ZP_ERR(zpInvalidArgument, "%s : payload %p is not %zu-byte aligned", call, payload, kPayloadAlign);
  }
  if (payloadStride % kPayloadAlign != 0) {
    return ZP_ERR(zpInvalidArgument, "%s : payload stride %zu is not a multiple of %zu", call, payloadStride,
                  kPayloadAlign);
  }
  if (reinterpret_cast<uintptr_t>(elems) % typeSize(type) != 0) {
    return ZP_ERR(zpInvalidArgument, "%s : buffer %p is not aligned to its %s elements", call, elems, typeName(type));
  }
  return zpSuccess;
}

zpResult_t quantArgsOf(const char* call, const void* input, void* payload, size_t count, zpDataType_t type, int bits,
                       int blockSize, KernelStream stream, int batch, size_t inputStrideElems,
                       size_t payloadStrideBytes, QuantArgs* a, bool* empty) {
  const size_t payloadBytes = quantPayloadBytes(count, bits, blockSize);
  if (payloadStrideBytes == 0) payloadStrideBytes = payloadBytes;
  ZPCHECK(checkCommon(call, input, payload, payloadStrideBytes, type, bits, blockSize, batch));
  if (batch > 1 && payloadStrideBytes < payloadBytes) {
    return ZP_ERR(zpInvalidArgument, "%s : payload stride %zu is below the payload size %zu", call, payloadStrideBytes,
                  payloadBytes);
  }
  *empty = count == 0 || batch == 0;
  a->input = static_cast<const char*>(input);
  a->payload = static_cast<char*>(payload);
  a->count = count;
  a->inputStride = (inputStrideElems == 0 ? count : inputStrideElems) * typeSize(type);
  a->payloadStride = payloadStrideBytes;
  a->blocks = quantBlockCount(count, blockSize);
  a->scaleBytes = quantScaleBytes(count, blockSize);
  a->codeBytes = quantCodeBytes(count, bits);
  a->batch = batch;
  a->sync = stream.sync;
  return zpSuccess;
}

}  // namespace zp
