// What the quantization kernels share on the host side: their geometry, the arguments of a launch (QuantArgs), the
// checks of a launcher's arguments and the dispatch over element type and code width (device/quantize.cu,
// dequantize.cu, quantize_grad.cu).
#pragma once

#include <cstddef>
#include <cstdint>

#include "device/kernel_stream.h"
#include "device/launch_geometry.h"
#include "host/base/check.h"
#include "host/quant_math.h"  // Fp16Type, Bf16Type, Fp32Type
#include "include/zpccl.h"

namespace zp {

constexpr int kVecBytes = 16;      // one vector access
constexpr int kVecsPerThread = 4;  // 64 bytes per thread in flight
constexpr int kCtaThreads = 256;   // CTA size, except when one group is a whole CTA

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

// True when every segment's elements start 16-byte aligned (the kernels then skip the fallback paths).
bool segmentsAligned(const void* base, size_t strideBytes, int batch);

// The checks every quantize and dequantize launcher makes; messages name `call`.
zpResult_t checkCommon(const char* call, const void* elems, const void* payload, size_t payloadStride,
                       zpDataType_t type, int bits, int blockSize, int batch);

// The checks and the geometry shared by both quantize launchers; *empty when there is nothing to launch.
zpResult_t quantArgsOf(const char* call, const void* input, void* payload, size_t count, zpDataType_t type, int bits,
                       int blockSize, KernelStream stream, int batch, size_t inputStrideElems,
                       size_t payloadStrideBytes, QuantArgs* a, bool* empty);

// One dispatch over type x bits: Launch<Type, Bits>::run(args...).
template <template <class, int> class Launch, class... Args>
zpResult_t dispatch(zpDataType_t type, int bits, const Args&... args) {
  switch (type) {
    case zpFloat16:
      return bits == 8 ? Launch<Fp16Type, 8>::run(args...) : Launch<Fp16Type, 4>::run(args...);
    case zpBfloat16:
      return bits == 8 ? Launch<Bf16Type, 8>::run(args...) : Launch<Bf16Type, 4>::run(args...);
    default:
      return bits == 8 ? Launch<Fp32Type, 8>::run(args...) : Launch<Fp32Type, 4>::run(args...);
  }
}

#ifdef __CUDACC__
// Launches Kernel(a) on CTAs of `threads` threads with `smem` bytes of dynamic shared memory, ctasPerSegment CTAs for
// each of a.batch segments (gridFor, device/launch_geometry.h: at most the CTAs resident on the stream's SMs,
// grid-stride loops beyond); under KernelStream::loadOnly it only loads Kernel.
template <auto Kernel, class Args>
zpResult_t launchSegments(const Args& a, size_t ctasPerSegment, int threads, size_t smem, KernelStream stream) {
  if (stream.loadOnly) return loadKernel<Kernel>();
  dim3 grid;
  ZPCHECK(gridFor<Kernel>(ctasPerSegment, a.batch, threads, smem, stream, &grid));
  Kernel<<<grid, threads, smem, stream.stream>>>(a);
  CUDACHECK(cudaGetLastError());
  return zpSuccess;
}
#endif

}  // namespace zp
