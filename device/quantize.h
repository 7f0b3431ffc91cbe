// Block quantization kernels: launchers for the format of include/zpccl.h, bit-identical to the host reference
// (host/quant_ref.h); the per-element arithmetic of both sides is host/quant_math.h.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "device/kernel_stream.h"
#include "host/philox.h"
#include "host/quant_ref.h"
#include "include/zpccl.h"

namespace zp {

/**
 * @brief Quantizes `batch` independent segments of `count` elements each into block-quantized payloads, in one
 *        kernel launch enqueued on `stream`. Segment i reads `input + i * inputStrideElems` elements and writes
 *        the payload at `payload + i * payloadStrideBytes` bytes; segments never share a block.
 *
 * @param input              device pointer to the first segment's elements; any alignment of the element type
 *                           (e.g. an fp16 tensor offset by 1, 3 or 7 elements). 16-byte aligned segments are read
 *                           with 16-byte vectors, others with the widest access their address allows.
 * @param payload            device pointer, 16-byte aligned (zpInvalidArgument otherwise); each segment's payload
 *                           receives quantPayloadBytes(count, bits, blockSize) bytes, padding written as zeros.
 * @param count              elements per segment; 0 launches nothing.
 * @param type               zpFloat16, zpBfloat16 or zpFloat32.
 * @param bits               4 or 8.
 * @param blockSize          elements per quantization block, a power of two in [32, 8192].
 * @param stream             stream to enqueue on (and the SMs the grid may fill there).
 * @param batch              number of segments (>= 0; 0 launches nothing).
 * @param inputStrideElems   elements between segment starts; 0 means `count` (segments back to back).
 * @param payloadStrideBytes bytes between segment payloads, a multiple of 16 and at least the payload size;
 *                           0 means the payload size.
 * @return zpSuccess, zpInvalidArgument for a bad argument, zpUnhandledCudaError if the launch failed.
 */
zpResult_t launchQuantize(const void* input, void* payload, size_t count, zpDataType_t type, int bits, int blockSize,
                          KernelStream stream, int batch = 1, size_t inputStrideElems = 0,
                          size_t payloadStrideBytes = 0);

/**
 * @brief Dequantizes `batch` payloads made by launchQuantize (same count, type, bits and blockSize) into
 *        `batch` segments of `count` elements, in one kernel launch enqueued on `stream`. Segment i reads
 *        `payload + i * payloadStrideBytes` bytes and writes `output + i * outputStrideElems` elements.
 *
 * @param payload            device pointer, 16-byte aligned (zpInvalidArgument otherwise).
 * @param output             device pointer; any alignment of the element type (16-byte aligned segments are
 *                           written with 16-byte vectors, others with the widest access their address allows).
 *                           Only the `count` elements of each segment are written.
 * @param count              elements per segment; 0 launches nothing.
 * @param type               zpFloat16, zpBfloat16 or zpFloat32.
 * @param bits               4 or 8.
 * @param blockSize          elements per quantization block, a power of two in [32, 8192].
 * @param stream             stream to enqueue on (and the SMs the grid may fill there).
 * @param batch              number of segments (>= 0; 0 launches nothing).
 * @param payloadStrideBytes bytes between segment payloads, a multiple of 16; 0 means the payload size.
 * @param outputStrideElems  elements between segment starts, at least `count` (segments must not overlap);
 *                           0 means `count`.
 * @return zpSuccess, zpInvalidArgument for a bad argument, zpUnhandledCudaError if the launch failed.
 */
zpResult_t launchDequantize(const void* payload, void* output, size_t count, zpDataType_t type, int bits, int blockSize,
                            KernelStream stream, int batch = 1, size_t payloadStrideBytes = 0,
                            size_t outputStrideElems = 0);

/**
 * @brief What qgZ's gradient rounding (include/zpccl.h, "Gradient rounding") adds to a quantization: stochastic
 *        rounding, drawn (host/philox.h) for element j = firstElem + i of the slice `slice0 + seg * sliceStride`
 *        (segment seg, element i of it), and a bf16 residual read and rewritten beside the input (segment seg's at
 *        `residual + seg * residualStrideElems` elements). Launches with it match host/quant_ref.h's
 *        quantizeGradRef bit for bit.
 */
struct GradQuantLaunch {
  bool stochastic = false;
  GradRandomKey key;
  uint32_t slice0 = 0;
  int sliceStride = 1;
  size_t firstElem = 0;            ///< a multiple of 8 (chunks start at whole blocks)
  uint16_t* residual = nullptr;    ///< device pointer, 2-byte aligned; nullptr: none
  size_t residualStrideElems = 0;  ///< elements between segments' residuals
};

/// The launch that draws as the host reference's GradQuant g (its rounding, key, slice and first element), with
/// the residual in device memory (g.residual is the host's).
inline GradQuantLaunch gradLaunchOf(const GradQuant& g, uint16_t* residual, size_t residualStrideElems) {
  GradQuantLaunch launch;
  launch.stochastic = g.stochastic;
  launch.key = g.key;
  launch.slice0 = g.slice;
  launch.firstElem = g.firstElem;
  launch.residual = residual;
  launch.residualStrideElems = residualStrideElems;
  return launch;
}

/**
 * @brief launchQuantize with gradient rounding (stochastic rounding, error feedback), same arguments otherwise.
 *        A separate kernel: one warp a quantization block, 8 elements a lane at a time (one Philox call), two
 *        passes over the block (absmax, then codes and residuals); the plain launchQuantize is left as it is.
 */
zpResult_t launchQuantizeGrad(const void* input, void* payload, size_t count, zpDataType_t type, int bits,
                              int blockSize, const GradQuantLaunch& grad, KernelStream stream, int batch = 1,
                              size_t inputStrideElems = 0, size_t payloadStrideBytes = 0);

}  // namespace zp
