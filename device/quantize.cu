// Block quantization kernels (format: include/zpccl.h; arithmetic: host/quant_math.h, shared with the host
// reference so that payloads are bit-identical).
//
// A group of P threads owns one quantization block of G elements; each thread takes kVecsPerThread 16-byte vectors
// of it (vector j of the group's thread t is the block's vector j * P + t, so each load step of a group covers
// P * 16 contiguous bytes). P = G / (16 elements for fp32, 32 for fp16/bf16) is a template parameter (one kernel
// per P: constant offsets, unrolled shuffles): groups of 1 to 32 threads share a warp (256-thread CTAs hold
// several) and load their vectors straight into registers; groups of 64 to 512 threads
// are a whole CTA and pipeline their blocks through shared memory with cp.async, so that loads stay in flight
// while the CTA meets at its barrier (registers and spills of each: perf/KERNELS.md). The thread's vectors stay in
// registers for both passes: absmax (packed pairs for fp16/bf16; reduced over the group with shuffles, across
// warps through shared memory), then the codes: the division's quotient from the reciprocal and one correction
// step (quotientRn, host/quant_math.h), rounded by one add, with no data-dependent branch (see "quantize: codes").
// Misaligned element pointers (an fp16 tensor at an odd element, say) load with the widest access the address
// allows (8, 4 or 2 bytes); segments that are all 16-byte aligned run kernels without these paths. Payloads are
// always 16-byte aligned.
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "device/code_pack.h"
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

constexpr int kStages = 2;  // quantize, blocks of a whole CTA: shared-memory pipeline depth
#if __CUDA_ARCH__ >= 800 || !defined(__CUDA_ARCH__)
constexpr bool kAsyncCopy = true;  // cp.async (sm_80+)
#else
constexpr bool kAsyncCopy = false;
#endif

// ---- reductions ----------------------------------------------------------------------------------------------

// max(m, |x|) propagating NaN. m and the result are >= 0 or NaN.
__device__ __forceinline__ float maxAbsNaN(float m, float x) {
#if __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(m), "f"(fabsf(x)));
  return r;
#else
  return __uint_as_float(max(__float_as_uint(m), absBits(x)));
#endif
}

// absBits (quant_math.h) of the largest |element| of the thread's vectors: the unsigned max of these over a
// block is what the host reference computes, NaN and Inf above every finite value.
template <class Type>
__device__ __forceinline__ uint32_t threadAbsMaxBits(const uint32_t (&v)[kVecsPerThread][4]) {
  if constexpr (sizeof(typename Type::Bits) == 4) {
    float m = 0.0f;
#pragma unroll
    for (int j = 0; j < kVecsPerThread; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) m = maxAbsNaN(m, __uint_as_float(v[j][i]));
    }
    return __float_as_uint(m) & kF32AbsMask;
  } else {
    // max |.| over the packed pairs, two elements an instruction, then over the two halves of the result. For
    // finite values the max magnitude is exact; a NaN gives a NaN, an Inf an Inf or a NaN: either way the
    // widened bits are >= kF32Inf, hence a NaN scale, as on the host. Widening is monotone on magnitudes.
    uint32_t m;  // sign bits meaningless
    if constexpr (std::is_same<Type, Fp16Type>::value) {
      // Two chains of max(acc, |a|, |b|) (sm_90: one 3-input VHMNMX with |.| each), over two vectors each.
      __half2 acc[2];
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        __half2 h[kVecsPerThread * 2];  // the words of vectors 2c and 2c + 1
#pragma unroll
        for (int k = 0; k < kVecsPerThread * 2; ++k) memcpy(&h[k], &v[c * 2 + (k >> 2)][k & 3], 4);
        acc[c] = __hmax2_nan(__habs2(h[0]), __habs2(h[1]));
#pragma unroll
        for (int k = 2; k < kVecsPerThread * 2; ++k) acc[c] = __hmax2_nan(acc[c], __habs2(h[k]));
      }
      const __half2 r = __hmax2_nan(acc[0], acc[1]);
      memcpy(&m, &r, 4);
    } else {
      // A tree of max(|a|, |b|) (sm_86+: one instruction each, |.| included; result signs: xor of the inputs').
      uint32_t p[kVecsPerThread * 2];
      auto pairMax = [](uint32_t a, uint32_t b) {
        uint32_t r;
#if __CUDA_ARCH__ >= 860
        asm("max.NaN.xorsign.abs.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
#else
        __nv_bfloat162 x, y;
        memcpy(&x, &a, 4);
        memcpy(&y, &b, 4);
        const __nv_bfloat162 t = __hmax2_nan(__habs2(x), __habs2(y));
        memcpy(&r, &t, 4);
#endif
        return r;
      };
#pragma unroll
      for (int k = 0; k < kVecsPerThread * 2; ++k) p[k] = pairMax(v[k >> 1][(k & 1) * 2], v[k >> 1][(k & 1) * 2 + 1]);
#pragma unroll
      for (int n = kVecsPerThread; n > 0; n >>= 1) {
#pragma unroll
        for (int k = 0; k < n; ++k) p[k] = pairMax(p[2 * k], p[2 * k + 1]);
      }
      m = p[0];
    }
    const uint32_t m16 = max(m & 0x7fffu, (m >> 16) & 0x7fffu);  // |x| bits of the larger half
    return absBits(Type::toFloat(static_cast<typename Type::Bits>(m16)));
  }
}

