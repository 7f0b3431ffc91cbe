// Block quantization kernels (format: include/zpccl.h; arithmetic: host/quant_math.h, shared with the host
// reference so that payloads and outputs are bit-identical).
//
// Quantize: a group of P threads owns one quantization block of G elements; each thread takes kVecsPerThread
// 16-byte vectors of it (vector j of the group's thread t is the block's vector j * P + t, so each load step of
// a group covers P * 16 contiguous bytes). P = G / (16 elements for fp32, 32 for fp16/bf16) is a template
// parameter (one kernel per P: constant offsets, unrolled shuffles): groups of 1 to 32 threads share a warp
// (256-thread CTAs hold several) and load their vectors straight into registers; groups of 64 to 512 threads
// are a whole CTA and pipeline their blocks through shared memory with cp.async, so that loads stay in flight
// while the CTA meets at its barrier (64 registers, no spills, either way). The thread's vectors stay in
// registers for both passes: absmax (packed pairs for fp16/bf16; reduced over the group with shuffles, across
// warps through shared memory), then the codes: the division's quotient from the reciprocal and one correction
// step (quotientRn, host/quant_math.h), rounded by one add, with no data-dependent branch (see "quantize: codes").
// Dequantize needs no reduction: each CTA step covers 256 * kVecsPerThread contiguous output vectors; each
// thread reads its vectors' codes and scales.
// Misaligned element pointers (an fp16 tensor at an odd element, say): quantize loads with the widest access
// the address allows (8, 4 or 2 bytes); dequantize stores whole aligned 16-byte windows, each lane combining
// its vector with its neighbour's (shuffles). Segments that are all 16-byte aligned run kernels without these
// paths. Payloads are always 16-byte aligned.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "device/grad_rounding.h"
#include "device/launch_geometry.h"
#include "device/quantize.h"
#include "device/warp_reduce.h"
#include "host/dtype.h"
#include "host/quant_format.h"
#include "host/quant_math.h"
#include "src/include/check.h"

namespace zp {
namespace {

constexpr int kVecBytes = 16;      // one vector access
constexpr int kVecsPerThread = 4;  // 64 bytes per thread in flight
constexpr int kCtaThreads = 256;   // CTA size, except when one group is a whole CTA
constexpr int kStages = 2;         // quantize, blocks of a whole CTA: shared-memory pipeline depth
#if __CUDA_ARCH__ >= 800 || !defined(__CUDA_ARCH__)
constexpr bool kAsyncCopy = true;  // cp.async (sm_80+)
#else
constexpr bool kAsyncCopy = false;
#endif

template <class Type>
constexpr int vecElems() {
  return kVecBytes / static_cast<int>(sizeof(typename Type::Bits));
}

struct QuantArgs {
  const char* input;     // segment 0's elements
  char* payload;         // segment 0's payload
  size_t count;          // elements per segment
  size_t inputStride;    // bytes between segment inputs
  size_t payloadStride;  // bytes between segment payloads
  size_t blocks;         // quantization blocks per segment
  size_t scaleBytes;     // where the codes start in a payload (scales plus padding)
  size_t codeBytes;      // code bytes, padding included
  int batch;
  int blockShift;  // log2(blockSize)
  int groupShift;  // log2(threads per quantization block)
  PeerSync sync;   // KernelStream::sync
};

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

// ---- vector access -------------------------------------------------------------------------------------------

// Widest access (16, 8, 4 or 2 bytes) that the address allows.
__device__ __forceinline__ int accessAlign(const void* p) {
  const uint32_t a = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(p)) | kVecBytes;
  return static_cast<int>(a & (~a + 1u));
}

__device__ __forceinline__ void loadVec(const char* p, int align, uint32_t (&w)[4]) {
  if (align == 16) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  } else if (align == 8) {
    const uint2 a = __ldg(reinterpret_cast<const uint2*>(p)), b = __ldg(reinterpret_cast<const uint2*>(p) + 1);
    w[0] = a.x, w[1] = a.y, w[2] = b.x, w[3] = b.y;
  } else if (align == 4) {
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = __ldg(reinterpret_cast<const unsigned int*>(p) + k);
  } else {
    const unsigned short* q = reinterpret_cast<const unsigned short*>(p);
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = __ldg(q + 2 * k) | (static_cast<uint32_t>(__ldg(q + 2 * k + 1)) << 16);
  }
}

