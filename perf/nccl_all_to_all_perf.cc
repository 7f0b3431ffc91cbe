// NCCL's all-to-all alone (ncclGroupStart + one ncclSend/ncclRecv per peer): the transport of qgZ's two hops.
// Size = total bytes sent per rank, as nccl-tests; each peer gets size/nranks. No in-place variant: sending
// from and receiving into one buffer at once is not a valid use of ncclSend/ncclRecv.
#include "perf/common.h"

namespace zp {
namespace perf {

std::vector<PerfOp> perfOps() {
  PerfOp op = ncclCollectiveOp("nccl_all_to_all", countsAllToAll, expectedAllToAll, runNcclAllToAll);
  op.hasInPlace = false;
  return {op};
}

}  // namespace perf
}  // namespace zp
