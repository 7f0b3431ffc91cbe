// How zpQuantAllReduce cuts a tensor into one shard per rank (include/zpccl.h, "Quantized all-reduce"): every shard
// a whole number of blocks, so that the blocks of both quantizations are the tensor's own blocks whatever the rank
// count, and every shard starts 16-byte aligned for the kernels' vector loads. The planner, both backends and the
// argument checks share it.
#pragma once

#include <algorithm>
#include <cstddef>

namespace zp {

// Elements of a full shard: ceil(count / ranks) rounded up to a whole number of blocks (0 for count 0).
inline size_t allReduceShardCount(size_t count, int ranks, int blockSize) {
  const size_t perRank = (count + ranks - 1) / static_cast<size_t>(ranks);
  return (perRank + blockSize - 1) / blockSize * blockSize;
}

// Rank r's shard is elements [offset(r), offset(r) + elems(r)) of the tensor: shardCount of them for every rank
// before the last non-empty shard, the remainder for it, none after.
struct AllReduceShards {
  size_t count = 0;       // elements of the tensor
  size_t shardCount = 0;  // allReduceShardCount's

  size_t offset(int r) const { return std::min(static_cast<size_t>(r) * shardCount, count); }
  size_t elems(int r) const { return std::min(offset(r) + shardCount, count) - offset(r); }
  // Elements of rank r's shard in the chunk of `chunkElems` elements at `first` of every shard (0 when the shard
  // ends before it).
  size_t chunkElems(int r, size_t first, size_t chunkElems) const {
    const size_t e = elems(r);
    return first >= e ? 0 : std::min(chunkElems, e - first);
  }
};

}  // namespace zp
