// NCCL's reduce-scatter alone: the baseline of the quantized reduce-scatter (qgZ). Size = total bytes sent
// per rank, as nccl-tests. Inputs are multiples of 1/8 so that NCCL's sums, in whatever order its
// algorithm picks, equal the host reference bit for bit (-o sum|avg).
#include "perf/common.h"

int main(int argc, char** argv) {
  using namespace zp::perf;
  static const PerfOp op = [] {
    PerfOp o =
        ncclCollectiveOp("nccl_reduce_scatter", countsReduceScatter, expectedReduceScatter, runNcclReduceScatter);
    o.reduces = true;
    o.fill = Fill::kExact;
    return o;
  }();
  return perfMain(op, argc, argv);
}
