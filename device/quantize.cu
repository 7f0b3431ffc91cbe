// Block quantization kernels (format: include/zpccl.h; arithmetic: host/quant_math.h, shared with the host
// reference so that payloads and outputs are bit-identical).
//
// Quantize: a group of P threads owns one quantization block of G elements; each thread takes kVecsPerThread
// 16-byte vectors of it (vector j of the group's thread t is the block's vector j * P + t, so each load step of
// a group covers P * 16 contiguous bytes). P = G / (16 elements for fp32, 32 for fp16/bf16): groups of 1 to 32
// threads share a warp (256-thread CTAs hold several), groups of 64 to 512 threads are a whole CTA.
// The block is read from global memory once and parked in the thread's shared-memory slots (loads land there
// without holding registers: 64 registers, 4 CTAs per SM, no spills); it is then read twice from shared memory:
// absmax (reduced over the group with shuffles, across warps through shared memory), then the codes. Codes use
// a reciprocal multiply that provably gives the division's result, the division only in a guard band
// (quantizeCodeFast). CTA-sized groups pipeline their blocks with cp.async so that loads stay in flight while
// the CTA meets at its barrier.
// Dequantize needs no reduction: each CTA step covers 256 * kVecsPerThread contiguous output vectors; each
// thread reads its vectors' codes and scales.
// Misaligned element pointers (an fp16 tensor at an odd element, say): quantize loads with the widest access
// the address allows (8, 4 or 2 bytes); dequantize stores whole aligned 16-byte windows, each lane combining
// its vector with its neighbour's (shuffles). Segments that are all 16-byte aligned run kernels without these
// paths. Payloads are always 16-byte aligned.
#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "device/quantize.h"
#include "host/dtype.h"
#include "host/quant_format.h"
#include "host/quant_math.h"
#include "src/check.h"

