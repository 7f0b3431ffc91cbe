// What each rank brings to a communicator's init: its node key, and the settings that every rank must pass alike
// (they shape the communicator: its nodes, its hpZ groups, what its collectives put on the wire). Both backends
// exchange one RankInit per rank when the ranks meet and compare them before anything is built from them, so
// every rank reaches the same verdict: ranks that passed different hpZ sizes would otherwise gather inconsistent
// groups, and ranks with different bits would read each other's payloads with the wrong sizes.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace zp {

// How a rank's node key was made.
enum RankLayout : int32_t { kLayoutHostHash = 0, kLayoutRanksPerNode = 1, kLayoutNodeId = 2 };

struct RankInit {
  uint64_t nodeKey = 0;
  int32_t layout = kLayoutHostHash;  // RankLayout
  int32_t ranksPerNode = 0;          // config->ranksPerNode; 0 when unset
  int32_t hpzSize = 0;               // config->hpzSize; 0 when unset (the whole node)
  int32_t weightBits = 0;            // resolved (config or default), as the rest
  int32_t gradBits = 0;
  int32_t blockSize = 0;
};
// The cuda backend all-gathers it as raw bytes, four 64-bit words a rank.
static_assert(sizeof(RankInit) == 32 && std::is_trivially_copyable<RankInit>::value, "RankInit is 4 words");

// The node keys of every rank, in rank order.
std::vector<uint64_t> nodeKeysOf(const std::vector<RankInit>& ranks);

// The first setting in which some rank differs from rank 0, as "config->hpzSize: 2 on rank 0, 4 on rank 3";
// empty when every rank agrees. Fields that mean the same are equal: an unset hpzSize and the size of the nodes
// when they are all of one size (the default hpZ group is the whole node). Deterministic in its input, so every
// rank that compares the same vector finds the same answer.
std::string initDisagreement(const std::vector<RankInit>& ranks);

}  // namespace zp