// ---- quantize: codes -----------------------------------------------------------------------------------------
//
// For a block whose scale s is at least kQuotientMinScale (its elements are then finite), with r = __frcp_rn(s):
// q = quotientRn(x, s, r) is divRn(x, s) wherever that can give a non-zero code, and rint(q) by the magic add
// (ties to even) is quantizeCode's code; |q| <= qmax (1 + 2^-23) rounds inside [-qmax, qmax], so the clamp is a
// no-op. The code is y's low byte, two's complement, for y = q + 1.5 * 2^23. Why not round x * r and redo the
// near-ties by division: bf16 blocks are full of exact ties (x = absmax / 2 quantizes to 3.5, and a power-of-two
// absmax makes half the odd mantissas ties), so the redo would run in most warps and cost most of the kernel's
// instructions; quotientRn has no data-dependent branch. Blocks with a smaller scale (below 2^-96, zero, NaN)
// take the division.

// The V elements of a vector as fp32 (exact): bf16 by a shift or a mask, fp16 two a conversion.
template <class Type>
ZP_QHD void unpackVec(const uint32_t (&w)[4], float (&x)[vecElems<Type>()]) {
  if constexpr (sizeof(typename Type::Bits) == 4) {
    ZP_UNROLL
    for (int k = 0; k < 4; ++k) x[k] = bitsFloat(w[k]);
  } else if constexpr (std::is_same<Type, Bf16Type>::value) {
    ZP_UNROLL
    for (int k = 0; k < 4; ++k) {
      x[2 * k] = bitsFloat(w[k] << 16);
      x[2 * k + 1] = bitsFloat(w[k] & 0xffff0000u);
    }
  } else {
    ZP_UNROLL
    for (int k = 0; k < 4; ++k) {
#if defined(__CUDA_ARCH__)
      __half2 h;
      memcpy(&h, &w[k], 4);
      const float2 f = __half22float2(h);
      x[2 * k] = f.x;
      x[2 * k + 1] = f.y;
#else
      x[2 * k] = halfBitsToFloat(static_cast<uint16_t>(w[k]));
      x[2 * k + 1] = halfBitsToFloat(static_cast<uint16_t>(w[k] >> 16));
#endif
    }
  }
}

// The packed codes of one vector of a block whose scale is at least kQuotientMinScale: quantizeCode's codes (see
// above).
template <class Type, int Bits>
ZP_QHD uint2 quantizeVecFast(const uint32_t (&w)[4], float scale, float rcp) {
  constexpr int V = vecElems<Type>();
  float x[V];
  unpackVec<Type>(w, x);
  uint32_t y[V];  // code i in the low byte of y[i]
  ZP_UNROLL
  for (int i = 0; i < V; ++i) y[i] = floatBits(addRn(quotientRn(x[i], scale, rcp), kRoundMagic));
  return packCodes<Bits, V>(y);
}

