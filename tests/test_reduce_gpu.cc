// qgZ's reduction kernels (device/reduce.h) against the host reference, bit for bit, on one GPU: the fused
// dequantize + sum + requantize (payload bytes, padding included) and the finishing sum (output bits), over
// bits x block size x count x sources x batch x output type x output misalignment x Sum/Avg. Sources are
// quantized random data with NaN, Inf, zero, huge and tiny blocks, or random bytes (codes quantize never makes,
// scales near FLT_MAX). Outputs and the gaps between them are poisoned before every run and must keep the poison.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "device/reduce.h"
#include "host/quant_format.h"
#include "host/quant_ref.h"
#include "host/reduce_ref.h"
#include "tests/gpu_util.h"

namespace {

constexpr unsigned char kPoison = 0x5a;

// Random source payload of one of several flavours.
void makeSource(std::mt19937_64& rng, unsigned char* p, size_t count, int bits, int g, int flavour) {
  std::vector<float> x(count);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (size_t i = 0; i < count; ++i) {
    float v = u(rng);
    if (flavour == 1) v *= std::ldexp(1.0f, static_cast<int>(rng() % 200) - 100);
    if (flavour == 2 && rng() % 500 == 0) v = (rng() & 1) ? NAN : INFINITY;
    if (flavour == 3) v *= 3.0e38f;
    if (flavour == 4) v *= 1e-41f;
    if (flavour == 5 && (i / g) % 3 == 0) v = 0.0f;
    x[i] = v;
  }
  zp::quantizeRef(x.data(), zpFloat32, count, bits, g, p);
  const size_t scaleBytes = zp::quantScaleBytes(count, g), blocks = zp::quantBlockCount(count, g);
  if (flavour == 6) {  // random codes (-128 and -8 included) and scales
    for (size_t i = scaleBytes; i < scaleBytes + (count * bits + 7) / 8; ++i) p[i] = static_cast<unsigned char>(rng());
    for (size_t b = 0; b < blocks; ++b) {
      const float s = std::ldexp(static_cast<float>(rng() % 1000) / 1000, static_cast<int>(rng() % 60) - 30);
      std::memcpy(p + 4 * b, &s, 4);
    }
  }
  if (flavour == 7) {  // scales near FLT_MAX: products that overflow fp32 saturate
    const float big = 3.0e38f;
    for (size_t b = 0; b < blocks; ++b)
      if (rng() & 1) std::memcpy(p + 4 * b, &big, 4);
  }
}

struct Case {
  size_t count;
  int bits, g, sources, batch;
  bool finish;
  zpDataType_t type;
  size_t misalign;  // output elements past a 16-byte boundary (finish)
  size_t gap;       // finish: extra elements between segment outputs; requantize: extra 16-byte units
  float divisor;
  int sms = 0;  // SMs the launches may fill (KernelStream::sms); 0: the whole device
  std::string name() const {
    return std::string(finish ? "finish" : "requantize") + " count=" + std::to_string(count) +
           " bits=" + std::to_string(bits) + " G=" + std::to_string(g) + " sources=" + std::to_string(sources) +
           " batch=" + std::to_string(batch) + " type=" + std::to_string(type) +
           " misalign=" + std::to_string(misalign) + " gap=" + std::to_string(gap) +
           " divisor=" + std::to_string(divisor) + " sms=" + std::to_string(sms);
  }
};

void runCase(const Case& c, std::mt19937_64& rng) {
  SCOPED_TRACE(c.name());
  const size_t pb = zp::quantPayloadBytes(c.count, c.bits, c.g);
  const size_t sourceStride = pb + 16 * (rng() % 3);
  const size_t segmentStride = sourceStride * c.sources + 16 * (rng() % 2);
  std::vector<unsigned char> host(segmentStride * c.batch, 0xa5);
  std::vector<std::vector<const unsigned char*>> segs(c.batch);
  for (int g = 0; g < c.batch; ++g)
    for (int s = 0; s < c.sources; ++s) {
      unsigned char* p = host.data() + g * segmentStride + s * sourceStride;
      makeSource(rng, p, c.count, c.bits, c.g, static_cast<int>(rng() % 8));
      segs[g].push_back(p);
    }
  void* src = nullptr;
  CUDA_ASSERT(cudaMalloc(&src, host.size()));
  CUDA_ASSERT(cudaMemcpy(src, host.data(), host.size(), cudaMemcpyHostToDevice));
  const zp::ReduceSources sources{src, sourceStride, segmentStride, c.sources, c.batch};
  const zp::KernelStream stream(nullptr, c.sms);
  std::vector<float> sum(c.count);
  if (!c.finish) {
    const size_t stride = pb + 16 * c.gap, bytes = stride * c.batch + 64;
    void* out = nullptr;
    CUDA_ASSERT(cudaMalloc(&out, bytes));
    CUDA_ASSERT(cudaMemset(out, kPoison, bytes));
    ASSERT_EQ(zp::launchReduceRequantize(sources, c.count, c.bits, c.g, out, stride, stream), zpSuccess);
    std::vector<unsigned char> got(bytes), want(pb);
    CUDA_ASSERT(cudaMemcpy(got.data(), out, bytes, cudaMemcpyDeviceToHost));
    for (int g = 0; g < c.batch; ++g) {
      zp::sumPayloadsRef(segs[g], c.count, c.bits, c.g, 0, c.count, sum.data());
      zp::quantizeRef(sum.data(), zpFloat32, c.count, c.bits, c.g, want.data());
      EXPECT_EQ(std::memcmp(got.data() + g * stride, want.data(), pb), 0) << "segment " << g;
      for (size_t i = g * stride + pb; i < (g + 1) * stride; ++i) ASSERT_EQ(got[i], kPoison) << "byte " << i;
    }
    for (size_t i = c.batch * stride; i < bytes; ++i) ASSERT_EQ(got[i], kPoison) << "byte " << i;
    CUDA_ASSERT(cudaFree(out));
  } else {
    const size_t esz = c.type == zpFloat32 ? 4 : 2, stride = c.count + c.gap;
    const size_t elems = stride * (c.batch - 1) + c.count, bytes = (elems + c.misalign) * esz + 64;
    unsigned char* out = nullptr;
    CUDA_ASSERT(cudaMalloc(&out, bytes));
    CUDA_ASSERT(cudaMemset(out, kPoison, bytes));
    unsigned char* dst = out + c.misalign * esz;
    ASSERT_EQ(zp::launchReduceFinish(sources, c.count, c.bits, c.g, c.type, c.divisor, dst, stride, stream), zpSuccess);
    std::vector<unsigned char> got(bytes);
    CUDA_ASSERT(cudaMemcpy(got.data(), out, bytes, cudaMemcpyDeviceToHost));
    std::vector<unsigned char> want(bytes, kPoison), finished(c.count * esz);
    for (int g = 0; g < c.batch; ++g) {
      zp::sumPayloadsRef(segs[g], c.count, c.bits, c.g, 0, c.count, sum.data());
      zp::finishRef(sum.data(), c.type, c.divisor, 0, c.count, finished.data());
      std::memcpy(want.data() + (c.misalign + g * stride) * esz, finished.data(), c.count * esz);
    }
    size_t first = bytes;
    for (size_t i = 0; i < bytes && first == bytes; ++i)
      if (got[i] != want[i]) first = i;
    EXPECT_EQ(first, bytes) << "first differing byte (output starts at byte " << c.misalign * esz << ")";
    CUDA_ASSERT(cudaFree(out));
  }
  CUDA_ASSERT(cudaFree(src));
}

TEST(GpuReduce, KernelsMatchHostReferenceBitForBit) {
  ZP_REQUIRE_GPUS(1);
  std::mt19937_64 rng(2024);
  const size_t counts[] = {1, 2, 7, 31, 32, 33, 255, 256, 257, 1023, 1025, 4097, 8191, 8193, 100003};
  const zpDataType_t types[] = {zpFloat16, zpBfloat16, zpFloat32};
  for (int g = zp::kMinBlockSize; g <= zp::kMaxBlockSize; g *= 2)
    for (int bits : {4, 8})
      for (size_t count : counts)
        for (bool finish : {false, true}) {
          Case c{count,
                 bits,
                 g,
                 1 + static_cast<int>(rng() % 9),
                 1 + static_cast<int>(rng() % 3),
                 finish,
                 types[rng() % 3],
                 rng() % 8,
                 (rng() & 1) ? 1 + rng() % 5 : 0,
                 (rng() & 1) ? 3.0f : 1.0f};
          runCase(c, rng);
          if (HasFatalFailure()) return;
        }
}

// Payloads long enough that the kernels' grid-stride loops come round more than once (more tiles than resident
// CTAs times the launchers' waves), so that a CTA reuses its shared memory for a second tile: the requantize
// kernel's double-buffered group maxima (G = 8192 spans the CTA) and the finish kernel's staging.
TEST(GpuReduce, GridStrideLoopsMatchHostReference) {
  ZP_REQUIRE_GPUS(1);
  int sms = 0;
  CUDA_ASSERT(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  // Launchers cap the grid at resident CTAs (at most 4 an SM here) times 8 waves.
  const size_t count = (static_cast<size_t>(sms) * 4 * 8 + 3) * 8192 + 77;
  std::mt19937_64 rng(77);
  for (int g : {256, 8192})
    for (int bits : {4, 8})
      for (bool finish : {false, true}) {
        runCase(Case{count, bits, g, 2, 1, finish, zpBfloat16, finish ? 3u : 0u, 0, 1.0f}, rng);
        if (HasFatalFailure()) return;
      }
}

// More than two sources (the finish's general kernel, sumSources: sources loaded two at a time, an odd last one
// at 3 and 5; the requantize kernel the same way), fp32 outputs misaligned by 1, 2 or 3 elements (every word
// offset of the finish's windowed stores), and enough tiles that both kernels' grid-stride loops come round a
// third time. The launchers' grid is at most kWaves = 8 waves of resident CTAs on the stream's SMs (gridFor), and
// an SM holds at most maxThreadsPerMultiProcessor / 256 CTAs (8 on H100/H200), so a KernelStream limited to one
// SM (as a green context's streams are limited) gets at most 64 CTAs; 2 x 64 + 3 whole tiles of 8192 elements
// and a partial one (77 or 6001 elements: a partial warp range and thread group), over one segment or two
// (work then crosses a segment boundary inside the loop), make a CTA take at least three. Block sizes of one
// thread, of a group of 8 and of the whole CTA; Sum and Avg.
TEST(GpuReduce, ManySourcesGridStrideMatchHostReference) {
  ZP_REQUIRE_GPUS(1);
  int threadsPerSm = 0;
  CUDA_ASSERT(cudaDeviceGetAttribute(&threadsPerSm, cudaDevAttrMaxThreadsPerMultiProcessor, 0));
  const size_t maxGrid = static_cast<size_t>(threadsPerSm / 256) * 8;  // CTAs of a one-SM launch, at most
  std::mt19937_64 rng(31337);
  const int gs[] = {32, 256, 8192};
  int n = 0;
  for (int sources : {3, 5, 8})
    for (int bits : {4, 8})
      for (bool finish : {false, true}) {
        // Choices spread so that each of finish and requantize meets one and two segments, every block size with
        // both bits, and the finish every misalignment.
        const int batch = 1 + (((n >> 1) ^ n) & 1);
        const size_t count = (2 * maxGrid + 3) / batch * 8192 + (n % 3 == 0 ? 6001 : 77);  // tiles: 2 maxGrid + 4
        const size_t misalign = 1 + (n >> 1) % 3;
        const float divisor = n % 4 == 3 ? static_cast<float>(sources) : 1.0f;
        runCase(Case{count, bits, gs[(n >> 1) % 3], sources, batch, finish, zpFloat32, misalign,
                     batch > 1 ? misalign : 0, divisor, 1},
                rng);
        if (HasFatalFailure()) return;
        ++n;
      }
}

}  // namespace
