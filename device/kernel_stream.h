// Where a device/ kernel is launched: a stream, and the SMs its grid may fill there.
#pragma once

#include <cuda_runtime.h>

namespace zp {

/**
 * @brief A stream plus the number of SMs that kernels launched on it can use. Streams of a green context (the
 *        chunk pipelines' quantize and finish stages, src/green_context.h) see only part of the device; their
 *        grids are sized to that part, since a grid sized for the whole device would leave its last wave on
 *        few SMs. Converts implicitly from a plain stream, which sees the whole device.
 */
struct KernelStream {
  // NOLINTNEXTLINE(google-explicit-constructor): a plain stream is a KernelStream of the whole device
  KernelStream(cudaStream_t s = nullptr, int smCount = 0) : stream(s), sms(smCount) {}

  cudaStream_t stream;
  int sms;  ///< SMs usable on `stream`; 0: every SM of the current device
};

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
