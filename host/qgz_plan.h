// The plan of qgZ (zpQuantReduceScatterA2A), shared by both backends: the order in which destination slices are
// quantized and sent, and the fixed order of the sums, which makes the result deterministic and equal on the
// host and cuda backends.
//
// One hop (one node, one rank per node, or uneven nodes): rank r quantizes slice d (for destination d) into
// send slot d; an all-to-all delivers slot r of every rank to rank r, which sums the n contributions in rank
// order, dequantized to fp32.
//
// Two hops (N nodes of L ranks each): rank (a, l) quantizes, for each local peer m and each node b, the slice
// of destination (b, m) into slot m*N + b, so each local peer's N slices are contiguous (the slice reordering
// fused into the quantize pass). Hop 1, an all-to-all inside the node, gives local rank m the N slices for
// destinations (b, m) from every local peer; it sums them over l = 0..L-1 in fp32 and requantizes each of the
// N partial sums. Hop 2, an all-to-all among the ranks of local rank m (one per node), gives destination (b, m)
// the partial sums of every node; it sums them over a = 0..N-1. Two quantization round trips in all.
#pragma once

#include <vector>

#include "host/topology.h"

namespace zp {

struct QgzPlan {
  bool twoHop = false;
  int nranks = 0;
  int nodes = 1;      // N (two hops), else 1
  int localSize = 1;  // L (two hops), else nranks
  // Destination rank of the slice in each first-hop send slot; the quantize pass reads slice sliceOfSlot[s]
  // of sendbuff into slot s.
  std::vector<int> sliceOfSlot;
};

inline QgzPlan makeQgzPlan(const Topology& t) {
  QgzPlan p;
  p.nranks = t.nranks;
  p.twoHop = t.hierarchical();
  if (!p.twoHop) {
    p.localSize = t.nranks;
    for (int d = 0; d < t.nranks; ++d) p.sliceOfSlot.push_back(d);
    return p;
  }
  p.nodes = t.nodes;
  p.localSize = t.localSize;
  for (int m = 0; m < t.localSize; ++m)
    for (int b = 0; b < t.nodes; ++b) p.sliceOfSlot.push_back(t.nodeRanks[b][m]);
  return p;
}

}  // namespace zp
