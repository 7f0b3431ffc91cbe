// Block dequantization kernel (format: include/zpccl.h; arithmetic: host/quant_math.h, shared with the host
// reference so that outputs are bit-identical). It needs no reduction: each CTA step covers 256 * kVecsPerThread
// contiguous output vectors; each thread reads its vectors' codes and scales. A misaligned output (an fp16 tensor
// at an odd element, say) is stored as whole aligned 16-byte windows, each lane combining its vector with its
// neighbour's (shuffles); segments that are all 16-byte aligned run a kernel without that path. Payloads are
// always 16-byte aligned.
#include <cstdint>
#include <type_traits>

#include "device/launch_geometry.h"
#include "device/quantize.h"
#include "device/quantize_args.h"
#include "device/vector_access.h"
#include "device/warp_reduce.h"
#include "host/base/check.h"
#include "host/dtype.h"
#include "host/quant_format.h"
#include "host/quant_math.h"

namespace zp {
namespace {

struct DequantArgs {
  const char* payload;   // segment 0's payload
  char* output;          // segment 0's elements
  size_t count;          // elements per segment
  size_t payloadStride;  // bytes between segment payloads
  size_t outputStride;   // bytes between segment outputs
  size_t scaleBytes;     // where the codes start in a payload
  size_t tiles;          // CTA steps per segment
  int batch;
  int blockShift;  // log2(blockSize)
  PeerSync sync;   // KernelStream::sync
};

// Bytes [o, o + 16) of the 32 bytes lo || hi (o even, 0..14): an aligned window of a misaligned stream.
__device__ __forceinline__ void window16(const uint32_t (&lo)[4], const uint32_t (&hi)[4], int o, uint32_t (&r)[4]) {
  const uint32_t c[8] = {lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]};
  const uint32_t shift = 8 * (o & 3);
  switch (o >> 2) {  // word offset, uniform per segment: constant register indices in each case
#define ZP_WINDOW_CASE(q)                                                              \
  case q:                                                                              \
    for (int k = 0; k < 4; ++k) r[k] = __funnelshift_r(c[q + k], c[q + k + 1], shift); \
    break;
    ZP_WINDOW_CASE(0)
    ZP_WINDOW_CASE(1)
    ZP_WINDOW_CASE(2)
    ZP_WINDOW_CASE(3)
#undef ZP_WINDOW_CASE
  }
}

// Bytes [from, to) of the 16-byte vector w to p + from, in 2-byte stores (from and to even).
__device__ __forceinline__ void storeBytes(char* p, const uint32_t (&w)[4], int from, int to) {
#pragma unroll
  for (int b = 0; b < 16; b += 2) {
    if (b >= from && b < to) {
      *reinterpret_cast<unsigned short*>(p + b) = static_cast<unsigned short>(w[b >> 2] >> (8 * (b & 2)));
    }
  }
}

template <class Type, int Bits, bool kAligned>
__global__ void __launch_bounds__(kCtaThreads) dequantizeKernel(const DequantArgs a) {
  constexpr int V = vecElems<Type>();
  constexpr int kTileVecs = kCtaThreads * kVecsPerThread;
  using CodeWord =
      typename std::conditional<V * Bits / 8 == 8, uint2,
                                typename std::conditional<V * Bits / 8 == 4, uint32_t, uint16_t>::type>::type;

  if (!peerEnter(a.sync)) return;
  for (int seg = blockIdx.y; seg < a.batch; seg += gridDim.y) {
    const char* payload = a.payload + seg * a.payloadStride;
    const float* scales = reinterpret_cast<const float*>(payload);
    const CodeWord* codes = reinterpret_cast<const CodeWord*>(payload + a.scaleBytes);
    char* out = a.output + seg * a.outputStride;
    const int align = kAligned ? 16 : accessAlign(out);  // kAligned: every segment starts 16-byte aligned
    for (size_t tile = blockIdx.x; tile < a.tiles; tile += gridDim.x) {
      // step 1: codes and scales of the thread's vectors (vector j at j * 256 + thread in the CTA's tile, so each
      // store step of the CTA writes 4 KB contiguous), all loads in flight before the first use.
      CodeWord code[kVecsPerThread];
      float scale[kVecsPerThread];
#pragma unroll
      for (int j = 0; j < kVecsPerThread; ++j) {
        const size_t vec = tile * kTileVecs + j * kCtaThreads + threadIdx.x;
        if (vec * V < a.count) {
          code[j] = __ldg(codes + vec);
          scale[j] = __ldg(scales + ((vec * V) >> a.blockShift));
        }
      }
      // step 2: x' = q * scale in the output type, stored as a vector (element by element at the end).
#pragma unroll
      for (int j = 0; j < kVecsPerThread; ++j) {
        const size_t vec = tile * kTileVecs + j * kCtaThreads + threadIdx.x;
        const size_t e0 = vec * V;
        if (e0 >= a.count) break;
        uint64_t bits;
        if constexpr (sizeof(CodeWord) == 8) {
          bits = code[j].x | (static_cast<uint64_t>(code[j].y) << 32);
        } else {
          bits = code[j];
        }
        uint32_t w[4] = {0, 0, 0, 0};
        if (dequantIsPlain<Type, Bits>(scale[j])) {  // the common case: product and conversion only
#pragma unroll
          for (int i = 0; i < V; ++i) {
            const float q = decodeCode<Bits>(static_cast<uint32_t>(bits >> (Bits * i)));
            setElem<Type>(w, i, Type::fromFloat(__fmul_rn(q, scale[j])));
          }
        } else {  // NaN block or a scale near the type's max
#pragma unroll
          for (int i = 0; i < V; ++i) {
            const float q = decodeCode<Bits>(static_cast<uint32_t>(bits >> (Bits * i)));
            setElem<Type>(w, i, dequantizeValue<Type>(q, scale[j]));
          }
        }
        char* p = out + e0 * sizeof(typename Type::Bits);
        const size_t warpEnd = (vec - (threadIdx.x & 31) + 32) * V;  // elements up to the warp's last vector
        if (align != 16 && warpEnd <= a.count) {
          // Misaligned output, whole warp in range: lane i stores the aligned window that holds the end of its
          // vector and the start of lane i+1's (one 16-byte store); lanes 0 and 31 add the two ragged edges.
          const int m = static_cast<int>(reinterpret_cast<uintptr_t>(p) & 15);
          uint32_t next[4], win[4];
#pragma unroll
          for (int k = 0; k < 4; ++k) next[k] = __shfl_down_sync(kFullMask, w[k], 1);
          window16(w, next, 16 - m, win);
          char* aligned = p - m + 16;
          if ((threadIdx.x & 31) != 31) {
            *reinterpret_cast<uint4*>(aligned) = make_uint4(win[0], win[1], win[2], win[3]);
          } else {
            storeBytes(p, w, 16 - m, 16);  // the end of the warp's last vector
          }
          if ((threadIdx.x & 31) == 0) storeBytes(p, w, 0, 16 - m);  // the start of its first
        } else if (e0 + V <= a.count) {
          storeVec(p, align, w);
        } else {
          storeTail<Type>(p, a.count - e0, w);
        }
      }
    }
  }
  peerLeave(a.sync);
}

// ---- launchers -----------------------------------------------------------------------------------------------

// One kernel per alignment; dispatch's Launch.
template <class Type, int Bits>
struct DequantizeLaunch {
  static zpResult_t run(const DequantArgs& a, bool aligned, KernelStream stream) {
    return aligned ? launchSegments<dequantizeKernel<Type, Bits, true>>(a, a.tiles, kCtaThreads, 0, stream)
                   : launchSegments<dequantizeKernel<Type, Bits, false>>(a, a.tiles, kCtaThreads, 0, stream);
  }
};

}  // namespace