__device__ __forceinline__ void storeVec(char* p, int align, const uint32_t (&w)[4]) {
  if (align == 16) {
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  } else if (align == 8) {
    reinterpret_cast<uint2*>(p)[0] = make_uint2(w[0], w[1]);
    reinterpret_cast<uint2*>(p)[1] = make_uint2(w[2], w[3]);
  } else if (align == 4) {
#pragma unroll
    for (int k = 0; k < 4; ++k) reinterpret_cast<uint32_t*>(p)[k] = w[k];
  } else {
    unsigned short* q = reinterpret_cast<unsigned short*>(p);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      q[2 * k] = static_cast<unsigned short>(w[k]);
      q[2 * k + 1] = static_cast<unsigned short>(w[k] >> 16);
    }
  }
}

// Element i of a vector held as four words (i a compile-time constant after unrolling: stays in registers).
template <class Type>
__device__ __forceinline__ typename Type::Bits getElem(const uint32_t (&w)[4], int i) {
  if constexpr (sizeof(typename Type::Bits) == 4) {
    return w[i];
  } else {
    return static_cast<typename Type::Bits>(w[i >> 1] >> (16 * (i & 1)));
  }
}

template <class Type>
__device__ __forceinline__ void setElem(uint32_t (&w)[4], int i, typename Type::Bits b) {
  if constexpr (sizeof(typename Type::Bits) == 4) {
    w[i] = b;
  } else {
    w[i >> 1] |= static_cast<uint32_t>(b) << (16 * (i & 1));
  }
}

// The first n (< one vector) elements at p, element by element; the rest zero.
template <class Type>
__device__ __forceinline__ void loadTail(const char* p, size_t n, uint32_t (&w)[4]) {
  using Bits = typename Type::Bits;
  w[0] = w[1] = w[2] = w[3] = 0;
#pragma unroll
  for (int i = 0; i < vecElems<Type>(); ++i) {
    if (static_cast<size_t>(i) < n) setElem<Type>(w, i, reinterpret_cast<const Bits*>(p)[i]);
  }
}

template <class Type>
__device__ __forceinline__ void storeTail(char* p, size_t n, const uint32_t (&w)[4]) {
  using Bits = typename Type::Bits;
#pragma unroll
  for (int i = 0; i < vecElems<Type>(); ++i) {
    if (static_cast<size_t>(i) < n) reinterpret_cast<Bits*>(p)[i] = getElem<Type>(w, i);
  }
}

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

// Host versions too, so that a host program can check the fast codes against quant_math.h.
#define ZP_QHD __host__ __device__ __forceinline__
#if defined(__CUDA_ARCH__)
#define ZP_UNROLL _Pragma("unroll")
#else
#define ZP_UNROLL
#endif

ZP_QHD uint32_t bytePerm(uint32_t a, uint32_t b, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(a, b, sel);
#else
  const uint64_t ab = (static_cast<uint64_t>(b) << 32) | a;
  uint32_t r = 0;
  for (int k = 0; k < 4; ++k) r |= static_cast<uint32_t>((ab >> (8 * ((sel >> (4 * k)) & 7))) & 0xffu) << (8 * k);
  return r;
#endif
}

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

