// Host reference of qgZ's reductions (device/reduce.h): the host backend's arithmetic and the oracle that the
// kernels are tested and benchmarked against, bit for bit. The per-element arithmetic is host/reduce_math.h.
#pragma once

#include <cstddef>
#include <vector>

#include "include/zpccl.h"

namespace zp {

// sum[i] for i in [begin, end): element i of payloads[0], then of payloads[1], 2, ... added in that order in fp32
// with round to nearest, the kernels' order; a block of which some sum is not finite (an overflow, or a source
// block that held NaN or Inf) is NaN in every element (reduce_math.h, the block rule). Every payload holds `count`
// elements of the given bits and blockSize (host/quant_format.h). A range (any, whole blocks or not) lets callers
// split one reduction over threads.
void sumPayloadsRef(const std::vector<const unsigned char*>& payloads, size_t count, int bits, int blockSize,
                    size_t begin, size_t end, float* sum);

// out[i] for i in [begin, end): sum[i] divided by divisor (1 for Sum, the rank count for Avg) and rounded to
// type (fp16, bf16 or fp32), as finishReduction does. out is an array of that type.
void finishRef(const float* sum, zpDataType_t type, float divisor, size_t begin, size_t end, void* out);

}  // namespace zp
