// The cuda backend's pipeline plumbing (pipeline.h): the plan of each call, scratch and window growth, the stages'
// streams and events, the first exchange with every peer, and zpCommReserve.
#include "src/cuda/pipeline.h"

#include <algorithm>

#include "host/all_reduce_shards.h"
#include "host/base/debug.h"
#include "host/quant_format.h"
#include "src/cuda/host_wait.h"

namespace zp {

namespace {

// Before one of the communicator's buffers grows: refused inside graph capture (growing allocates), then waits
// for the work that may still use the old buffer: the caller's stream and the previous call (its finish stage, or
// a direct-load call on another stream).
zpResult_t beforeGrowing(CudaExec& e, cudaStream_t stream, const char* call, const char* what, size_t need,
                         size_t have) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (stream != nullptr) CUDACHECK(cudaStreamIsCapturing(stream, &status));
  if (status != cudaStreamCaptureStatusNone) {
    return ZP_ERR(zpInvalidUsage,
                  "%s : needs %zu bytes of %s, the communicator holds %zu, and the stream is being captured: call "
                  "zpCommReserve (or this collective once) before capture",
                  call, need, what, have);
  }
  if (stream != nullptr) ZPCHECK(waitOnHost(stream, &e.stopHostWaits, call, "the stream's work before a growth"));
  return waitOnHost(e.sideDone, &e.stopHostWaits, call, "the previous call before a growth");
}

}  // namespace

zpResult_t ensureScratch(CudaExec& e, int which, size_t bytes, cudaStream_t stream, const char* call) {
  ScratchBuffer& s = e.scratch[which];
  if (s.bytes >= bytes) return zpSuccess;
  ZPCHECK(beforeGrowing(e, stream, call, "scratch memory", bytes, s.bytes));
  if (s.ptr != nullptr && s.captured) {
    e.retiredScratch.push_back(s.ptr);  // a graph may still replay with it
    ZP_INFO(kSubsysAlloc, "%s : scratch %d (%zu bytes) retired, not freed: a captured call uses it", call, which,
            s.bytes);
  } else if (s.ptr != nullptr) {
    CUDACHECK(cudaFree(s.ptr));
  }
  s = ScratchBuffer();
  const size_t rounded = alignUp(bytes, size_t{1} << 20);
  CUDACHECK(cudaMalloc(&s.ptr, rounded));
  // Zeroed once, so that no byte of scratch is ever undefined (compute-sanitizer initcheck, which does not see
  // the writes of the NCCL kernels it is told to skip, then reports nothing from our kernels' reads). On the
  // non-blocking setup stream: a plain cudaMemset would go to the legacy default stream and wait for every
  // blocking stream, including one where another communicator's NCCL kernel waits for a peer (a deadlock).
  CUDACHECK(cudaMemsetAsync(s.ptr, 0, rounded, e.setupStream));
  ZPCHECK(waitOnHost(e.setupStream, &e.stopHostWaits, call, "zeroing scratch"));
  s.bytes = rounded;
  ZP_INFO(kSubsysAlloc, "%s : scratch %d grown to %zu bytes", call, which, rounded);
  return zpSuccess;
}

zpResult_t prepareWindow(CudaExec& e, size_t bytes, cudaStream_t stream, const char* call) {
  PeerWindow& w = e.peers;
  if (w.broken) {
    return ZP_ERR(zpInternalError,
                  "%s : the direct-load window failed to grow in an earlier call (its error said why); "
                  "abort the communicator",
                  call);
  }
  if (w.bytes < bytes && !w.frozen) {
    ZPCHECK(beforeGrowing(e, stream, call, "direct-load window", bytes, w.bytes));
    ZPCHECK(growPeerWindow(w, e.comms.world, bytes, e.setupStream, &e.stopHostWaits, call));
  }
  return zpSuccess;
}

LinkFacts linkFactsOf(const CudaExec& e) { return LinkFacts{e.shmChannels, e.peers.usable, e.green.active()}; }

