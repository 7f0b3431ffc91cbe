// The pipelines' chunk plans (host/chunk_plan.h): whole blocks, at most the chunks asked for, and the ramped
// variant's half-size ends. Hand-computed cases; the fuzzer (fuzz_host.cc) checks the invariants on random ones.
#include <gtest/gtest.h>

#include <vector>

#include "host/chunk_plan.h"

namespace zp {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

std::vector<size_t> sizesOf(const ChunkPlan& p) {
  std::vector<size_t> out;
  for (int c = 0; c < p.chunks; ++c) out.push_back(p.elems(c));
  return out;
}

TEST(ChunkPlan, EqualChunksOfWholeBlocksWithTheRestLast) {
  // 1000 blocks of 256 elements, 4 chunks wanted (256 MiB over 64 MiB chunks): 250 blocks each.
  const ChunkPlan p = makeChunkPlan(256000, 256, 256 * kMiB, 0, 8);
  EXPECT_EQ(sizesOf(p), (std::vector<size_t>{64000, 64000, 64000, 64000}));
  // 1001 blocks, the last one partial: ceil(1001 / 4) = 251 blocks a chunk, the rest in the last.
  const ChunkPlan q = makeChunkPlan(256100, 256, 256 * kMiB, 0, 8);
  EXPECT_EQ(sizesOf(q), (std::vector<size_t>{64256, 64256, 64256, 63332}));
  EXPECT_EQ(q.offset(3), 3 * 64256u);
}

TEST(ChunkPlan, FewChunksWhenSmallOrCapped) {
  EXPECT_EQ(makeChunkPlan(1000, 256, 2000, 0, 8).chunks, 1);                                 // below one chunk's bytes
  EXPECT_EQ(makeChunkPlan(256000, 256, size_t{1} << 40, 0, 3).chunks, 3);                    // capped by maxChunks
  EXPECT_EQ(makeChunkPlan(256000, 256, size_t{1} << 40, 0, 64).chunks, kMaxPipelineChunks);  // and by the events
  EXPECT_EQ(makeChunkPlan(300, 256, size_t{1} << 40, 0, 8).chunks, 2);  // two blocks: two chunks at most
  const ChunkPlan none = makeChunkPlan(0, 256, 0, 0, 8);
  EXPECT_EQ(none.chunks, 0);
  EXPECT_EQ(none.bounds[0], 0u);
}

TEST(ChunkPlan, RampedPlansHalveTheFirstAndLastChunk) {
  // 4 chunks wanted: 6 units of ceil(1000 / 6) = 167 blocks: 167, 334, 334, then the rest (165).
  const ChunkPlan p = makeChunkPlan(256000, 256, 256 * kMiB, 0, 8, /*ramp=*/true);
  EXPECT_EQ(sizesOf(p), (std::vector<size_t>{167 * 256, 334 * 256, 334 * 256, 165 * 256}));
  // 8 chunks wanted: 14 units of ceil(1000 / 14) = 72 blocks: 72, six of 144, then 64.
  const ChunkPlan q = makeChunkPlan(256000, 256, 1024 * kMiB, 0, 8, /*ramp=*/true);
  std::vector<size_t> expected(1, 72 * 256);
  expected.insert(expected.end(), 6, 144 * 256);
  expected.push_back(64 * 256);
  EXPECT_EQ(sizesOf(q), expected);
  // Fewer than three chunks: no ramp.
  EXPECT_EQ(sizesOf(makeChunkPlan(256000, 256, 128 * kMiB, 0, 8, true)), (std::vector<size_t>{128000, 128000}));
}

// Buffers of `bufferBytes` that chunk c's payload (bits, G = 256) takes, the last one started.
size_t buffersOf(const ChunkPlan& p, int c, int bits, size_t bufferBytes) {
  return (quantPayloadBytes(p.elems(c), bits, 256) + bufferBytes - 1) / bufferBytes;
}

TEST(ChunkPlan, AlignedChunksCarryWholeBuffersAndAreNeverMore) {
  // 4 MiB over 256 int8 codes and a scale (260 bytes), less the padding's 16-byte margin; int4: 132 bytes a block.
  EXPECT_EQ(blocksPerBuffer(4 * kMiB, 8, 256), 16131u);
  EXPECT_EQ(blocksPerBuffer(4 * kMiB, 4, 256), 31774u);
  EXPECT_EQ(blocksPerBuffer(16, 8, 256), 0u);
  // The shard of a 256 MiB bf16 all-reduce over two ranks: 2^26 elements, 262144 blocks, 4 chunks of 65536 wanted.
  // int8: each rounded up to 5 buffers (80655 blocks), three of them and the rest (20179 blocks): 5 + 5 + 5 + 2 = 17
  // buffers, as one chunk of everything (16.25, started: 17); equal chunks (4.06 each) take 4 x 5 = 20.
  const size_t count = size_t{1} << 26;
  const ChunkPlan p = makeChunkPlan(count, 256, 256 * kMiB, 0, 8, false, 16131);
  EXPECT_EQ(sizesOf(p), (std::vector<size_t>{80655 * 256, 80655 * 256, 80655 * 256, 20179 * 256}));
  size_t buffers = 0;
  for (int c = 0; c < p.chunks; ++c) buffers += buffersOf(p, c, 8, 4 * kMiB);
  EXPECT_EQ(buffers, 17u);
  const ChunkPlan equal = makeChunkPlan(count, 256, 256 * kMiB, 0, 8);
  ASSERT_EQ(equal.chunks, 4);
  for (int c = 0; c < 4; ++c) EXPECT_EQ(buffersOf(equal, c, 8, 4 * kMiB), 5u) << c;
  // int4: 3 buffers a chunk (95322 blocks), two of them and the rest: 9 buffers (8.25 in one chunk), not 4 x 3.
  const ChunkPlan q = makeChunkPlan(count, 256, 256 * kMiB, 0, 8, false, 31774);
  EXPECT_EQ(sizesOf(q), (std::vector<size_t>{95322 * 256, 95322 * 256, 71500 * 256}));
  EXPECT_EQ(buffersOf(q, 0, 4, 4 * kMiB) + buffersOf(q, 1, 4, 4 * kMiB) + buffersOf(q, 2, 4, 4 * kMiB), 9u);
  // Buffers larger than the equal chunk (1000 blocks, 250 a chunk): chunks of whole buffers, never more chunks.
  EXPECT_EQ(sizesOf(makeChunkPlan(256000, 256, 256 * kMiB, 0, 8, false, 300)),
            (std::vector<size_t>{300 * 256, 300 * 256, 300 * 256, 100 * 256}));
  EXPECT_EQ(sizesOf(makeChunkPlan(256000, 256, 256 * kMiB, 0, 8, false, 600)),
            (std::vector<size_t>{600 * 256, 400 * 256}));
  EXPECT_EQ(makeChunkPlan(256000, 256, 256 * kMiB, 0, 8, false, 1000).chunks, 1);
  // One chunk has nothing to align; a ramped plan keeps its ramp.
  EXPECT_EQ(makeChunkPlan(count, 256, 64 * kMiB, 0, 8, false, 16131).chunks, 1);
  EXPECT_EQ(sizesOf(makeChunkPlan(256000, 256, 256 * kMiB, 0, 8, true, 300)),
            sizesOf(makeChunkPlan(256000, 256, 256 * kMiB, 0, 8, true)));
}

}  // namespace
}  // namespace zp
