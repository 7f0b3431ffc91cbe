// NCCL's reduce-scatter alone: the baseline of the quantized reduce-scatter (qgZ). Size = total bytes sent
// per rank, as nccl-tests. Inputs are multiples of 1/8 so that NCCL's sums, in whatever order its
// algorithm picks, equal the host reference bit for bit (-o sum|avg).
#include "perf/common.h"

namespace {

bool run(const zp::perf::RunArgs& args) { return zp::perf::runNcclReduceScatter(args); }

zp::perf::PerfOp makeOp() {
  zp::perf::PerfOp op;
  op.name = "nccl_reduce_scatter";
  op.runLabel = "nccl";
  op.uses = zp::perf::kUsesNccl;
  op.defaultType = zpBfloat16;
  op.reduces = true;
  op.fill = zp::perf::Fill::kExact;
  op.counts = zp::perf::countsReduceScatter;
  op.init = zp::perf::initStandard;
  op.expected = zp::perf::expectedReduceScatter;
  op.bw = zp::perf::bwCollective;
  op.run = run;
  return op;
}

}  // namespace

int main(int argc, char** argv) {
  static const zp::perf::PerfOp op = makeOp();
  return zp::perf::perfMain(op, argc, argv);
}
