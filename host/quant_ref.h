// Host reference of the block quantization format (include/zpccl.h): the host backend's quantizer and the
// oracle that the device kernels are tested against, bit for bit. Arithmetic in host/quant_math.h.
#pragma once

#include <cstddef>

#include "include/zpccl.h"

namespace zp {

// Quantizes count elements of input (fp16, bf16 or fp32, any element alignment) into payload, which receives
// quantPayloadBytes(count, bits, blockSize) bytes, padding included (written as zeros). Arguments are assumed
// valid (checked by the caller): bits 4 or 8, blockSize a power of two in [32, 8192].
void quantizeRef(const void* input, zpDataType_t type, size_t count, int bits, int blockSize, void* payload);

// Dequantizes a payload made with the same count, bits and blockSize into count elements of output.
void dequantizeRef(const void* payload, zpDataType_t type, size_t count, int bits, int blockSize, void* output);

}  // namespace zp
