// Where a device/ kernel is launched: a stream, the SMs its grid may fill there, and how it takes part in a
// direct-load call (device/peer_sync.h).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "device/peer_sync.h"
#include "host/base/check.h"
#include "include/zpccl.h"

namespace zp {

/**
 * @brief A stream plus the number of SMs that kernels launched on it can use, and optionally how its kernels take
 *        part in a direct-load call (`sync`). Streams of a green context (the chunk pipelines' quantize and finish
 *        stages, src/cuda/green_context.h) see only part of the device; their grids are sized to that part, since a
 *        grid sized for the whole device would leave its last wave on few SMs. Converts implicitly from a plain
 *        stream, which sees the whole device.
 */
struct KernelStream {
  // NOLINTNEXTLINE(google-explicit-constructor): a plain stream is a KernelStream of the whole device
  KernelStream(cudaStream_t s = nullptr, int smCount = 0) : stream(s), sms(smCount) {}

  cudaStream_t stream;
  int sms;        ///< SMs usable on `stream`; 0: every SM of the current device
  PeerSync sync;  ///< the kernels that take it (quantize, dequantize, the reduce kernels): see PeerSync
  /// Launch nothing: only load the kernel that the call would launch (src/cuda/cuda_backend.cc, loadKernels).
  bool loadOnly = false;
};

#ifdef __CUDACC__
/// What a launcher does in place of a launch under KernelStream::loadOnly: loads Kernel (cudaFuncGetAttributes
/// loads a lazily loaded kernel).
template <auto Kernel>
zpResult_t loadKernel() {
  cudaFuncAttributes attributes;
  CUDACHECK(cudaFuncGetAttributes(&attributes, Kernel));
  return zpSuccess;
}
#endif

/// SMs that grids launched on `s` should fill: s.sms, or the current device's SM count when it is 0.
inline cudaError_t kernelStreamSms(const KernelStream& s, int* sms) {
  if (s.sms > 0) {
    *sms = s.sms;
    return cudaSuccess;
  }
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  return cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, device);
}

}  // namespace zp
