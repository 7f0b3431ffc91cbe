// Device quantization kernels (device/quantize.h) against the host reference (host/quant_ref.h), bit for bit:
// payload bytes and dequantized output bits, over type x bits x block size x count x misalignment, with NaN,
// Inf, zero, denormal and tie blocks in the data; outputs poisoned before every run; batched launches.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "device/quantize.h"
#include "host/dtype.h"
#include "host/quant_format.h"
#include "host/quant_ref.h"
#include "tests/gpu_util.h"
#include "tests/quant_test_util.h"

namespace {

constexpr size_t kGuard = 64;  // poisoned bytes around each output, which must stay untouched
constexpr unsigned char kPoison = 0xff;

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&ptr_, bytes) != cudaSuccess) ptr_ = nullptr;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  unsigned char* get() const { return static_cast<unsigned char*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

// First differing byte of two buffers, or -1.
long firstDiff(const unsigned char* a, const unsigned char* b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) return static_cast<long>(i);
  }
  return -1;
}

bool allBytes(const unsigned char* p, size_t n, unsigned char v) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != v) return false;
  }
  return true;
}

std::string caseName(zpDataType_t type, int bits, int g, size_t count, size_t offset) {
  return std::string(zp::typeName(type)) + " bits=" + std::to_string(bits) + " G=" + std::to_string(g) +
         " count=" + std::to_string(count) + " offset=" + std::to_string(offset);
}

TEST(QuantGpu, MatchesHostReferenceBitForBit) {
  ZP_REQUIRE_GPUS(1);
  const size_t counts[] = {1, 31, 255, 256, 257, 4097, 100003, (size_t{1} << 20) + 3};
  const size_t maxCount = counts[sizeof(counts) / sizeof(counts[0]) - 1];
  const size_t maxOffset = 7;
  const size_t maxPayload = zp::quantPayloadBytes(maxCount, 8, 32);
  const size_t maxElemBytes = (maxCount + maxOffset) * 4 + kGuard;
  DeviceBuffer dIn(maxElemBytes), dPayload(maxPayload + kGuard), dOut(maxElemBytes);
  ASSERT_NE(dIn.get(), nullptr);
  ASSERT_NE(dPayload.get(), nullptr);
  ASSERT_NE(dOut.get(), nullptr);
  std::vector<unsigned char> in(maxElemBytes), refPayload(maxPayload), refOut(maxElemBytes);
  std::vector<unsigned char> payload(maxPayload + kGuard), out(maxElemBytes);

  uint32_t seed = 1;
  for (zpDataType_t type : zptest::kQuantTypes) {
    const size_t esize = zptest::elemSize(type);
    for (int bits : {4, 8}) {
      for (int g : {32, 64, 128, 256, 512, 1024, 2048, 4096, 8192}) {
        for (size_t count : counts) {
          for (size_t offset : {0, 1, 3, 7}) {
            const std::string name = caseName(type, bits, g, count, offset);
            const size_t payloadBytes = zp::quantPayloadBytes(count, bits, g);
            const size_t elemBytes = count * esize;
            zptest::fillData(type, in.data() + offset * esize, count, g, bits, seed++, /*specials=*/true);
            zp::quantizeRef(in.data() + offset * esize, type, count, bits, g, refPayload.data());
            zp::dequantizeRef(refPayload.data(), type, count, bits, g, refOut.data());

            // Quantize into a poisoned payload.
            CUDA_ASSERT(cudaMemcpy(dIn.get(), in.data(), offset * esize + elemBytes, cudaMemcpyHostToDevice));
            CUDA_ASSERT(cudaMemset(dPayload.get(), kPoison, payloadBytes + kGuard));
            ASSERT_EQ(zp::launchQuantize(dIn.get() + offset * esize, dPayload.get(), count, type, bits, g, nullptr),
                      zpSuccess)
                << name;
            CUDA_ASSERT(cudaMemcpy(payload.data(), dPayload.get(), payloadBytes + kGuard, cudaMemcpyDeviceToHost));
            const long pd = firstDiff(payload.data(), refPayload.data(), payloadBytes);
            ASSERT_EQ(pd, -1) << name << ": payload byte " << pd << " (scale region " << zp::quantScaleBytes(count, g)
                              << " bytes): device " << int(payload[pd < 0 ? 0 : pd]) << " host "
                              << int(refPayload[pd < 0 ? 0 : pd]);
            ASSERT_TRUE(allBytes(payload.data() + payloadBytes, kGuard, kPoison)) << name << ": write past payload";

            // Dequantize the device payload into a poisoned, equally misaligned output.
            CUDA_ASSERT(cudaMemset(dOut.get(), kPoison, offset * esize + elemBytes + kGuard));
            ASSERT_EQ(zp::launchDequantize(dPayload.get(), dOut.get() + offset * esize, count, type, bits, g, nullptr),
                      zpSuccess)
                << name;
            CUDA_ASSERT(
                cudaMemcpy(out.data(), dOut.get(), offset * esize + elemBytes + kGuard, cudaMemcpyDeviceToHost));
            ASSERT_TRUE(allBytes(out.data(), offset * esize, kPoison)) << name << ": write before output";
            const long od = firstDiff(out.data() + offset * esize, refOut.data(), elemBytes);
            ASSERT_EQ(od, -1) << name << ": output element " << (od < 0 ? 0 : od / esize) << ": device 0x" << std::hex
                              << zptest::loadElemBits(type, out.data() + offset * esize, od < 0 ? 0 : od / esize)
                              << " host 0x" << zptest::loadElemBits(type, refOut.data(), od < 0 ? 0 : od / esize);
            ASSERT_TRUE(allBytes(out.data() + offset * esize + elemBytes, kGuard, kPoison))
                << name << ": write past output";
          }
        }
      }
    }
  }
  CUDA_ASSERT(cudaDeviceSynchronize());
}