// Stores the V * Bits / 8 bytes of packed codes (2, 4 or 8, naturally aligned).
template <int Bits, int V>
__device__ __forceinline__ void storePacked(char* p, uint2 packed) {
  constexpr int kBytes = V * Bits / 8;
  if constexpr (kBytes == 8) {
    *reinterpret_cast<uint2*>(p) = packed;
  } else if constexpr (kBytes == 4) {
    *reinterpret_cast<uint32_t*>(p) = packed.x;
  } else {
    *reinterpret_cast<unsigned short*>(p) = static_cast<unsigned short>(packed.x);
  }
}

// The packed codes of one vector by division: blocks whose scale is below kQuotientMinScale (see above). Out of
// line, so that its division calls stay out of the hot loop's register budget.
template <class Type, int Bits>
__device__ __noinline__ uint2 quantizeVecExact(uint4 x, float scale) {
  constexpr int V = vecElems<Type>();
  const uint32_t v[4] = {x.x, x.y, x.z, x.w};
  uint32_t c[V];
#pragma unroll
  for (int i = 0; i < V; ++i)
    c[i] = quantizeCode(Type::toFloat(getElem<Type>(v, i)), scale, static_cast<float>(quantMax(Bits)));
  return packCodes<Bits, V>(c);
}

// ---- quantize: one block -------------------------------------------------------------------------------------
//
// Group geometry is a template parameter: a group of 1 << kShift threads, so that the block size, the strides
// and every offset are constants. kShift <= 5: warp-sized groups, several to a 256-thread CTA; kShift > 5: the
// group is the CTA.

// log2 of the elements a thread holds of its block (kVecsPerThread vectors).
template <class Type>
constexpr int threadElemsShift() {
  return sizeof(typename Type::Bits) == 2 ? 5 : 4;
}
static_assert(kVecsPerThread == 4, "threadElemsShift, threadAbsMaxBits");

template <class Type, int kShift>
constexpr int blockShiftOf() {
  return kShift + threadElemsShift<Type>();
}

