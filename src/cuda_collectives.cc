// The cuda backend's collectives: NCCL moves the payloads, device/ kernels quantize and reduce. Each is a chunk
// pipeline of three stages on three streams (cuda_exec.h): quantize, move (the caller's stream, where NCCL
// runs), finish; events order each chunk through them and join everything back to the caller's stream. Among
// the ranks of one NVLink domain, qwZ and one-hop qgZ instead read the peers' payloads from their memory inside
// the finishing kernel (directLoads, src/peer_window.h); over slow links each rank's own slot, which never
// crosses the link, is worked while the others travel (ownSlotEarly). No host synchronization and no allocation
// once scratch is sized: every call can be captured in a CUDA graph.
#include <algorithm>
#include <bitset>
#include <cstdio>
#include <string>

#include "device/peer_window.h"
#include "device/quantize.h"
#include "device/reduce.h"
#include "host/chunk_plan.h"
#include "host/dtype.h"
#include "host/quant_format.h"
#include "src/cuda_exec.h"
#include "src/host_wait.h"
#include "src/include/check.h"
#include "src/include/debug.h"
#include "src/include/params.h"

namespace zp {

namespace {

ChunkPlan chunkPlanFor(size_t count, int blockSize, size_t logicalBytes) {
  const int maxChunks = static_cast<int>(std::min<int64_t>(paramPipelineMaxChunks(), kMaxPipelineChunks));
  return makeChunkPlan(count, blockSize, logicalBytes, paramPipelineChunkBytes(), maxChunks,
                       paramPipelineChunkRamp() != 0);
}

// A scratch region of `slots` payloads a chunk, chunk after chunk: where chunk c's slots lie.
class ChunkRegion {
 public:
  ChunkRegion(const ChunkPlan& plan, int slots, int bits, int blockSize) : chunks_(plan.chunks) {
    for (int c = 0; c < plan.chunks; ++c) {
      slotBytes_[c] = quantPayloadBytes(plan.elems(c), bits, blockSize);
      offset_[c + 1] = offset_[c] + slots * slotBytes_[c];
    }
  }
  size_t slotBytes(int c) const { return slotBytes_[c]; }  // one payload: chunk c's elements, quantized
  size_t offset(int c) const { return offset_[c]; }        // chunk c's first slot, from the region's start
  size_t bytes() const { return offset_[chunks_]; }

 private:
  int chunks_;
  std::array<size_t, kMaxPipelineChunks> slotBytes_{};
  std::array<size_t, kMaxPipelineChunks + 1> offset_{};
};

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

// Whether a call moving logicalBytes takes the direct path (src/peer_window.h): direct loads are usable at its
// size, and the window has room for `payloadBytes` after its flags, grown if needed (like scratch, outside capture
// only) unless a captured graph froze it. Every rank answers the same: the window's size and freezing are agreed.
zpResult_t takesDirectPath(CudaExec& e, size_t logicalBytes, size_t payloadBytes, cudaStream_t stream, const char* call,
                           bool* direct) {
  PeerWindow& w = e.peers;
  *direct = false;
  if (!useDirectLoads(w, logicalBytes)) return zpSuccess;
  if (w.broken) {
    return ZP_ERR(zpInternalError,
                  "%s : the direct-load window failed to grow in an earlier call (its error said why); "
                  "abort the communicator",
                  call);
  }
  const size_t bytes = w.payloadOffset() + payloadBytes;
  if (w.bytes < bytes && !w.frozen) {
    ZPCHECK(beforeGrowing(e, stream, call, "direct-load window", bytes, w.bytes));
    ZPCHECK(growPeerWindow(w, e.comms.world, bytes, e.setupStream, &e.stopHostWaits, call));
  }
  *direct = w.bytes >= bytes;
  return zpSuccess;
}

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
                         bool ownSlotEarly = false) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CUDACHECK(cudaStreamIsCapturing(stream, &status));
  const bool captured = status != cudaStreamCaptureStatusNone;
  if (!captured) CUDACHECK(cudaStreamWaitEvent(stream, e.sideDone, 0));
  if (captured) {
    // Every allocated buffer, whether or not this call uses it: one that is idle now costs only its memory.
    for (ScratchBuffer& s : e.scratch) s.captured = s.captured || s.ptr != nullptr;
  }
  const GreenStreams& g = e.green;
  if (chunks <= 1) {
    *stages = Stages{stream, stream, stream, stream, captured, stream};
    if (ownSlotEarly) stages->own = g.active() ? KernelStream(g.side, g.sms) : KernelStream(e.sideStream);
    return zpSuccess;
  }
  const bool useGreen = green && g.active();
  const KernelStream quant = useGreen ? KernelStream(g.quant, g.sms) : KernelStream(e.quantStream);
  const KernelStream finish = useGreen ? KernelStream(g.side, g.sms) : KernelStream(e.sideStream);
  *stages = Stages{stream, e.moveStream, quant, finish, captured, finish};
  CUDACHECK(cudaEventRecord(e.callStart, stream));
  CUDACHECK(cudaStreamWaitEvent(stages->quant.stream, e.callStart, 0));
  CUDACHECK(cudaStreamWaitEvent(e.moveStream, e.callStart, 0));
  return zpSuccess;
}