namespace zp {
namespace {

constexpr int kVecBytes = 16;          // one vector access
constexpr int kVecsPerThread = 4;      // 64 bytes per thread in flight
constexpr int kCtaThreads = 256;       // CTA size, except when one group is a whole CTA
constexpr int kMaxGroupThreads = 512;  // fp32 with 8192-element blocks
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kStages = 2;  // quantize, blocks of a whole CTA: shared-memory pipeline depth
#if __CUDA_ARCH__ >= 800 || !defined(__CUDA_ARCH__)
constexpr bool kAsyncCopy = true;  // cp.async (sm_80+)
#else
constexpr bool kAsyncCopy = false;
#endif
constexpr bool kPackedAbsMax = true;  // fp16/bf16 absmax on packed pairs

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
};

int log2Int(size_t v) {
  int s = 0;
  while ((size_t{1} << s) < v) ++s;
  return s;
}

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

// Max over the aligned group of `groupThreads` (<= 32) lanes of a warp; every lane of the warp calls it.
__device__ __forceinline__ uint32_t groupMax(uint32_t v, int groupThreads) {
#if __CUDA_ARCH__ >= 800
  if (groupThreads == 32) return __reduce_max_sync(kFullMask, v);
#endif
  for (int s = groupThreads >> 1; s > 0; s >>= 1) v = max(v, __shfl_xor_sync(kFullMask, v, s));
  return v;
}

// ---- quantize ------------------------------------------------------------------------------------------------

// The V codes of one vector, packed (int8: V bytes; int4: V / 2 bytes, element 2i in the low nibble).
template <int Bits, int V>
__device__ __forceinline__ uint2 packCodes(const uint32_t (&c)[V]) {
  uint32_t words[2] = {0, 0};
  if constexpr (Bits == 8) {
#pragma unroll
    for (int k = 0; k < V / 4; ++k) {
      words[k] = __byte_perm(__byte_perm(c[4 * k], c[4 * k + 1], 0x0040),
                             __byte_perm(c[4 * k + 2], c[4 * k + 3], 0x0040), 0x5410);
    }
  } else {
#pragma unroll
    for (int k = 0; k < V / 2; ++k) words[0] |= packInt4Pair(c[2 * k], c[2 * k + 1]) << (8 * k);
  }
  return make_uint2(words[0], words[1]);
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

// The packed codes of one vector by division: blocks whose scale is 0, subnormal or NaN, and the rare vectors
// the fast path flags. Out of line, so that its division calls stay out of the hot loop's register budget.
template <class Type, int Bits>
__device__ __noinline__ uint2 quantizeVecExact(uint4 x, float scale) {
  constexpr int V = vecElems<Type>();
  const uint32_t v[4] = {x.x, x.y, x.z, x.w};
  uint32_t c[V];
#pragma unroll
  for (int i = 0; i < V; ++i) c[i] = quantizeCode(Type::toFloat(getElem<Type>(v, i)), scale, Bits == 8 ? 127.0f : 7.0f);
  return packCodes<Bits, V>(c);
}

// The thread's vector j of the current block, from its pipeline-stage slots (stride: the CTA's thread count).
__device__ __forceinline__ void readVec(const uint4* mine, int j, uint32_t (&v)[4]) {
  const uint4 x = mine[j * blockDim.x];
  v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
}

// max |x| over the thread's elements of the block, NaN if one is NaN.
template <class Type>
__device__ __forceinline__ float threadAbsMax(const uint4* mine) {
  float m = 0.0f;
#pragma unroll
  for (int j = 0; j < kVecsPerThread; ++j) {
    uint32_t v[4];
    readVec(mine, j, v);
#if __CUDA_ARCH__ >= 800
    if constexpr (kPackedAbsMax && sizeof(typename Type::Bits) == 2) {
      // Two elements an instruction; the max of the widened values equals the widened max (exact, monotone).
      using Pair = typename std::conditional<std::is_same<Type, Fp16Type>::value, __half2, __nv_bfloat162>::type;
      Pair p[4];
      memcpy(p, v, sizeof(p));
      const Pair pm = __hmax2_nan(__hmax2_nan(__habs2(p[0]), __habs2(p[1])), __hmax2_nan(__habs2(p[2]), __habs2(p[3])));
      m = maxAbsNaN(maxAbsNaN(m, __low2float(pm)), __high2float(pm));
    } else
#endif
    {
#pragma unroll
      for (int i = 0; i < vecElems<Type>(); ++i) m = maxAbsNaN(m, Type::toFloat(getElem<Type>(v, i)));
    }
  }
  return m;
}

// Steps 2 to 4 for one block whose vectors sit in the thread's stage slots.
template <class Type, int Bits, bool kCtaGroup>
__device__ __forceinline__ void quantizeBlock(const QuantArgs a, const uint4* mine, size_t block, int lane,
                                              float* scales, char* codes, uint32_t (&warpMax)[2][kMaxGroupThreads / 32],
                                              int& parity) {
  constexpr int V = vecElems<Type>();
  const int groupThreads = 1 << a.groupShift;

  // step 2: absmax of the block: the thread's elements, then the group (NaN and Inf order above all).
  uint32_t absMax = groupMax(__float_as_uint(threadAbsMax<Type>(mine)) & kF32AbsMask, min(groupThreads, 32));
  if constexpr (kCtaGroup) {  // the CTA is the group: combine its warps
    if ((threadIdx.x & 31) == 0) warpMax[parity][threadIdx.x >> 5] = absMax;
    __syncthreads();
    for (int k = 0; k < (groupThreads >> 5); ++k) absMax = max(absMax, warpMax[parity][k]);
    parity ^= 1;
  }

  // step 3: the scale; the group's first thread stores it (and the scale region's zero padding).
  const float scale = blockScale(absMax, Bits);
  if (lane == 0 && block < a.blocks) {
    scales[block] = scale;
    if (block == a.blocks - 1) {
      for (size_t k = a.blocks; k < a.scaleBytes / sizeof(float); ++k) scales[k] = 0.0f;
    }
  }

  // step 4: codes, re-reading each vector. Elements past the end are zeros, hence code 0: the codes' padding.
  // A normal scale takes the reciprocal fast path (same codes as the division, see quantizeCodeFast).
  const bool fast = scale >= __uint_as_float(kF32MinNormal);  // false for 0, subnormal and NaN scales
  const float rcp = fast ? __frcp_rn(scale) : 0.0f;
  const size_t blockStart = block << a.blockShift;
#pragma unroll
  for (int j = 0; j < kVecsPerThread; ++j) {
    const size_t e0 = blockStart + static_cast<size_t>((j << a.groupShift) + lane) * V;
    const size_t codeOffset = e0 * Bits / 8;
    if (codeOffset >= a.codeBytes) continue;  // past the padded code region (or no block)
    uint32_t v[4], c[V];
    readVec(mine, j, v);
    float fracMax = fast ? 0.0f : 1.0f;
    if (fast) {
#pragma unroll
      for (int i = 0; i < V; ++i) c[i] = quantizeCodeFast(Type::toFloat(getElem<Type>(v, i)), rcp, fracMax);
    }
    uint2 packed = packCodes<Bits, V>(c);
    if (fracMax >= kFastPathFrac) packed = quantizeVecExact<Type, Bits>(make_uint4(v[0], v[1], v[2], v[3]), scale);
    storePacked<Bits, V>(codes + codeOffset, packed);
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

// Starts the copies of the thread's vectors of a whole block (no tail: nothing is read past the segment's end)
// into its slots of one pipeline stage. Each thread later reads back only its own slots: no barrier needed.
template <class Type>
__device__ __forceinline__ void issueThreadVectors(uint4* mine, const char* in, size_t blockStart, int groupShift,
                                                   int lane) {
  constexpr int V = vecElems<Type>();
#pragma unroll
  for (int j = 0; j < kVecsPerThread; ++j) {
    const size_t e0 = blockStart + static_cast<size_t>((j << groupShift) + lane) * V;
    copyAsync16(mine + j * blockDim.x, in + e0 * sizeof(typename Type::Bits));
  }
}

// Misaligned segments: the thread's vectors through registers (the widest loads the address allows) into its
// stage slots, so that both paths quantize from shared memory.
template <class Type>
__device__ __forceinline__ void loadThreadVectors(uint4* mine, const char* in, size_t count, int align,
                                                  size_t blockStart, int groupShift, int lane) {
  constexpr int V = vecElems<Type>();
  uint32_t w[kVecsPerThread][4];
#pragma unroll
  for (int j = 0; j < kVecsPerThread; ++j) {
    const size_t e0 = blockStart + static_cast<size_t>((j << groupShift) + lane) * V;
    if (e0 + V <= count) {
      loadVec(in + e0 * sizeof(typename Type::Bits), align, w[j]);
    } else if (e0 < count) {
      loadTail<Type>(in + e0 * sizeof(typename Type::Bits), count - e0, w[j]);
    } else {
      w[j][0] = w[j][1] = w[j][2] = w[j][3] = 0;
    }
  }
#pragma unroll
  for (int j = 0; j < kVecsPerThread; ++j) mine[j * blockDim.x] = make_uint4(w[j][0], w[j][1], w[j][2], w[j][3]);
}

template <class Type, int Bits, bool kCtaGroup, bool kAligned>
__global__ void __launch_bounds__(kCtaGroup ? kMaxGroupThreads : kCtaThreads, kCtaGroup ? 2 : 4)
    quantizeKernel(const QuantArgs a) {
  extern __shared__ uint4 stages[];  // [kStages][kVecsPerThread][blockDim.x]
  const int lane = threadIdx.x & ((1 << a.groupShift) - 1);
  const size_t groupsPerCta = blockDim.x >> a.groupShift;
  const size_t group = threadIdx.x >> a.groupShift;
  const size_t stride = gridDim.x * groupsPerCta;
  const int stageVecs = kVecsPerThread * blockDim.x;
  uint4* const mine = stages + threadIdx.x;               // slot j of stage s: mine[s * stageVecs + j * blockDim.x]
  __shared__ uint32_t warpMax[2][kMaxGroupThreads / 32];  // double-buffered: one barrier per block
  int parity = 0;

  for (int seg = blockIdx.y; seg < a.batch; seg += gridDim.y) {
    const char* in = a.input + seg * a.inputStride;
    char* out = a.payload + seg * a.payloadStride;
    float* scales = reinterpret_cast<float*>(out);
    char* codes = out + a.scaleBytes;
    const int align = kAligned ? 16 : accessAlign(in);  // kAligned: every segment starts 16-byte aligned
    // Trip counts are uniform across the CTA (barriers, full-warp shuffles): trailing groups run with no block.
    size_t first = blockIdx.x * groupsPerCta;
    // step 1, blocks of a whole CTA: a pipeline of kStages blocks per CTA, the copies of kStages - 1 of them in
    // flight (in shared memory, not registers) while one is quantized and the CTA waits at its barrier. Blocks
    // with a tail are left to the direct loop below. Measured on H200: the pipeline pays for blocks of a whole
    // CTA; for warp-sized groups direct loads are as fast or faster.
    if (kCtaGroup && kAsyncCopy && align == 16) {
      const size_t wholeBlocks = a.count >> a.blockShift;  // groupsPerCta == 1 here
#pragma unroll
      for (int s = 0; s < kStages - 1; ++s) {
        const size_t b = first + s * stride;
        if (b < wholeBlocks) issueThreadVectors<Type>(mine + s * stageVecs, in, b << a.blockShift, a.groupShift, lane);
        commitAsync();
      }
#pragma unroll 1
      for (int s = 0; first < wholeBlocks; first += stride, s = s + 1 == kStages ? 0 : s + 1) {
        const size_t ahead = first + (kStages - 1) * stride;
        if (ahead < wholeBlocks) {
          const int slot = s == 0 ? kStages - 1 : s - 1;  // the stage read in the previous step
          issueThreadVectors<Type>(mine + slot * stageVecs, in, ahead << a.blockShift, a.groupShift, lane);
        }
        commitAsync();
        waitAsync<kStages - 1>();  // this step's block has landed
        quantizeBlock<Type, Bits, kCtaGroup>(a, mine + s * stageVecs, first, lane, scales, codes, warpMax, parity);
      }
      waitAsync<0>();
    }
    // step 1, otherwise: the widest loads the address allows, through registers into the thread's slots.
#pragma unroll 1
    for (; first < a.blocks; first += stride) {
      loadThreadVectors<Type>(mine, in, a.count, align, (first + group) << a.blockShift, a.groupShift, lane);
      quantizeBlock<Type, Bits, kCtaGroup>(a, mine, first + group, lane, scales, codes, warpMax, parity);
    }
  }
}

// ---- dequantize ----------------------------------------------------------------------------------------------

template <class Type, int Bits, bool kAligned>
__global__ void __launch_bounds__(kCtaThreads) dequantizeKernel(const DequantArgs a) {
  constexpr int V = vecElems<Type>();
  constexpr int kTileVecs = kCtaThreads * kVecsPerThread;
  using CodeWord =
      typename std::conditional<V * Bits / 8 == 8, uint2,
                                typename std::conditional<V * Bits / 8 == 4, uint32_t, uint16_t>::type>::type;

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
}

// ---- launchers -----------------------------------------------------------------------------------------------

// CTAs of `threads` threads of Kernel that fit on one SM, cached per kernel and CTA size. A sizing hint only:
// any grid is correct.
template <auto Kernel>
zpResult_t residentCtas(int threads, size_t smem, int* perSm) {
  static std::atomic<int> cache[32];
  const int slot = log2Int(threads);
  int n = cache[slot].load(std::memory_order_relaxed);
  if (n == 0) {
    CUDACHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, Kernel, threads, smem));
    if (n < 1) n = 1;
    cache[slot].store(n, std::memory_order_relaxed);
  }
  *perSm = n;
  return zpSuccess;
}

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

// One wave of resident CTAs (grid-stride loops do the rest: an extra partial wave would idle most SMs at the
// end), split over the segments; never more CTAs than a segment has work for.
template <auto Kernel>
zpResult_t gridFor(size_t ctasPerSegment, int batch, int threads, size_t smem, dim3* grid) {
  int device = 0, sms = 0, perSm = 0;
  CUDACHECK(cudaGetDevice(&device));
  CUDACHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  ZPCHECK(residentCtas<Kernel>(threads, smem, &perSm));
  const int gy = batch < 65535 ? batch : 65535;
  const size_t resident = static_cast<size_t>(sms) * perSm;
  size_t gx = resident / gy;
  if (gx > ctasPerSegment) gx = ctasPerSegment;
  if (gx < 1) gx = 1;
  *grid = dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy), 1);
  return zpSuccess;
}

