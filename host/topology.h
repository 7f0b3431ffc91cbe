// Which rank is on which node, and the groups built from that: intra-node, inter-node (same local rank across
// nodes) and hpZ groups. Pure host code: both backends and the tests build it from the node key of every rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "include/zpccl.h"

namespace zp {

struct Topology {
  int nranks = 0;
  int rank = 0;
  int nodes = 0;                            // distinct node keys
  std::vector<int> nodeOfRank;              // node index of each rank; nodes numbered by their lowest rank
  std::vector<std::vector<int>> nodeRanks;  // ranks of each node, ascending
  std::vector<int> localRankOf;             // index of each rank inside its node
  int node = 0;                             // this rank's node
  int localRank = 0;
  int localSize = 0;
  bool even = true;  // every node has the same number of ranks
  // hpZ: groups of hpzSize consecutive local ranks inside a node. hpzUsable is false on uneven layouts.
  int hpzSize = 0;
  int hpzRank = 0;
  int hpzGroup = 0;  // global index of this rank's hpZ group
  bool hpzUsable = false;
  std::vector<int> hpzRanks;    // global ranks of this rank's hpZ group, in hpZ-rank order
  std::vector<int> interRanks;  // ranks with this rank's local rank, one per node, in node order (even layouts)

  // Two hops (intra then inter node) pay off only with several nodes of several ranks each, all equal.
  bool hierarchical() const { return even && nodes > 1 && localSize > 1; }
  std::string describe() const;  // one line, for logs and the main job
};

// The name of this process's host: NCCL_HOSTID when set, as NCCL reads it (an empty value too, which names a host of
// its own), else the hostname. Processes of one name are one node.
std::string hostKey();

// Host hash of this process: of hostKey().
uint64_t hostHash();

// Builds the topology seen by `rank` from every rank's node key. hpzRequest 0 means the whole node; otherwise
// it must divide the size of every node (else zpInvalidArgument with a message naming `call`).
zpResult_t buildTopology(const std::vector<uint64_t>& nodeKeys, int rank, int hpzRequest, const char* call,
                         Topology* topo);

}  // namespace zp