// Whether `comm`'s transfers cross a slow link: host shared memory (one node without NCCL P2P, on the extra
// channels) or sockets (the world over several nodes; an hpZ group shares a node).
bool overSlowLink(const CudaExec& e, ncclComm_t comm) {
  return e.shmChannels || (comm == e.comms.world && e.topo.nodes > 1);
}

// Over a slow link (host shared memory, sockets) each rank's own slot, the one that never crosses it, is worked
// while the first chunk travels (ZP_OWN_SLOT_EARLY_BYTES): qwZ dequantizes its own shard, qgZ quantizes the slice
// it keeps, on the finish stage, or for a call of one chunk (64 MB over shared memory, whose kernels are all
// exposed) on a side stream while the rest stays on the caller's. Those kernels then leave the transfer's
// critical path. NVLink keeps the plain pipeline (the direct path, or NCCL's CTAs needing the SMs).
bool ownSlotEarly(bool slowLink, size_t logicalBytes) {
  const int64_t from = paramOwnSlotEarlyBytes();
  return slowLink && from >= 0 && logicalBytes >= static_cast<size_t>(from);
}

// The own slots may be worked once every chunk is quantized (the quantize stage is in order)...
zpResult_t afterQuantizeStage(CudaExec& e, const Stages& s, int chunks) {
  if (s.ownOnSide()) CUDACHECK(cudaEventRecord(e.quantReady[chunks - 1], s.quant.stream));
  if (s.pipelined() || s.ownOnSide()) CUDACHECK(cudaStreamWaitEvent(s.own.stream, e.quantReady[chunks - 1], 0));
  return zpSuccess;
}
// ...and are done before the finish stage's first kernel.
zpResult_t joinOwnSlots(CudaExec& e, const Stages& s) {
  if (!s.ownOnSide()) return zpSuccess;
  CUDACHECK(cudaEventRecord(e.ownSlotDone, s.own.stream));
  CUDACHECK(cudaStreamWaitEvent(s.finish.stream, e.ownSlotDone, 0));
  return zpSuccess;
}

// Chunk c is quantized (recorded right after its quantization, before later chunks are enqueued)...
zpResult_t quantized(CudaExec& e, const Stages& s, int c) {
  if (!s.pipelined()) return zpSuccess;
  CUDACHECK(cudaEventRecord(e.quantReady[c], s.quant.stream));
  return zpSuccess;
}
// ...so the move stage may send it.
zpResult_t waitQuantized(CudaExec& e, const Stages& s, int c) {
  if (!s.pipelined()) return zpSuccess;
  CUDACHECK(cudaStreamWaitEvent(s.move, e.quantReady[c], 0));
  return zpSuccess;
}

// Chunk c has moved: the finish stage may use it.
zpResult_t handOver(CudaExec& e, const Stages& s, int c) {
  if (!s.pipelined()) return zpSuccess;
  CUDACHECK(cudaEventRecord(e.chunkReady[c], s.move));
  CUDACHECK(cudaStreamWaitEvent(s.finish.stream, e.chunkReady[c], 0));
  return zpSuccess;
}

// Joins the finish stage (which waited for every chunk's move, hence for the whole move stage) back into the
// caller's stream. A call of one chunk ran on the caller's stream: sideDone then only marks its end there, since
// the next call may come on another stream and must not touch scratch before this one is done with it.
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

