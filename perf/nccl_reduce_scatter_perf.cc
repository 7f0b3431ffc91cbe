// NCCL's reduce-scatter alone: the baseline of the quantized reduce-scatter (qgZ). Size = total bytes sent
// per rank, as nccl-tests. Inputs are multiples of 1/8 so that NCCL's sums, in whatever order its
// algorithm picks, equal the host reference bit for bit (-o sum|avg).
#include "perf/common.h"

namespace zp {
namespace perf {

std::vector<PerfOp> perfOps() {
  PerfOp op = ncclCollectiveOp("nccl_reduce_scatter", countsReduceScatter, expectedReduceScatter, runNcclReduceScatter);
  op.reduces = true;
  op.fill = Fill::kExact;
  return {op};
}

}  // namespace perf
}  // namespace zp
