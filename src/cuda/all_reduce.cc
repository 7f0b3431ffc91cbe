// zpQuantAllReduce on the cuda backend (include/zpccl.h, "Quantized all-reduce"), composed of the two collectives
// it is made of, one after the other on the caller's stream: qgZ's reduce-scatter (qgz.cc: one hop, two, or the
// direct path) over one shard a rank, then qwZ's gather (gathers.cc) of the reduced shards, each rank's own shard
// dequantized with the others.
//
// Both take n equal shards of whole blocks. A tensor whose count is n x shardCount is worked where it lies: the
// reduce-scatter writes this rank's shard of recvbuff, the gather gathers recvbuff in place. Any other count is
// copied into a padded copy of n x shardCount elements (scratch 2), zeros after the tensor, and error feedback's
// residual likewise (scratch 3): zeros change no block's scale, quantize to code 0 whatever the draw and keep a
// zero residual, so the padded call gives the host backend's bits on the tensor (AllReduceGrad.* asserts that very
// equality on the host), and the result is copied back. The gather takes one flat all-gather over the world where
// the host's plan takes two hops on several nodes of several ranks: the payloads are the same, so are the bits.
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
  const int n = e.topo.nranks, rank = e.topo.rank;
  const size_t esz = typeSize(a.type);
  const size_t shard = allReduceShardCount(a.count, n, a.blockSize);
  const size_t padded = shard * n;
  const bool even = padded == a.count;
  CollArgs rs = a;  // the reduce-scatter: rank r's shard of the (padded) tensor reduced into its place
  rs.kind = CollKind::kQuantReduceScatter;
  rs.count = shard;
  CollArgs ag = a;  // the gather of the reduced shards, in place, always to nearest
  ag.kind = CollKind::kQuantAllGather;
  ag.count = shard;
  ag.grad = GradArgs();
  char* tensor = static_cast<char*>(a.recvbuff);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CUDACHECK(cudaStreamIsCapturing(a.stream, &status));
  const bool captured = status != cudaStreamCaptureStatusNone;
  if (!even) {
    ZPCHECK(ensureScratch(e, kScratchAllReduceTensor, padded * esz, a.stream, a.opName));
    if (a.grad.residual != nullptr) {
      ZPCHECK(ensureScratch(e, kScratchAllReduceResidual, padded * sizeof(uint16_t), a.stream, a.opName));
    }
    // The previous call, perhaps on another stream, may still read the padded copies.
    if (!captured) CUDACHECK(cudaStreamWaitEvent(a.stream, e.sideDone, 0));
    tensor = static_cast<char*>(e.scratch[kScratchAllReduceTensor].ptr);
    ZPCHECK(padInto(tensor, a.sendbuff, a.count * esz, padded * esz, a.stream));
    rs.sendbuff = tensor;
    if (a.grad.residual != nullptr) {
      rs.grad.residual = static_cast<uint16_t*>(e.scratch[kScratchAllReduceResidual].ptr);
      ZPCHECK(
          padInto(rs.grad.residual, a.grad.residual, a.count * sizeof(uint16_t), padded * sizeof(uint16_t), a.stream));
    }
  }
  // In place is safe: the reduce-scatter quantizes every slice of a chunk before it writes that chunk of the shard,
  // and the gather quantizes the shard before it writes any of the tensor.
  rs.recvbuff = tensor + rank * shard * esz;
  ZPCHECK(cudaQuantReduceScatter(e, rs));
  ag.sendbuff = rs.recvbuff;
  ag.recvbuff = tensor;
  ZPCHECK(cudaQuantAllGather(e, ag));
  if (even) return zpSuccess;
  CUDACHECK(cudaMemcpyAsync(a.recvbuff, tensor, a.count * esz, cudaMemcpyDeviceToDevice, a.stream));
  if (a.grad.residual != nullptr) {
    CUDACHECK(cudaMemcpyAsync(a.grad.residual, rs.grad.residual, a.count * sizeof(uint16_t), cudaMemcpyDeviceToDevice,
                              a.stream));
  }
  // The next call, and a growth, wait for the copies back, as for a pipeline's finish stage.
  if (!captured) CUDACHECK(cudaEventRecord(e.sideDone, a.stream));
  return zpSuccess;
}

}  // namespace zp
