// Block quantization with gradient rounding (stochastic rounding, error feedback), qgZ's sender side: one kernel
// per rounding and residual, apart from the plain quantize (device/quantize.cu), which carries nothing of theirs.
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
#include <algorithm>
#include <cstdint>

#include "device/code_pack.h"
#include "device/grad_rounding.h"
#include "device/launch_geometry.h"
#include "device/quantize.h"
#include "device/quantize_args.h"
#include "device/warp_reduce.h"
#include "host/base/check.h"
#include "host/dtype.h"
#include "host/quant_format.h"
#include "host/quant_math.h"

namespace zp {
namespace {

// Groups a lane holds from the absmax to the codes: four, or two with residuals (their words double a group's
// registers, and four groups with residuals spill: perf/KERNELS.md).
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
      absMax = logicalWarpMax(absMax, lanes);
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

// ---- launchers -----------------------------------------------------------------------------------------------

template <class Type, int Bits, bool kStochastic, bool kResidual>
zpResult_t launchQuantizeGradKernel(const GradArgsDev& a, KernelStream stream) {
  // A warp holds 32 / blockLanes blocks (none of which a load-only call has).
  const size_t blocksPerCta = stream.loadOnly ? 1 : kCtaThreads / 32 * (32 / a.blockLanes);
  return launchSegments<quantizeGradKernel<Type, Bits, kStochastic, kResidual>>(
      a, (a.blocks + blocksPerCta - 1) / blocksPerCta, kCtaThreads, 0, stream);
}

// One kernel per rounding and residual; a load (KernelStream::loadOnly) loads all four. dispatch's Launch.
template <class Type, int Bits>
struct QuantizeGradLaunch {
  static zpResult_t run(const GradArgsDev& a, KernelStream stream) {
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
};

}  // namespace

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
  return dispatch<QuantizeGradLaunch>(type, bits, a, stream);
}

}  // namespace zp
