// How a pipelined collective cuts its elements into chunks: whole quantization blocks, so that chunking never
// changes a result (every block is quantized exactly as without chunks), and few enough chunks that each one
// still moves enough bytes to run at full link speed.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace zp {

struct ChunkPlan {
  int chunks = 1;
  size_t chunkElems = 0;  // every chunk but the last; a multiple of the block size
  size_t count = 0;

  size_t offset(int c) const { return static_cast<size_t>(c) * chunkElems; }
  size_t elems(int c) const { return std::min(chunkElems, count - offset(c)); }
};

// Logical bytes per chunk when ZP_CHUNK_BYTES is unset: below this a chunk's transfer runs at less than full
// speed and the pipeline's gain is gone.
constexpr size_t kDefaultChunkBytes = size_t{64} << 20;

// count elements per rank, logicalBytes moved by the whole collective; chunkBytes 0 means the default.
inline ChunkPlan makeChunkPlan(size_t count, int blockSize, size_t logicalBytes, int64_t chunkBytes, int maxChunks) {
  ChunkPlan p;
  p.count = count;
  const size_t target = chunkBytes > 0 ? static_cast<size_t>(chunkBytes) : kDefaultChunkBytes;
  size_t wanted = std::max<size_t>(1, logicalBytes / target);
  wanted = std::min<size_t>(wanted, static_cast<size_t>(std::max(1, maxChunks)));
  const size_t blocks = (count + blockSize - 1) / blockSize;
  const size_t blocksPerChunk = std::max<size_t>(1, (blocks + wanted - 1) / wanted);
  p.chunkElems = blocksPerChunk * blockSize;
  p.chunks = count == 0 ? 0 : static_cast<int>((count + p.chunkElems - 1) / p.chunkElems);
  return p;
}

}  // namespace zp