// Three segments in one launch, with strides that misalign the segments differently and leave gaps that must
// stay untouched; each segment must equal its own host reference.
TEST(QuantGpu, BatchedSegmentsMatchHostReference) {
  ZP_REQUIRE_GPUS(1);
  constexpr int kBatch = 3;
  uint32_t seed = 777;
  for (zpDataType_t type : zptest::kQuantTypes) {
    const size_t esize = zptest::elemSize(type);
    for (int bits : {4, 8}) {
      for (int g : {32, 256, 8192}) {
        for (size_t count : {size_t{1}, size_t{257}, size_t{100003}}) {
          for (bool dense : {false, true}) {
            const std::string name = caseName(type, bits, g, count, 0) + (dense ? " dense" : " strided");
            const size_t payloadBytes = zp::quantPayloadBytes(count, bits, g);
            const size_t inStride = dense ? count : count + 5;  // elements
            const size_t payloadStride = dense ? payloadBytes : payloadBytes + 48;
            const size_t outStride = dense ? count : count + 3;
            const size_t inBytes = (inStride * (kBatch - 1) + count) * esize;
            const size_t outBytes = (outStride * (kBatch - 1) + count) * esize;
            const size_t payloadTotal = payloadStride * (kBatch - 1) + payloadBytes;
            std::vector<unsigned char> in(inBytes), payload(payloadTotal + kGuard), out(outBytes + kGuard);
            for (int s = 0; s < kBatch; ++s) {
              zptest::fillData(type, in.data() + s * inStride * esize, count, g, bits, seed++, true);
            }
            DeviceBuffer dIn(inBytes), dPayload(payloadTotal + kGuard), dOut(outBytes + kGuard);
            CUDA_ASSERT(cudaMemcpy(dIn.get(), in.data(), inBytes, cudaMemcpyHostToDevice));
            CUDA_ASSERT(cudaMemset(dPayload.get(), kPoison, payloadTotal + kGuard));
            CUDA_ASSERT(cudaMemset(dOut.get(), kPoison, outBytes + kGuard));
            ASSERT_EQ(zp::launchQuantize(dIn.get(), dPayload.get(), count, type, bits, g, nullptr, kBatch,
                                         dense ? 0 : inStride, dense ? 0 : payloadStride),
                      zpSuccess)
                << name;
            ASSERT_EQ(zp::launchDequantize(dPayload.get(), dOut.get(), count, type, bits, g, nullptr, kBatch,
                                           dense ? 0 : payloadStride, dense ? 0 : outStride),
                      zpSuccess)
                << name;
            CUDA_ASSERT(cudaMemcpy(payload.data(), dPayload.get(), payloadTotal + kGuard, cudaMemcpyDeviceToHost));
            CUDA_ASSERT(cudaMemcpy(out.data(), dOut.get(), outBytes + kGuard, cudaMemcpyDeviceToHost));
            std::vector<unsigned char> refPayload(payloadBytes), refOut(count * esize);
            for (int s = 0; s < kBatch; ++s) {
              zp::quantizeRef(in.data() + s * inStride * esize, type, count, bits, g, refPayload.data());
              zp::dequantizeRef(refPayload.data(), type, count, bits, g, refOut.data());
              EXPECT_EQ(firstDiff(payload.data() + s * payloadStride, refPayload.data(), payloadBytes), -1)
                  << name << " segment " << s;
              EXPECT_EQ(firstDiff(out.data() + s * outStride * esize, refOut.data(), count * esize), -1)
                  << name << " segment " << s;
              if (s + 1 < kBatch) {
                EXPECT_TRUE(
                    allBytes(payload.data() + s * payloadStride + payloadBytes, payloadStride - payloadBytes, kPoison))
                    << name << " payload gap after segment " << s;
                EXPECT_TRUE(
                    allBytes(out.data() + (s * outStride + count) * esize, (outStride - count) * esize, kPoison))
                    << name << " output gap after segment " << s;
              }
            }
            EXPECT_TRUE(allBytes(payload.data() + payloadTotal, kGuard, kPoison)) << name;
            EXPECT_TRUE(allBytes(out.data() + outBytes, kGuard, kPoison)) << name;
          }
        }
      }
    }
  }
}

