// Reductions over a logical warp: an aligned group of LogicalWarpThreads lanes of one warp (a power of two, 1 to
// 32), each group of the warp reduced on its own, every lane of a group getting its group's result. The shape of
// CUB's WarpReduce: the width a template parameter where the kernel knows it at compile time (constant shuffle
// offsets, unrolled), a run-time width where it does not, the operator a functor. Every lane of the warp must call
// together, lanes with no work included: the shuffles take the full mask.
#pragma once

#include <cstdint>

namespace zp {

constexpr unsigned kFullMask = 0xffffffffu;  // every lane of the warp takes part

struct MaxOp {
  template <class T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return max(a, b);
  }
};

struct OrOp {
  template <class T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a | b;
  }
};

/// @tparam LogicalWarpThreads lanes of a group: a power of two from 1 to 32
/// @param v this lane's value
/// @param op associative and commutative binary functor
template <int LogicalWarpThreads, class T, class Op>
__device__ __forceinline__ T logicalWarpReduce(T v, Op op) {
  static_assert(
      LogicalWarpThreads >= 1 && LogicalWarpThreads <= 32 && (LogicalWarpThreads & (LogicalWarpThreads - 1)) == 0,
      "a logical warp is a power of two of lanes, at most 32");
#pragma unroll
  for (int s = LogicalWarpThreads >> 1; s > 0; s >>= 1) v = op(v, __shfl_xor_sync(kFullMask, v, s));
  return v;
}

/// The same with the width known at run time only.
/// @param lanes lanes of a group: a power of two from 1 to 32, the same in every lane of the warp
template <class T, class Op>
__device__ __forceinline__ T logicalWarpReduce(T v, int lanes, Op op) {
  for (int s = lanes >> 1; s > 0; s >>= 1) v = op(v, __shfl_xor_sync(kFullMask, v, s));
  return v;
}

/// Maximum of unsigned words over the logical warp; a whole warp takes one redux.sync on sm_80 and later.
template <int LogicalWarpThreads>
__device__ __forceinline__ uint32_t logicalWarpMax(uint32_t v) {
#if __CUDA_ARCH__ >= 800
  if constexpr (LogicalWarpThreads == 32) {
    return __reduce_max_sync(kFullMask, v);
  } else
#endif
  {
    return logicalWarpReduce<LogicalWarpThreads>(v, MaxOp{});
  }
}

/// The same with the width known at run time only (`lanes` as logicalWarpReduce's).
__device__ __forceinline__ uint32_t logicalWarpMax(uint32_t v, int lanes) {
#if __CUDA_ARCH__ >= 800
  if (lanes == 32) return __reduce_max_sync(kFullMask, v);
#endif
  return logicalWarpReduce(v, lanes, MaxOp{});
}

}  // namespace zp
