// NCCL's all-to-all alone (ncclGroupStart + one ncclSend/ncclRecv per peer): the transport of qgZ's two hops.
// Size = total bytes sent per rank, as nccl-tests; each peer gets size/nranks. No in-place variant: sending
// from and receiving into one buffer at once is not a valid use of ncclSend/ncclRecv.
#include "perf/common.h"

int main(int argc, char** argv) {
  using namespace zp::perf;
  static const PerfOp op = [] {
    PerfOp o = ncclCollectiveOp("nccl_all_to_all", countsAllToAll, expectedAllToAll, runNcclAllToAll);
    o.hasInPlace = false;
    return o;
  }();
  return perfMain(op, argc, argv);
}
