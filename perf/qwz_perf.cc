// zpQuantAllGather (qwZ) against ncclAllGather on the same type and logical size, in the same run. Size = total
// bytes received per rank (the unquantized tensor), as nccl-tests. -B weight bits (default 8), -G block size.
// Correctness: every rank's output must equal, bit for bit, the host backend's over the same inputs.
#include "host/quant_format.h"
#include "perf/common.h"

namespace zp {
namespace perf {
namespace {

bool run(const RunArgs& a) {
  const zpQuantOptions_t options = {a.size->bits, a.size->blockSize};
  PERF_ZP(a.comm, zpQuantAllGatherEx(a.send, a.recv, a.counts->paramCount, a.size->type, &options, a.comm, a.stream));
  return true;
}

// A ring all-gather of the payloads: every rank's payload travels to n-1 peers.
WireBytes wire(const SizeArgs& s, const OpCounts& c) {
  const double payload = static_cast<double>(quantPayloadBytes(c.paramCount, s.bits, s.blockSize));
  return ringWire(payload * s.nranks, s.nranks, s.nodes);
}

PerfOp makeOp() {
  PerfOp op = zpCollectiveOp("qwz_all_gather", countsAllGather, run, runNcclAllGather);
  op.quantTypesOnly = true;
  op.defaultBits = 8;
  op.wire = wire;
  return op;
}

}  // namespace

std::vector<PerfOp> perfOps() { return {makeOp()}; }

}  // namespace perf
}  // namespace zp