namespace {

WindowFacts windowFactsOf(const PeerWindow& w) { return WindowFacts{w.bytes, w.frozen, w.payloadOffset()}; }

}  // namespace

zpResult_t planCall(CudaExec& e, const CollArgs& a, CollPlan* plan) {
  PlanFacts f = planFactsOf(e.topo, a);
  f.link = linkFactsOf(e);
  f.window = windowFactsOf(e.peers);
  *plan = planCollective(f);
  if (plan->path == PlanPath::kDirect) {
    ZPCHECK(prepareWindow(e, plan->windowBytes, a.stream, a.opName));
    if (e.peers.bytes < plan->windowBytes) {  // frozen instead of grown: a graph holds it
      f.window = windowFactsOf(e.peers);
      *plan = planCollective(f);
    }
  }
  ZP_INFO(kSubsysColl, "%s : %s", a.opName, plan->describe().c_str());
  return zpSuccess;
}

ncclComm_t commOf(const CudaExec& e, PlanComm c) {
  switch (c) {
    case PlanComm::kIntra:
      return e.comms.intra;
    case PlanComm::kInter:
      return e.comms.inter;
    case PlanComm::kHpz:
      return e.comms.hpz;
    default:
      return e.comms.world;
  }
}

zpResult_t beginPipeline(CudaExec& e, cudaStream_t stream, const CollPlan& plan, Stages* stages) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CUDACHECK(cudaStreamIsCapturing(stream, &status));
  const bool captured = status != cudaStreamCaptureStatusNone;
  if (!captured) CUDACHECK(cudaStreamWaitEvent(stream, e.sideDone, 0));
  if (captured) {
    // Every allocated buffer, whether or not this call uses it: one that is idle now costs only its memory.
    for (ScratchBuffer& s : e.scratch) s.captured = s.captured || s.ptr != nullptr;
  }
  const GreenStreams& g = e.green;
  if (!plan.pipelined()) {
    *stages = Stages{stream, stream, stream, stream, captured, stream};
    if (plan.ownSlot == OwnSlot::kSideStream) {
      stages->own = plan.ownInGreen ? KernelStream(g.side, g.sms) : KernelStream(e.sideStream);
    }
    return zpSuccess;
  }
  const KernelStream quant = plan.greenStages ? KernelStream(g.quant, g.sms) : KernelStream(e.quantStream);
  const KernelStream finish = plan.greenStages ? KernelStream(g.side, g.sms) : KernelStream(e.sideStream);
  *stages = Stages{stream, e.moveStream, quant, finish, captured, finish};
  CUDACHECK(cudaEventRecord(e.callStart, stream));
  CUDACHECK(cudaStreamWaitEvent(stages->quant.stream, e.callStart, 0));
  CUDACHECK(cudaStreamWaitEvent(e.moveStream, e.callStart, 0));
  return zpSuccess;
}

zpResult_t afterQuantizeStage(CudaExec& e, const Stages& s, int chunks) {
  if (s.ownOnSide()) CUDACHECK(cudaEventRecord(e.quantReady[chunks - 1], s.quant.stream));
  if (s.pipelined() || s.ownOnSide()) CUDACHECK(cudaStreamWaitEvent(s.own.stream, e.quantReady[chunks - 1], 0));
  return zpSuccess;
}
zpResult_t joinOwnSlots(CudaExec& e, const Stages& s) {
  if (!s.ownOnSide()) return zpSuccess;
  CUDACHECK(cudaEventRecord(e.ownSlotDone, s.own.stream));
  CUDACHECK(cudaStreamWaitEvent(s.finish.stream, e.ownSlotDone, 0));
  return zpSuccess;
}

