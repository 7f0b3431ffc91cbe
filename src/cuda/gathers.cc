// The gathers of the cuda backend: qwZ (the quantized gather over the world) and hpZ (the secondary shards over
// the hpZ group, as they are or quantized), on the path their plan chose (host/coll_plan.h): the pipeline of
// pipeline.h or, among the ranks of one NVLink domain, direct loads of the peers' payloads.
#include <nccl.h>

#include "device/quantize.h"
#include "host/base/check.h"
#include "host/chunk_plan.h"
#include "host/coll_plan.h"
#include "host/dtype.h"
#include "src/cuda/cuda_exec.h"
#include "src/cuda/nccl_check.h"
#include "src/cuda/pipeline.h"
#include "src/cuda/pipeline_trace.h"

namespace zp {

namespace {

// The direct path (qwZ, or hpZ over the whole world, of n ranks): each rank's window holds its quantized shard;
// one launch dequantizes the n windows, the peers' read over NVLink, into recvbuff.
zpResult_t gatherDirect(CudaExec& e, const CollArgs& a, const CollPlan& p) {
  const int n = p.ranks;
  return directLoads(
      e, a, p,
      [&](char* payload, KernelStream writeStream) {
        return launchQuantize(a.sendbuff, payload, a.count, a.type, a.bits, a.blockSize, writeStream);
      },
      [&](const PeerWindow& w, KernelStream readStream) {
        return launchDequantize(w.rankWindow(0), a.recvbuff, a.count, a.type, a.bits, a.blockSize, readStream, n,
                                w.rankStride, a.count);
      });
}

// The pipelined gather over the plan's group (n ranks, this one `rank`). Quantize: the own shard into its slot of
// every chunk's region. Move: all-gather the regions chunk by chunk, in one hop over the group or, on the plan's two
// hops (the all-reduce's gather on nodes of several ranks), among the ranks of this local rank and then inside the
// node, the region's slots in twoHopGatherSlots' order (host/coll_plan.h). Finish: dequantize each gathered chunk
// into recvbuff, all ranks' slots in one launch, or one a run of twoHopGatherSlots. The gather's kernels leave
// ZP_NCCL_SMS SMs to NCCL where the plan runs its stages in the green context: its transfer is the longest stage,
// and its CTAs cannot start on an SM that our CTAs occupy (src/cuda/green_context.h; perf/RESULTS.md, qwZ).
zpResult_t gatherPipeline(CudaExec& e, const CollArgs& a, const CollPlan& p) {
  const size_t esz = typeSize(a.type);
  const int n = p.ranks;
  const bool twoHops = p.path == PlanPath::kTwoHops;
  const TwoHopGatherSlots slots = twoHops ? twoHopGatherSlots(e.topo) : TwoHopGatherSlots{};
  const int rank = twoHops ? slots.mySlot : p.rank;  // this rank's slot in a chunk's region
  const ncclComm_t comm = commOf(e, p.hop[0].comm);
  const ChunkPlan& plan = p.chunks;
  const ChunkRegion at(plan, p.sendSlots, a.bits, a.blockSize);  // chunk c: every rank's slot, in rank order
  ZPCHECK(ensureScratch(e, 0, p.scratchBytes[0], a.stream, a.opName));
  const bool ownEarly = p.ownEarly();
  Stages st;
  ZPCHECK(beginPipeline(e, a.stream, p, &st));
  PipelineTrace trace(e, a.opName, p.logicalBytes, plan.chunks, a.stream);
  char* region = static_cast<char*>(e.scratch[0].ptr);
  const auto* send = static_cast<const char*>(a.sendbuff);
  auto* recv = static_cast<char*>(a.recvbuff);

  // Step 1 (quantize stage): chunk c of the shard into this rank's slot of chunk c's region. In place is safe:
  // the finish stage of chunk c' writes only chunk c' of each shard, and chunk c' is quantized before.
  for (int c = 0; c < plan.chunks; ++c) {
    const size_t pb = at.slotBytes(c);
    trace.mark(PipelineTrace::kQuantize, c, false, st.quant.stream);
    ZPCHECK(launchQuantize(send + plan.offset(c) * esz, region + at.offset(c) + rank * pb, plan.elems(c), a.type,
                           a.bits, a.blockSize, st.quant));
    trace.mark(PipelineTrace::kQuantize, c, true, st.quant.stream);
    ZPCHECK(quantized(e, st, c));
  }
  // Dequantizes slots [first, first + count) of chunk c into their shards of recvbuff.
  auto dequantizeSlots = [&](int c, int first, int count, KernelStream stream) {
    if (count <= 0) return zpSuccess;
    const size_t pb = at.slotBytes(c);
    return launchDequantize(region + at.offset(c) + first * pb, recv + (first * a.count + plan.offset(c)) * esz,
                            plan.elems(c), a.type, a.bits, a.blockSize, stream, count, pb, a.count);
  };
  if (ownEarly) {
    // Step 1b (while the first chunk travels): this rank's slot of every chunk into its own shard. In place, the
    // shard is the send buffer, which every chunk's quantization has read by then.
    ZPCHECK(afterQuantizeStage(e, st, plan.chunks));
    for (int c = 0; c < plan.chunks; ++c) {
      trace.mark(PipelineTrace::kOwn, c, false, st.own.stream);
      ZPCHECK(dequantizeSlots(c, rank, 1, st.own));
      trace.mark(PipelineTrace::kOwn, c, true, st.own.stream);
    }
  }
  // Step 2 (move stage): gather chunk c while chunk c+1 is quantized and chunk c-1 dequantized.
  for (int c = 0; c < plan.chunks; ++c) {
    const size_t pb = at.slotBytes(c);
    char* chunk = region + at.offset(c);
    ZPCHECK(waitQuantized(e, st, c));
    trace.mark(PipelineTrace::kMove, c, false, st.move);
    if (twoHops) {
      // This local rank's N slots from its peers on the other nodes, then every local rank's N slots.
      const int N = e.topo.nodes;
      char* mine = chunk + e.topo.localRank * N * pb;
      ZPCHECK(ncclCheck(ncclAllGather(mine + e.topo.node * pb, mine, pb, ncclUint8, comm, st.move), a.opName,
                        "ncclAllGather across nodes"));
      ZPCHECK(ncclCheck(ncclAllGather(mine, chunk, N * pb, ncclUint8, commOf(e, p.hop[1].comm), st.move), a.opName,
                        "ncclAllGather inside the node"));
    } else {
      ZPCHECK(
          ncclCheck(ncclAllGather(chunk + rank * pb, chunk, pb, ncclUint8, comm, st.move), a.opName, "ncclAllGather"));
    }
    trace.mark(PipelineTrace::kMove, c, true, st.move);
    ZPCHECK(handOver(e, st, c));
    if (c == 0) ZPCHECK(joinOwnSlots(e, st));
    trace.mark(PipelineTrace::kFinish, c, false, st.finish.stream);
    if (twoHops) {
      const size_t pb = at.slotBytes(c);
      for (const TwoHopGatherSlots::Run& r : slots.runs) {
        ZPCHECK(launchDequantize(region + at.offset(c) + r.first * pb,
                                 recv + (r.rank0 * a.count + plan.offset(c)) * esz, plan.elems(c), a.type, a.bits,
                                 a.blockSize, st.finish, r.count, pb, r.stride * a.count));
      }
    } else if (ownEarly) {  // the peers' slots, before and after this rank's
      ZPCHECK(dequantizeSlots(c, 0, rank, st.finish));
      ZPCHECK(dequantizeSlots(c, rank + 1, n - rank - 1, st.finish));
    } else {
      ZPCHECK(dequantizeSlots(c, 0, n, st.finish));
    }
    trace.mark(PipelineTrace::kFinish, c, true, st.finish.stream);
  }
  return endPipeline(e, st, trace);
}

// qwZ over the world (and the all-reduce's gather, in one hop or two), hpZ's quantized mode over the hpZ group, and
// exact hpZ: the secondary shards as they are, one all-gather over the hpZ group's communicator.
zpResult_t gather(CudaExec& e, const CollArgs& a) {
  CollPlan p;
  ZPCHECK(planCall(e, a, &p));
  switch (p.path) {
    case PlanPath::kDirect:
      return gatherDirect(e, a, p);
    case PlanPath::kExact:
      return ncclCheck(ncclAllGather(a.sendbuff, a.recvbuff, a.count * typeSize(a.type), ncclUint8,
                                     commOf(e, p.hop[0].comm), a.stream),
                       a.opName, "ncclAllGather over the hpZ group");
    default:
      return gatherPipeline(e, a, p);
  }
}

}  // namespace

zpResult_t cudaQuantAllGather(CudaExec& e, const CollArgs& a) { return gather(e, a); }

zpResult_t cudaHierAllGather(CudaExec& e, const CollArgs& a) { return gather(e, a); }

}  // namespace zp
