// The plumbing of the cuda backend's collectives, which execute the plans of host/coll_plan.h (planCall). Each is
// a chunk pipeline of three stages on three streams (cuda_exec.h): quantize, move (the caller's stream, where NCCL
// runs), finish; events order each chunk through them and join everything back to the caller's stream. On the
// direct path qwZ and one-hop qgZ instead read the peers' payloads from their memory inside the finishing kernel
// (directLoads, src/cuda/peer_window.h); where the plan says so, each rank's own slot, which never crosses the
// link, is worked while the others travel (CollPlan::ownSlot). No host synchronization and no allocation once
// scratch is sized: every call can be captured in a CUDA graph.
//
// The collectives themselves: gathers.cc (qwZ, hpZ), qgz.cc (qgZ); the tracing diagnostic: pipeline_trace.h.
#pragma once

#include <nccl.h>

#include <algorithm>

#include "device/kernel_stream.h"
#include "device/peer_window.h"
#include "host/base/backend.h"
#include "host/base/check.h"
#include "host/chunk_plan.h"
#include "host/coll_plan.h"
#include "src/cuda/cuda_exec.h"
#include "src/cuda/nccl_check.h"

namespace zp {

// Grows scratch buffer `which` to at least `bytes` (zeroed), outside graph capture only.
zpResult_t ensureScratch(CudaExec& e, int which, size_t bytes, cudaStream_t stream, const char* call);

// The link facts of this communicator (host/coll_plan.h): host shared memory on extra channels, direct loads agreed
// at init, a green context.
LinkFacts linkFactsOf(const CudaExec& e);

// The plan of call `a` (host/coll_plan.h), chosen from this communicator's facts and logged (INFO COLL). A plan on
// the direct path gets its window (prepareWindow). When that growth finds that some rank's CUDA graph holds the
// window (growPeerWindow's vote, which every rank sees alike), the window stays as it is, frozen, and the call is
// planned again with it: it takes NCCL's path on every rank.
zpResult_t planCall(CudaExec& e, const CollArgs& a, CollPlan* plan);

// Makes the direct-load window hold `bytes` (its flags included) for a call already planned on the direct path:
// grown if it is smaller (like scratch, outside capture only, waiting for the stream and the previous call), unless
// a captured graph froze it. A window that failed to grow in an earlier call fails the call.
zpResult_t prepareWindow(CudaExec& e, size_t bytes, cudaStream_t stream, const char* call);

// The NCCL communicator of a plan's group or hop.
ncclComm_t commOf(const CudaExec& e, PlanComm c);

// NCCL connects point-to-point peers on first use, which cannot happen inside graph capture: one tiny exchange
// with every peer of each communicator that qgZ's all-to-alls use, outside capture, connects them all.
zpResult_t connectPeers(CudaExec& e, const char* call);

// The streams of one call's three stages. A call of one chunk has nothing to overlap: all of it runs on the
// caller's stream, which saves the events' latency on small messages; only its own slot, when worked early
// (OwnSlot::kSideStream), goes to a side stream.
struct Stages {
  cudaStream_t caller, move;
  KernelStream quant, finish;
  bool captured;
  KernelStream own;  // where the own slot is worked early: the finish stage, or a side stream (one chunk)
  bool pipelined() const { return quant.stream != caller; }
  bool ownOnSide() const { return own.stream != finish.stream; }
};

// Orders this call after the previous call's finish stage (which may still read scratch), unless the stream is
// being captured (inside a graph the order of replays is the caller's; the scratch buffers are then marked as
// captured, so that a later growth keeps them for the graph), then starts the quantize stage. The streams are the
// plan's: with greenStages, the quantize and finish stages' kernels run in the green context (the finish stage must
// not call NCCL); the own slot on the finish stage, or on a side stream (in the green context with ownInGreen).
zpResult_t beginPipeline(CudaExec& e, cudaStream_t stream, const CollPlan& plan, Stages* stages);

// The own slots may be worked once every chunk is quantized (the quantize stage is in order)...
zpResult_t afterQuantizeStage(CudaExec& e, const Stages& s, int chunks);
// ...and are done before the finish stage's first kernel.
zpResult_t joinOwnSlots(CudaExec& e, const Stages& s);

// Chunk c is quantized (recorded right after its quantization, before later chunks are enqueued)...
zpResult_t quantized(CudaExec& e, const Stages& s, int c);
// ...so the move stage may send it.
zpResult_t waitQuantized(CudaExec& e, const Stages& s, int c);

// Chunk c has moved: the finish stage may use it.
zpResult_t handOver(CudaExec& e, const Stages& s, int c);

// Joins the finish stage (which waited for every chunk's move, hence for the whole move stage) back into the
// caller's stream. A call of one chunk ran on the caller's stream: sideDone then only marks its end there, since
// the next call may come on another stream and must not touch scratch before this one is done with it.
zpResult_t endPipeline(CudaExec& e, const Stages& s);

// The direct path's frame (src/cuda/peer_window.h), around `write` (fills this rank's window's payload) and `read`
// (reads every rank's payload into recvbuff), both on the caller's stream with every SM, after the previous
// call's work; the window holds the payloads (planCall). The kernels order themselves with the peers' through the
// window's flags (the KernelStream each gets, and a wait before each, inside them where the plan says inlineWaits);
// two events bracket them for an abort (cancelPeerReads). No NCCL call: at 1 MB the whole call is two launches.
template <typename Write, typename Read>
zpResult_t directLoads(CudaExec& e, const CollArgs& a, const CollPlan& plan, Write write, Read read) {
  PeerWindow& w = e.peers;
  Stages st;
  ZPCHECK(beginPipeline(e, a.stream, plan, &st));
  w.captured = w.captured || st.captured;  // a growth must then keep the window for the graph (growPeerWindow)
  KernelStream writeStream(a.stream), readStream(a.stream);
  writeStream.sync = w.sync(/*write=*/true);
  readStream.sync = w.sync(/*write=*/false);
  const bool inlineWaits = plan.inlineWaits;
  if (inlineWaits) {
    for (KernelStream* k : {&writeStream, &readStream}) {
      k->sync.waitInKernel = true;
      k->sms = std::max(1, e.sms / 4);
    }
  }
  if (!st.captured) CUDACHECK(cudaEventRecord(w.readStart, a.stream));
  if (!inlineWaits) ZPCHECK(launchPeerWait(writeStream.sync, a.stream));
  ZPCHECK(write(w.payload(), writeStream));
  if (!inlineWaits) ZPCHECK(launchPeerWait(readStream.sync, a.stream));
  ZPCHECK(read(w, readStream));
  if (!st.captured) {
    CUDACHECK(cudaEventRecord(w.readDone, a.stream));
    // The next call's start and zpCommDestroy wait for this, as for a pipeline's finish stage.
    CUDACHECK(cudaEventRecord(e.sideDone, a.stream));
  }
  return zpSuccess;
}

}  // namespace zp