template <class Type, int Bits, bool kCtaGroup, bool kAligned>
zpResult_t launchQuantizeKernel(const QuantArgs& a, int threads, size_t smem, size_t ctasPerSegment,
                                cudaStream_t stream) {
  constexpr auto kKernel = quantizeKernel<Type, Bits, kCtaGroup, kAligned>;
  ZPCHECK(allowSharedMemory<kKernel>(smem / threads * (kCtaGroup ? kMaxGroupThreads : kCtaThreads)));
  dim3 grid;
  ZPCHECK(gridFor<kKernel>(ctasPerSegment, a.batch, threads, smem, &grid));
  kKernel<<<grid, threads, smem, stream>>>(a);
  CUDACHECK(cudaGetLastError());
  return zpSuccess;
}

template <class Type, int Bits>
zpResult_t quantizeTyped(QuantArgs a, bool aligned, cudaStream_t stream) {
  const int groupThreads = 1 << a.groupShift;
  const int threads = groupThreads > 32 ? groupThreads : kCtaThreads;
  const size_t ctasPerSegment = (a.blocks + threads / groupThreads - 1) / (threads / groupThreads);
  const size_t smem = static_cast<size_t>(groupThreads > 32 ? kStages : 1) * kVecsPerThread * kVecBytes * threads;
  if (groupThreads > 32) {
    return aligned ? launchQuantizeKernel<Type, Bits, true, true>(a, threads, smem, ctasPerSegment, stream)
                   : launchQuantizeKernel<Type, Bits, true, false>(a, threads, smem, ctasPerSegment, stream);
  }
  return aligned ? launchQuantizeKernel<Type, Bits, false, true>(a, threads, smem, ctasPerSegment, stream)
                 : launchQuantizeKernel<Type, Bits, false, false>(a, threads, smem, ctasPerSegment, stream);
}