// Steps 2 to 4 for one block whose vectors the thread holds in registers (vector j: the block's vector
// j * P + lane). `out`: where the codes of the thread's vector 0 go. `whole`: the block lies within the segment
// (its codes need no bounds checks). warpMax: CTA groups only, 2 * P / 32 words (double-buffered: one barrier
// per block).
template <class Type, int Bits, int kShift>
__device__ __forceinline__ void quantizeBlock(const QuantArgs& a, const uint32_t (&v)[kVecsPerThread][4], size_t block,
                                              bool whole, int lane, float* scales, char* out, uint32_t* warpMax,
                                              int& parity) {
  constexpr int V = vecElems<Type>();
  constexpr int kPackedBytes = V * Bits / 8;                                                // code bytes of one vector
  constexpr int kStepShift = (kPackedBytes == 8 ? 3 : kPackedBytes == 4 ? 2 : 1) + kShift;  // between vectors

  // step 2: absmax of the block: the thread's elements, then the group (NaN and Inf order above all).
  uint32_t absMax = threadAbsMaxBits<Type>(v);
  if constexpr (kShift <= 5) {
    absMax = logicalWarpMax<1 << kShift>(absMax);
  } else {  // the CTA is the group: combine its warps
    constexpr int kWarps = 1 << (kShift - 5);
    absMax = logicalWarpMax<32>(absMax);
    uint32_t* slots = warpMax + parity * kWarps;
    if ((threadIdx.x & 31) == 0) slots[threadIdx.x >> 5] = absMax;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kWarps; ++k) absMax = max(absMax, slots[k]);
    parity ^= 1;
  }

  // step 3: the scale; the group's first thread stores it.
  const float scale = blockScale(absMax, Bits);
  if (lane == 0 && block < a.blocks) scales[block] = scale;

  // step 4: codes. Elements past the end are zeros, hence code 0: the codes' padding. Vector j's codes go to
  // out + j * step, unless past the padded code region (or there is no block).
  int inRange = kVecsPerThread;  // the thread's vectors whose codes lie in the padded code region
  if (!whole) {
    const size_t offset = ((block << blockShiftOf<Type, kShift>()) + static_cast<size_t>(lane) * V) * Bits / 8;
    const size_t left = a.codeBytes > offset ? a.codeBytes - offset : 0;
    inRange = static_cast<int>(
        (min(left, static_cast<size_t>(kVecsPerThread) << kStepShift) + (size_t{1} << kStepShift) - 1) >> kStepShift);
  }
  auto store = [&](int j, uint2 packed) {
    if (j < inRange) storePacked<Bits, V>(out + (j << kStepShift), packed);
  };
  // A scale from kQuotientMinScale up takes the fast path (codes of quantizeCode, see above), stored at once.
  const bool fast = scale >= kQuotientMinScale;  // false for 0, NaN and tiny scales
  const float rcp = __frcp_rn(fast ? scale : 1.0f);
  if constexpr (kShift == 0 && kPackedBytes * kVecsPerThread % 16 == 0) {
    // One thread a block (fp16/bf16, G = 32): its codes are contiguous and 16-byte aligned: whole vectors.
    uint2 packed[kVecsPerThread];
#pragma unroll
    for (int j = 0; j < kVecsPerThread; ++j) packed[j] = quantizeVecFast<Type, Bits>(v[j], scale, rcp);
    if (whole) {
      uint32_t u[kPackedBytes * kVecsPerThread / 4];
#pragma unroll
      for (int j = 0; j < kVecsPerThread; ++j) {
        u[j * kPackedBytes / 4] = packed[j].x;
        if constexpr (kPackedBytes == 8) u[j * 2 + 1] = packed[j].y;
      }
#pragma unroll
      for (int k = 0; k < kPackedBytes * kVecsPerThread / 16; ++k) {
        reinterpret_cast<uint4*>(out)[k] = make_uint4(u[4 * k], u[4 * k + 1], u[4 * k + 2], u[4 * k + 3]);
      }
    } else {
#pragma unroll
      for (int j = 0; j < kVecsPerThread; ++j) store(j, packed[j]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kVecsPerThread; ++j) store(j, quantizeVecFast<Type, Bits>(v[j], scale, rcp));
  }
  // Rarely: a scale that is 0 or NaN (every code 0) or tiny (every element by division). The thread stores its
  // vectors again (its own stores, in order: the last one stays). Out of line; unrolled so that v stays in
  // registers.
  if (!fast) {
#pragma unroll
    for (int j = 0; j < kVecsPerThread; ++j) {
      store(j, scale > 0.0f ? quantizeVecExact<Type, Bits>(make_uint4(v[j][0], v[j][1], v[j][2], v[j][3]), scale)
                            : make_uint2(0, 0));
    }
  }
}

// ---- asynchronous copies (sm_80+): global -> shared without holding registers --------------------------------

__device__ __forceinline__ void copyAsync16(void* smem, const void* global) {
#if __CUDA_ARCH__ >= 800
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(global) : "memory");
#endif
}
__device__ __forceinline__ void commitAsync() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int Pending>
__device__ __forceinline__ void waitAsync() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
#endif
}

// ---- quantize: kernels ---------------------------------------------------------------------------------------