// Payloads the quantizer never makes (codes -128 / -8, Inf, NaN and huge scales) dequantize as on the host.
TEST(QuantGpu, ForeignPayloadMatchesHostReference) {
  ZP_REQUIRE_GPUS(1);
  const size_t count = 32 * 6;
  const float scales[6] = {std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::max() / 2,
                           std::numeric_limits<float>::quiet_NaN(),
                           0x1p-140f,
                           1e30f,
                           -1.0f};
  std::mt19937 rng(5);
  for (int bits : {4, 8}) {
    const size_t payloadBytes = zp::quantPayloadBytes(count, bits, 32);
    std::vector<unsigned char> payload(payloadBytes, 0);
    std::memcpy(payload.data(), scales, sizeof(scales));
    for (size_t k = zp::quantScaleBytes(count, 32); k < payloadBytes; ++k)
      payload[k] = static_cast<unsigned char>(rng());
    DeviceBuffer dPayload(payloadBytes), dOut(count * 4);
    CUDA_ASSERT(cudaMemcpy(dPayload.get(), payload.data(), payloadBytes, cudaMemcpyHostToDevice));
    for (zpDataType_t type : zptest::kQuantTypes) {
      const size_t esize = zptest::elemSize(type);
      std::vector<unsigned char> ref(count * esize), out(count * esize);
      zp::dequantizeRef(payload.data(), type, count, bits, 32, ref.data());
      ASSERT_EQ(zp::launchDequantize(dPayload.get(), dOut.get(), count, type, bits, 32, nullptr), zpSuccess);
      CUDA_ASSERT(cudaMemcpy(out.data(), dOut.get(), count * esize, cudaMemcpyDeviceToHost));
      EXPECT_EQ(firstDiff(out.data(), ref.data(), count * esize), -1) << zp::typeName(type) << " bits=" << bits;
    }
  }
}

TEST(QuantGpu, EmptyAndBadArguments) {
  ZP_REQUIRE_GPUS(1);
  DeviceBuffer dIn(4096), dPayload(4096);
  CUDA_ASSERT(cudaMemset(dPayload.get(), kPoison, 4096));
  EXPECT_EQ(zp::launchQuantize(dIn.get(), dPayload.get(), 0, zpFloat16, 8, 256, nullptr), zpSuccess);
  EXPECT_EQ(zp::launchQuantize(dIn.get(), dPayload.get(), 100, zpFloat16, 8, 256, nullptr, 0), zpSuccess);
  EXPECT_EQ(zp::launchDequantize(dPayload.get(), dIn.get(), 0, zpFloat16, 8, 256, nullptr), zpSuccess);
  std::vector<unsigned char> payload(4096);
  CUDA_ASSERT(cudaMemcpy(payload.data(), dPayload.get(), 4096, cudaMemcpyDeviceToHost));
  EXPECT_TRUE(allBytes(payload.data(), 4096, kPoison)) << "an empty call wrote";

  EXPECT_EQ(zp::launchQuantize(dIn.get(), dPayload.get() + 8, 100, zpFloat16, 8, 256, nullptr), zpInvalidArgument);
  EXPECT_EQ(zp::launchDequantize(dPayload.get() + 4, dIn.get(), 100, zpFloat32, 4, 32, nullptr), zpInvalidArgument);
  EXPECT_EQ(zp::launchQuantize(dIn.get() + 1, dPayload.get(), 100, zpFloat16, 8, 256, nullptr), zpInvalidArgument);
  EXPECT_EQ(zp::launchQuantize(dIn.get(), dPayload.get(), 100, zpInt8, 8, 256, nullptr), zpInvalidArgument);
  EXPECT_EQ(zp::launchQuantize(dIn.get(), dPayload.get(), 100, zpFloat16, 5, 256, nullptr), zpInvalidArgument);
  EXPECT_EQ(zp::launchQuantize(dIn.get(), dPayload.get(), 100, zpFloat16, 8, 100, nullptr), zpInvalidArgument);
  EXPECT_EQ(zp::launchQuantize(dIn.get(), dPayload.get(), 100, zpFloat16, 8, 256, nullptr, 2, 0, 8), zpInvalidArgument);
  CUDA_ASSERT(cudaDeviceSynchronize());
}

}  // namespace
