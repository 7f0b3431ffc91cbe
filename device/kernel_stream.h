// Where a device/ kernel is launched: a stream, and the SMs its grid may fill there.
#pragma once

#include <cuda_runtime.h>

namespace zp {

/**
 * @brief A stream plus the number of SMs that kernels launched on it can use, and optionally a word that cancels
 *        them. Streams of a green context Streams of a green context (the
 *        chunk pipelines' quantize and finish stages, src/green_context.h) see only part of the device; their
 *        grids are sized to that part, since a grid sized for the whole device would leave its last wave on
 *        few SMs. Converts implicitly from a plain stream, which sees the whole device.
 *
 *        `cancel` (device memory, or nullptr): the kernels that read other ranks' memory (dequantize, the reduce
 *        kernels) do nothing when the word is nonzero as they start. The direct loads set it before their NCCL
 *        communicator is aborted, which unmaps the peers' windows that the kernels still queued would read
 *        (src/peer_window.h).
 */
struct KernelStream {
  // NOLINTNEXTLINE(google-explicit-constructor): a plain stream is a KernelStream of the whole device
  KernelStream(cudaStream_t s = nullptr, int smCount = 0) : stream(s), sms(smCount) {}

  cudaStream_t stream;
  int sms;                      ///< SMs usable on `stream`; 0: every SM of the current device
  const int* cancel = nullptr;  ///< nonzero as a kernel starts: the kernel does nothing
};

#ifdef __CUDACC__
/// Whether the kernel must do nothing (KernelStream::cancel): one read of the word per CTA, shared by its threads,
/// so that a CTA stops whole (its kernels have block-wide barriers). CTAs that start before the word is set run
/// to the end; a cancelled call's output is undefined anyway.
__device__ __forceinline__ bool kernelCancelled(const int* cancel) {
  if (cancel == nullptr) return false;  // the same for every thread: the argument of the launch
  return __syncthreads_or(threadIdx.x == 0 && *static_cast<const volatile int*>(cancel) != 0) != 0;
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