// The V codes of one vector, packed (int8: V bytes; int4: V / 2 bytes, element 2i in the low nibble; bits past
// them are not zero), from words whose low byte holds each code in two's complement (higher bits ignored).
template <int Bits, int V>
ZP_QHD uint2 packCodes(const uint32_t (&c)[V]) {
  uint32_t words[2] = {0, 0};
  if constexpr (Bits == 8) {
    ZP_UNROLL
    for (int k = 0; k < V / 4; ++k) {
      words[k] =
          bytePerm(bytePerm(c[4 * k], c[4 * k + 1], 0x0040), bytePerm(c[4 * k + 2], c[4 * k + 3], 0x0040), 0x5410);
    }
  } else {
    // The low bytes of the even elements (byte k: element 2k) and of the odd ones (byte k: element 2k + 1), then
    // the even codes' low nibbles beside the odd ones moved up.
    uint32_t even, odd;
    if constexpr (V == 8) {
      even = bytePerm(bytePerm(c[0], c[2], 0x0040), bytePerm(c[4], c[6], 0x0040), 0x5410);
      odd = bytePerm(bytePerm(c[1], c[3], 0x0040), bytePerm(c[5], c[7], 0x0040), 0x5410);
    } else {
      even = bytePerm(c[0], c[2], 0x0040);
      odd = bytePerm(c[1], c[3], 0x0040);
    }
    words[0] = (even & 0x0f0f0f0fu) | ((odd << 4) & 0xf0f0f0f0u);
  }
  return make_uint2(words[0], words[1]);
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
  for (int i = 0; i < V; ++i) c[i] = quantizeCode(Type::toFloat(getElem<Type>(v, i)), scale, Bits == 8 ? 127.0f : 7.0f);
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

// ---- dequantize ----------------------------------------------------------------------------------------------

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

// ---- quantize with gradient rounding (stochastic rounding, error feedback) -----------------------------------
//
// The unit of work is a group of 8 elements (one Philox call, host/philox.h; 4 or 8 bytes of codes). A block of G
// elements belongs to P = min(G / 32, 32) lanes of a warp (a warp holds 32 / P blocks side by side); the block's
// lane t takes its groups t, t + P, t + 2P, ..., so that each load step of the warp covers whole contiguous lines.
// A lane loads its first kGradKeptGroups groups (all of them for blocks of up to 1024 elements, 512 with residuals)
// before anything else, so that 4 to 8 16-byte loads a lane are in flight, and keeps them in registers from the
// absmax to the codes; larger blocks stream their other groups through the absmax and load them again for the
// codes (from L1 or L2). Then: the block's absmax over its P lanes, the scale, and per group the codes by
// quantizeCode or quantizeCodeStochastic and the new residuals. Groups move as 16-byte vectors where they are
// aligned (the input is any element-aligned tensor, and the residual follows its layout), else element by element.
// The quotients are quotientRn's, whose codes are the division's (host/quant_math.h), so the result equals
// host/quant_ref.cc's quantizeGradTyped.

// Groups a lane holds from the absmax to the codes: four, or two with residuals (their words double a group's
// registers; four groups with residuals spill some 200 bytes a thread at 80 registers).
template <bool kResidual>
constexpr int kGradKeptGroups = kResidual ? 2 : 4;

struct GradArgsDev : QuantArgs {  // QuantArgs' geometry; blockShift and groupShift unused
  int blockSize;
  int blockLanes;  // P: lanes a block, min(blockSize / 32, 32), a power of two
  GradQuantLaunch grad;
};

template <class T, int N>
__device__ __forceinline__ bool groupVectors(const T* p, size_t e, size_t count) {
  return e + N <= count && (reinterpret_cast<uintptr_t>(p + e) & 15) == 0;
}

// A group's elements and residuals as loaded, before any use: the loads of several groups are issued before the
// first of them is waited on.
template <class Type, bool kResidual>
struct GradGroupWords {
  alignas(16) typename Type::Bits elems[kGradGroup];  // alignas: the vector loads write them as uint4
  alignas(16) uint16_t residuals[kResidual ? kGradGroup : 1];
};

// Elements [e, e + 8) and their residuals, 0 past the end.
template <class Type, bool kResidual>
__device__ __forceinline__ void loadGradGroup(const GradArgsDev& a, const char* in, const uint16_t* res, size_t e,
                                              GradGroupWords<Type, kResidual>& g) {
  using Bits = typename Type::Bits;
  const Bits* elems = reinterpret_cast<const Bits*>(in);
  if (groupVectors<Bits, kGradGroup>(elems, e, a.count)) {
    constexpr int kVecs = kGradGroup * sizeof(Bits) / 16;
#pragma unroll
    for (int i = 0; i < kVecs; ++i)
      reinterpret_cast<uint4*>(g.elems)[i] = __ldg(reinterpret_cast<const uint4*>(elems + e) + i);
  } else {
#pragma unroll
    for (int k = 0; k < kGradGroup; ++k) g.elems[k] = e + k < a.count ? __ldg(elems + e + k) : Bits{0};
  }
  if constexpr (kResidual) {
    if (groupVectors<uint16_t, kGradGroup>(res, e, a.count)) {
      *reinterpret_cast<uint4*>(g.residuals) = *reinterpret_cast<const uint4*>(res + e);
    } else {
#pragma unroll
      for (int k = 0; k < kGradGroup; ++k) g.residuals[k] = e + k < a.count ? res[e + k] : 0;
    }
  }
}

// The group's values as fp32, residual added (elements past the segment's count: 0).
template <class Type, bool kResidual>
__device__ __forceinline__ void gradGroupValues(const GradGroupWords<Type, kResidual>& g, size_t e, size_t count,
                                                float (&x)[kGradGroup]) {
#pragma unroll
  for (int k = 0; k < kGradGroup; ++k) {
    x[k] = Type::toFloat(g.elems[k]);
    if constexpr (kResidual) {
      if (e + k < count) x[k] = withResidual(x[k], g.residuals[k]);
    }
  }
}

// What the codes of one block need: its scale and the reciprocal, and which path its groups take.
struct GradBlockScale {
  float scale, rcp, qmax;
  bool fast;      // the quotient from the reciprocal (quotientRn) gives the division's codes
  bool straight;  // gradScaleIsFast: device/grad_rounding.h's straight-line groups
};

// A group's packed codes and new residuals (bf16 pairs, element 2i in the low half of word i).
struct GradGroupOut {
  uint2 codes;
  uint4 residuals;
};

// roundGradGroup for blocks that fail gradScaleIsFast (a zero, NaN, tiny or near-FLT_MAX scale): element by element,
// as the host reference does. Out of line, so that its divisions and saturation checks cost the hot loop no
// registers; `valid`: the group's elements below the segment's count (the others get code 0).
template <int Bits, bool kStochastic, bool kResidual>
__device__ __noinline__ GradGroupOut roundGradGroupByElement(float4 x0, float4 x1, int valid, float scale, float rcp,
                                                             float qmax, bool fast, uint4 random) {
  const float x[kGradGroup] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
  const Philox4x32 r{{random.x, random.y, random.z, random.w}};
  uint32_t c[kGradGroup];
#pragma unroll
  for (int k = 0; k < kGradGroup; ++k) {
    c[k] = gradElementCode<kStochastic>(x[k], scale, rcp, qmax, fast, gradRandom16(r, k));
    if (k >= valid) c[k] = 0;
  }
  GradGroupOut out{packCodes<Bits, kGradGroup>(c), make_uint4(0, 0, 0, 0)};
  if constexpr (kResidual) {
    uint32_t w[kGradGroup / 2];
#pragma unroll
    for (int i = 0; i < kGradGroup / 2; ++i) {
      w[i] = residualAfter<Bits>(x[2 * i], c[2 * i], scale) |
             static_cast<uint32_t>(residualAfter<Bits>(x[2 * i + 1], c[2 * i + 1], scale)) << 16;
    }
    out.residuals = make_uint4(w[0], w[1], w[2], w[3]);
  }
  return out;
}

// The codes and new residuals of the group at element e (a multiple of 8, below the segment's count) whose values
// (residual added) are x; stores both.
template <class Type, int Bits, bool kStochastic, bool kResidual>
__device__ __forceinline__ void roundGradGroup(const GradArgsDev& a, const float (&x)[kGradGroup], size_t e,
                                               const GradBlockScale& b, uint32_t slice, unsigned char* codes,
                                               uint16_t* res) {
  Philox4x32 r{};
  if constexpr (kStochastic) r = gradRandomGroup(a.grad.key, slice, (a.grad.firstElem + e) >> 3);
  const bool whole = e + kGradGroup <= a.count;
  GradGroupOut out;
  if (b.straight) {
    uint32_t c[kGradGroup];
    gradGroupCodes<kStochastic>(x, b.scale, b.rcp, b.qmax, r, c);
    if (!whole) {
#pragma unroll
      for (int k = 0; k < kGradGroup; ++k) c[k] = e + k < a.count ? c[k] : 0;
    }
    out.codes = packCodes<Bits, kGradGroup>(c);
    if constexpr (kResidual) {
      uint32_t w[kGradGroup / 2];
      gradGroupResiduals<Bits>(x, c, b.scale, w);
      out.residuals = make_uint4(w[0], w[1], w[2], w[3]);
    }
  } else {
    const int valid = whole ? kGradGroup : static_cast<int>(a.count - e);
    out = roundGradGroupByElement<Bits, kStochastic, kResidual>(
        make_float4(x[0], x[1], x[2], x[3]), make_float4(x[4], x[5], x[6], x[7]), valid, b.scale, b.rcp, b.qmax, b.fast,
        make_uint4(r.v[0], r.v[1], r.v[2], r.v[3]));
  }
  if constexpr (kResidual) {
    if (groupVectors<uint16_t, kGradGroup>(res, e, a.count)) {
      *reinterpret_cast<uint4*>(res + e) = out.residuals;
    } else {
      const uint32_t w[kGradGroup / 2] = {out.residuals.x, out.residuals.y, out.residuals.z, out.residuals.w};
#pragma unroll
      for (int k = 0; k < kGradGroup; ++k) {
        if (e + k < a.count) res[e + k] = static_cast<uint16_t>(w[k >> 1] >> (16 * (k & 1)));
      }
    }
  }
  if constexpr (Bits == 8) {
    *reinterpret_cast<uint2*>(codes + e) = out.codes;
  } else {
    *reinterpret_cast<uint32_t*>(codes + e / 2) = out.codes.x;
  }
}

template <class Type, int Bits, bool kStochastic, bool kResidual>
__global__ void __launch_bounds__(kCtaThreads, 3) quantizeGradKernel(const GradArgsDev a) {
  constexpr int kWarps = kCtaThreads / 32;
  const int lane = threadIdx.x & 31;
  const int lanes = a.blockLanes;
  const int sub = lane & (lanes - 1);  // the lane's place among its block's lanes
  const size_t blocksPerWarp = 32 / lanes;
  const size_t groupStep = static_cast<size_t>(lanes) * kGradGroup;  // elements between a lane's groups
  const float qmax = static_cast<float>(quantMax(Bits));
  if (!peerEnter(a.sync)) return;
  for (int seg = blockIdx.y; seg < a.batch; seg += gridDim.y) {
    const char* in = a.input + seg * a.inputStride;
    char* payload = a.payload + seg * a.payloadStride;
    float* scales = reinterpret_cast<float*>(payload);
    unsigned char* codes = reinterpret_cast<unsigned char*>(payload + a.scaleBytes);
    uint16_t* res = kResidual ? a.grad.residual + seg * a.grad.residualStrideElems : nullptr;
    const uint32_t slice = a.grad.slice0 + static_cast<uint32_t>(seg * a.grad.sliceStride);
    // Trip counts are uniform across the warp (its lanes shuffle): lanes past the last block run with none.
    const size_t warpStep = static_cast<size_t>(gridDim.x) * kWarps * blocksPerWarp;
    for (size_t warpFirst = (static_cast<size_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5)) * blocksPerWarp;
         warpFirst < a.blocks; warpFirst += warpStep) {
      const size_t block = warpFirst + lane / lanes;
      const size_t first = block * a.blockSize;
      const size_t end = block < a.blocks ? min(first + a.blockSize, a.count) : first;
      const size_t mine = first + sub * kGradGroup;  // the lane's first group
      // step 1: the kept groups' loads, all issued before any is used; then the absmax of x (+ residual).
      GradGroupWords<Type, kResidual> kept[kGradKeptGroups<kResidual>];
#pragma unroll
      for (int j = 0; j < kGradKeptGroups<kResidual>; ++j) {
        const size_t e = mine + j * groupStep;
        if (e < end) {
          loadGradGroup<Type, kResidual>(a, in, res, e, kept[j]);
        } else {
          kept[j] = {};
        }
      }
      uint32_t absMax = 0;
#pragma unroll
      for (int j = 0; j < kGradKeptGroups<kResidual>; ++j) {
        float x[kGradGroup];
        gradGroupValues<Type, kResidual>(kept[j], mine + j * groupStep, a.count, x);
#pragma unroll
        for (int k = 0; k < kGradGroup; ++k) absMax = max(absMax, absBits(x[k]));
      }
      for (size_t e = mine + kGradKeptGroups<kResidual> * groupStep; e < end; e += groupStep) {
        GradGroupWords<Type, kResidual> g;
        loadGradGroup<Type, kResidual>(a, in, res, e, g);
        float x[kGradGroup];
        gradGroupValues<Type, kResidual>(g, e, a.count, x);
#pragma unroll
        for (int k = 0; k < kGradGroup; ++k) absMax = max(absMax, absBits(x[k]));
      }
      absMax = logicalWarpReduce(absMax, lanes, MaxOp{});
      if (block >= a.blocks) continue;
      GradBlockScale b;
      b.scale = blockScale(absMax, Bits);
      b.qmax = qmax;
      b.fast = b.scale >= (kStochastic ? kStochasticQuotientMinScale : kQuotientMinScale);
      b.rcp = b.fast ? divRn(1.0f, b.scale) : 0.0f;
      b.straight = gradScaleIsFast<Bits, kStochastic, kResidual>(b.scale);
      if (sub == 0) {
        scales[block] = b.scale;
        if (block == a.blocks - 1) {  // the scales' padding
          for (size_t k = a.blocks; k < a.scaleBytes / sizeof(float); ++k) scales[k] = 0.0f;
        }
      }
      // step 2: codes (zeros past the end) and residuals.
#pragma unroll
      for (int j = 0; j < kGradKeptGroups<kResidual>; ++j) {
        const size_t e = mine + j * groupStep;
        if (e < end) {
          float x[kGradGroup];
          gradGroupValues<Type, kResidual>(kept[j], e, a.count, x);
          roundGradGroup<Type, Bits, kStochastic, kResidual>(a, x, e, b, slice, codes, res);
        }
      }
      for (size_t e = mine + kGradKeptGroups<kResidual> * groupStep; e < end; e += groupStep) {
        GradGroupWords<Type, kResidual> g;
        loadGradGroup<Type, kResidual>(a, in, res, e, g);
        float x[kGradGroup];
        gradGroupValues<Type, kResidual>(g, e, a.count, x);
        roundGradGroup<Type, Bits, kStochastic, kResidual>(a, x, e, b, slice, codes, res);
      }
      // The codes' padding, after the last group, up to the end of the code region.
      if (block == a.blocks - 1) {
        const size_t used = (a.count + kGradGroup - 1) / kGradGroup * kGradGroup * Bits / 8;
        for (size_t k = used + sub; k < a.codeBytes; k += lanes) codes[k] = 0;
      }
    }
  }
  peerLeave(a.sync);
}

