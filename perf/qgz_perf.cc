// zpQuantReduceScatterA2A (qgZ) against ncclReduceScatter on the same type and logical size, in the same run.
// Size = total bytes sent per rank, as nccl-tests. -B gradient bits (default 4), -G block size, -o sum|avg.
// Correctness: every rank's output must equal, bit for bit, the host backend's over the same inputs.
// -s: stochastic rounding, -E: error feedback (include/zpccl.h, "Gradient rounding"), through
// zpQuantReduceScatterA2AEx2: residuals (bf16, the sendbuff's count, and the hop residual) in the op's scratch,
// updated by every timed call as in training; every call draws with sequence 0 so that the checked call (one fresh
// call after the timed ones, residuals zeroed first) equals the host backend's first.
#include <cstring>

#include "host/quant_format.h"
#include "perf/common.h"

namespace zp {
namespace perf {
namespace {

// Elements of the two residuals of error feedback: the sender's (the whole input) and the intermediate hop's (at
// most as many: nodes * recvcount).
size_t residualElems(const OpCounts& c, const SizeArgs& s) { return c.paramCount * s.nranks; }

void counts(const SizeArgs& s, OpCounts* c) {
  countsReduceScatter(s, c);
  if (s.feedback) c->scratchBytes = 2 * 2 * residualElems(*c, s);
}

bool run(const RunArgs& a) {
  const SizeArgs& s = *a.size;
  if (!s.stochastic && !s.feedback) {
    const zpQuantOptions_t options = {s.bits, s.blockSize};
    PERF_ZP(a.comm, zpQuantReduceScatterA2AEx(a.send, a.recv, a.counts->paramCount, s.type, s.redOp, &options, a.comm,
                                              a.stream));
    return true;
  }
  zpGradOptions_t o = ZP_GRAD_OPTIONS_INITIALIZER;
  o.bits = s.bits;
  o.blockSize = s.blockSize;
  o.rounding = s.stochastic ? zpRoundStochastic : zpRoundNearest;
  o.sequence = 0;
  if (s.feedback) {
    size_t hop = 0;
    PERF_ZP(a.comm, zpGradHopResidualCount(a.counts->paramCount, &hop, a.comm));
    o.residual = a.scratch;
    o.residualCount = residualElems(*a.counts, s);
    o.hopResidual = hop ? static_cast<char*>(a.scratch) + 2 * o.residualCount : nullptr;
    o.hopResidualCount = hop;
  }
  PERF_ZP(a.comm,
          zpQuantReduceScatterA2AEx2(a.send, a.recv, a.counts->paramCount, s.type, s.redOp, &o, a.comm, a.stream));
  return true;
}

// Zero residuals before a checked call (on both sides).
bool reset(const RunArgs& a) {
  if (!a.size->feedback) return true;
  if (a.backend == zpBackendHost) {
    std::memset(a.scratch, 0, a.counts->scratchBytes);
    return true;
  }
  PERF_CUDA(cudaMemsetAsync(a.scratch, 0, a.counts->scratchBytes, a.stream));
  return true;
}

// The plan of host/qgz_plan.h. Two hops (zpTwoHops: N equal nodes of L ranks each): N slices to each of the L-1
// local peers, then one requantized partial to each of the N-1 peers of the same local rank. One hop: one
// payload to each other rank.
WireBytes wire(const SizeArgs& s, const OpCounts& c) {
  const double pb = static_cast<double>(quantPayloadBytes(c.paramCount, s.bits, s.blockSize));
  if (!zpTwoHops(s)) return directWire(pb, s.nranks, s.nodes);
  const int N = s.nodes, L = s.nranks / N;
  WireBytes w;
  w.intra = pb * N * (L - 1);
  w.inter = pb * (N - 1);
  return w;
}

PerfOp makeOp() {
  PerfOp op = zpCollectiveOp("qgz_reduce_scatter", counts, run, runNcclReduceScatter);
  op.reset = reset;
  op.quantTypesOnly = true;
  op.defaultBits = 4;
  op.reduces = true;
  op.wire = wire;
  return op;
}

}  // namespace

std::vector<PerfOp> perfOps() { return {makeOp()}; }

}  // namespace perf
}  // namespace zp