// ZP_TRACE_PIPELINE=1: timing events around each stage of each chunk, read back at the end of the call and logged
// (INFO COLL) as one line: when each stage of each chunk ran, relative to the call's start (and the own slot's
// kernel, ownSlotEarly, wherever it runs), each stage's busy time, and the overlap achieved: (sum of the stages' busy
// times - the call's time) / (that sum - the busiest stage's), 0 when the stages ran one after another, 1 for a perfect
// pipeline. The read-back is a host wait, so a traced call is never captured (inside capture the trace is off) and
// back-to-back calls no longer overlap.
class PipelineTrace {
 public:
  enum Stage { kQuantize = 0, kMove = 1, kFinish = 2, kOwn = 3 };  // kOwn: not a stage of the overlap

  PipelineTrace(CudaExec& e, const char* op, size_t logicalBytes, int chunks, cudaStream_t caller)
      : e_(e), op_(op), bytes_(logicalBytes), chunks_(chunks), caller_(caller) {
    if (paramTracePipeline() == 0 || chunks > kMaxPipelineChunks) return;
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(caller, &status) != cudaSuccess || status != cudaStreamCaptureStatusNone) return;
    while (e.traceEvents.size() < kEvents) {
      cudaEvent_t ev = nullptr;
      if (cudaEventCreate(&ev) != cudaSuccess) return;
      e.traceEvents.push_back(ev);
    }
    on_ = cudaEventRecord(e.traceEvents[0], caller) == cudaSuccess;
  }

  // Stage s of chunk c begins (end = false) or ends (true) at this point of `stream`.
  void mark(Stage s, int c, bool end, cudaStream_t stream) {
    if (!on_) return;
    if (cudaEventRecord(e_.traceEvents[slot(s, c, end)], stream) != cudaSuccess) on_ = false;
    marked_.set(slot(s, c, end));
  }

  // After the call is joined back to the caller's stream: waits for it and logs the line.
  void report() {
    if (!on_) return;
    cudaEvent_t done = e_.traceEvents[1];
    float ms = 0;
    if (cudaEventRecord(done, caller_) != cudaSuccess || cudaEventSynchronize(done) != cudaSuccess ||
        cudaEventElapsedTime(&ms, e_.traceEvents[0], done) != cudaSuccess) {
      (void)cudaGetLastError();
      return;
    }
    const double total = 1000.0 * ms;
    double busy[kStages] = {0, 0, 0, 0};
    std::string chunks;
    for (int c = 0; c < chunks_; ++c) {
      chunks += " | c" + std::to_string(c);
      for (int s = 0; s < kStages; ++s) {
        const double begin = at(slot(static_cast<Stage>(s), c, false)), end = at(slot(static_cast<Stage>(s), c, true));
        if (begin < 0 || end < 0) continue;
        busy[s] += end - begin;
        char text[64];
        snprintf(text, sizeof(text), " %c %.0f-%.0f", "qmfo"[s], begin, end);
        chunks += text;
      }
    }
    const double sum = busy[0] + busy[1] + busy[2];
    const double longest = std::max(busy[0], std::max(busy[1], busy[2]));
    const double overlap = sum > longest ? (sum - total) / (sum - longest) : 0.0;
    ZP_INFO(kSubsysColl,
            "trace %s %zu B, %d chunk(s): %.1f us; busy quantize %.1f, move %.1f, finish %.1f, own slot %.1f us;"
            " overlap %.2f; per chunk (q quantize, m move, f finish, o own slot; us from the call's start)%s",
            op_, bytes_, chunks_, total, busy[0], busy[1], busy[2], busy[3], overlap, chunks.c_str());
  }

 private:
  static constexpr int kStages = 4;
  static constexpr size_t kEvents = 2 + 2 * kStages * kMaxPipelineChunks;
  static size_t slot(Stage s, int c, bool end) {
    return 2 + 2 * kStages * static_cast<size_t>(c) + 2 * s + (end ? 1 : 0);
  }
  // Microseconds from the call's start to event i, or -1 when that event was not recorded in this call.
  double at(size_t i) const {
    if (!marked_.test(i)) return -1;
    float ms = 0;
    if (cudaEventElapsedTime(&ms, e_.traceEvents[0], e_.traceEvents[i]) != cudaSuccess) {
      (void)cudaGetLastError();
      return -1;
    }
    return 1000.0 * ms;
  }

  CudaExec& e_;
  const char* op_;
  size_t bytes_;
  int chunks_;
  cudaStream_t caller_;
  bool on_ = false;
  std::bitset<kEvents> marked_;  // the events recorded in this call (the others may hold an earlier call's time)
};

