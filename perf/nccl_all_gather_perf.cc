// NCCL's all-gather alone: the baseline the zpccl gathers (qwZ, hpZ) are compared with, measured by the same
// harness so that its numbers line up with theirs. Size = total bytes received per rank, as nccl-tests.
#include "perf/common.h"

namespace {

bool run(const zp::perf::RunArgs& args) { return zp::perf::runNcclAllGather(args); }

zp::perf::PerfOp makeOp() {
  zp::perf::PerfOp op;
  op.name = "nccl_all_gather";
  op.runLabel = "nccl";
  op.uses = zp::perf::kUsesNccl;
  op.defaultType = zpBfloat16;
  op.fill = zp::perf::Fill::kSpread;  // gathers move bits: any values check exactly
  op.counts = zp::perf::countsAllGather;
  op.init = zp::perf::initStandard;
  op.expected = zp::perf::expectedAllGather;
  op.bw = zp::perf::bwCollective;
  op.run = run;
  return op;
}

}  // namespace

int main(int argc, char** argv) {
  static const zp::perf::PerfOp op = makeOp();
  return zp::perf::perfMain(op, argc, argv);
}