// The thread's vectors of one block into registers (zeros past the segment's end), its vector 0 at `src`:
// 16-byte loads for a whole block of an aligned segment, otherwise the widest loads the address allows and
// element-wise tails. Returns whether the whole block lies within the segment.
template <class Type, int kShift, bool kAligned>
__device__ __forceinline__ bool loadThreadVectors(uint32_t (&w)[kVecsPerThread][4], const char* src, const QuantArgs& a,
                                                  int align, size_t block, int lane) {
  constexpr int V = vecElems<Type>();
  constexpr int kBlockShift = blockShiftOf<Type, kShift>();
  constexpr int kStep = kVecBytes << kShift;
  const bool whole = block < (a.count >> kBlockShift);
  if (whole && (kAligned || align == 16)) {
#pragma unroll
    for (int j = 0; j < kVecsPerThread; ++j) {
      const uint4 x = __ldg(reinterpret_cast<const uint4*>(src + j * kStep));
      w[j][0] = x.x, w[j][1] = x.y, w[j][2] = x.z, w[j][3] = x.w;
    }
  } else {
    const size_t e0 = (block << kBlockShift) + static_cast<size_t>(lane) * V;
#pragma unroll
    for (int j = 0; j < kVecsPerThread; ++j) {
      const size_t e = e0 + (static_cast<size_t>(j) << kShift) * V;
      if (e + V <= a.count) {
        loadVec(src + j * kStep, align, w[j]);
      } else if (e < a.count) {
        loadTail<Type>(src + j * kStep, a.count - e, w[j]);
      } else {
        w[j][0] = w[j][1] = w[j][2] = w[j][3] = 0;
      }
    }
  }
  return whole;
}

// Segment seg of a quantize launch: its input, scales and codes, and the input's access alignment (16 for
// kAligned launches). The segment's first CTA also writes the scale region's zero padding after the last block's
// scale (at most 3 floats).
struct QuantSegment {
  const char* in;
  float* scales;
  char* codes;
  int align;
};
template <bool kAligned>
__device__ __forceinline__ QuantSegment openSegment(const QuantArgs& a, int seg) {
  const char* in = a.input + seg * a.inputStride;
  char* out = a.payload + seg * a.payloadStride;
  QuantSegment s{in, reinterpret_cast<float*>(out), out + a.scaleBytes, kAligned ? 16 : accessAlign(in)};
  if (blockIdx.x == 0 && a.blocks + threadIdx.x < a.scaleBytes / sizeof(float)) s.scales[a.blocks + threadIdx.x] = 0.0f;
  return s;
}

// Blocks of warp-sized groups (1 << kShift threads): 256-thread CTAs of several groups, loads straight into
// registers.
template <class Type, int Bits, int kShift, bool kAligned>
__global__ void __launch_bounds__(kCtaThreads, 4) quantizeWarpKernel(const QuantArgs a) {
  using Elem = typename Type::Bits;
  constexpr int V = vecElems<Type>();
  constexpr int kGroupsPerCta = kCtaThreads >> kShift;
  constexpr int kBlockShift = blockShiftOf<Type, kShift>();
  const int lane = threadIdx.x & ((1 << kShift) - 1);
  const size_t group = threadIdx.x >> kShift;
  const size_t stride = static_cast<size_t>(gridDim.x) * kGroupsPerCta;
  int parity = 0;  // unused: no CTA-wide reduction
  if (!peerEnter(a.sync)) return;

  for (int seg = blockIdx.y; seg < a.batch; seg += gridDim.y) {
    const auto [in, scales, codes, align] = openSegment<kAligned>(a, seg);
    // Trip counts are uniform across the CTA (full-warp shuffles): trailing groups run with no block. The
    // thread's first element and code byte advance by a grid step's blocks.
    size_t first = static_cast<size_t>(blockIdx.x) * kGroupsPerCta;
    const size_t e0 = ((first + group) << kBlockShift) + static_cast<size_t>(lane) * V;
    const char* src = in + e0 * sizeof(Elem);
    char* dst = codes + e0 * Bits / 8;
    const size_t srcStep = (stride << kBlockShift) * sizeof(Elem);
    const size_t dstStep = (stride << kBlockShift) * Bits / 8;
#pragma unroll 1
    for (; first < a.blocks; first += stride, src += srcStep, dst += dstStep) {
      uint32_t v[kVecsPerThread][4];
      const bool whole = loadThreadVectors<Type, kShift, kAligned>(v, src, a, align, first + group, lane);
      quantizeBlock<Type, Bits, kShift>(a, v, first + group, whole, lane, scales, dst, nullptr, parity);
    }
  }
  peerLeave(a.sync);
}

