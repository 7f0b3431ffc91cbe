// Payload arithmetic of the block quantization format (see include/zpccl.h): one payload = the fp32 scales of
// all blocks padded to 16 bytes, then the packed codes padded to 16 bytes. Compiles for host and device.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define ZP_HD __host__ __device__ __forceinline__
#else
#define ZP_HD inline
#endif

namespace zp {

constexpr int kMinBlockSize = 32;
constexpr int kMaxBlockSize = 8192;
constexpr size_t kPayloadAlign = 16;

ZP_HD bool isValidBits(int bits) { return bits == 4 || bits == 8; }
ZP_HD bool isValidBlockSize(int blockSize) {
  return blockSize >= kMinBlockSize && blockSize <= kMaxBlockSize && (blockSize & (blockSize - 1)) == 0;
}
ZP_HD int quantMax(int bits) { return bits == 8 ? 127 : 7; }

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
