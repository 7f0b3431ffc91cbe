// zpQuantAllReduce on the cuda backend (include/zpccl.h, "Quantized all-reduce"): the two calls of
// host/all_reduce_shards.h, one after the other on the caller's stream, each planned and run as that collective
// alone (qgz.cc: one hop, two, or the direct path; gathers.cc: the gather, in two hops on nodes of several ranks),
// as the host backend runs them. A tensor whose count is n x shardCount is worked where it lies; any other count
// in a padded copy of n x shardCount elements (scratch kScratchAllReduceTensor), and error feedback's residual
// likewise (kScratchAllReduceResidual), copied back after the gather.
#include "host/all_reduce_shards.h"
#include "host/base/check.h"
#include "host/dtype.h"
#include "src/cuda/cuda_exec.h"
#include "src/cuda/pipeline.h"

namespace zp {

namespace {

// Copies `bytes` of `src` to the front of `dst` and zeros `dst` up to `paddedBytes`, on `stream`.
zpResult_t padInto(void* dst, const void* src, size_t bytes, size_t paddedBytes, cudaStream_t stream) {
  CUDACHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
  if (paddedBytes > bytes) CUDACHECK(cudaMemsetAsync(static_cast<char*>(dst) + bytes, 0, paddedBytes - bytes, stream));
  return zpSuccess;
}

}  // namespace

zpResult_t cudaQuantAllReduce(CudaExec& e, const CollArgs& a) {
  const size_t esz = typeSize(a.type);
  AllReduceSteps steps = allReduceSteps(a, e.topo.nranks, e.topo.rank, a.recvbuff, a.grad.residual);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CUDACHECK(cudaStreamIsCapturing(a.stream, &status));
  const bool captured = status != cudaStreamCaptureStatusNone;
  if (steps.padded) {
    const size_t padded = steps.paddedCount;
    ZPCHECK(ensureScratch(e, kScratchAllReduceTensor, padded * esz, a.stream, a.opName));
    if (a.grad.residual != nullptr) {
      ZPCHECK(ensureScratch(e, kScratchAllReduceResidual, padded * sizeof(uint16_t), a.stream, a.opName));
    }
    // The previous call, perhaps on another stream, may still read the padded copies.
    if (!captured) CUDACHECK(cudaStreamWaitEvent(a.stream, e.sideDone, 0));
    void* tensor = e.scratch[kScratchAllReduceTensor].ptr;
    ZPCHECK(padInto(tensor, a.sendbuff, a.count * esz, padded * esz, a.stream));
    uint16_t* residual = nullptr;
    if (a.grad.residual != nullptr) {
      residual = static_cast<uint16_t*>(e.scratch[kScratchAllReduceResidual].ptr);
      ZPCHECK(padInto(residual, a.grad.residual, a.count * sizeof(uint16_t), padded * sizeof(uint16_t), a.stream));
    }
    steps = allReduceSteps(a, e.topo.nranks, e.topo.rank, tensor, residual);
  }
  ZPCHECK(cudaQuantReduceScatter(e, steps.reduceScatter));
  ZPCHECK(cudaQuantAllGather(e, steps.gather));
  if (!steps.padded) return zpSuccess;
  CUDACHECK(cudaMemcpyAsync(a.recvbuff, steps.gather.recvbuff, a.count * esz, cudaMemcpyDeviceToDevice, a.stream));
  if (a.grad.residual != nullptr) {
    CUDACHECK(cudaMemcpyAsync(a.grad.residual, steps.reduceScatter.grad.residual, a.count * sizeof(uint16_t),
                              cudaMemcpyDeviceToDevice, a.stream));
  }
  // The next call, and a growth, wait for the copies back, as for a pipeline's finish stage.
  if (!captured) CUDACHECK(cudaEventRecord(e.sideDone, a.stream));
  return zpSuccess;
}

}  // namespace zp