zpResult_t quantized(CudaExec& e, const Stages& s, int c) {
  if (!s.pipelined()) return zpSuccess;
  CUDACHECK(cudaEventRecord(e.quantReady[c], s.quant.stream));
  return zpSuccess;
}
zpResult_t waitQuantized(CudaExec& e, const Stages& s, int c) {
  if (!s.pipelined()) return zpSuccess;
  CUDACHECK(cudaStreamWaitEvent(s.move, e.quantReady[c], 0));
  return zpSuccess;
}

zpResult_t handOver(CudaExec& e, const Stages& s, int c) {
  if (!s.pipelined()) return zpSuccess;
  CUDACHECK(cudaEventRecord(e.chunkReady[c], s.move));
  CUDACHECK(cudaStreamWaitEvent(s.finish.stream, e.chunkReady[c], 0));
  return zpSuccess;
}

zpResult_t endPipeline(CudaExec& e, const Stages& s) {
  if (!s.pipelined()) {
    if (!s.captured) CUDACHECK(cudaEventRecord(e.sideDone, s.caller));
    return zpSuccess;
  }
  cudaEvent_t done = s.captured ? e.capturedSideDone : e.sideDone;
  CUDACHECK(cudaEventRecord(done, s.finish.stream));
  CUDACHECK(cudaStreamWaitEvent(s.caller, done, 0));
  return zpSuccess;
}

zpResult_t connectPeers(CudaExec& e, const char* call) {
  if (e.peersConnected) return zpSuccess;
  ZPCHECK(ensureScratch(e, 0, 16 * (e.topo.nranks + 1), e.setupStream, call));
  // Its bytes go through scratch 0, which the previous call may still use (on the caller's stream).
  CUDACHECK(cudaStreamWaitEvent(e.setupStream, e.sideDone, 0));
  char* buf = static_cast<char*>(e.scratch[0].ptr);
  for (ncclComm_t comm : {e.comms.world, e.comms.intra, e.comms.inter}) {
    if (comm == nullptr) continue;
    int peers = 0;
    ZPCHECK(ncclCheck(ncclCommCount(comm, &peers), call, "ncclCommCount"));
    ZPCHECK(ncclCheck(ncclGroupStart(), call, "ncclGroupStart"));
    for (int p = 0; p < peers; ++p) {
      ZPCHECK(ncclCheck(ncclSend(buf, 1, ncclUint8, p, comm, e.setupStream), call, "ncclSend"));
      ZPCHECK(ncclCheck(ncclRecv(buf + 16 * (p + 1), 1, ncclUint8, p, comm, e.setupStream), call, "ncclRecv"));
    }
    ZPCHECK(ncclCheck(ncclGroupEnd(), call, "ncclGroupEnd"));
  }
  ZPCHECK(waitOnHost(e.setupStream, &e.stopHostWaits, call, "the first exchange with every peer"));
  e.peersConnected = true;
  return zpSuccess;
}

zpResult_t cudaReserve(CudaExec& e, size_t maxBytes) {
  const ReservePlan r =
      planReserve(e.topo, PlanTunables::fromParams(), linkFactsOf(e), e.peers.payloadOffset(), maxBytes);
  ZPCHECK(ensureScratch(e, 0, r.scratchBytes[0], e.setupStream, "zpCommReserve"));
  ZPCHECK(ensureScratch(e, 1, r.scratchBytes[1], e.setupStream, "zpCommReserve"));
  if (r.windowBytes > 0) ZPCHECK(prepareWindow(e, r.windowBytes, e.setupStream, "zpCommReserve"));
  // The all-reduce's padded copy of a tensor that is not n whole shards (all_reduce.cc), in the widest type's
  // elements, whose count rounds up most.
  size_t padded = 0;
  for (size_t esz : {size_t{2}, size_t{4}}) {
    padded = std::max(padded, e.topo.nranks * allReduceShardCount(maxBytes / esz, e.topo.nranks, kMaxBlockSize) * esz);
  }
  ZPCHECK(ensureScratch(e, kScratchAllReduceTensor, padded, e.setupStream, "zpCommReserve"));
  return connectPeers(e, "zpCommReserve");
}

}  // namespace zp
