// hpZ (zpHierAllGather, zpHierSecondaryShard) on the host backend: the gather inside the hpZ group moves bits
// exactly for every type, in place and out of place, on node-major, interleaved and sub-node hpZ layouts; the
// forward-gather -> secondary shard -> backward-gather flow rebuilds the forward tensor bit for bit; uneven
// layouts and bad input are refused with a message, leaving the communicator usable.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "host/dtype.h"
#include "host/quant_format.h"
#include "host/quant_ref.h"
#include "include/zpccl.h"
#include "tests/collective_check.h"
#include "tests/host_ranks.h"

namespace {

using zpcheck::Buffer;
using zpcheck::mentions;
using zpcheck::sameBits;
using zptest::runHostRanks;

// A layout: nranks, and either ranksPerNode (node = rank / ranksPerNode) or a node label per rank.
struct Layout {
  const char* name;
  int nranks;
  int ranksPerNode;  // 0: use nodeMod
  int nodeMod;       // nodeId = rank % nodeMod (interleaved numbering)
  int hpzSize;       // 0: the whole node
};

// gtest prints a parameter with this (else as raw bytes).
void PrintTo(const Layout& L, std::ostream* os) { *os << L.name; }

void configure(const Layout& L, zpConfig_t* c, int rank) {
  if (L.ranksPerNode)
    c->ranksPerNode = L.ranksPerNode;
  else
    c->nodeId = rank % L.nodeMod;
  if (L.hpzSize) c->hpzSize = L.hpzSize;
}

// The hpZ group of `rank`, derived here from the layout alone: nodes hold their ranks in ascending order, and a
// group is hpzSize consecutive local ranks of one node (default: the whole node).
struct Group {
  std::vector<int> ranks;  // in hpZ-rank order
  int hpzRank = 0;
};

Group hpzGroupOf(const Layout& L, int rank) {
  auto label = [&](int r) { return L.ranksPerNode ? r / L.ranksPerNode : r % L.nodeMod; };
  std::vector<int> node;
  for (int r = 0; r < L.nranks; ++r) {
    if (label(r) == label(rank)) node.push_back(r);
  }
  int local = 0;
  while (node[local] != rank) ++local;
  const int hpz = L.hpzSize ? L.hpzSize : static_cast<int>(node.size());
  Group g;
  g.hpzRank = local % hpz;
  for (int i = 0; i < hpz; ++i) g.ranks.push_back(node[local - g.hpzRank + i]);
  return g;
}

std::string layoutName(const ::testing::TestParamInfo<Layout>& info) { return info.param.name; }

// Runs body(rank, comm, group) on every rank of layout L, with the rank's hpZ group as the layout alone gives it,
// and checks that every rank ran it.
void onEveryRank(const Layout& L, const std::function<void(int, zpComm_t, const Group&)>& body) {
  std::atomic<int> ran{0};
  runHostRanks(
      L.nranks, [&](int rank, zpConfig_t* c) { configure(L, c, rank); },
      [&](int rank, zpComm_t comm) {
        body(rank, comm, hpzGroupOf(L, rank));
        ran++;
      });
  EXPECT_EQ(ran.load(), L.nranks);
}

const Layout kLayouts[] = {
    {"n1x4", 4, 4, 0, 0},           {"n2x4", 8, 4, 0, 0},
    {"n4x2", 8, 2, 0, 0},           {"n2x8", 16, 8, 0, 0},
    {"n2x8_hpz2", 16, 8, 0, 2},     {"n2x8_hpz4", 16, 8, 0, 4},
    {"interleaved2x4", 8, 0, 2, 0}, {"interleaved2x4_hpz2", 8, 0, 2, 2},
    {"interleaved4x2", 8, 0, 4, 0}, {"n1x1", 1, 1, 0, 0},
    {"n4x2_hpz1", 8, 2, 0, 1},
};

class HpzLayout : public ::testing::TestWithParam<Layout> {};

TEST_P(HpzLayout, ExactForEveryTypeInAndOutOfPlace) {
  const Layout L = GetParam();
  onEveryRank(L, [&](int rank, zpComm_t comm, const Group& g) {
    const int hpz = static_cast<int>(g.ranks.size());
    int value = -1;
    ASSERT_EQ(zpCommHpzSize(comm, &value), zpSuccess);
    ASSERT_EQ(value, hpz);
    ASSERT_EQ(zpCommHpzRank(comm, &value), zpSuccess);
    ASSERT_EQ(value, g.hpzRank);
    for (int t = 0; t < zpNumTypes; ++t) {
      const zpDataType_t type = static_cast<zpDataType_t>(t);
      const size_t es = zpcheck::bytesOf(type);
      for (size_t count : {size_t{1}, size_t{7}, size_t{1000}}) {
        SCOPED_TRACE(::testing::Message() << "rank " << rank << " type " << zp::typeName(type) << " count " << count);
        const size_t shard = count * es;
        const uint64_t seed = 31 * t + count;
        Buffer expected(shard * hpz);
        for (int i = 0; i < hpz; ++i) zpcheck::fillBytes(expected.data() + i * shard, shard, seed, g.ranks[i]);
        Buffer send(shard), recv(shard * hpz);
        zpcheck::fillBytes(send.data(), shard, seed, rank);
        ASSERT_EQ(zpHierAllGather(send.data(), recv.data(), count, type, comm, nullptr), zpSuccess)
            << zpGetLastError(comm);
        EXPECT_STREQ(zpGetLastError(comm), "");
        EXPECT_TRUE(sameBits(recv.data(), expected.data(), count * hpz, es)) << "out of place";
        EXPECT_TRUE(sameBits(send.data(), expected.data() + g.hpzRank * shard, count, es)) << "sendbuff changed";
        Buffer inplace(shard * hpz);
        std::memcpy(inplace.data() + g.hpzRank * shard, send.data(), shard);
        ASSERT_EQ(zpHierAllGather(inplace.data() + g.hpzRank * shard, inplace.data(), count, type, comm, nullptr),
                  zpSuccess)
            << zpGetLastError(comm);
        EXPECT_TRUE(sameBits(inplace.data(), expected.data(), count * hpz, es)) << "in place";
      }
    }
  });
}

// The ZeRO++ flow: forward qwZ gather of the primary shards; each rank keeps its secondary shard of the gathered
// tensor; the backward hpZ gather rebuilds exactly the forward tensor on every rank.
TEST_P(HpzLayout, SecondaryShardsRebuildTheForwardGatherBitForBit) {
  const Layout L = GetParam();
  onEveryRank(L, [&](int rank, zpComm_t comm, const Group& g) {
    const size_t hpz = g.ranks.size();
    for (zpDataType_t type : zpcheck::kQuantTypes) {
      const size_t es = zpcheck::bytesOf(type);
      for (size_t shardCount : {size_t{4}, size_t{5}, size_t{257}, size_t{1000}}) {
        const size_t full = shardCount * L.nranks;  // a multiple of hpz: hpz divides the node, the node nranks
        SCOPED_TRACE(::testing::Message()
                     << "rank " << rank << " type " << zp::typeName(type) << " shard " << shardCount);
        Buffer primary(shardCount * es), forward(full * es);
        zpcheck::fillRandom(type, primary.data(), shardCount, 77 + shardCount, rank);
        ASSERT_EQ(zpQuantAllGather(primary.data(), forward.data(), shardCount, type, comm, nullptr), zpSuccess)
            << zpGetLastError(comm);
        size_t offset = SIZE_MAX, count = SIZE_MAX;
        ASSERT_EQ(zpHierSecondaryShard(full, &offset, &count, comm), zpSuccess) << zpGetLastError(comm);
        EXPECT_EQ(count, full / hpz);
        EXPECT_EQ(offset, g.hpzRank * (full / hpz));
        ASSERT_LE(offset + count, full);
        Buffer secondary(count * es);
        std::memcpy(secondary.data(), forward.data() + offset * es, count * es);
        Buffer rebuilt(full * es);
        ASSERT_EQ(zpHierAllGather(secondary.data(), rebuilt.data(), count, type, comm, nullptr), zpSuccess)
            << zpGetLastError(comm);
        EXPECT_TRUE(sameBits(rebuilt.data(), forward.data(), full, type)) << "out of place";
        Buffer inplace(full * es);
        std::memcpy(inplace.data() + offset * es, secondary.data(), count * es);
        ASSERT_EQ(zpHierAllGather(inplace.data() + offset * es, inplace.data(), count, type, comm, nullptr), zpSuccess)
            << zpGetLastError(comm);
        EXPECT_TRUE(sameBits(inplace.data(), forward.data(), full, type)) << "in place";
      }
    }
  });
}

// The optional quantized mode (zpHierAllGatherEx with bits): every rank of a group receives each member's shard
// as dequantize(quantize(shard)), its own included, so the group's outputs are bit-identical.
TEST_P(HpzLayout, QuantizedModeGathersDequantizedShards) {
  const Layout L = GetParam();
  for (zpDataType_t type : zpcheck::kQuantTypes) {
    for (int bits : {8, 4}) {
      SCOPED_TRACE(std::string(zp::typeName(type)) + " bits " + std::to_string(bits));
      const size_t count = 777, esz = zpcheck::bytesOf(type);
      onEveryRank(L, [&](int rank, zpComm_t comm, const Group& g) {
        const int hpz = static_cast<int>(g.ranks.size());
        Buffer send(count * esz), recv(count * esz * hpz), expected(count * esz * hpz);
        zpcheck::fillRandom(type, send.data(), count, 91, rank);
        Buffer shard(count * esz), payload(zp::quantPayloadBytes(count, bits, 128));
        for (int i = 0; i < hpz; ++i) {
          zpcheck::fillRandom(type, shard.data(), count, 91, g.ranks[i]);
          zp::quantizeRef(shard.data(), type, count, bits, 128, payload.data());
          zp::dequantizeRef(payload.data(), type, count, bits, 128, expected.data() + i * count * esz);
        }
        const zpQuantOptions_t options = {bits, 128};
        ASSERT_EQ(zpHierAllGatherEx(send.data(), recv.data(), count, type, &options, comm, nullptr), zpSuccess)
            << zpGetLastError(comm);
        EXPECT_TRUE(sameBits(recv.data(), expected.data(), count * hpz, type));
        // Exact mode is still the default, and integer types cannot be quantized.
        const zpQuantOptions_t exact = {0, 0};
        ASSERT_EQ(zpHierAllGatherEx(send.data(), recv.data(), count, type, &exact, comm, nullptr), zpSuccess);
        EXPECT_TRUE(sameBits(recv.data() + g.hpzRank * count * esz, send.data(), count, type));
        EXPECT_EQ(zpHierAllGatherEx(send.data(), recv.data(), count, zpInt32, &options, comm, nullptr),
                  zpInvalidArgument);
        EXPECT_TRUE(mentions(zpGetLastError(comm), "type int32 is not supported")) << zpGetLastError(comm);
      });
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Hpz, HpzLayout, ::testing::ValuesIn(kLayouts), layoutName);

// ---- uneven layouts --------------------------------------------------------------------------------------------

class HpzUneven : public ::testing::TestWithParam<std::vector<int>> {};

TEST_P(HpzUneven, RefusedAsInvalidUsageAndCommStaysUsable) {
  const std::vector<int> nodeOf = GetParam();
  const int n = static_cast<int>(nodeOf.size());
  std::atomic<int> finished{0};
  runHostRanks(
      n, [&](int rank, zpConfig_t* c) { c->nodeId = nodeOf[rank]; },
      [&](int rank, zpComm_t comm) {
        Buffer send(64 * 4), recv(64 * 4 * n);
        zpcheck::fillRandom(zpFloat32, send.data(), 64, 1, rank);
        recv.poison(0x5a);
        EXPECT_EQ(zpHierAllGather(send.data(), recv.data(), 64, zpFloat32, comm, nullptr), zpInvalidUsage);
        const std::string msg = zpGetLastError(comm);
        EXPECT_TRUE(mentions(msg.c_str(), "zpHierAllGather")) << msg;
        EXPECT_TRUE(mentions(msg.c_str(), "uneven")) << msg;
        EXPECT_TRUE(zpcheck::allBytesAre(recv.data(), recv.size(), 0x5a)) << "recvbuff written by a refused call";
        size_t offset = 0, count = 0;
        EXPECT_EQ(zpHierSecondaryShard(64, &offset, &count, comm), zpInvalidUsage);
        EXPECT_TRUE(mentions(zpGetLastError(comm), "zpHierSecondaryShard")) << zpGetLastError(comm);
        // Other collectives still run on this communicator (flat paths).
        ASSERT_EQ(zpQuantAllGather(send.data(), recv.data(), 64, zpFloat32, comm, nullptr), zpSuccess)
            << zpGetLastError(comm);
        EXPECT_STREQ(zpGetLastError(comm), "");
        finished++;
      });
  EXPECT_EQ(finished.load(), n);
}

INSTANTIATE_TEST_SUITE_P(Hpz, HpzUneven,
                         ::testing::Values(std::vector<int>{0, 0, 0, 1}, std::vector<int>{5, 9, 5},
                                           std::vector<int>{1, 0, 1, 1}));

// ---- bad input -------------------------------------------------------------------------------------------------

zpUniqueId newId() {
  zpUniqueId id;
  EXPECT_EQ(zpGetUniqueId(&id), zpSuccess);
  return id;
}

TEST(HpzBadInput, HpzSizeNotDividingTheNodeAtInit) {
  // With ranksPerNode the check needs no peer.
  for (int hpz : {3, 8}) {
    zpConfig_t c = ZP_CONFIG_INITIALIZER;
    c.backend = zpBackendHost;
    c.ranksPerNode = 4;
    c.hpzSize = hpz;
    zpComm_t comm = nullptr;
    EXPECT_EQ(zpCommInitRankConfig(&comm, 8, newId(), 0, &c), zpInvalidArgument) << "hpz " << hpz;
    EXPECT_TRUE(mentions(zpGetLastError(nullptr), "hpzSize")) << zpGetLastError(nullptr);
    EXPECT_EQ(comm, nullptr);
  }
  // With node labels the check runs on the exchanged layout (nodes of 4 and 4), on every rank alike.
  for (int hpz : {3, 8}) {
    const int n = 8;
    std::vector<zpResult_t> results(n, zpSuccess);
    std::vector<std::string> messages(n);
    const zpUniqueId id = newId();
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        zpConfig_t c = ZP_CONFIG_INITIALIZER;
        c.backend = zpBackendHost;
        c.nodeId = r % 2;
        c.hpzSize = hpz;
        zpComm_t comm = nullptr;
        results[r] = zpCommInitRankConfig(&comm, n, id, r, &c);
        messages[r] = zpGetLastError(nullptr);
        if (results[r] == zpSuccess) zpCommDestroy(comm);
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(results[r], zpInvalidArgument) << "hpz " << hpz << " rank " << r;
      EXPECT_TRUE(mentions(messages[r].c_str(), "hpzSize")) << messages[r];
    }
  }
}

TEST(HpzBadInput, RefusedWithNamedArgumentAndCommStaysUsable) {
  const int n = 4;
  const size_t count = 100;
  runHostRanks(
      n,
      [](int, zpConfig_t* c) {
        c->ranksPerNode = 4;
        c->hpzSize = 2;
      },
      [&](int rank, zpComm_t comm) {
        const int hpz = 2, hpzRank = rank % 2;
        Buffer send(count * 4), recv(count * 4 * hpz), big(count * 4 * (hpz + 1));
        zpcheck::fillBytes(send.data(), send.size(), 11, rank);
        auto goodCallWorks = [&](const char* after) {
          recv.poison();
          ASSERT_EQ(zpHierAllGather(send.data(), recv.data(), count, zpInt32, comm, nullptr), zpSuccess)
              << "after " << after << ": " << zpGetLastError(comm);
          EXPECT_STREQ(zpGetLastError(comm), "") << "after " << after;
          EXPECT_TRUE(sameBits(recv.data() + hpzRank * count * 4, send.data(), count, 4)) << "after " << after;
        };
        auto expectBad = [&](const char* name, zpResult_t res, const char* call, const char* mention) {
          EXPECT_EQ(res, zpInvalidArgument) << name;
          const std::string msg = zpGetLastError(comm);
          EXPECT_TRUE(mentions(msg.c_str(), call)) << name << ": " << msg;
          EXPECT_TRUE(mentions(msg.c_str(), mention)) << name << ": " << msg;
          goodCallWorks(name);
        };
        const char* hag = "zpHierAllGather";
        unsigned char* r = recv.data();
        expectBad("NULL sendbuff", zpHierAllGather(nullptr, r, count, zpInt32, comm, nullptr), hag, "sendbuff");
        expectBad("NULL recvbuff", zpHierAllGather(send.data(), nullptr, count, zpInt32, comm, nullptr), hag,
                  "recvbuff");
        expectBad("type 99", zpHierAllGather(send.data(), r, count, static_cast<zpDataType_t>(99), comm, nullptr), hag,
                  "invalid type 99");
        expectBad("type -1", zpHierAllGather(send.data(), r, count, static_cast<zpDataType_t>(-1), comm, nullptr), hag,
                  "invalid type -1");
        expectBad("SIZE_MAX/2 int32", zpHierAllGather(send.data(), r, SIZE_MAX / 2, zpInt32, comm, nullptr), hag,
                  "overflow");
        expectBad("SIZE_MAX/2 int8 x hpz", zpHierAllGather(send.data(), r, SIZE_MAX / 2 + 1, zpInt8, comm, nullptr),
                  hag, "overflow");
        expectBad("SIZE_MAX/8 fp64", zpHierAllGather(send.data(), r, SIZE_MAX / 8 + 1, zpFloat64, comm, nullptr), hag,
                  "overflow");
        expectBad("stream", zpHierAllGather(send.data(), r, count, zpInt32, comm, zpcheck::bogusStream()), hag,
                  "stream");
        unsigned char* g = big.data();
        expectBad("overlap +1", zpHierAllGather(g + (hpzRank * count + 1) * 4, g, count, zpInt32, comm, nullptr), hag,
                  "overlap");
        expectBad("overlap peer", zpHierAllGather(g + (1 - hpzRank) * count * 4, g, count, zpInt32, comm, nullptr), hag,
                  "overlap");
        // zpHierSecondaryShard.
        const char* hss = "zpHierSecondaryShard";
        size_t offset = 12345, cnt = 6789;
        for (size_t full : {size_t{1}, size_t{3}, size_t{1001}, SIZE_MAX}) {
          offset = 12345;
          cnt = 6789;
          expectBad("fullCount", zpHierSecondaryShard(full, &offset, &cnt, comm), hss, "fullCount");
          EXPECT_EQ(offset, 12345u);
          EXPECT_EQ(cnt, 6789u);
        }
        expectBad("NULL offset", zpHierSecondaryShard(100, nullptr, &cnt, comm), hss, "offset");
        expectBad("NULL count", zpHierSecondaryShard(100, &offset, nullptr, comm), hss, "count");
        ASSERT_EQ(zpHierSecondaryShard(100, &offset, &cnt, comm), zpSuccess) << zpGetLastError(comm);
        EXPECT_EQ(cnt, 50u);
        EXPECT_EQ(offset, 50u * hpzRank);
        EXPECT_STREQ(zpGetLastError(comm), "");
        // fullCount 0 is a multiple of every hpzSize: an empty shard.
        ASSERT_EQ(zpHierSecondaryShard(0, &offset, &cnt, comm), zpSuccess) << zpGetLastError(comm);
        EXPECT_EQ(cnt, 0u);
      });
}

TEST(HpzEdge, CountZeroSucceedsAndLeavesRecvbuffUntouched) {
  runHostRanks(
      4, [](int, zpConfig_t* c) { c->ranksPerNode = 2; },
      [](int rank, zpComm_t comm) {
        Buffer send(64), recv(64);
        zpcheck::fillBytes(send.data(), 64, 2, rank);
        recv.poison(0xa5);
        EXPECT_EQ(zpHierAllGather(send.data(), recv.data(), 0, zpFloat64, comm, nullptr), zpSuccess);
        EXPECT_TRUE(zpcheck::allBytesAre(recv.data(), recv.size(), 0xa5));
        EXPECT_STREQ(zpGetLastError(comm), "");
      });
}

}  // namespace
