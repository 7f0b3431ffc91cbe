// NCCL's all-gather alone: the baseline the zpccl gathers (qwZ, hpZ) are compared with, measured by the same
// harness so that its numbers line up with theirs. Size = total bytes received per rank, as nccl-tests.
#include "perf/common.h"

namespace zp {
namespace perf {

std::vector<PerfOp> perfOps() {
  PerfOp op = ncclCollectiveOp("nccl_all_gather", countsAllGather, expectedAllGather, runNcclAllGather);
  op.fill = Fill::kSpread;  // gathers move bits: any values check exactly
  return {op};
}

}  // namespace perf
}  // namespace zp
