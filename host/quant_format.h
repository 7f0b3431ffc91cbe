// Payload arithmetic of the block quantization format (see include/zpccl.h): one payload = the fp32 scales of
// all blocks padded to 16 bytes, then the packed codes padded to 16 bytes. Compiles for host and device. The
// format's bounds are the public header's macros, so that the checks, the kernels and the callers agree on them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "include/zpccl.h"

#if defined(__CUDACC__)
#define ZP_HD __host__ __device__ __forceinline__
#else
#define ZP_HD inline
#endif

namespace zp {

constexpr int kMinBlockSize = ZP_MIN_BLOCK_SIZE;
constexpr int kMaxBlockSize = ZP_MAX_BLOCK_SIZE;
constexpr size_t kPayloadAlign = ZP_PAYLOAD_ALIGN;

// The two rules in the words of the library's messages ("bits 6 must be 4 or 8"), as zpccl.enums words them.
#define ZP_QUANT_FORMAT_TEXT_(value) #value
#define ZP_QUANT_FORMAT_TEXT(value) ZP_QUANT_FORMAT_TEXT_(value)
constexpr char kBitsRule[] = ZP_QUANT_FORMAT_TEXT(ZP_BITS_INT4) " or " ZP_QUANT_FORMAT_TEXT(ZP_BITS_INT8);
constexpr char kBlockSizeRule[] =
    "a power of two in [" ZP_QUANT_FORMAT_TEXT(ZP_MIN_BLOCK_SIZE) ", " ZP_QUANT_FORMAT_TEXT(ZP_MAX_BLOCK_SIZE) "]";
#undef ZP_QUANT_FORMAT_TEXT
#undef ZP_QUANT_FORMAT_TEXT_

ZP_HD bool isValidBits(int bits) { return bits == ZP_BITS_INT4 || bits == ZP_BITS_INT8; }
ZP_HD bool isValidBlockSize(int blockSize) {
  return blockSize >= kMinBlockSize && blockSize <= kMaxBlockSize && (blockSize & (blockSize - 1)) == 0;
}
ZP_HD int quantMax(int bits) { return bits == ZP_BITS_INT8 ? 127 : 7; }

ZP_HD size_t alignUp(size_t bytes, size_t align) { return (bytes + align - 1) / align * align; }
ZP_HD size_t quantBlockCount(size_t count, int blockSize) { return (count + blockSize - 1) / blockSize; }
// Bytes of the scale region, padded so that the codes start 16-byte aligned.
ZP_HD size_t quantScaleBytes(size_t count, int blockSize) {
  return alignUp(quantBlockCount(count, blockSize) * sizeof(float), kPayloadAlign);
}
ZP_HD size_t quantCodeBytes(size_t count, int bits) { return alignUp((count * bits + 7) / 8, kPayloadAlign); }
ZP_HD size_t quantPayloadBytes(size_t count, int bits, int blockSize) {
  return count == 0 ? 0 : quantScaleBytes(count, blockSize) + quantCodeBytes(count, bits);
}

}  // namespace zp
