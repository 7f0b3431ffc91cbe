// zpQuantReduceScatterA2A (qgZ) against ncclReduceScatter on the same type and logical size, in the same run.
// Size = total bytes sent per rank, as nccl-tests. -B gradient bits (default 4), -G block size, -o sum|avg.
// Correctness: every rank's output must equal, bit for bit, the host backend's over the same inputs.
#include "host/quant_format.h"
#include "perf/common.h"

namespace zp {
namespace perf {
namespace {

bool run(const RunArgs& a) {
  const zpQuantOptions_t options = {a.size->bits, a.size->blockSize};
  PERF_ZP(a.comm, zpQuantReduceScatterA2AEx(a.send, a.recv, a.counts->paramCount, a.size->type, a.size->redOp, &options,
                                            a.comm, a.stream));
  return true;
}

// The plan of host/qgz_plan.h. Two hops (several equal nodes of several ranks): N slices to each of the L-1
// local peers, then one requantized partial to each of the N-1 peers of the same local rank. One hop: one
// payload to each other rank.
WireBytes wire(const SizeArgs& s, const OpCounts& c) {
  const double pb = static_cast<double>(quantPayloadBytes(c.paramCount, s.bits, s.blockSize));
  const int n = s.nranks, N = s.nodes, L = n / std::max(1, N);
  const bool twoHop = N > 1 && L > 1 && L * N == n;
  if (!twoHop) return directWire(pb, n, N);
  WireBytes w;
  w.intra = pb * N * (L - 1);
  w.inter = pb * (N - 1);
  return w;
}

PerfOp makeOp() {
  PerfOp op = zpCollectiveOp("qgz_reduce_scatter", countsReduceScatter, run, runNcclReduceScatter);
  op.quantTypesOnly = true;
  op.defaultBits = 4;
  op.reduces = true;
  op.wire = wire;
  return op;
}

}  // namespace
}  // namespace perf
}  // namespace zp

int main(int argc, char** argv) {
  static const zp::perf::PerfOp op = zp::perf::makeOp();
  return zp::perf::perfMain(op, argc, argv);
}
