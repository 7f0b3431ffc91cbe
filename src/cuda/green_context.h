// A share of the device's SMs for the chunk pipelines' own kernels (a CUDA green context), so that NCCL finds SMs
// free while they run.
//
// Why: an NCCL kernel's CTA takes 512-640 threads of 96 registers each, nearly a whole SM's register file, so it
// can only start on an SM that none of our CTAs occupy. The quantize and dequantize kernels fill every SM with one
// wave of long-lived CTAs, so on the whole device a chunk's all-gather waits for the next chunk's quantization to
// finish: the stages run one after another. Kernels on the streams below see only the green context's SMs; the others
// stay free for NCCL, which runs on ordinary streams.
#pragma once

#include <cuda_runtime.h>

#include "include/zpccl.h"

namespace zp {

struct GreenStreams {
  cudaStream_t quant = nullptr;  ///< non-blocking streams of the device's green context; null when there is none
  cudaStream_t side = nullptr;   ///< (the pipelines then use every SM)
  int sms = 0;                   ///< SMs of the green context

  bool active() const { return quant != nullptr; }
};

/**
 * @brief Makes two non-blocking streams of `priority` in `device`'s green context: the device's SMs less at least
 *        `leaveFree` (rounded to the device's partition granularity), made by the first call for the device and
 *        shared by every later one. Where that cannot be done (leaveFree <= 0,
 *        a driver without green contexts, a partition too small) it leaves `out` empty and says why at INFO INIT;
 *        that is not an error.
 * @return zpSuccess, or zpUnhandledCudaError when a stream cannot be made in the context.
 */
zpResult_t createGreenStreams(int device, int leaveFree, int priority, GreenStreams* out);

/// Destroys the streams createGreenStreams made (an empty GreenStreams is fine; the device's context stays);
/// work on the streams must be done.
void destroyGreenStreams(GreenStreams* g);

}  // namespace zp
