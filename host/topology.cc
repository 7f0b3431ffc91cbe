#include "host/topology.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>

#include "host/base/check.h"

namespace zp {

namespace {
// 64-bit FNV-1a: stable across processes and builds, which is all a host hash needs.
uint64_t fnv1a(const char* text) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (const char* p = text; *p; ++p) {
    hash ^= static_cast<unsigned char>(*p);
    hash *= 0x100000001b3ull;
  }
  return hash;
}
}  // namespace

std::string hostKey() {
  if (const char* id = getenv("NCCL_HOSTID")) return id;
  char host[1024] = {0};
  gethostname(host, sizeof(host) - 1);
  return host;
}

uint64_t hostHash() { return fnv1a(hostKey().c_str()); }

zpResult_t buildTopology(const std::vector<uint64_t>& nodeKeys, int rank, int hpzRequest, const char* call,
                         Topology* topo) {
  const int nranks = static_cast<int>(nodeKeys.size());
  if (nranks <= 0 || rank < 0 || rank >= nranks) {
    return ZP_ERR(zpInternalError, "%s : topology of rank %d among %d ranks", call, rank, nranks);
  }
  Topology t;
  t.nranks = nranks;
  t.rank = rank;
  t.nodeOfRank.assign(nranks, -1);
  t.localRankOf.assign(nranks, -1);
  std::map<uint64_t, int> nodeOfKey;  // nodes numbered in order of first appearance = of their lowest rank
  for (int r = 0; r < nranks; ++r) {
    auto it = nodeOfKey.find(nodeKeys[r]);
    if (it == nodeOfKey.end()) {
      it = nodeOfKey.emplace(nodeKeys[r], static_cast<int>(t.nodeRanks.size())).first;
      t.nodeRanks.emplace_back();
    }
    t.nodeOfRank[r] = it->second;
    t.localRankOf[r] = static_cast<int>(t.nodeRanks[it->second].size());
    t.nodeRanks[it->second].push_back(r);
  }
  t.nodes = static_cast<int>(t.nodeRanks.size());
  t.node = t.nodeOfRank[rank];
  t.localRank = t.localRankOf[rank];
  t.localSize = static_cast<int>(t.nodeRanks[t.node].size());
  for (const auto& ranks : t.nodeRanks) t.even = t.even && ranks.size() == t.nodeRanks[0].size();

  // hpZ groups: consecutive local ranks of one node.
  if (hpzRequest < 0) return ZP_ERR(zpInvalidArgument, "%s : hpzSize %d must be positive", call, hpzRequest);
  for (int n = 0; n < t.nodes; ++n) {
    const int size = static_cast<int>(t.nodeRanks[n].size());
    if (hpzRequest > 0 && size % hpzRequest != 0) {
      return ZP_ERR(zpInvalidArgument, "%s : hpzSize %d does not divide the %d ranks of node %d", call, hpzRequest,
                    size, n);
    }
  }
  t.hpzSize = hpzRequest > 0 ? hpzRequest : t.localSize;
  t.hpzRank = t.localRank % t.hpzSize;
  t.hpzUsable = t.even;
  t.hpzGroup = 0;
  for (int n = 0; n < t.node; ++n) t.hpzGroup += static_cast<int>(t.nodeRanks[n].size()) / t.hpzSize;
  t.hpzGroup += t.localRank / t.hpzSize;
  const int first = t.localRank - t.hpzRank;
  for (int i = 0; i < t.hpzSize; ++i) t.hpzRanks.push_back(t.nodeRanks[t.node][first + i]);

  if (t.even) {
    for (int n = 0; n < t.nodes; ++n) t.interRanks.push_back(t.nodeRanks[n][t.localRank]);
  }
  *topo = std::move(t);
  return zpSuccess;
}

std::string Topology::describe() const {
  std::ostringstream out;
  out << "rank " << rank << "/" << nranks << ": node " << node << "/" << nodes << " local " << localRank << "/"
      << localSize << (even ? "" : " (uneven nodes: hierarchical paths fall back to flat ones)") << ", hpZ group "
      << hpzGroup << " rank " << hpzRank << "/" << hpzSize << " {";
  for (size_t i = 0; i < hpzRanks.size(); ++i) out << (i ? "," : "") << hpzRanks[i];
  out << "}, nodes {";
  for (int n = 0; n < nodes; ++n) {
    out << (n ? " | " : "");
    for (size_t i = 0; i < nodeRanks[n].size(); ++i) out << (i ? "," : "") << nodeRanks[n][i];
  }
  out << "}";
  return out.str();
}

}  // namespace zp
