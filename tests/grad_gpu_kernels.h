// Device kernels for tests/test_grad_gpu.cc: host/philox.h's generator beside cuRAND's on the GPU, and stochastic
// rounding's integer form against its threshold form on the GPU.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace zptest {

// For each i < n: counter ctrKey[6i .. 6i+3], key ctrKey[6i+4], ctrKey[6i+5] (host memory); writes the 4 output
// words of cuRAND's curand_Philox4x32_10 to curandOut[4i..] and of zp::philox4x32_10 to zpOut[4i..] (host memory).
cudaError_t philoxOnDevice(const uint32_t* ctrKey, size_t n, uint32_t* curandOut, uint32_t* zpOut);

// For every float a with bits in [first, last], and -a, at a's step draws (tests/stochastic_threshold.h): counts the
// pairs checked and those where zp::stochasticCodeOfQuotient differs from the threshold form on the device.
cudaError_t stochasticFormsOnDevice(uint32_t first, uint32_t last, float qmax, unsigned long long* checked,
                                    unsigned long long* mismatches);

}  // namespace zptest
