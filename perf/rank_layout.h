// Where the ranks of a perf run are: how many each process drives, which GPU each takes, and the node of each,
// from what every process says of itself. Free of CUDA, so that the host-only tests cover it.
#pragma once

#include <string>
#include <vector>

namespace zp {
namespace perf {

// What one process tells the others before the ranks are laid out (exchanged as bytes between processes).
struct ProcInfo {
  char hostname[128];
  char nodeKey[128];  // zp::hostKey(): NCCL_HOSTID when set, else the host name; what makes a node for NCCL and zpccl
  int deviceCount;    // -1: CUDA unusable in that process (everyone then stops)
  int threads;        // requested ranks; 0: derive from the devices of the host
};

struct RankLayout {
  int nranks = 0;
  int rankBase = 0;                   // this process's first rank
  int localRanks = 0;                 // ranks (threads) of this process
  int maxLocalRanks = 0;              // over processes: the size of per-process exchanges
  int nodes = 1;                      // nodes of the layout
  std::vector<int> nodeOf;            // per global rank
  std::vector<std::string> nodeName;  // per node, for the rank lines
  std::vector<int> devices;           // per local rank (cuda backend)
};

// Lays out the ranks of every process (procs[p] from process p; `me` is this one): each process drives its
// requested ranks, else on the host backend 8, else its host's visible GPUs shared among that host's processes
// (all of them each with `shareGpus`, the GPUs numbered from 0 in every process); a host's processes take its
// GPUs in turn unless they share them. Nodes: `nodes` > 0 emulates that many equal ones (ranks node-major), 0
// takes one node per distinct node key, except on the host backend, which emulates 2 when the rank count is even
// and at least 4. False, with a message for process 0 to print (bad flags: exit status 2), when the ranks do not
// fit the GPUs or the nodes do not divide the ranks.
bool layOutRanks(const std::vector<ProcInfo>& procs, int me, bool host, bool shareGpus, int nodes, RankLayout* layout,
                 std::string* error);

}  // namespace perf
}  // namespace zp
