// Topology and group construction from node keys: pure host code, no communicator.
#include <gtest/gtest.h>

#include <vector>

#include "host/topology.h"

namespace zp {
namespace {

std::vector<Topology> buildAll(const std::vector<uint64_t>& keys, int hpz = 0) {
  std::vector<Topology> out(keys.size());
  for (size_t r = 0; r < keys.size(); ++r) {
    EXPECT_EQ(buildTopology(keys, static_cast<int>(r), hpz, "test", &out[r]), zpSuccess);
  }
  return out;
}

// Node-major layout of nodes x perNode ranks.
std::vector<uint64_t> blockKeys(int nodes, int perNode) {
  std::vector<uint64_t> keys;
  for (int n = 0; n < nodes; ++n)
    for (int i = 0; i < perNode; ++i) keys.push_back(1000 + n);
  return keys;
}

// Invariants every layout must satisfy, whatever its shape.
void checkConsistent(const std::vector<Topology>& all) {
  const int nranks = static_cast<int>(all.size());
  for (const Topology& t : all) {
    ASSERT_EQ(t.nranks, nranks);
    ASSERT_EQ(t.nodeRanks[t.node][t.localRank], t.rank);
    ASSERT_EQ(static_cast<int>(t.nodeRanks[t.node].size()), t.localSize);
    ASSERT_EQ(static_cast<int>(t.hpzRanks.size()), t.hpzSize);
    ASSERT_EQ(t.hpzRanks[t.hpzRank], t.rank);
    for (int peer : t.hpzRanks) {
      EXPECT_EQ(all[peer].node, t.node) << "hpZ groups stay inside a node";
      EXPECT_EQ(all[peer].hpzGroup, t.hpzGroup);
      EXPECT_EQ(all[peer].hpzRanks, t.hpzRanks);
    }
    if (t.even) {
      ASSERT_EQ(static_cast<int>(t.interRanks.size()), t.nodes);
      for (int n = 0; n < t.nodes; ++n) {
        EXPECT_EQ(all[t.interRanks[n]].node, n);
        EXPECT_EQ(all[t.interRanks[n]].localRank, t.localRank);
      }
    }
  }
}

TEST(Topology, OneRank) {
  auto all = buildAll({42});
  checkConsistent(all);
  EXPECT_EQ(all[0].nodes, 1);
  EXPECT_EQ(all[0].localSize, 1);
  EXPECT_FALSE(all[0].hierarchical());
}

TEST(Topology, OneNodeOfEight) {
  auto all = buildAll(blockKeys(1, 8));
  checkConsistent(all);
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(all[r].nodes, 1);
    EXPECT_EQ(all[r].localRank, r);
    EXPECT_EQ(all[r].hpzSize, 8);
  }
  EXPECT_FALSE(all[0].hierarchical());
}

TEST(Topology, TwoNodesOfOne) {
  auto all = buildAll(blockKeys(2, 1));
  checkConsistent(all);
  EXPECT_EQ(all[1].node, 1);
  EXPECT_EQ(all[1].localRank, 0);
  EXPECT_EQ(all[1].interRanks, (std::vector<int>{0, 1}));
  EXPECT_FALSE(all[0].hierarchical());
}

TEST(Topology, FourByFour) {
  auto all = buildAll(blockKeys(4, 4));
  checkConsistent(all);
  const Topology& t = all[9];
  EXPECT_EQ(t.nodes, 4);
  EXPECT_EQ(t.node, 2);
  EXPECT_EQ(t.localRank, 1);
  EXPECT_EQ(t.interRanks, (std::vector<int>{1, 5, 9, 13}));
  EXPECT_EQ(t.hpzRanks, (std::vector<int>{8, 9, 10, 11}));
  EXPECT_TRUE(t.hierarchical());
}

TEST(Topology, HpzGroupsInsideNodes) {
  auto all = buildAll(blockKeys(2, 8), 4);
  checkConsistent(all);
  EXPECT_EQ(all[5].hpzRanks, (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(all[5].hpzRank, 1);
  EXPECT_EQ(all[13].hpzGroup, 3);
  auto pairs = buildAll(blockKeys(2, 8), 2);
  checkConsistent(pairs);
  EXPECT_EQ(pairs[13].hpzRanks, (std::vector<int>{12, 13}));
}

TEST(Topology, UnevenNodes) {
  // Three nodes of 3, 1 and 2 ranks.
  auto all = buildAll({7, 7, 7, 8, 9, 9});
  checkConsistent(all);
  EXPECT_EQ(all[0].nodes, 3);
  EXPECT_FALSE(all[0].even);
  EXPECT_FALSE(all[0].hierarchical());
  EXPECT_FALSE(all[0].hpzUsable);
  EXPECT_EQ(all[3].localSize, 1);
  EXPECT_EQ(all[5].localRank, 1);
  EXPECT_TRUE(all[0].interRanks.empty());
}

TEST(Topology, InterleavedNumbering) {
  // Ranks alternate between two hosts: node membership follows the key, never rank order.
  auto all = buildAll({5, 6, 5, 6, 5, 6});
  checkConsistent(all);
  EXPECT_EQ(all[0].nodeRanks[0], (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(all[3].node, 1);
  EXPECT_EQ(all[3].localRank, 1);
  EXPECT_EQ(all[3].interRanks, (std::vector<int>{2, 3}));
  EXPECT_EQ(all[3].hpzRanks, (std::vector<int>{1, 3, 5}));
  EXPECT_TRUE(all[0].hierarchical());
}

TEST(Topology, HpzMustDivideEveryNode) {
  Topology t;
  EXPECT_EQ(buildTopology(blockKeys(2, 6), 0, 4, "test", &t), zpInvalidArgument);
  EXPECT_EQ(buildTopology({1, 1, 2, 2, 2, 2}, 0, 2, "test", &t), zpSuccess);
  EXPECT_EQ(buildTopology({1, 1, 1, 2, 2}, 0, 2, "test", &t), zpInvalidArgument);
}

TEST(Topology, HostHashFollowsNcclHostId) {
  const char* saved = getenv("NCCL_HOSTID");
  std::string keep = saved ? saved : "";
  setenv("NCCL_HOSTID", "node-a", 1);
  const uint64_t a = hostHash();
  setenv("NCCL_HOSTID", "node-b", 1);
  const uint64_t b = hostHash();
  setenv("NCCL_HOSTID", "node-a", 1);
  EXPECT_EQ(hostHash(), a);
  EXPECT_NE(a, b);
  EXPECT_EQ(hostKey(), "node-a");
  // Set but empty, NCCL_HOSTID still names the host (NCCL hashes the empty name): not the hostname's.
  setenv("NCCL_HOSTID", "", 1);
  EXPECT_EQ(hostKey(), "");
  const uint64_t empty = hostHash();
  unsetenv("NCCL_HOSTID");
  EXPECT_NE(hostKey(), "");
  EXPECT_NE(hostHash(), empty);
  if (saved)
    setenv("NCCL_HOSTID", keep.c_str(), 1);
  else
    unsetenv("NCCL_HOSTID");
}

}  // namespace
}  // namespace zp