template <class Type, int Bits, bool kStochastic, bool kResidual>
zpResult_t launchQuantizeGradKernel(const GradArgsDev& a, KernelStream stream) {
  constexpr auto kKernel = quantizeGradKernel<Type, Bits, kStochastic, kResidual>;
  if (stream.loadOnly) return loadKernel<kKernel>();
  const size_t blocksPerCta = kCtaThreads / 32 * (32 / a.blockLanes);
  dim3 grid;
  ZPCHECK(gridFor<kKernel>((a.blocks + blocksPerCta - 1) / blocksPerCta, a.batch, kCtaThreads, 0, stream, &grid));
  kKernel<<<grid, kCtaThreads, 0, stream.stream>>>(a);
  CUDACHECK(cudaGetLastError());
  return zpSuccess;
}

// One kernel per rounding and residual; a load (KernelStream::loadOnly) loads all four.
template <class Type, int Bits>
zpResult_t launchQuantizeGradTyped(const GradArgsDev& a, KernelStream stream) {
  if (stream.loadOnly) {
    ZPCHECK((launchQuantizeGradKernel<Type, Bits, false, false>(a, stream)));
    ZPCHECK((launchQuantizeGradKernel<Type, Bits, false, true>(a, stream)));
    ZPCHECK((launchQuantizeGradKernel<Type, Bits, true, false>(a, stream)));
    return launchQuantizeGradKernel<Type, Bits, true, true>(a, stream);
  }
  const bool residual = a.grad.residual != nullptr;
  if (a.grad.stochastic) {
    return residual ? launchQuantizeGradKernel<Type, Bits, true, true>(a, stream)
                    : launchQuantizeGradKernel<Type, Bits, true, false>(a, stream);
  }
  return residual ? launchQuantizeGradKernel<Type, Bits, false, true>(a, stream)
                  : launchQuantizeGradKernel<Type, Bits, false, false>(a, stream);
}