// Blocks of a whole CTA (1 << kShift threads, 64 to 512), one block at a time per CTA: a pipeline of kStages
// blocks in shared memory (cp.async), the copies of kStages - 1 of them in flight, not holding registers, while
// one is quantized and the CTA meets at its barrier. Blocks with a tail, and misaligned segments, take the
// direct loop. The pipeline pays for blocks of a whole CTA; for warp-sized groups direct loads are as fast or
// faster (quantize_perf; perf/RESULTS.md, Kernels).
template <class Type, int Bits, int kShift, bool kAligned>
__global__ void __launch_bounds__(1 << kShift, 1024 >> kShift) quantizeCtaKernel(const QuantArgs a) {
  using Elem = typename Type::Bits;
  constexpr int V = vecElems<Type>();
  constexpr int kThreads = 1 << kShift;
  constexpr int kBlockShift = blockShiftOf<Type, kShift>();
  constexpr int kStageVecs = kVecsPerThread * kThreads;
  constexpr int kStep = kVecBytes << kShift;  // bytes between a thread's vectors in global memory
  extern __shared__ uint4 stages[];           // [kStages][kVecsPerThread][kThreads]
  __shared__ uint32_t warpMax[2 * (kThreads / 32)];
  const int lane = threadIdx.x;
  uint4* const mine = stages + threadIdx.x;  // slot j of stage s: mine[s * kStageVecs + j * kThreads]
  const size_t stride = gridDim.x;
  int parity = 0;
  if (!peerEnter(a.sync)) return;

  for (int seg = blockIdx.y; seg < a.batch; seg += gridDim.y) {
    const auto [in, scales, codes, align] = openSegment<kAligned>(a, seg);
    // Trip counts are uniform across the CTA (barriers).
    size_t first = blockIdx.x;
    if (kAsyncCopy && align == 16) {
      const size_t wholeBlocks = a.count >> kBlockShift;
      const size_t e0 = (first << kBlockShift) + static_cast<size_t>(lane) * V;
      const char* ahead = in + e0 * sizeof(Elem);  // the thread's vector 0 of the next block to copy
      const size_t aheadStep = (stride << kBlockShift) * sizeof(Elem);
      char* dst = codes + e0 * Bits / 8;
      const size_t dstStep = (stride << kBlockShift) * Bits / 8;
      auto issue = [&](int s) {  // the next block's copies into stage s (each thread: only its own slots)
#pragma unroll
        for (int j = 0; j < kVecsPerThread; ++j) copyAsync16(mine + s * kStageVecs + j * kThreads, ahead + j * kStep);
      };
#pragma unroll
      for (int s = 0; s < kStages - 1; ++s, ahead += aheadStep) {
        if (first + s * stride < wholeBlocks) issue(s);
        commitAsync();
      }
#pragma unroll 1
      for (int s = 0; first < wholeBlocks; first += stride, dst += dstStep, s = s + 1 == kStages ? 0 : s + 1) {
        if (first + (kStages - 1) * stride < wholeBlocks) issue(s == 0 ? kStages - 1 : s - 1);  // read last step
        ahead += aheadStep;
        commitAsync();
        waitAsync<kStages - 1>();  // this step's block has landed
        uint32_t v[kVecsPerThread][4];
#pragma unroll
        for (int j = 0; j < kVecsPerThread; ++j) {
          const uint4 x = mine[s * kStageVecs + j * kThreads];
          v[j][0] = x.x, v[j][1] = x.y, v[j][2] = x.z, v[j][3] = x.w;
        }
        quantizeBlock<Type, Bits, kShift>(a, v, first, true, lane, scales, dst, warpMax, parity);
      }
      waitAsync<0>();
    }
    // Otherwise straight into registers.
#pragma unroll 1
    for (; first < a.blocks; first += stride) {
      uint32_t v[kVecsPerThread][4];
      const size_t e0 = (first << kBlockShift) + static_cast<size_t>(lane) * V;
      const bool whole = loadThreadVectors<Type, kShift, kAligned>(v, in + e0 * sizeof(Elem), a, align, first, lane);
      quantizeBlock<Type, Bits, kShift>(a, v, first, whole, lane, scales, codes + e0 * Bits / 8, warpMax, parity);
    }
  }
  peerLeave(a.sync);
}

