// How zpQuantAllReduce cuts a tensor into one shard per rank, and the two collectives it is made of (include/zpccl.h,
// "Quantized all-reduce"). Every shard is a whole number of blocks, so that the blocks of both quantizations are the
// tensor's own blocks whatever the rank count, and starts 16-byte aligned for the kernels' vector loads. Both backends
// run an all-reduce as the same two calls, each planned as a call of its own (host/coll_plan.h): the decisions of
// the two collectives are made once, in the planner, for the all-reduce as for qgZ and qwZ alone.
#pragma once

#include <cstddef>
#include <cstdint>

#include "host/base/backend.h"
#include "host/dtype.h"

namespace zp {

// Elements of a full shard: ceil(count / ranks) rounded up to a whole number of blocks (0 for count 0).
inline size_t allReduceShardCount(size_t count, int ranks, int blockSize) {
  const size_t perRank = (count + ranks - 1) / static_cast<size_t>(ranks);
  return (perRank + blockSize - 1) / blockSize * blockSize;
}

// The all-reduce `a` among `ranks` ranks as two calls over one tensor of ranks x shardCount elements: qgZ's
// reduce-scatter of the tensor into this rank's shard of it (NCCL's in-place layout when sendbuff is recvbuff),
// then the gather of the reduced shards into the tensor in qwZ's format, in place, always to nearest, with the
// all-reduce's hops (CollArgs::allReduceGather; host/coll_plan.h: two where nodes hold several ranks). When the
// count is not ranks whole shards (`padded`), the tensor is a copy of sendbuff padded with zeros to paddedCount
// elements, and error feedback's residual a copy padded likewise: zeros change no block's scale, quantize to code 0
// whatever the draw and keep a zero residual, so the padded calls give the tensor's own bits. The caller makes those
// copies and copies the first `count` elements of each back after the gather.
struct AllReduceSteps {
  size_t shardCount = 0;
  size_t paddedCount = 0;  // ranks x shardCount
  bool padded = false;     // paddedCount != count: the calls work in copies
  CollArgs reduceScatter{};
  CollArgs gather{};
};

// The steps of `a` (rank `rank` of `ranks`) over `tensor`, `residual` (when padded: the padded copies; otherwise
// recvbuff and the caller's residual). The steps keep `a`'s name, so that their errors name the all-reduce.
inline AllReduceSteps allReduceSteps(const CollArgs& a, int ranks, int rank, void* tensor, uint16_t* residual) {
  AllReduceSteps s;
  s.shardCount = allReduceShardCount(a.count, ranks, a.blockSize);
  s.paddedCount = s.shardCount * static_cast<size_t>(ranks);
  s.padded = s.paddedCount != a.count;
  char* shard = static_cast<char*>(tensor) + static_cast<size_t>(rank) * s.shardCount * typeSize(a.type);
  s.reduceScatter = a;
  s.reduceScatter.kind = CollKind::kQuantReduceScatter;
  s.reduceScatter.count = s.shardCount;
  s.reduceScatter.sendbuff = s.padded ? tensor : a.sendbuff;
  s.reduceScatter.recvbuff = shard;
  s.reduceScatter.grad.residual = residual;
  s.gather = a;
  s.gather.kind = CollKind::kQuantAllGather;
  s.gather.count = s.shardCount;
  s.gather.sendbuff = shard;
  s.gather.recvbuff = tensor;
  s.gather.grad = GradArgs();
  s.gather.allReduceGather = true;
  return s;
}

}  // namespace zp
