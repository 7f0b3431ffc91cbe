#include <curand_kernel.h>

#include "host/philox.h"
#include "tests/grad_gpu_kernels.h"

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

}  // namespace zptest