zpResult_t ncclCheck(ncclResult_t r, const char* call, const char* what) {
  if (r == ncclSuccess || r == ncclInProgress) return zpSuccess;
  return ZP_ERR(static_cast<zpResult_t>(r), "%s : %s failed: %s (%s)", call, what, ncclGetErrorString(r),
                ncclGetLastError(nullptr));
}

// Quantizes count elements of sendbuff's slices into n send slots of one chunk: slot s holds slice
// sliceOfSlot[s] (elements [offset, offset+count) of it). Runs of slots whose slices are evenly spaced go in
// one launch (every slot for one hop; one launch per local peer for node-major two-hop layouts).
zpResult_t quantizeSlots(const CollArgs& a, const int* sliceOfSlot, int n, size_t sliceElems, size_t offset,
                         size_t count, char* slots, size_t slotBytes, KernelStream stream) {
  const size_t esz = typeSize(a.type);
  const auto* send = static_cast<const char*>(a.sendbuff);
  for (int s = 0; s < n;) {
    int run = 1;
    const long stride = s + 1 < n ? sliceOfSlot[s + 1] - sliceOfSlot[s] : 1;
    while (s + run < n && stride > 0 && sliceOfSlot[s + run] - sliceOfSlot[s + run - 1] == stride) run++;
    // A direct-load write of several launches (PeerSync): the first waits for the peers, the last signals them.
    KernelStream launch = stream;
    if (s > 0) launch.sync.waitFor = PeerSync::kNone;
    if (s + run < n) launch.sync.raise = PeerSync::kNone;
    ZPCHECK(launchQuantize(send + (sliceOfSlot[s] * sliceElems + offset) * esz, slots + s * slotBytes, count, a.type,
                           a.bits, a.blockSize, launch, run, stride * sliceElems, slotBytes));
    s += run;
  }
  return zpSuccess;
}

// NCCL connects point-to-point peers on first use, which cannot happen inside graph capture: one tiny exchange
// with every peer of each communicator that qgZ's all-to-alls use, outside capture, connects them all.
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

}  // namespace

zpResult_t cudaReserve(CudaExec& e, size_t maxBytes) {
  // Size for the worst settings a call may ask for: 8 bits, the smallest block, 2-byte types.
  const int bits = 8, blockSize = kMinBlockSize, n = e.topo.nranks;
  const size_t count = maxBytes / (2 * n);  // elements per rank (qwZ shard, qgZ slice)
  const ChunkPlan plan = chunkPlanFor(count, blockSize, maxBytes);
  ZPCHECK(ensureScratch(e, 0, ChunkRegion(plan, n, bits, blockSize).bytes(), e.setupStream, "zpCommReserve"));
  // qgZ's pair layout receives into three slots a chunk (cudaQuantReduceScatter).
  ZPCHECK(
      ensureScratch(e, 1, ChunkRegion(plan, std::max(n, 3), bits, blockSize).bytes(), e.setupStream, "zpCommReserve"));
  bool direct = false;  // room for qgZ's n slots of one call (qwZ needs one)
  ZPCHECK(takesDirectPath(e, maxBytes, n * quantPayloadBytes(count, bits, blockSize), e.setupStream, "zpCommReserve",
                          &direct));
  return connectPeers(e, "zpCommReserve");
}

