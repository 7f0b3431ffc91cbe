// qgZ's reduction kernels: fixed-order fp32 sums of several block-quantized payloads, either requantized (the
// fused dequantize + reduce + requantize between the two hops) or finished into the output type (the last
// step). Arithmetic in host/reduce_math.h, shared with the host backend, so results are bit-identical.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "device/kernel_stream.h"
#include "device/quantize.h"
#include "include/zpccl.h"

namespace zp {

/**
 * @brief Where the payloads to sum are. Segment g (0 <= g < batch) sums, in order s = 0..sources-1, the
 *        payloads at `base + g * segmentStride + s * sourceStride`; each holds `count` elements.
 */
struct ReduceSources {
  const void* base;      ///< device pointer, 16-byte aligned
  size_t sourceStride;   ///< bytes between the sources of one segment, a multiple of 16
  size_t segmentStride;  ///< bytes between segments, a multiple of 16
  int sources;           ///< payloads summed per segment, >= 1
  int batch;             ///< segments, >= 0
};

/**
 * @brief Sums each segment's sources and requantizes the fp32 sums into one payload per segment, at
 *        `payload + g * payloadStride` (16-byte aligned, stride a multiple of 16, padding written as zeros).
 * @param count     elements per payload; 0 launches nothing.
 * @param bits      4 or 8, for the sources and the result.
 * @param blockSize power of two in [32, 8192].
 */
zpResult_t launchReduceRequantize(const ReduceSources& src, size_t count, int bits, int blockSize, void* payload,
                                  size_t payloadStride, KernelStream stream);

/**
 * @brief launchReduceRequantize with gradient rounding (include/zpccl.h): each segment's fp32 sums plus its
 *        residual (`grad.residual + g * grad.residualStrideElems`, bf16) are requantized, stochastically when
 *        grad.stochastic (segment g draws as slice grad.slice0 + g * grad.sliceStride, element j = firstElem + i),
 *        and the residual rewritten. Equal to host/quant_ref.h's quantizeGradRef of the sums (as fp32) bit for bit.
 */
zpResult_t launchReduceRequantizeGrad(const ReduceSources& src, size_t count, int bits, int blockSize, void* payload,
                                      size_t payloadStride, const GradQuantLaunch& grad, KernelStream stream);

/**
 * @brief Sums each segment's sources, divides by `divisor` when it is not 1 (Avg), and writes `count` elements
 *        of `type` (fp16, bf16 or fp32; any element alignment) at `output + g * outputStrideElems` elements.
 */
zpResult_t launchReduceFinish(const ReduceSources& src, size_t count, int bits, int blockSize, zpDataType_t type,
                              float divisor, void* output, size_t outputStrideElems, KernelStream stream);

}  // namespace zp
