// NCCL's all-gather alone: the baseline the zpccl gathers (qwZ, hpZ) are compared with, measured by the same
// harness so that its numbers line up with theirs. Size = total bytes received per rank, as nccl-tests.
#include "perf/common.h"

int main(int argc, char** argv) {
  using namespace zp::perf;
  static const PerfOp op = [] {
    PerfOp o = ncclCollectiveOp("nccl_all_gather", countsAllGather, expectedAllGather, runNcclAllGather);
    o.fill = Fill::kSpread;  // gathers move bits: any values check exactly
    return o;
  }();
  return perfMain(op, argc, argv);
}
