// How a pipelined collective cuts its elements into chunks: whole quantization blocks, so that chunking never
// changes a result (every block is quantized exactly as without chunks), and few enough chunks that each one
// still moves enough bytes to run at full link speed; and where each chunk's payloads lie in scratch (ChunkRegion).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>

#include "host/quant_format.h"

namespace zp {

// The most chunks a pipeline has (its events are per chunk, src/cuda/cuda_exec.h).
constexpr int kMaxPipelineChunks = 16;

// A fixed array, so that planning a call allocates nothing.
struct ChunkPlan {
  int chunks = 0;
  size_t count = 0;
  std::array<size_t, kMaxPipelineChunks + 1> bounds{};  // chunk c holds elements [bounds[c], bounds[c + 1])

  size_t offset(int c) const { return bounds[c]; }
  size_t elems(int c) const { return bounds[c + 1] - bounds[c]; }
};

// Logical bytes per chunk when ZP_CHUNK_BYTES is unset: below this a chunk's transfer runs at less than full
// speed and the pipeline's gain is gone.
constexpr size_t kDefaultChunkBytes = size_t{64} << 20;

// count elements per rank, logicalBytes moved by the whole collective; chunkBytes 0 means the default; at most
// min(maxChunks, kMaxPipelineChunks) chunks.
//
// Chunks are of equal size (the last takes the remainder), or with `ramp` (ZP_CHUNK_RAMP), when there are three
// or more, the first and the last are half the others: the first chunk's quantization and the last one's finish
// overlap nothing, so halving them shortens the pipeline's exposed ends by half a chunk's kernel time each, at
// the cost of two smaller transfers.
inline ChunkPlan makeChunkPlan(size_t count, int blockSize, size_t logicalBytes, int64_t chunkBytes, int maxChunks,
                               bool ramp = false) {
  ChunkPlan p;
  p.count = count;
  if (count == 0) return p;
  const size_t target = chunkBytes > 0 ? static_cast<size_t>(chunkBytes) : kDefaultChunkBytes;
  size_t wanted = std::max<size_t>(1, logicalBytes / target);
  wanted = std::min<size_t>(wanted, static_cast<size_t>(std::clamp(maxChunks, 1, kMaxPipelineChunks)));
  const size_t blocks = (count + blockSize - 1) / blockSize;
  // In units of blocks: equal chunks of `unit`, or ramped ones of unit, 2 * unit, ..., 2 * unit, then the rest
  // (2 * wanted - 2 units in all, so at most `wanted` chunks, the last about one unit).
  const bool ramped = ramp && wanted >= 3;
  const size_t units = ramped ? 2 * wanted - 2 : wanted;
  const size_t unit = std::max<size_t>(1, (blocks + units - 1) / units);
  const size_t unitElems = unit * blockSize;
  while (p.bounds[p.chunks] < count) {
    const size_t start = p.bounds[p.chunks];
    const size_t size = ramped && p.chunks > 0 ? 2 * unitElems : unitElems;
    p.bounds[++p.chunks] = count - start > size ? start + size : count;
  }
  return p;
}

// A scratch region of `slots` payloads a chunk, chunk after chunk: where chunk c's slots lie (the cuda backend's
// pipelines lay out their scratch so, src/cuda/pipeline.h).
class ChunkRegion {
 public:
  ChunkRegion(const ChunkPlan& plan, int slots, int bits, int blockSize) : chunks_(plan.chunks) {
    for (int c = 0; c < plan.chunks; ++c) {
      slotBytes_[c] = quantPayloadBytes(plan.elems(c), bits, blockSize);
      offset_[c + 1] = offset_[c] + slots * slotBytes_[c];
    }
  }
  size_t slotBytes(int c) const { return slotBytes_[c]; }  // one payload: chunk c's elements, quantized
  size_t offset(int c) const { return offset_[c]; }        // chunk c's first slot, from the region's start
  size_t bytes() const { return offset_[chunks_]; }

 private:
  int chunks_;
  std::array<size_t, kMaxPipelineChunks> slotBytes_{};
  std::array<size_t, kMaxPipelineChunks + 1> offset_{};
};

}  // namespace zp