template <class Type, int Bits, bool kAligned>
zpResult_t launchDequantizeKernel(const DequantArgs& a, cudaStream_t stream) {
  constexpr auto kKernel = dequantizeKernel<Type, Bits, kAligned>;
  dim3 grid;
  ZPCHECK(gridFor<kKernel>(a.tiles, a.batch, kCtaThreads, 0, &grid));
  kKernel<<<grid, kCtaThreads, 0, stream>>>(a);
  CUDACHECK(cudaGetLastError());
  return zpSuccess;
}

template <class Type, int Bits>
zpResult_t dequantizeTyped(DequantArgs a, bool aligned, cudaStream_t stream) {
  return aligned ? launchDequantizeKernel<Type, Bits, true>(a, stream)
                 : launchDequantizeKernel<Type, Bits, false>(a, stream);
}

// One dispatch over type x bits for both directions.
template <template <class, int> class Launch, class Args>
zpResult_t dispatch(zpDataType_t type, int bits, const Args& a, bool aligned, cudaStream_t stream) {
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
  static zpResult_t run(const QuantArgs& a, bool aligned, cudaStream_t s) {
    return quantizeTyped<Type, Bits>(a, aligned, s);
  }
};
template <class Type, int Bits>
struct DequantizeLaunch {
  static zpResult_t run(const DequantArgs& a, bool aligned, cudaStream_t s) {
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

}  // namespace

zpResult_t launchQuantize(const void* input, void* payload, size_t count, zpDataType_t type, int bits, int blockSize,
                          cudaStream_t stream, int batch, size_t inputStrideElems, size_t payloadStrideBytes) {
  const size_t payloadBytes = quantPayloadBytes(count, bits, blockSize);
  if (payloadStrideBytes == 0) payloadStrideBytes = payloadBytes;
  ZPCHECK(checkCommon("quantize", input, payload, payloadStrideBytes, type, bits, blockSize, batch));
  if (batch > 1 && payloadStrideBytes < payloadBytes) {
    return ZP_ERR(zpInvalidArgument, "quantize : payload stride %zu is below the payload size %zu", payloadStrideBytes,
                  payloadBytes);
  }
  if (count == 0 || batch == 0) return zpSuccess;
  QuantArgs a;
  a.input = static_cast<const char*>(input);
  a.payload = static_cast<char*>(payload);
  a.count = count;
  a.inputStride = (inputStrideElems == 0 ? count : inputStrideElems) * typeSize(type);
  a.payloadStride = payloadStrideBytes;
  a.blocks = quantBlockCount(count, blockSize);
  a.scaleBytes = quantScaleBytes(count, blockSize);
  a.codeBytes = quantCodeBytes(count, bits);
  a.batch = batch;
  a.blockShift = log2Int(blockSize);
  // Each thread holds kVecsPerThread vectors: 16 (fp32) or 32 (fp16/bf16) elements of its block.
  const int perThread = kVecsPerThread * kVecBytes / static_cast<int>(typeSize(type));
  a.groupShift = a.blockShift - log2Int(perThread);
  return dispatch<QuantizeLaunch>(type, bits, a, segmentsAligned(input, a.inputStride, batch), stream);
}

zpResult_t launchDequantize(const void* payload, void* output, size_t count, zpDataType_t type, int bits, int blockSize,
                            cudaStream_t stream, int batch, size_t payloadStrideBytes, size_t outputStrideElems) {
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
  return dispatch<DequantizeLaunch>(type, bits, a, segmentsAligned(output, a.outputStride, batch), stream);
}

}  // namespace zp