namespace {

// The direct path's frame (src/peer_window.h), around `write` (fills this rank's window's payload) and `read`
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

// The quantized gather over `comm` (n ranks, this one `rank`): qwZ over the world, hpZ's quantized mode over the
// hpZ group. Quantize: the own shard into its slot of every chunk's region. Move: all-gather the regions chunk
// by chunk. Finish: dequantize each gathered chunk (all ranks' slots in one launch) into recvbuff.
zpResult_t quantizedGather(CudaExec& e, const CollArgs& a, ncclComm_t comm, int n, int rank) {
  const size_t esz = typeSize(a.type);
  bool direct = false;
  if (comm == e.comms.world && rank == e.topo.rank) {
    ZPCHECK(takesDirectPath(e, a.count * n * esz, quantPayloadBytes(a.count, a.bits, a.blockSize), a.stream, a.opName,
                            &direct));
  }
  if (direct) {
    // Each rank's window holds its quantized shard; one launch dequantizes the n windows, the peers' read over
    // NVLink, into recvbuff.
    return directLoads(
        e, a, a.count * n * esz,
        [&](char* payload, KernelStream writeStream) {
          return launchQuantize(a.sendbuff, payload, a.count, a.type, a.bits, a.blockSize, writeStream);
        },
        [&](const PeerWindow& w, KernelStream readStream) {
          return launchDequantize(w.rankWindow(0), a.recvbuff, a.count, a.type, a.bits, a.blockSize, readStream, n,
                                  w.rankStride, a.count);
        });
  }
  const ChunkPlan plan = chunkPlanFor(a.count, a.blockSize, a.count * n * esz);
  const ChunkRegion at(plan, n, a.bits, a.blockSize);  // chunk c: every rank's slot, in rank order
  ZPCHECK(ensureScratch(e, 0, at.bytes(), a.stream, a.opName));
  const bool ownEarly = ownSlotEarly(overSlowLink(e, comm), a.count * n * esz);
  Stages st;
  // The gather's kernels leave ZP_NCCL_SMS SMs (32 by default) to NCCL: its transfer is the longest stage, and its
  // CTAs cannot start on an SM that our CTAs occupy (src/green_context.h). Measured over NVLink, int8 at 1 GB:
  // 1.21x NCCL with every SM, 1.30x with 32 SMs left to NCCL.
  ZPCHECK(beginPipeline(e, a.stream, plan.chunks, /*green=*/true, &st, ownEarly));
  PipelineTrace trace(e, a.opName, a.count * n * esz, plan.chunks, a.stream);
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
    ZPCHECK(
        ncclCheck(ncclAllGather(chunk + rank * pb, chunk, pb, ncclUint8, comm, st.move), a.opName, "ncclAllGather"));
    trace.mark(PipelineTrace::kMove, c, true, st.move);
    ZPCHECK(handOver(e, st, c));
    if (c == 0) ZPCHECK(joinOwnSlots(e, st));
    trace.mark(PipelineTrace::kFinish, c, false, st.finish.stream);
    if (ownEarly) {  // the peers' slots, before and after this rank's
      ZPCHECK(dequantizeSlots(c, 0, rank, st.finish));
      ZPCHECK(dequantizeSlots(c, rank + 1, n - rank - 1, st.finish));
    } else {
      ZPCHECK(dequantizeSlots(c, 0, n, st.finish));
    }
    trace.mark(PipelineTrace::kFinish, c, true, st.finish.stream);
  }
  ZPCHECK(endPipeline(e, st));
  trace.report();
  return zpSuccess;
}

}  // namespace

zpResult_t cudaQuantAllGather(CudaExec& e, const CollArgs& a) {
  return quantizedGather(e, a, e.comms.world, e.topo.nranks, e.topo.rank);
}

// hpZ moves the secondary shards as they are: one all-gather over the hpZ group's communicator (or, when the
// call asks for bits, the quantized gather over that group).
zpResult_t cudaHierAllGather(CudaExec& e, const CollArgs& a) {
  if (a.bits != 0) return quantizedGather(e, a, e.comms.hpz, e.topo.hpzSize, e.topo.hpzRank);
  const size_t bytes = a.count * typeSize(a.type);
  return ncclCheck(ncclAllGather(a.sendbuff, a.recvbuff, bytes, ncclUint8, e.comms.hpz, a.stream), a.opName,
                   "ncclAllGather over the hpZ group");
}

// Whether two ranks exchange their slots by one all-gather (exchangeSlots).
bool pairGather(int peers, bool ringFaster) {
  const int64_t mode = paramPairAllGather();
  return peers == 2 && (mode == 1 || (mode == 2 && ringFaster));
}