template <auto Kernel>
zpResult_t launchQuantizeKernel(const QuantArgs& a, int threads, size_t smem, size_t ctasPerSegment,
                                KernelStream stream) {
  if (stream.loadOnly) return loadKernel<Kernel>();
  if (smem > 0) ZPCHECK(allowSharedMemory<Kernel>(smem));
  dim3 grid;
  ZPCHECK(gridFor<Kernel>(ctasPerSegment, a.batch, threads, smem, stream, &grid));
  Kernel<<<grid, threads, smem, stream.stream>>>(a);
  CUDACHECK(cudaGetLastError());
  return zpSuccess;
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

template <class Type, int Bits>
zpResult_t quantizeTyped(QuantArgs a, bool aligned, KernelStream stream) {
  return aligned ? launchQuantizeShift<Type, Bits, true>(a, stream) : launchQuantizeShift<Type, Bits, false>(a, stream);
}

template <class Type, int Bits, bool kAligned>
zpResult_t launchDequantizeKernel(const DequantArgs& a, KernelStream stream) {
  constexpr auto kKernel = dequantizeKernel<Type, Bits, kAligned>;
  if (stream.loadOnly) return loadKernel<kKernel>();
  dim3 grid;
  ZPCHECK(gridFor<kKernel>(a.tiles, a.batch, kCtaThreads, 0, stream, &grid));
  kKernel<<<grid, kCtaThreads, 0, stream.stream>>>(a);
  CUDACHECK(cudaGetLastError());
  return zpSuccess;
}

template <class Type, int Bits>
zpResult_t dequantizeTyped(DequantArgs a, bool aligned, KernelStream stream) {
  return aligned ? launchDequantizeKernel<Type, Bits, true>(a, stream)
                 : launchDequantizeKernel<Type, Bits, false>(a, stream);
}

// One dispatch over type x bits for both directions.
template <template <class, int> class Launch, class Args>
zpResult_t dispatch(zpDataType_t type, int bits, const Args& a, bool aligned, KernelStream stream) {
  switch (type) {
    case zpFloat16:
      return bits == 8 ? Launch<Fp16Type, 8>::run(a, aligned, stream) : Launch<Fp16Type, 4>::run(a, aligned, stream);
    case zpBfloat16:
      return bits == 8 ? Launch<Bf16Type, 8>::run(a, aligned, stream) : Launch<Bf16Type, 4>::run(a, aligned, stream);
    default:
      return bits == 8 ? Launch<Fp32Type, 8>::run(a, aligned, stream) : Launch<Fp32Type, 4>::run(a, aligned, stream);
  }
}

template <class Type, int Bits>
struct QuantizeLaunch {
  static zpResult_t run(const QuantArgs& a, bool aligned, KernelStream s) {
    return quantizeTyped<Type, Bits>(a, aligned, s);
  }
};
template <class Type, int Bits>
struct DequantizeLaunch {
  static zpResult_t run(const DequantArgs& a, bool aligned, KernelStream s) {
    return dequantizeTyped<Type, Bits>(a, aligned, s);
  }
};

// True when every segment's elements start 16-byte aligned (the kernels then skip the fallback paths).
bool segmentsAligned(const void* base, size_t strideBytes, int batch) {
  return reinterpret_cast<uintptr_t>(base) % kVecBytes == 0 && (batch <= 1 || strideBytes % kVecBytes == 0);
}

zpResult_t checkCommon(const char* call, const void* elems, const void* payload, size_t payloadStride,
                       zpDataType_t type, int bits, int blockSize, int batch) {
  if (!isQuantType(type)) return ZP_ERR(zpInvalidArgument, "%s : invalid type %d", call, static_cast<int>(type));
  if (!isValidBits(bits)) return ZP_ERR(zpInvalidArgument, "%s : invalid bits %d (4 or 8)", call, bits);
  if (!isValidBlockSize(blockSize)) {
    return ZP_ERR(zpInvalidArgument, "%s : invalid blockSize %d (a power of two in [32, 8192])", call, blockSize);
  }
  if (batch < 0) return ZP_ERR(zpInvalidArgument, "%s : invalid batch %d", call, batch);
  if (reinterpret_cast<uintptr_t>(payload) % kPayloadAlign != 0) {
    return ZP_ERR(zpInvalidArgument, "%s : payload %p is not 16-byte aligned", call, payload);
  }
  if (payloadStride % kPayloadAlign != 0) {
    return ZP_ERR(zpInvalidArgument, "%s : payload stride %zu is not a multiple of 16", call, payloadStride);
  }
  if (reinterpret_cast<uintptr_t>(elems) % typeSize(type) != 0) {
    return ZP_ERR(zpInvalidArgument, "%s : buffer %p is not aligned to its %s elements", call, elems, typeName(type));
  }
  return zpSuccess;
}

// The checks and the geometry shared by both quantize launchers; *empty when there is nothing to launch.
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

zpResult_t launchQuantizeGrad(const void* input, void* payload, size_t count, zpDataType_t type, int bits,
                              int blockSize, const GradQuantLaunch& grad, KernelStream stream, int batch,
                              size_t inputStrideElems, size_t payloadStrideBytes) {
  if (grad.firstElem % kGradGroup != 0 || reinterpret_cast<uintptr_t>(grad.residual) % 2 != 0) {
    return ZP_ERR(zpInvalidArgument, "quantize : first element %zu is not a multiple of 8 or residual %p misaligned",
                  grad.firstElem, static_cast<const void*>(grad.residual));
  }
  GradArgsDev a;
  bool empty = false;
  ZPCHECK(quantArgsOf("quantize (gradient rounding)", input, payload, count, type, bits, blockSize, stream, batch,
                      inputStrideElems, payloadStrideBytes, &a, &empty));
  if (empty) return zpSuccess;
  a.blockShift = a.groupShift = 0;
  a.blockSize = blockSize;
  a.blockLanes = std::min(blockSize / 32, 32);
  a.grad = grad;
  switch (type) {
    case zpFloat16:
      return bits == 8 ? launchQuantizeGradTyped<Fp16Type, 8>(a, stream)
                       : launchQuantizeGradTyped<Fp16Type, 4>(a, stream);
    case zpBfloat16:
      return bits == 8 ? launchQuantizeGradTyped<Bf16Type, 8>(a, stream)
                       : launchQuantizeGradTyped<Bf16Type, 4>(a, stream);
    default:
      return bits == 8 ? launchQuantizeGradTyped<Fp32Type, 8>(a, stream)
                       : launchQuantizeGradTyped<Fp32Type, 4>(a, stream);
  }
}

}  // namespace zp
