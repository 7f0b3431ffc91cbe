// 16-byte vectors of elements, as the quantization kernels load and store them (four 32-bit words a vector), and
// the fallbacks for element pointers that are not 16-byte aligned: the widest access the address allows, and
// element-wise tails at a segment's end.
#pragma once

#include <cstddef>
#include <cstdint>

#include "device/quantize_args.h"  // kVecBytes, vecElems

namespace zp {

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

}  // namespace zp
