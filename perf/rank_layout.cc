// The perf harness's rank layout (perf/rank_layout.h).
#include "perf/rank_layout.h"

#include <algorithm>
#include <cstring>

namespace zp {
namespace perf {

bool layOutRanks(const std::vector<ProcInfo>& procs, int me, bool host, bool shareGpus, int nodes, RankLayout* layout,
                 std::string* error) {
  const int nprocs = static_cast<int>(procs.size());
  auto sameHost = [&](int p, int q) { return std::strcmp(procs[size_t(p)].hostname, procs[size_t(q)].hostname) == 0; };
  std::vector<int> threads(static_cast<size_t>(nprocs)), localBase(static_cast<size_t>(nprocs));
  for (int p = 0; p < nprocs; ++p) {
    int onHost = 0;
    for (int q = 0; q < nprocs; ++q) onHost += sameHost(p, q);
    int n = procs[size_t(p)].threads;
    if (n == 0) n = host ? 8 : std::max(1, procs[size_t(p)].deviceCount / (shareGpus ? 1 : onHost));
    threads[size_t(p)] = n;
  }
  // A host's processes take its GPUs in turn, unless they share them (each from GPU 0).
  for (int p = 0; p < nprocs && !shareGpus; ++p)
    for (int q = 0; q < p; ++q)
      if (sameHost(p, q)) localBase[size_t(p)] += threads[size_t(q)];

  RankLayout& l = *layout;
  l = RankLayout();
  l.localRanks = threads[size_t(me)];
  l.maxLocalRanks = *std::max_element(threads.begin(), threads.end());
  for (int p = 0; p < nprocs; ++p) {
    if (p == me) l.rankBase = l.nranks;
    l.nranks += threads[size_t(p)];
  }
  if (!host) {
    for (int p = 0; p < nprocs; ++p) {
      const int onHost = localBase[size_t(p)] + threads[size_t(p)];
      if (onHost > procs[size_t(p)].deviceCount) {
        *error = std::to_string(onHost) + " ranks on host " + procs[size_t(p)].hostname + " but only " +
                 std::to_string(procs[size_t(p)].deviceCount) + " GPUs visible there (one GPU per rank; see -t)";
        return false;
      }
    }
    for (int t = 0; t < l.localRanks; ++t) l.devices.push_back(localBase[size_t(me)] + t);
  }

  // Node layout: emulated (-N, or the host backend's default), else one node per distinct node key.
  if (nodes == 0 && host) nodes = (l.nranks % 2 == 0 && l.nranks >= 4) ? 2 : 1;
  if (nodes > 0) {
    if (l.nranks % nodes != 0) {
      *error = "-N " + std::to_string(nodes) + " does not divide " + std::to_string(l.nranks) + " ranks";
      return false;
    }
    l.nodes = nodes;
    for (int r = 0; r < l.nranks; ++r) l.nodeOf.push_back(r / (l.nranks / nodes));
    for (int n = 0; n < nodes; ++n) l.nodeName.push_back("emulated " + std::to_string(n));
    return true;
  }
  for (int p = 0; p < nprocs; ++p) {
    const auto known = std::find(l.nodeName.begin(), l.nodeName.end(), procs[size_t(p)].nodeKey);
    const int node = static_cast<int>(known - l.nodeName.begin());
    if (known == l.nodeName.end()) l.nodeName.push_back(procs[size_t(p)].nodeKey);
    for (int t = 0; t < threads[size_t(p)]; ++t) l.nodeOf.push_back(node);
  }
  l.nodes = static_cast<int>(l.nodeName.size());
  return true;
}

}  // namespace perf
}  // namespace zp
