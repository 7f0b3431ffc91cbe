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

}  // namespace
}  // namespace zp