// An all-to-all among the `peers` ranks of `comm` (this one `self`), `peerBytes` per peer: slot p of `send` goes
// to peer p, slot p of `recv` comes from peer p (this rank's own slot included).
// Between two ranks where `ringFaster` (ZP_PAIR_ALLGATHER) it is one all-gather of the slot each sends the other:
// the same bytes on the wire, on NCCL's collective path. Over sockets that runs at the ring's bandwidth where its
// point-to-point reaches ~2/3 of it (qgZ int4 over net, 1 GB: 2.56x -> 3.82x NCCL); over host shared memory it
// gets the ZP_SHM_MIN_CTAS channels, which point-to-point does not (int4 at 1 GB: 3.38x -> 3.75x). Over NVLink the
// gather is the slower (1.80x -> 1.59x), so NVLink ranks keep ncclSend/ncclRecv. The gather leaves this rank's
// outgoing slot in its own receive slot; a local copy then puts there the slot it keeps.
// With `withoutSelf`, this rank's slots are left out (point-to-point only: the caller fills its receive slot).
zpResult_t exchangeSlots(const char* send, char* recv, size_t peerBytes, int peers, int self, bool ringFaster,
                         ncclComm_t comm, cudaStream_t stream, const char* call, bool withoutSelf = false) {
  if (!withoutSelf && pairGather(peers, ringFaster)) {
    const int other = 1 - self;
    ZPCHECK(ncclCheck(ncclAllGather(send + other * peerBytes, recv, peerBytes, ncclUint8, comm, stream), call,
                      "ncclAllGather of a pair's slots"));
    CUDACHECK(
        cudaMemcpyAsync(recv + self * peerBytes, send + self * peerBytes, peerBytes, cudaMemcpyDeviceToDevice, stream));
    return zpSuccess;
  }
  ZPCHECK(ncclCheck(ncclGroupStart(), call, "ncclGroupStart"));
  for (int peer = 0; peer < peers; ++peer) {
    if (withoutSelf && peer == self) continue;
    ZPCHECK(ncclCheck(ncclSend(send + peer * peerBytes, peerBytes, ncclUint8, peer, comm, stream), call, "ncclSend"));
    ZPCHECK(ncclCheck(ncclRecv(recv + peer * peerBytes, peerBytes, ncclUint8, peer, comm, stream), call, "ncclRecv"));
  }
  return ncclCheck(ncclGroupEnd(), call, "ncclGroupEnd");
}

