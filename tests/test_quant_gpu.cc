// Device quantization kernels (device/quantize.h) against the host reference (host/quant_ref.h), bit for bit:
// payload bytes and dequantized output bits, over type x bits x block size x count x misalignment, with NaN,
// Inf, zero, denormal and tie blocks in the data; outputs poisoned before every run; batched launches; counts
// that take the grid-stride loops round several times; more than 2^31 elements (GpuQuantLarge).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
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

// Device memory, or page-locked host memory (the large test reads gigabytes back through it); get() is null when
// the allocation failed.
class CudaBuffer {
 public:
  enum Kind { kDevice, kPinnedHost };
  explicit CudaBuffer(size_t bytes, Kind kind = kDevice) : bytes_(bytes), kind_(kind) {
    const cudaError_t r = kind == kDevice ? cudaMalloc(&ptr_, bytes) : cudaMallocHost(&ptr_, bytes);
    if (r != cudaSuccess) ptr_ = nullptr;
  }
  ~CudaBuffer() {
    if (ptr_ == nullptr) return;
    if (kind_ == kDevice) {
      cudaFree(ptr_);
    } else {
      cudaFreeHost(ptr_);
    }
  }
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;
  unsigned char* get() const { return static_cast<unsigned char*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
  Kind kind_;
};

// The device side of round trips: the elements in, the payload, the elements out.
struct DeviceRoundTrip {
  DeviceRoundTrip(size_t elemBytes, size_t payloadBytes) : in(elemBytes), payload(payloadBytes), out(elemBytes) {}
  bool allocated() const { return in.get() != nullptr && payload.get() != nullptr && out.get() != nullptr; }
  CudaBuffer in, payload, out;
};

// First differing byte of two buffers, or -1.
long firstDiff(const unsigned char* a, const unsigned char* b, size_t n) {
  if (n == 0 || std::memcmp(a, b, n) == 0) return -1;  // the common case, fast on the large buffers
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

// Quantizes `count` elements of `type` (host `in`) on `stream` into a poisoned payload and dequantizes that into a
// poisoned output, at each of `offsets` (elements past a 16-byte boundary, input and output alike): both must
// equal the host reference bit for bit, and the kGuard bytes after each, like the output's bytes before the
// offset, must keep the poison. The device buffers must hold the largest offset's case.
void checkRoundTrips(zpDataType_t type, int bits, int g, size_t count, const unsigned char* in,
                     std::initializer_list<size_t> offsets, zp::KernelStream stream, const DeviceRoundTrip& d) {
  const CudaBuffer &dIn = d.in, &dPayload = d.payload, &dOut = d.out;
  const size_t esize = zptest::elemSize(type);
  const size_t payloadBytes = zp::quantPayloadBytes(count, bits, g);
  const size_t elemBytes = count * esize;
  std::vector<unsigned char> refPayload(payloadBytes), refOut(elemBytes);
  zp::quantizeRef(in, type, count, bits, g, refPayload.data());
  zp::dequantizeRef(refPayload.data(), type, count, bits, g, refOut.data());
  std::vector<unsigned char> payload(payloadBytes + kGuard), out(elemBytes + std::max(offsets) * esize + kGuard);
  for (size_t offset : offsets) {
    const std::string name = caseName(type, bits, g, count, offset) + " sms=" + std::to_string(stream.sms);
    const size_t lead = offset * esize;  // bytes before the elements
    ASSERT_LE(lead + elemBytes + kGuard, std::min(dIn.bytes(), dOut.bytes())) << name;
    ASSERT_LE(payloadBytes + kGuard, dPayload.bytes()) << name;

    // Quantize into a poisoned payload.
    CUDA_ASSERT(cudaMemcpy(dIn.get() + lead, in, elemBytes, cudaMemcpyHostToDevice));
    CUDA_ASSERT(cudaMemset(dPayload.get(), kPoison, payloadBytes + kGuard));
    ASSERT_EQ(zp::launchQuantize(dIn.get() + lead, dPayload.get(), count, type, bits, g, stream), zpSuccess) << name;
    CUDA_ASSERT(cudaMemcpy(payload.data(), dPayload.get(), payloadBytes + kGuard, cudaMemcpyDeviceToHost));
    const long pd = firstDiff(payload.data(), refPayload.data(), payloadBytes);
    ASSERT_EQ(pd, -1) << name << ": payload byte " << pd << " (scale region " << zp::quantScaleBytes(count, g)
                      << " bytes): device " << int(payload[pd < 0 ? 0 : pd]) << " host "
                      << int(refPayload[pd < 0 ? 0 : pd]);
    ASSERT_TRUE(allBytes(payload.data() + payloadBytes, kGuard, kPoison)) << name << ": write past payload";

    // Dequantize the device payload into a poisoned, equally misaligned output.
    CUDA_ASSERT(cudaMemset(dOut.get(), kPoison, lead + elemBytes + kGuard));
    ASSERT_EQ(zp::launchDequantize(dPayload.get(), dOut.get() + lead, count, type, bits, g, stream), zpSuccess) << name;
    CUDA_ASSERT(cudaMemcpy(out.data(), dOut.get(), lead + elemBytes + kGuard, cudaMemcpyDeviceToHost));
    ASSERT_TRUE(allBytes(out.data(), lead, kPoison)) << name << ": write before output";
    const long od = firstDiff(out.data() + lead, refOut.data(), elemBytes);
    ASSERT_EQ(od, -1) << name << ": output element " << (od < 0 ? 0 : od / esize) << ": device 0x" << std::hex
                      << zptest::loadElemBits(type, out.data() + lead, od < 0 ? 0 : od / esize) << " host 0x"
                      << zptest::loadElemBits(type, refOut.data(), od < 0 ? 0 : od / esize);
    ASSERT_TRUE(allBytes(out.data() + lead + elemBytes, kGuard, kPoison)) << name << ": write past output";
  }
}

// At most the elements one grid step of the quantize or of the dequantize kernel covers on `sms` SMs
// (device/quantize.cu, device/dequantize.cu): the launchers' grid is one wave of resident CTAs (gridFor), at most
// `threadsPerSm` threads an SM, and a thread holds kVecsPerThread = 4 vectors of 16 bytes of elements at a time, of
// its block (quantize: a group of P threads owns a block of 64 P bytes, a CTA of 256 threads 256 / P blocks, or the
// CTA is the group) or of its CTA's tile (dequantize: 256 x 4 vectors). Counts above take the grid-stride loops
// round again.
size_t gridStepElems(int sms, int threadsPerSm, zpDataType_t type) {
  return static_cast<size_t>(sms) * threadsPerSm * 64 / zptest::elemSize(type);
}

TEST(QuantGpu, MatchesHostReferenceBitForBit) {
  ZP_REQUIRE_GPUS(1);
  const size_t counts[] = {1, 31, 255, 256, 257, 4097, 100003, (size_t{1} << 20) + 3};
  const size_t maxCount = counts[sizeof(counts) / sizeof(counts[0]) - 1];
  const size_t maxOffset = 7;
  const size_t maxPayload = zp::quantPayloadBytes(maxCount, 8, 32);
  const size_t maxElemBytes = (maxCount + maxOffset) * 4 + kGuard;
  DeviceRoundTrip d(maxElemBytes, maxPayload + kGuard);
  ASSERT_TRUE(d.allocated());
  std::vector<unsigned char> in(maxElemBytes);

  uint32_t seed = 1;
  for (zpDataType_t type : zptest::kQuantTypes) {
    for (int bits : {4, 8}) {
      for (int g = zp::kMinBlockSize; g <= zp::kMaxBlockSize; g *= 2) {
        for (size_t count : counts) {
          for (size_t offset : {0, 1, 3, 7}) {
            zptest::fillData(type, in.data(), count, g, bits, seed++, /*specials=*/true);
            checkRoundTrips(type, bits, g, count, in.data(), {offset}, nullptr, d);
            if (::testing::Test::HasFatalFailure()) return;
          }
        }
      }
    }
  }
  CUDA_ASSERT(cudaDeviceSynchronize());
}

// The grid-stride loops of the quantize and dequantize kernels coming round a second and a third time, on a
// KernelStream limited to 1 or 3 SMs (the launchers size the grid to a stream's SMs, as for a green context's
// streams): 2.5 grid steps (gridStepElems: at most 2048 x 64 bytes an SM on H100/H200, 64K bf16 elements) plus
// 4097 elements, so every CTA takes at least two steps and the first CTAs a third or more, the last block's CTA
// among them. That block is partial for every block size (count = 4097 mod 8192, 1 mod 4096 and below), and
// its last vector too.
// Every block size (each group size is its own kernel: warp-sized groups, and CTA-sized ones with the cp.async
// pipeline when aligned, the direct loop when not), and offsets 0, 1, 2, 4, 6 elements: every access width of
// the misaligned loads and stores (bf16/fp16: 2, 4, 8 bytes; fp32: 4, 8).
TEST(QuantGpu, GridStrideLoopsOnFewSmsMatchHostReference) {
  ZP_REQUIRE_GPUS(1);
  int threadsPerSm = 0;
  CUDA_ASSERT(cudaDeviceGetAttribute(&threadsPerSm, cudaDevAttrMaxThreadsPerMultiProcessor, 0));
  uint32_t seed = 4242;
  for (zpDataType_t type : zptest::kQuantTypes) {
    const size_t esize = zptest::elemSize(type);
    const size_t maxStep = gridStepElems(3, threadsPerSm, type);
    const size_t maxCount = 2 * maxStep + maxStep / 2 + 4097;
    const size_t maxElemBytes = (maxCount + 6) * esize + kGuard;
    DeviceRoundTrip d(maxElemBytes, zp::quantPayloadBytes(maxCount, 8, 32) + kGuard);
    ASSERT_TRUE(d.allocated());
    std::vector<unsigned char> in(maxCount * esize);
    zptest::fillData(type, in.data(), maxCount, 256, 8, seed++, /*specials=*/true);
    for (int sms : {1, 3}) {
      const size_t step = gridStepElems(sms, threadsPerSm, type);
      const size_t count = 2 * step + step / 2 + 4097;
      for (int bits : {4, 8}) {
        for (int g = zp::kMinBlockSize; g <= zp::kMaxBlockSize; g *= 2) {
          checkRoundTrips(type, bits, g, count, in.data(), {0, 1, 2, 4, 6}, zp::KernelStream(nullptr, sms), d);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
  CUDA_ASSERT(cudaDeviceSynchronize());
}

// The same on the whole device (a plain stream): 1.5 grid steps of the largest grid the device can keep
// resident (gridStepElems: 132 SMs x 2048 threads x 64 bytes = 16.5 MiB on H200, 8.65M bf16 elements) plus 4097
// elements, so at least half the CTAs take a second step, the last block's among them. The default block size
// (warp-sized groups) and the largest (a CTA a block), each with int4 for one type and int8 for the next, aligned
// and misaligned by one element.
TEST(QuantGpu, GridStrideLoopsOnWholeDeviceMatchHostReference) {
  ZP_REQUIRE_GPUS(1);
  int device = 0, sms = 0, threadsPerSm = 0;
  CUDA_ASSERT(cudaGetDevice(&device));
  CUDA_ASSERT(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  CUDA_ASSERT(cudaDeviceGetAttribute(&threadsPerSm, cudaDevAttrMaxThreadsPerMultiProcessor, device));
  for (int t = 0; t < 3; ++t) {
    const zpDataType_t type = zptest::kQuantTypes[t];
    const size_t esize = zptest::elemSize(type);
    const size_t step = gridStepElems(sms, threadsPerSm, type);
    const size_t count = step + step / 2 + 4097;
    const size_t elemBytes = (count + 1) * esize + kGuard;
    DeviceRoundTrip d(elemBytes, zp::quantPayloadBytes(count, 8, 256) + kGuard);
    ASSERT_TRUE(d.allocated());
    std::vector<unsigned char> in(count * esize);
    zptest::fillData(type, in.data(), count, 256, 8, 9001 + t, /*specials=*/true);
    for (int g : {256, 8192}) {
      const int bits = (g == 256) == (t % 2 == 0) ? 8 : 4;  // fp16, fp32: int8 at G = 256; bf16: int4
      checkRoundTrips(type, bits, g, count, in.data(), {0, 1}, nullptr, d);
      if (HasFatalFailure()) return;
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
            CudaBuffer dIn(inBytes), dPayload(payloadTotal + kGuard), dOut(outBytes + kGuard);
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
    CudaBuffer dPayload(payloadBytes), dOut(count * 4);
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
  CudaBuffer dIn(4096), dPayload(4096);
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

// The device bytes [dev, dev + bytes) must be `period` (periodBytes long) repeated, the last repetition possibly
// cut short. Read back through `scratch` a whole number of periods at a time.
void expectPeriodic(const std::string& what, const unsigned char* dev, size_t bytes, const unsigned char* period,
                    size_t periodBytes, const CudaBuffer& scratch) {
  ASSERT_LE(periodBytes, scratch.bytes()) << what;
  const size_t chunk = scratch.bytes() / periodBytes * periodBytes;
  for (size_t at = 0; at < bytes; at += chunk) {
    const size_t n = std::min(chunk, bytes - at);
    CUDA_ASSERT(cudaMemcpy(scratch.get(), dev + at, n, cudaMemcpyDeviceToHost));
    for (size_t p = 0; p < n; p += periodBytes) {
      const long d = firstDiff(scratch.get() + p, period, std::min(periodBytes, n - p));
      if (d < 0) continue;
      FAIL() << what << ": byte " << at + p + d << " (byte " << d << " of a " << periodBytes << "-byte period): device "
             << int(scratch.get()[p + d]) << " host " << int(period[d]);
    }
  }
}

// The device bytes [dev, dev + want.size()) must be `want`.
void expectBytes(const std::string& what, const unsigned char* dev, const std::vector<unsigned char>& want) {
  if (want.empty()) return;
  std::vector<unsigned char> got(want.size());
  CUDA_ASSERT(cudaMemcpy(got.data(), dev, got.size(), cudaMemcpyDeviceToHost));
  const long d = firstDiff(got.data(), want.data(), want.size());
  ASSERT_EQ(d, -1) << what << ": byte " << d << ": device " << int(got[d < 0 ? 0 : d]) << " host "
                   << int(want[d < 0 ? 0 : d]);
}

// More than 2^31 elements (bf16: 2^31 + 257, 4 GiB), so that element indices, byte offsets (inputs and outputs
// past 4 GiB, int8 codes past 2 GiB) and their products must not overflow 32 bits anywhere in the kernels or
// launchers. The input repeats a period of P = 129 x 8192 elements, a multiple of every block size, so whole
// blocks repeat with it; 2^31 mod P = 131072, so an index wrapped at 2^31 or 2^32 reads other data. Blocks are
// quantized independently (host/quant_ref.cc: a block's scale and codes depend on its elements only;
// host/quant_format.h: block b's scale at byte 4b, element i's code at scaleBytes + i * bits / 8): the payload's
// scales and codes and the output repeat the host reference of one period, up to the last, partial block, whose
// reference is that block quantized alone. The whole payload and output are read back and compared, padding
// and guard bytes included. int8, G = 256, aligned (warp-sized groups, 16-byte loads and stores); int4,
// G = 8192, misaligned by one element (CTA-sized groups' direct loop, 2-byte loads, windowed stores).
TEST(GpuQuantLarge, MoreThan2To31ElementsMatchHostReference) {
  ZP_REQUIRE_GPUS(1);
  constexpr zpDataType_t kType = zpBfloat16;
  constexpr size_t kEsize = 2;
  constexpr size_t kPeriod = 129 * size_t{8192};
  const size_t count = (size_t{1} << 31) + 257;
  const size_t elemBytes = (count + 1) * kEsize + kGuard;                   // offsets 0 and 1
  const size_t maxPayload = zp::quantPayloadBytes(count, 8, 256) + kGuard;  // the int8 case's
  size_t freeBytes = 0, totalBytes = 0;
  CUDA_ASSERT(cudaMemGetInfo(&freeBytes, &totalBytes));
  if (freeBytes < 2 * elemBytes + maxPayload + (size_t{1} << 30)) {
    GTEST_SKIP() << "needs " << ((2 * elemBytes + maxPayload) >> 30) + 1 << " GiB of free device memory, "
                 << (freeBytes >> 30) << " GiB free";
  }
  DeviceRoundTrip d(elemBytes, maxPayload);
  ASSERT_TRUE(d.allocated());
  const CudaBuffer scratch(size_t{256} << 20, CudaBuffer::kPinnedHost);
  ASSERT_NE(scratch.get(), nullptr);
  std::vector<unsigned char> period(kPeriod * kEsize);
  zptest::fillData(kType, period.data(), kPeriod, 256, 8, 2031, /*specials=*/true);

  struct LargeCase {
    int bits, g;
    size_t offset;
  };
  for (const LargeCase c : {LargeCase{8, 256, 0}, LargeCase{4, 8192, 1}}) {
    const std::string name = caseName(kType, c.bits, c.g, count, c.offset);
    SCOPED_TRACE(name);
    const size_t payloadBytes = zp::quantPayloadBytes(count, c.bits, c.g);
    const size_t scaleBytes = zp::quantScaleBytes(count, c.g);
    const size_t whole = count / c.g * c.g, tail = count - whole;  // elements of whole blocks; of the last one
    const size_t lead = c.offset * kEsize;

    // Host references: one period, and the last block alone.
    std::vector<unsigned char> refPayload(zp::quantPayloadBytes(kPeriod, c.bits, c.g)), refOut(kPeriod * kEsize);
    zp::quantizeRef(period.data(), kType, kPeriod, c.bits, c.g, refPayload.data());
    zp::dequantizeRef(refPayload.data(), kType, kPeriod, c.bits, c.g, refOut.data());
    const unsigned char* refCodes = refPayload.data() + zp::quantScaleBytes(kPeriod, c.g);
    std::vector<unsigned char> tailIn(tail * kEsize), tailPayload(zp::quantPayloadBytes(tail, c.bits, c.g));
    std::vector<unsigned char> tailOut(tail * kEsize);
    for (size_t i = 0; i < tail; ++i) {
      std::memcpy(&tailIn[i * kEsize], &period[(whole + i) % kPeriod * kEsize], kEsize);
    }
    zp::quantizeRef(tailIn.data(), kType, tail, c.bits, c.g, tailPayload.data());
    zp::dequantizeRef(tailPayload.data(), kType, tail, c.bits, c.g, tailOut.data());
    // The premise, on the host: two periods quantize to the period's scales, then its codes, twice.
    {
      std::vector<unsigned char> twice(2 * period.size()),
          twicePayload(zp::quantPayloadBytes(2 * kPeriod, c.bits, c.g));
      std::memcpy(twice.data(), period.data(), period.size());
      std::memcpy(twice.data() + period.size(), period.data(), period.size());
      zp::quantizeRef(twice.data(), kType, 2 * kPeriod, c.bits, c.g, twicePayload.data());
      const size_t periodScales = kPeriod / c.g * sizeof(float), periodCodes = kPeriod * c.bits / 8;
      const unsigned char* twiceCodes = twicePayload.data() + zp::quantScaleBytes(2 * kPeriod, c.g);
      for (int k = 0; k < 2; ++k) {
        ASSERT_EQ(std::memcmp(twicePayload.data() + k * periodScales, refPayload.data(), periodScales), 0)
            << "blocks are not quantized independently: period " << k << "'s scales";
        ASSERT_EQ(std::memcmp(twiceCodes + k * periodCodes, refCodes, periodCodes), 0)
            << "blocks are not quantized independently: period " << k << "'s codes";
      }
    }

    // The input: the period, then the filled part copied after itself until `count` elements.
    unsigned char* in = d.in.get() + lead;
    CUDA_ASSERT(cudaMemcpy(in, period.data(), period.size(), cudaMemcpyHostToDevice));
    for (size_t n = kPeriod; n < count;) {
      const size_t k = std::min(n, count - n);
      CUDA_ASSERT(cudaMemcpy(in + n * kEsize, in, k * kEsize, cudaMemcpyDeviceToDevice));
      n += k;
    }
    CUDA_ASSERT(cudaMemset(d.payload.get(), kPoison, payloadBytes + kGuard));
    CUDA_ASSERT(cudaMemset(d.out.get(), kPoison, lead + count * kEsize + kGuard));
    ASSERT_EQ(zp::launchQuantize(in, d.payload.get(), count, kType, c.bits, c.g, nullptr), zpSuccess);
    ASSERT_EQ(zp::launchDequantize(d.payload.get(), d.out.get() + lead, count, kType, c.bits, c.g, nullptr), zpSuccess);
    CUDA_ASSERT(cudaDeviceSynchronize());

    // Payload: the scales of whole blocks, then the last block's, zeros to the codes; the codes of whole blocks,
    // then the last block's, zeros to the end of the payload, the guard.
    const size_t wholeScales = whole / c.g * sizeof(float), wholeCodes = whole * c.bits / 8;
    expectPeriodic("scales", d.payload.get(), wholeScales, refPayload.data(), kPeriod / c.g * sizeof(float), scratch);
    if (HasFatalFailure()) return;
    std::vector<unsigned char> scaleEnd(scaleBytes - wholeScales, 0);
    if (tail > 0) std::memcpy(scaleEnd.data(), tailPayload.data(), sizeof(float));
    expectBytes("scale region end", d.payload.get() + wholeScales, scaleEnd);
    expectPeriodic("codes", d.payload.get() + scaleBytes, wholeCodes, refCodes, kPeriod * c.bits / 8, scratch);
    if (HasFatalFailure()) return;
    std::vector<unsigned char> codeEnd(payloadBytes - scaleBytes - wholeCodes, 0);
    std::memcpy(codeEnd.data(), tailPayload.data() + zp::quantScaleBytes(tail, c.g), (tail * c.bits + 7) / 8);
    codeEnd.insert(codeEnd.end(), kGuard, kPoison);
    expectBytes("code region end and guard", d.payload.get() + scaleBytes + wholeCodes, codeEnd);

    // Output: poison before it, whole blocks, the last block, the guard.
    expectBytes("before output", d.out.get(), std::vector<unsigned char>(lead, kPoison));
    expectPeriodic("output", d.out.get() + lead, whole * kEsize, refOut.data(), refOut.size(), scratch);
    if (HasFatalFailure()) return;
    std::vector<unsigned char> outEnd(tailOut);
    outEnd.insert(outEnd.end(), kGuard, kPoison);
    expectBytes("output end and guard", d.out.get() + lead + whole * kEsize, outEnd);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
