// NCCL's all-to-all alone (ncclGroupStart + one ncclSend/ncclRecv per peer): the transport of qgZ's two hops.
// Size = total bytes sent per rank, as nccl-tests; each peer gets size/nranks. No in-place variant: sending
// from and receiving into one buffer at once is not a valid use of ncclSend/ncclRecv.
#include "perf/common.h"

namespace {

bool run(const zp::perf::RunArgs& args) { return zp::perf::runNcclAllToAll(args); }

zp::perf::PerfOp makeOp() {
  zp::perf::PerfOp op;
  op.name = "nccl_all_to_all";
  op.runLabel = "nccl";
  op.uses = zp::perf::kUsesNccl;
  op.defaultType = zpBfloat16;
  op.hasInPlace = false;
  op.fill = zp::perf::Fill::kSpread;
  op.counts = zp::perf::countsAllToAll;
  op.init = zp::perf::initStandard;
  op.expected = zp::perf::expectedAllToAll;
  op.bw = zp::perf::bwCollective;
  op.run = run;
  return op;
}

}  // namespace

int main(int argc, char** argv) {
  static const zp::perf::PerfOp op = makeOp();
  return zp::perf::perfMain(op, argc, argv);
}
