// qgZ's reduction kernels. One CTA per quantization block of one segment: each thread owns 4 consecutive
// elements per step (one 32-bit word of int8 codes, one 16-bit word of int4 codes), sums them over the sources
// in order, and either writes the finished values or keeps the sums (in shared memory for blocks larger than
// one step) for the block's absmax and the requantization. Summation order and arithmetic are those of
// host/reduce_math.h.
#include <cub/block/block_reduce.cuh>
#include <cuda/functional>

#include "device/reduce.h"
#include "host/quant_format.h"
#include "host/reduce_math.h"
#include "src/check.h"

namespace zp {
namespace {

constexpr int kThreads = 256;
constexpr int kElemsPerThread = 4;

struct KernelArgs {
  const unsigned char* base;
  size_t sourceStride;
  size_t segmentStride;
  int sources;
  size_t count;
  size_t blocksPerSegment;
  size_t scaleBytes;  // offset of the codes in a payload
  int blockSize;
};

// The 4 codes of elements [i, i+4) of a payload's code region (i a multiple of 4).
template <int Bits>
__device__ __forceinline__ uint32_t loadCodes4(const unsigned char* codes, size_t i) {
  if (Bits == 8) return *reinterpret_cast<const uint32_t*>(codes + i);
  return *reinterpret_cast<const uint16_t*>(codes + i / 2);
}

template <int Bits>
__device__ __forceinline__ uint32_t codeAt(uint32_t word, int k) {
  return Bits == 8 ? (word >> (8 * k)) & 0xffu : (word >> (4 * k)) & 0xfu;
}

// Fixed-order fp32 sums of elements [begin + i, begin + i + n) over a segment's sources (n <= 4).
template <int Bits>
__device__ __forceinline__ void sumSources(const KernelArgs& a, const unsigned char* seg, size_t block, size_t elem,
                                           int n, float (&acc)[kElemsPerThread]) {
  for (int s = 0; s < a.sources; ++s) {
    const unsigned char* payload = seg + s * a.sourceStride;
    const float scale = reinterpret_cast<const float*>(payload)[block];
    const unsigned char* codes = payload + a.scaleBytes;
    // A partial group at the end of the last block reads only the codes that exist.
    uint32_t word = 0;
    if (n == kElemsPerThread) {
      word = loadCodes4<Bits>(codes, elem);
    } else {
      for (int k = 0; k < n; ++k) {
        const size_t i = elem + k;
        const uint32_t c = Bits == 8 ? codes[i] : unpackInt4(codes[i / 2], static_cast<int>(i & 1));
        word |= c << (Bits * k);
      }
    }
#pragma unroll
    for (int k = 0; k < kElemsPerThread; ++k) {
      if (k < n) {
        const float v = bitsFloat(dequantizeValue<Fp32Type>(decodeCode<Bits>(codeAt<Bits>(word, k)), scale));
        acc[k] = s == 0 ? v : addRn(acc[k], v);
      }
    }
  }
}

template <int Bits>
__global__ void __launch_bounds__(kThreads)
    reduceRequantizeKernel(KernelArgs a, unsigned char* out, size_t payloadStride, size_t codeBytes) {
  using BlockMax = cub::BlockReduce<uint32_t, kThreads>;
  __shared__ typename BlockMax::TempStorage tmp;
  __shared__ uint32_t blockAbsMax;
  extern __shared__ float sums[];  // the block's sums when it spans more than one step
  const size_t seg = blockIdx.x / a.blocksPerSegment;
  const size_t block = blockIdx.x % a.blocksPerSegment;
  const size_t begin = block * a.blockSize;
  const int len = static_cast<int>(min(static_cast<size_t>(a.blockSize), a.count - begin));
  const unsigned char* src = a.base + seg * a.segmentStride;
  unsigned char* payload = out + seg * payloadStride;

  // Step 1: sums and their absmax (bits of |x|: NaN and Inf compare above every finite value).
  uint32_t absMax = 0;
  for (int i = threadIdx.x * kElemsPerThread; i < len; i += kThreads * kElemsPerThread) {
    float acc[kElemsPerThread];
    const int n = min(kElemsPerThread, len - i);
    sumSources<Bits>(a, src, block, begin + i, n, acc);
    for (int k = 0; k < n; ++k) {
      sums[i + k] = acc[k];
      absMax = max(absMax, absBits(acc[k]));
    }
  }
  absMax = BlockMax(tmp).Reduce(absMax, ::cuda::maximum<uint32_t>());
  if (threadIdx.x == 0) blockAbsMax = absMax;
  __syncthreads();

  // Step 2: the block's scale and codes, from the sums this thread wrote itself.
  const float scale = blockScale(blockAbsMax, Bits);
  const float qmax = static_cast<float>(quantMax(Bits));
  if (threadIdx.x == 0) reinterpret_cast<float*>(payload)[block] = scale;
  unsigned char* codes = payload + a.scaleBytes;
  for (int i = threadIdx.x * kElemsPerThread; i < len; i += kThreads * kElemsPerThread) {
    const int n = min(kElemsPerThread, len - i);
    uint32_t word = 0;
    for (int k = 0; k < n; ++k) word |= (quantizeCode(sums[i + k], scale, qmax) & ((1u << Bits) - 1u)) << (Bits * k);
    const size_t e = begin + i;
    if (Bits == 8) {
      if (n == kElemsPerThread)
        *reinterpret_cast<uint32_t*>(codes + e) = word;
      else
        for (int k = 0; k < n; ++k) codes[e + k] = static_cast<unsigned char>(word >> (8 * k));
    } else {
      if (n == kElemsPerThread)
        *reinterpret_cast<uint16_t*>(codes + e / 2) = static_cast<uint16_t>(word);
      else
        for (int k = 0; k < n; k += 2) codes[(e + k) / 2] = static_cast<unsigned char>(word >> (4 * k));
    }
  }
  // Padding after the last scale and after the last code is zero, as in every payload.
  if (block == a.blocksPerSegment - 1) {
    for (size_t p = a.blocksPerSegment * sizeof(float) + threadIdx.x; p < a.scaleBytes; p += kThreads) payload[p] = 0;
    const size_t used = (a.count * Bits + 7) / 8;
    for (size_t p = used + threadIdx.x; p < codeBytes; p += kThreads) codes[p] = 0;
  }
}

template <int Bits, class Type>
__global__ void __launch_bounds__(kThreads)
    reduceFinishKernel(KernelArgs a, typename Type::Bits* out, size_t outputStride, float divisor) {
  const size_t seg = blockIdx.x / a.blocksPerSegment;
  const size_t block = blockIdx.x % a.blocksPerSegment;
  const size_t begin = block * a.blockSize;
  const int len = static_cast<int>(min(static_cast<size_t>(a.blockSize), a.count - begin));
  const unsigned char* src = a.base + seg * a.segmentStride;
  typename Type::Bits* dst = out + seg * outputStride + begin;
  for (int i = threadIdx.x * kElemsPerThread; i < len; i += kThreads * kElemsPerThread) {
    float acc[kElemsPerThread];
    const int n = min(kElemsPerThread, len - i);
    sumSources<Bits>(a, src, block, begin + i, n, acc);
    for (int k = 0; k < n; ++k) dst[i + k] = finishReduction<Type>(acc[k], divisor);
  }
}

zpResult_t checkSources(const ReduceSources& s, const char* what) {
  auto aligned = [](size_t v) { return v % kPayloadAlign == 0; };
  if (s.base == nullptr || !aligned(reinterpret_cast<uintptr_t>(s.base)) || !aligned(s.sourceStride) ||
      !aligned(s.segmentStride) || s.sources < 1 || s.batch < 0) {
    return ZP_ERR(zpInternalError, "%s : bad reduction sources", what);
  }
  return zpSuccess;
}

KernelArgs kernelArgs(const ReduceSources& s, size_t count, int blockSize) {
  return KernelArgs{static_cast<const unsigned char*>(s.base),
                    s.sourceStride,
                    s.segmentStride,
                    s.sources,
                    count,
                    quantBlockCount(count, blockSize),
                    quantScaleBytes(count, blockSize),
                    blockSize};
}

template <int Bits, class Type>
void launchFinish(const KernelArgs& a, unsigned grid, void* output, size_t stride, float divisor, cudaStream_t stream) {
  reduceFinishKernel<Bits, Type>
      <<<grid, kThreads, 0, stream>>>(a, static_cast<typename Type::Bits*>(output), stride, divisor);
}

}  // namespace

zpResult_t launchReduceRequantize(const ReduceSources& src, size_t count, int bits, int blockSize, void* payload,
                                  size_t payloadStride, cudaStream_t stream) {
  if (count == 0 || src.batch == 0) return zpSuccess;
  ZPCHECK(checkSources(src, "launchReduceRequantize"));
  const KernelArgs a = kernelArgs(src, count, blockSize);
  const size_t grid = a.blocksPerSegment * src.batch;
  // Sums of blocks that span several steps wait in shared memory (32 KB for 8192-element blocks).
  const size_t smem = blockSize * sizeof(float);
  auto* out = static_cast<unsigned char*>(payload);
  const size_t codeBytes = quantCodeBytes(count, bits);
  if (bits == 8) {
    reduceRequantizeKernel<8>
        <<<static_cast<unsigned>(grid), kThreads, smem, stream>>>(a, out, payloadStride, codeBytes);
  } else {
    reduceRequantizeKernel<4>
        <<<static_cast<unsigned>(grid), kThreads, smem, stream>>>(a, out, payloadStride, codeBytes);
  }
  CUDACHECK(cudaGetLastError());
  return zpSuccess;
}

zpResult_t launchReduceFinish(const ReduceSources& src, size_t count, int bits, int blockSize, zpDataType_t type,
                              float divisor, void* output, size_t outputStrideElems, cudaStream_t stream) {
  if (count == 0 || src.batch == 0) return zpSuccess;
  ZPCHECK(checkSources(src, "launchReduceFinish"));
  const KernelArgs a = kernelArgs(src, count, blockSize);
  const auto grid = static_cast<unsigned>(a.blocksPerSegment * src.batch);
  const size_t stride = outputStrideElems ? outputStrideElems : count;
  switch (type) {
    case zpFloat16:
      bits == 8 ? launchFinish<8, Fp16Type>(a, grid, output, stride, divisor, stream)
                : launchFinish<4, Fp16Type>(a, grid, output, stride, divisor, stream);
      break;
    case zpBfloat16:
      bits == 8 ? launchFinish<8, Bf16Type>(a, grid, output, stride, divisor, stream)
                : launchFinish<4, Bf16Type>(a, grid, output, stride, divisor, stream);
      break;
    case zpFloat32:
      bits == 8 ? launchFinish<8, Fp32Type>(a, grid, output, stride, divisor, stream)
                : launchFinish<4, Fp32Type>(a, grid, output, stride, divisor, stream);
      break;
    default:
      return ZP_ERR(zpInternalError, "launchReduceFinish : type %d", static_cast<int>(type));
  }
  CUDACHECK(cudaGetLastError());
  return zpSuccess;
}

}  // namespace zp