zpResult_t launchDequantize(const void* payload, void* output, size_t count, zpDataType_t type, int bits, int blockSize,
                            KernelStream stream, int batch, size_t payloadStrideBytes, size_t outputStrideElems) {
  const size_t payloadBytes = quantPayloadBytes(count, bits, blockSize);
  if (payloadStrideBytes == 0) payloadStrideBytes = payloadBytes;
  if (outputStrideElems == 0) outputStrideElems = count;
  ZPCHECK(checkCommon("dequantize", output, payload, payloadStrideBytes, type, bits, blockSize, batch));
  if (batch > 1 && outputStrideElems < count) {
    return ZP_ERR(zpInvalidArgument, "dequantize : output stride %zu is below count %zu (segments overlap)",
                  outputStrideElems, count);
  }
  if (count == 0 || batch == 0) return zpSuccess;
  DequantArgs a;
  a.payload = static_cast<const char*>(payload);
  a.output = static_cast<char*>(output);
  a.count = count;
  a.payloadStride = payloadStrideBytes;
  a.outputStride = outputStrideElems * typeSize(type);
  a.scaleBytes = quantScaleBytes(count, blockSize);
  const size_t vecs = (count * typeSize(type) + kVecBytes - 1) / kVecBytes;
  a.tiles = (vecs + kCtaThreads * kVecsPerThread - 1) / (kCtaThreads * kVecsPerThread);
  a.batch = batch;
  a.blockShift = log2Int(blockSize);
  a.sync = stream.sync;
  return dispatch<DequantizeLaunch>(type, bits, a, segmentsAligned(output, a.outputStride, batch), stream);
}

}  // namespace zp
