// The plumbing of the cuda backend's collectives. Each is a chunk pipeline of three stages on three streams
// (cuda_exec.h): quantize, move (the caller's stream, where NCCL runs), finish; events order each chunk through
// them and join everything back to the caller's stream. Among the ranks of one NVLink domain, qwZ and one-hop qgZ
// instead read the peers' payloads from their memory inside the finishing kernel (directLoads,
// src/cuda/peer_window.h); over slow links each rank's own slot, which never crosses the link, is worked while
// the others travel (ownSlotEarly). No host synchronization and no allocation once scratch is sized: every call
// can be captured in a CUDA graph.
//
// The collectives themselves: gathers.cc (qwZ, hpZ), qgz.cc (qgZ); the tracing diagnostic: pipeline_trace.h.
#pragma once

#include <nccl.h>

#include <algorithm>

#include "device/kernel_stream.h"
#include "device/peer_window.h"
#include "host/chunk_plan.h"
#include "src/cuda/cuda_exec.h"
#include "src/include/backend.h"
#include "src/include/check.h"
#include "src/include/nccl_check.h"
#include "src/include/params.h"

namespace zp {

// How a call of `count` elements a rank (logicalBytes in all) is cut into chunks (ZP_CHUNK_BYTES, ZP_MAX_CHUNKS,
// ZP_CHUNK_RAMP).
ChunkPlan chunkPlanFor(size_t count, int blockSize, size_t logicalBytes);

// Grows scratch buffer `which` to at least `bytes` (zeroed), outside graph capture only.
zpResult_t ensureScratch(CudaExec& e, int which, size_t bytes, cudaStream_t stream, const char* call);

// Whether a call moving logicalBytes takes the direct path (src/cuda/peer_window.h): direct loads are usable at
// its size, and the window has room for `payloadBytes` after its flags, grown if needed (like scratch, outside
// capture only) unless a captured graph froze it. Every rank answers the same: the window's size and freezing
// are agreed.
zpResult_t takesDirectPath(CudaExec& e, size_t logicalBytes, size_t payloadBytes, cudaStream_t stream, const char* call,
                           bool* direct);

// NCCL connects point-to-point peers on first use, which cannot happen inside graph capture: one tiny exchange
// with every peer of each communicator that qgZ's all-to-alls use, outside capture, connects them all.
zpResult_t connectPeers(CudaExec& e, const char* call);

// The streams of one call's three stages. A call of one chunk has nothing to overlap: all of it runs on the
// caller's stream, which saves the events' latency on small messages; only its own slot, when worked early
// (ownSlotEarly), goes to a side stream.
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
// captured, so that a later growth keeps them for the graph), then starts the quantize stage. With
// `green`, the quantize and finish stages' kernels run in the green context (the finish stage must not call NCCL).
// With `ownSlotEarly` (below), a one-chunk call works its own slot on a side stream, in the green context when
// there is one whatever `green` says: it runs beside NCCL's kernel, whose CTAs need free SMs.
zpResult_t beginPipeline(CudaExec& e, cudaStream_t stream, int chunks, bool green, Stages* stages,
                         bool ownSlotEarly = false);

// Whether `comm`'s transfers cross a slow link: host shared memory (one node without NCCL P2P, on the extra
// channels) or sockets (the world over several nodes; an hpZ group shares a node).
bool overSlowLink(const CudaExec& e, ncclComm_t comm);

// Over a slow link (host shared memory, sockets) each rank's own slot, the one that never crosses it, is worked
// while the first chunk travels (ZP_OWN_SLOT_EARLY_BYTES): qwZ dequantizes its own shard, qgZ quantizes the slice
// it keeps, on the finish stage, or for a call of one chunk (whose kernels are all exposed) on a side stream while
// the rest stays on the caller's. Those kernels then leave the transfer's critical path. NVLink keeps the plain
// pipeline (the direct path, or NCCL's CTAs needing the SMs).
bool ownSlotEarly(bool slowLink, size_t logicalBytes);

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
// call's work; the window holds the payloads (takesDirectPath). The kernels order themselves with the peers' through
// the window's flags (the KernelStream each gets, and a wait before each, inside them for small calls); two events
// bracket them for an abort (cancelPeerReads). No NCCL call: at 1 MB the whole call is two launches.
template <typename Write, typename Read>
zpResult_t directLoads(CudaExec& e, const CollArgs& a, size_t logicalBytes, Write write, Read read) {
  PeerWindow& w = e.peers;
  Stages st;
  ZPCHECK(beginPipeline(e, a.stream, /*chunks=*/1, /*green=*/false, &st));
  w.captured = w.captured || st.captured;  // a growth must then keep the window for the graph (growPeerWindow)
  KernelStream writeStream(a.stream), readStream(a.stream);
  writeStream.sync = w.sync(/*write=*/true);
  readStream.sync = w.sync(/*write=*/false);
  const bool inlineWaits = logicalBytes <= static_cast<size_t>(paramDirectInlineWaitBytes());
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