// ---- launchers -----------------------------------------------------------------------------------------------

// Lets Kernel take up to `bytes` of dynamic shared memory (beside its static shared memory, the total may pass
// the default 48 KB), once per device.
template <auto Kernel>
zpResult_t allowSharedMemory(size_t bytes) {
  static std::atomic<uint64_t> done{0};
  int device = 0;
  CUDACHECK(cudaGetDevice(&device));
  const uint64_t bit = uint64_t{1} << (device & 63);
  if (done.load(std::memory_order_relaxed) & bit) return zpSuccess;
  CUDACHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  done.fetch_or(bit, std::memory_order_relaxed);
  return zpSuccess;
}

template <auto Kernel>
zpResult_t launchQuantizeKernel(const QuantArgs& a, int threads, size_t smem, size_t ctasPerSegment,
                                KernelStream stream) {
  if (smem > 0 && !stream.loadOnly) ZPCHECK(allowSharedMemory<Kernel>(smem));
  return launchSegments<Kernel>(a, ctasPerSegment, threads, smem, stream);
}

// One kernel per group size (1 << kShift threads): warp-sized groups from the smallest up to 32 threads, then
// CTA-sized ones up to the largest (8192-element blocks).
template <class Type, int Bits, bool kAligned, int kShift = 5 - threadElemsShift<Type>()>
zpResult_t launchQuantizeShift(const QuantArgs& a, KernelStream stream) {
  static_assert(kShift <= 13 - threadElemsShift<Type>(), "no larger group");
  if constexpr (kShift < 13 - threadElemsShift<Type>()) {
    if (a.groupShift != kShift) return launchQuantizeShift<Type, Bits, kAligned, kShift + 1>(a, stream);
  }
  if constexpr (kShift <= 5) {
    constexpr size_t kGroupsPerCta = kCtaThreads >> kShift;
    return launchQuantizeKernel<quantizeWarpKernel<Type, Bits, kShift, kAligned>>(
        a, kCtaThreads, 0, (a.blocks + kGroupsPerCta - 1) / kGroupsPerCta, stream);
  } else {  // one CTA a block; shared memory: its cp.async pipeline
    constexpr size_t kSmem = static_cast<size_t>(kStages) * kVecsPerThread * kVecBytes << kShift;
    return launchQuantizeKernel<quantizeCtaKernel<Type, Bits, kShift, kAligned>>(a, 1 << kShift, kSmem, a.blocks,
                                                                                 stream);
  }
}

// One kernel per group size and alignment (1 << kShift threads); dispatch's Launch.
template <class Type, int Bits>
struct QuantizeLaunch {
  static zpResult_t run(const QuantArgs& a, bool aligned, KernelStream stream) {
    return aligned ? launchQuantizeShift<Type, Bits, true>(a, stream)
                   : launchQuantizeShift<Type, Bits, false>(a, stream);
  }
};

}  // namespace

zpResult_t launchQuantize(const void* input, void* payload, size_t count, zpDataType_t type, int bits, int blockSize,
                          KernelStream stream, int batch, size_t inputStrideElems, size_t payloadStrideBytes) {
  QuantArgs a;
  bool empty = false;
  ZPCHECK(quantArgsOf("quantize", input, payload, count, type, bits, blockSize, stream, batch, inputStrideElems,
                      payloadStrideBytes, &a, &empty));
  if (empty) return zpSuccess;
  a.blockShift = log2Int(blockSize);
  // Each thread holds kVecsPerThread vectors: 16 (fp32) or 32 (fp16/bf16) elements of its block.
  const int perThread = kVecsPerThread * kVecBytes / static_cast<int>(typeSize(type));
  a.groupShift = a.blockShift - log2Int(perThread);
  return dispatch<QuantizeLaunch>(type, bits, a, segmentsAligned(input, a.inputStride, batch), stream);
}

}  // namespace zp
