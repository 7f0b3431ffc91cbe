#include "host/rank_init.h"

#include <map>

namespace zp {

namespace {

const char* layoutName(int32_t layout) {
  switch (layout) {
    case kLayoutRanksPerNode:
      return "config->ranksPerNode";
    case kLayoutNodeId:
      return "config->nodeId";
    default:
      return "the host (config->ranksPerNode and config->nodeId unset)";
  }
}

// "<field>: <a> on rank 0, <b> on rank r".
std::string differs(const char* field, const std::string& a, const std::string& b, int r) {
  return std::string(field) + ": " + a + " on rank 0, " + b + " on rank " + std::to_string(r);
}

}  // namespace

std::vector<uint64_t> nodeKeysOf(const std::vector<RankInit>& ranks) {
  std::vector<uint64_t> keys;
  keys.reserve(ranks.size());
  for (const RankInit& r : ranks) keys.push_back(r.nodeKey);
  return keys;
}

std::string initDisagreement(const std::vector<RankInit>& ranks) {
  if (ranks.empty()) return std::string();
  // The size of every node when they are all alike (0 otherwise): what an unset hpzSize means.
  std::map<uint64_t, int> nodeSizes;
  for (const RankInit& r : ranks) nodeSizes[r.nodeKey]++;
  int evenSize = nodeSizes.begin()->second;
  for (const auto& node : nodeSizes) evenSize = node.second == evenSize ? evenSize : 0;
  auto hpz = [&](const RankInit& r) { return r.hpzSize > 0 || evenSize == 0 ? r.hpzSize : evenSize; };
  auto hpzText = [&](const RankInit& r) {
    if (r.hpzSize > 0) return std::to_string(r.hpzSize);
    return evenSize > 0 ? "unset (the whole node, " + std::to_string(evenSize) + ")" : std::string("unset");
  };
  const RankInit& a = ranks[0];
  for (size_t i = 1; i < ranks.size(); ++i) {
    const RankInit& b = ranks[i];
    const int r = static_cast<int>(i);
    if (a.layout != b.layout) return differs("the node layout", layoutName(a.layout), layoutName(b.layout), r);
    if (a.ranksPerNode != b.ranksPerNode) {
      return differs("config->ranksPerNode", std::to_string(a.ranksPerNode), std::to_string(b.ranksPerNode), r);
    }
    if (hpz(a) != hpz(b)) return differs("config->hpzSize", hpzText(a), hpzText(b), r);
    if (a.weightBits != b.weightBits) {
      return differs("config->weightBits", std::to_string(a.weightBits), std::to_string(b.weightBits), r);
    }
    if (a.gradBits != b.gradBits) {
      return differs("config->gradBits", std::to_string(a.gradBits), std::to_string(b.gradBits), r);
    }
    if (a.blockSize != b.blockSize) {
      return differs("config->blockSize", std::to_string(a.blockSize), std::to_string(b.blockSize), r);
    }
  }
  return std::string();
}

}  // namespace zp
