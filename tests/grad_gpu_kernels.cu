#include <curand_kernel.h>

#include "host/philox.h"
#include "tests/grad_gpu_kernels.h"
#include "tests/stochastic_threshold.h"

namespace zptest {
namespace {

__global__ void philoxKernel(const uint32_t* ctrKey, size_t n, uint32_t* curandOut, uint32_t* zpOut) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint32_t* in = ctrKey + 6 * i;
    const uint4 c = make_uint4(in[0], in[1], in[2], in[3]);
    const uint2 k = make_uint2(in[4], in[5]);
    const uint4 r = curand_Philox4x32_10(c, k);
    curandOut[4 * i] = r.x, curandOut[4 * i + 1] = r.y, curandOut[4 * i + 2] = r.z, curandOut[4 * i + 3] = r.w;
    const zp::Philox4x32 z = zp::philox4x32_10(zp::Philox4x32{{in[0], in[1], in[2], in[3]}}, in[4], in[5]);
    for (int w = 0; w < 4; ++w) zpOut[4 * i + w] = z.v[w];
  }
}

// Both forms of stochastic rounding on every float a in [first, last] (bit patterns) and on -a, at a's step draws.
__global__ void stochasticFormsKernel(uint32_t first, uint32_t last, float qmax, unsigned long long* counts) {
  unsigned long long checked = 0, bad = 0;
  for (uint64_t u = first + blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; u <= last;
       u += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const float a = __uint_as_float(static_cast<uint32_t>(u));
    uint32_t draws[4];
    stochasticStepDraws(fminf(a, qmax), draws);
    for (uint32_t r : draws) {
      for (float q : {a, -a}) {
        ++checked;
        bad += zp::stochasticCodeOfQuotient(q, qmax, r) != stochasticCodeByThreshold(q, qmax, r);
      }
    }
  }
  atomicAdd(counts, checked);
  atomicAdd(counts + 1, bad);
}

}  // namespace

cudaError_t philoxOnDevice(const uint32_t* ctrKey, size_t n, uint32_t* curandOut, uint32_t* zpOut) {
  uint32_t *dIn = nullptr, *dCurand = nullptr, *dZp = nullptr;
  cudaError_t e = cudaMalloc(&dIn, n * 6 * sizeof(uint32_t));
  if (e == cudaSuccess) e = cudaMalloc(&dCurand, n * 4 * sizeof(uint32_t));
  if (e == cudaSuccess) e = cudaMalloc(&dZp, n * 4 * sizeof(uint32_t));
  if (e == cudaSuccess) e = cudaMemcpy(dIn, ctrKey, n * 6 * sizeof(uint32_t), cudaMemcpyHostToDevice);
  if (e == cudaSuccess) {
    philoxKernel<<<64, 256>>>(dIn, n, dCurand, dZp);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaMemcpy(curandOut, dCurand, n * 4 * sizeof(uint32_t), cudaMemcpyDeviceToHost);
  if (e == cudaSuccess) e = cudaMemcpy(zpOut, dZp, n * 4 * sizeof(uint32_t), cudaMemcpyDeviceToHost);
  cudaFree(dIn);
  cudaFree(dCurand);
  cudaFree(dZp);
  return e;
}

cudaError_t stochasticFormsOnDevice(uint32_t first, uint32_t last, float qmax, unsigned long long* checked,
                                    unsigned long long* mismatches) {
  unsigned long long* d = nullptr;
  cudaError_t e = cudaMalloc(&d, 2 * sizeof(unsigned long long));
  if (e == cudaSuccess) e = cudaMemset(d, 0, 2 * sizeof(unsigned long long));
  if (e == cudaSuccess) {
    stochasticFormsKernel<<<1024, 256>>>(first, last, qmax, d);
    e = cudaGetLastError();
  }
  unsigned long long h[2] = {0, 0};
  if (e == cudaSuccess) e = cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost);
  cudaFree(d);
  *checked = h[0];
  *mismatches = h[1];
  return e;
}

}  // namespace zptest
