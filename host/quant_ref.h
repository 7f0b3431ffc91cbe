// Host reference of the block quantization format (include/zpccl.h): the host backend's quantizer and the
// oracle that the device kernels are tested against, bit for bit. Arithmetic in host/quant_math.h.
#pragma once

#include <cstddef>

#include "host/philox.h"
#include "include/zpccl.h"

namespace zp {

// Quantizes count elements of input (fp16, bf16 or fp32, any element alignment) into payload, which receives
// quantPayloadBytes(count, bits, blockSize) bytes, padding included (written as zeros). Arguments are assumed
// valid (checked by the caller): bits 4 or 8, blockSize a power of two in [32, 8192].
void quantizeRef(const void* input, zpDataType_t type, size_t count, int bits, int blockSize, void* payload);

// Dequantizes a payload made with the same count, bits and blockSize into count elements of output.
void dequantizeRef(const void* payload, zpDataType_t type, size_t count, int bits, int blockSize, void* output);

// What qgZ's quantizations add to the format (include/zpccl.h, "Gradient rounding"): stochastic rounding and
// error feedback. The default is the plain quantizeRef.
struct GradQuant {
  bool stochastic = false;  // round by quantizeCodeStochastic, drawing from key (host/philox.h)
  GradRandomKey key;
  uint32_t slice = 0;            // the counter's slice (destination rank, or node for the intermediate hop)
  size_t firstElem = 0;          // index in the slice of element 0 (a chunk may start inside its slice)
  uint16_t* residual = nullptr;  // bf16, `count` elements: added before, rewritten after; nullptr: none
};

// quantizeRef with qgZ's rounding and residual: element i is x_i (+ residual_i), the block's scale is that of
// these sums, codes are rounded to nearest or stochastically (element j = firstElem + i of the slice draws
// gradRandom16), and residual_i becomes residualAfter. With a default GradQuant it equals quantizeRef.
void quantizeGradRef(const void* input, zpDataType_t type, size_t count, int bits, int blockSize, const GradQuant& g,
                     void* payload);

}  // namespace zp
