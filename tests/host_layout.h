// A layout of host-backend ranks for parameterized collective suites: how many ranks and which node each is on
// (consecutive ranks per node, or a label per rank), with the communicator settings a suite may vary per layout.
#pragma once

#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "include/zpccl.h"
#include "tests/collective_check.h"

namespace zptest {

struct Layout {
  const char* name;
  int nranks;
  int ranksPerNode;          // > 0: node = rank / ranksPerNode (config.ranksPerNode)
  std::vector<int> nodeIds;  // else: config.nodeId of each rank
  bool large = false;        // the suite's large case too
  int configBits = 0;        // config.gradBits (0: the default)
  int configBlock = 0;       // config.blockSize (0: the default)
};

// gtest prints a parameter with this (else as raw bytes).
inline void PrintTo(const Layout& L, std::ostream* os) { *os << L.name; }
inline std::string layoutName(const ::testing::TestParamInfo<Layout>& info) { return info.param.name; }

inline void configure(const Layout& L, int rank, zpConfig_t* c) {
  if (L.ranksPerNode > 0)
    c->ranksPerNode = L.ranksPerNode;
  else
    c->nodeId = L.nodeIds[rank];
  if (L.configBits) c->gradBits = L.configBits;
  if (L.configBlock) c->blockSize = L.configBlock;
}

inline zpcheck::RefTopo refTopo(const Layout& L) { return zpcheck::refTopo(L.nranks, L.ranksPerNode, L.nodeIds); }

// Node labels rank % mod: nodes whose ranks interleave.
inline std::vector<int> labels(int nranks, int mod) {
  std::vector<int> v;
  for (int r = 0; r < nranks; ++r) v.push_back(r % mod);
  return v;
}

}  // namespace zptest