// qgZ, as host/qgz_plan.h describes it, chunk by chunk (each chunk covers the same element range of every slice).
// One hop:  move = all-to-all of the slots; finish = sum the n received payloads into recvbuff.
// Two hops: move = intra-node all-to-all, then the fused dequantize + sum + requantize of the N partials;
//           finish = inter-node all-to-all of the partials, then their sum into recvbuff.
// Scratch 0 holds each chunk's send slots (later its requantized partials); scratch 1 its received payloads
// (later the partials received in hop 2).
zpResult_t cudaQuantReduceScatter(CudaExec& e, const CollArgs& a) {
  const QgzPlan& q = e.qgz;
  const int n = q.nranks, N = q.nodes, L = q.localSize;
  const size_t esz = typeSize(a.type);
  const float divisor = a.op == zpAvg ? static_cast<float>(n) : 1.0f;
  const size_t sliceBytes = quantPayloadBytes(a.count, a.bits, a.blockSize);  // a whole slice's payload
  bool direct = false;
  if (!q.twoHop) ZPCHECK(takesDirectPath(e, a.count * n * esz, n * sliceBytes, a.stream, a.opName, &direct));
  if (direct) {
    // Slot s of each rank's window holds its quantized slice for rank s; one launch sums slot `rank` of every
    // window, the peers' read over NVLink, in rank order into recvbuff.
    return directLoads(
        e, a, a.count * n * esz,
        [&](char* payload, KernelStream writeStream) {
          return quantizeSlots(a, q.sliceOfSlot.data(), n, a.count, 0, a.count, payload, sliceBytes, writeStream);
        },
        [&](const PeerWindow& w, KernelStream readStream) {
          const ReduceSources sources{w.rankWindow(0) + e.topo.rank * sliceBytes, w.rankStride, 0, n, 1};
          return launchReduceFinish(sources, a.count, a.bits, a.blockSize, a.type, divisor, a.recvbuff, a.count,
                                    readStream);
        });
  }
  const ChunkPlan plan = chunkPlanFor(a.count, a.blockSize, a.count * n * esz);
  // One hop over a slow link, from ZP_OWN_SLOT_EARLY_BYTES: the slice this rank keeps is quantized on the finish
  // stage while the others travel (ownSlotEarly), straight into the received slot that the sum reads, and is never
  // sent. Between two ranks that exchange by a gather, each chunk receives into three slots (pairLayout): the
  // outgoing slot in the middle, gathered in place, so that NCCL writes only the peer's slot (left of it on rank
  // 1, right of it on rank 0), and the kept one at the other end: the two sources in rank order at slots 0 and 2.
  const bool slowLink = overSlowLink(e, e.comms.world);
  // One hop: across nodes when the ranks are on several (two ranks: one each), or over host shared memory on the
  // extra channels, which NCCL's collectives use and its point-to-point does not.
  const bool ringFaster = !q.twoHop && slowLink;
  const bool keptLate = !q.twoHop && ownSlotEarly(slowLink, a.count * n * esz);
  const bool pairLayout = keptLate && pairGather(n, ringFaster);
  const int recvSlots = pairLayout ? 3 : n;
  const int self = e.topo.rank, other = 1 - self;  // other: pairLayout's peer
  const ChunkRegion sendAt(plan, n, a.bits, a.blockSize), recvAt(plan, recvSlots, a.bits, a.blockSize);
  ZPCHECK(ensureScratch(e, 0, sendAt.bytes(), a.stream, a.opName));
  ZPCHECK(ensureScratch(e, 1, recvAt.bytes(), a.stream, a.opName));
  if (!e.peersConnected) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    CUDACHECK(cudaStreamIsCapturing(a.stream, &status));
    if (status != cudaStreamCaptureStatusNone) {
      return ZP_ERR(zpInvalidUsage, "%s : first call inside graph capture: call zpCommReserve before capturing",
                    a.opName);
    }
    ZPCHECK(connectPeers(e, a.opName));
  }
  Stages st;
  // Every SM for qgZ's kernels: it quantizes all n slices (the gather only its shard), so its quantize stage is
  // as long as its transfer over NVLink, and fewer SMs slow the whole pipeline (measured, int4 at 1 GB: 1.75x
  // NCCL with every SM, 1.46x with 32 SMs left to NCCL).
  ZPCHECK(beginPipeline(e, a.stream, plan.chunks, /*green=*/false, &st, keptLate));
  PipelineTrace trace(e, a.opName, a.count * n * esz, plan.chunks, a.stream);
  auto* sendRegion = static_cast<char*>(e.scratch[0].ptr);
  auto* recvRegion = static_cast<char*>(e.scratch[1].ptr);
  auto* recv = static_cast<char*>(a.recvbuff);
  const int* slices = q.sliceOfSlot.data();
  // Quantizes chunk c of slots [first, first + count) into `slots` (slot `first` at its start).
  auto quantizeRun = [&](int c, int first, int count, char* slots, KernelStream stream) {
    if (count <= 0) return zpSuccess;
    return quantizeSlots(a, slices + first, count, a.count, plan.offset(c), plan.elems(c), slots, sendAt.slotBytes(c),
                         stream);
  };

  // Step 1 (quantize stage): chunk c of every slice into its send slot (with keptLate, of every slice but the
  // kept one). In place is safe: the finish stage of chunk c' writes only chunk c' of recvbuff, and chunk c' of
  // every slice is quantized before.
  for (int c = 0; c < plan.chunks; ++c) {
    const size_t pb = sendAt.slotBytes(c);  // the same in both regions
    char* slots = sendRegion + sendAt.offset(c);
    trace.mark(PipelineTrace::kQuantize, c, false, st.quant.stream);
    if (!keptLate) {
      ZPCHECK(quantizeRun(c, 0, n, slots, st.quant));
    } else if (pairLayout) {
      ZPCHECK(quantizeRun(c, other, 1, recvRegion + recvAt.offset(c) + pb, st.quant));
    } else {
      ZPCHECK(quantizeRun(c, 0, self, slots, st.quant));
      ZPCHECK(quantizeRun(c, self + 1, n - self - 1, slots + (self + 1) * pb, st.quant));
    }
    trace.mark(PipelineTrace::kQuantize, c, true, st.quant.stream);
    ZPCHECK(quantized(e, st, c));
  }
  if (keptLate) {
    // Step 1b (while the first chunk travels): the kept slice of every chunk into its received slot. In place,
    // the finish stage writes that slice only after this.
    ZPCHECK(afterQuantizeStage(e, st, plan.chunks));
    const int keptSlot = pairLayout ? 2 * self : self;
    for (int c = 0; c < plan.chunks; ++c) {
      trace.mark(PipelineTrace::kOwn, c, false, st.own.stream);
      ZPCHECK(quantizeRun(c, self, 1, recvRegion + recvAt.offset(c) + keptSlot * recvAt.slotBytes(c), st.own));
      trace.mark(PipelineTrace::kOwn, c, true, st.own.stream);
    }
  }
  for (int c = 0; c < plan.chunks; ++c) {
    const size_t cc = plan.elems(c);
    const size_t pb = sendAt.slotBytes(c);
    char* slots = sendRegion + sendAt.offset(c);
    char* received = recvRegion + recvAt.offset(c);
    ZPCHECK(waitQuantized(e, st, c));
    trace.mark(PipelineTrace::kMove, c, false, st.move);
    // Step 2 (move): the first all-to-all: L peers, N slots each (one hop: L = n peers, one slot each).
    ncclComm_t firstHop = q.twoHop ? e.comms.intra : e.comms.world;
    const int firstHopRank = q.twoHop ? e.topo.localRank : e.topo.rank;
    const size_t peerBytes = N * pb;
    if (pairLayout) {
      ZPCHECK(ncclCheck(ncclAllGather(received + pb, received + other * pb, pb, ncclUint8, firstHop, st.move), a.opName,
                        "ncclAllGather of a pair's slots"));
    } else {
      ZPCHECK(exchangeSlots(slots, received, peerBytes, L, firstHopRank, ringFaster, firstHop, st.move, a.opName,
                            /*withoutSelf=*/keptLate));
    }
    if (!q.twoHop) {
      trace.mark(PipelineTrace::kMove, c, true, st.move);
      ZPCHECK(handOver(e, st, c));
      if (c == 0) ZPCHECK(joinOwnSlots(e, st));
      trace.mark(PipelineTrace::kFinish, c, false, st.finish.stream);
      // Step 3 (finish): the slot from rank j (j-th source) summed in rank order.
      const ReduceSources sources{received, pairLayout ? 2 * pb : pb, 0, n, 1};
      ZPCHECK(launchReduceFinish(sources, cc, a.bits, a.blockSize, a.type, divisor, recv + plan.offset(c) * esz, cc,
                                 st.finish));
      trace.mark(PipelineTrace::kFinish, c, true, st.finish.stream);
    } else {
      // Step 3 (move): partial b = sum over local peers l (in order) of received slot l*N + b, requantized
      // into the front of this chunk's send region (its slots have left).
      const ReduceSources partials{received, peerBytes, pb, L, N};
      ZPCHECK(launchReduceRequantize(partials, cc, a.bits, a.blockSize, slots, pb, st.move));
      trace.mark(PipelineTrace::kMove, c, true, st.move);
      ZPCHECK(handOver(e, st, c));
      trace.mark(PipelineTrace::kFinish, c, false, st.finish.stream);
      // Step 4 (finish): the inter-node all-to-all among ranks of this local rank: partial b to node b.
      ZPCHECK(exchangeSlots(slots, received, pb, N, e.topo.node, /*ringFaster=*/true, e.comms.inter, st.finish.stream,
                            a.opName));
      // Step 5 (finish): node a's partial, summed in node order, into recvbuff.
      const ReduceSources finals{received, pb, 0, N, 1};
      ZPCHECK(launchReduceFinish(finals, cc, a.bits, a.blockSize, a.type, divisor, recv + plan.offset(c) * esz, cc,
                                 st.finish));
      trace.mark(PipelineTrace::kFinish, c, true, st.finish.stream);
    }
  }
  ZPCHECK(endPipeline(e, st));
  trace.report();
  return zpSuccess;
}

}  // namespace zp
