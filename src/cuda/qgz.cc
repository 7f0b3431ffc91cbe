// qgZ on the cuda backend (zpQuantReduceScatterA2A), as host/qgz_plan.h describes it, chunk by chunk (each chunk
// covers the same element range of every slice), on the path its plan chose (host/coll_plan.h), one named helper
// each:
// - direct (one hop among the ranks of one NVLink domain): each rank quantizes its slices into its window, and
//   one launch sums every window's slot for this rank (pipeline.h, directLoads);
// - one hop: move = all-to-all of the slots; finish = sum the n received payloads into recvbuff;
// - two hops: move = intra-node all-to-all, then the fused dequantize + sum + requantize of the N partials;
//   finish = inter-node all-to-all of the partials, then their sum into recvbuff.
// Scratch 0 holds each chunk's send slots (two hops: later its requantized partials); scratch 1 its received
// payloads (two hops: later the partials received in hop 2).
//
// Every SM for qgZ's kernels: it quantizes all n slices (the gather only its shard), so its quantize stage is as
// long as its transfer over NVLink, and SMs left to NCCL slow the whole pipeline (perf/RESULTS.md, qgZ).
#include <nccl.h>

#include "device/quantize.h"
#include "device/reduce.h"
#include "host/base/check.h"
#include "host/chunk_plan.h"
#include "host/coll_plan.h"
#include "host/dtype.h"
#include "host/qgz_plan.h"
#include "host/quant_format.h"
#include "src/cuda/cuda_exec.h"
#include "src/cuda/nccl_check.h"
#include "src/cuda/pipeline.h"
#include "src/cuda/pipeline_trace.h"

namespace zp {

// An all-to-all among the hop's peers on `comm` (this rank hop.self), `peerBytes` per peer: slot p of `send` goes
// to peer p, slot p of `recv` comes from peer p (this rank's own slot included, unless hop.withoutSelf: the caller
// fills its receive slot). A pair's gather (Exchange::kPairGather, ZP_PAIR_ALLGATHER: the same bytes on the wire, on
// NCCL's collective path, host/coll_plan.h says where it is faster) leaves this rank's outgoing slot in its own
// receive slot; a local copy then puts there the slot it keeps.
zpResult_t exchangeSlots(const char* send, char* recv, size_t peerBytes, const HopPlan& hop, ncclComm_t comm,
                         cudaStream_t stream, const char* call) {
  const int self = hop.self;
  if (hop.exchange == Exchange::kPairGather) {
    const int other = 1 - self;
    ZPCHECK(ncclCheck(ncclAllGather(send + other * peerBytes, recv, peerBytes, ncclUint8, comm, stream), call,
                      "ncclAllGather of a pair's slots"));
    CUDACHECK(
        cudaMemcpyAsync(recv + self * peerBytes, send + self * peerBytes, peerBytes, cudaMemcpyDeviceToDevice, stream));
    return zpSuccess;
  }
  if (hop.exchange != Exchange::kSendRecv) {
    return ZP_ERR(zpInternalError, "%s : exchangeSlots cannot run a %s", call, exchangeName(hop.exchange));
  }
  ZPCHECK(ncclCheck(ncclGroupStart(), call, "ncclGroupStart"));
  for (int peer = 0; peer < hop.peers; ++peer) {
    if (hop.withoutSelf && peer == self) continue;
    ZPCHECK(ncclCheck(ncclSend(send + peer * peerBytes, peerBytes, ncclUint8, peer, comm, stream), call, "ncclSend"));
    ZPCHECK(ncclCheck(ncclRecv(recv + peer * peerBytes, peerBytes, ncclUint8, peer, comm, stream), call, "ncclRecv"));
  }
  return ncclCheck(ncclGroupEnd(), call, "ncclGroupEnd");
}

namespace {

// Gradient rounding (include/zpccl.h): the launch of hop `hop` on this rank, for segment 0 of slice `slice` at
// element `offset` of it, segments `sliceStride` slices apart, its residual (the sendbuff's layout for hop 0, the
// hop residual's for hop 1: slice * count + offset on) `residualStride` elements apart.
GradQuantLaunch gradLaunch(const CollArgs& a, int rank, uint32_t hop, int slice, int sliceStride, size_t offset,
                           uint16_t* residual, size_t residualStride) {
  GradQuantLaunch g;
  g.stochastic = a.grad.stochastic;
  g.key = GradRandomKey{a.grad.seed, a.grad.sequence, static_cast<uint32_t>(rank), hop};
  g.slice0 = static_cast<uint32_t>(slice);
  g.sliceStride = sliceStride;
  g.firstElem = offset;
  g.residual = residual != nullptr ? residual + static_cast<size_t>(slice) * a.count + offset : nullptr;
  g.residualStrideElems = residualStride;
  return g;
}

// Quantizes count elements of sendbuff's slices into n send slots of one chunk: slot s holds slice
// sliceOfSlot[s] (elements [offset, offset+count) of it). Runs of slots whose slices are evenly spaced go in
// one launch (every slot for one hop; one launch per local peer for node-major two-hop layouts). With gradient
// rounding, each slice draws as slice d of hop 0 of `rank` and feeds back through its part of the residual.
zpResult_t quantizeSlots(const CollArgs& a, int rank, const int* sliceOfSlot, int n, size_t sliceElems, size_t offset,
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
    const char* in = send + (sliceOfSlot[s] * sliceElems + offset) * esz;
    if (a.grad.any()) {
      const GradQuantLaunch g = gradLaunch(a, rank, 0, sliceOfSlot[s], static_cast<int>(stride), offset,
                                           a.grad.residual, stride * sliceElems);
      ZPCHECK(launchQuantizeGrad(in, slots + s * slotBytes, count, a.type, a.bits, a.blockSize, g, launch, run,
                                 stride * sliceElems, slotBytes));
    } else {
      ZPCHECK(launchQuantize(in, slots + s * slotBytes, count, a.type, a.bits, a.blockSize, launch, run,
                             stride * sliceElems, slotBytes));
    }
    s += run;
  }
  return zpSuccess;
}

// Sums `sources` (chunk c's elements of each), in their order, into chunk c of recvbuff, divided by `divisor`.
zpResult_t sumIntoRecv(const CollArgs& a, const ChunkPlan& plan, int c, const ReduceSources& sources, float divisor,
                       KernelStream stream) {
  auto* recv = static_cast<char*>(a.recvbuff) + plan.offset(c) * typeSize(a.type);
  return launchReduceFinish(sources, plan.elems(c), a.bits, a.blockSize, a.type, divisor, recv, plan.elems(c), stream);
}

// The direct path: slot s of each rank's window holds its quantized slice for rank s; one launch sums slot
// `rank` of every window, the peers' read over NVLink, in rank order into recvbuff.
zpResult_t qgzDirect(CudaExec& e, const CollArgs& a, const CollPlan& coll, float divisor) {
  const QgzPlan& q = e.qgz;
  const int n = q.nranks;
  const size_t sliceBytes = quantPayloadBytes(a.count, a.bits, a.blockSize);  // a whole slice's payload
  return directLoads(
      e, a, coll,
      [&](char* payload, KernelStream writeStream) {
        return quantizeSlots(a, e.topo.rank, q.sliceOfSlot.data(), n, a.count, 0, a.count, payload, sliceBytes,
                             writeStream);
      },
      [&](const PeerWindow& w, KernelStream readStream) {
        const ReduceSources sources{w.rankWindow(0) + e.topo.rank * sliceBytes, w.rankStride, 0, n, 1};
        return launchReduceFinish(sources, a.count, a.bits, a.blockSize, a.type, divisor, a.recvbuff, a.count,
                                  readStream);
      });
}

// What a pipelined call (one hop or two) works with: its chunks, where each chunk's send and receive slots lie in
// scratch 0 and 1, and its stages.
struct QgzPipeline {
  ChunkPlan plan;
  ChunkRegion sendAt, recvAt;
  char* sendRegion = nullptr;
  char* recvRegion = nullptr;
  Stages st;

  QgzPipeline(const ChunkPlan& p, int n, int recvSlots, int bits, int blockSize)
      : plan(p), sendAt(p, n, bits, blockSize), recvAt(p, recvSlots, bits, blockSize) {}
};

// Sizes the scratch of a pipelined call (the plan's), connects the peers (never inside capture), and begins the
// pipeline on the plan's streams.
zpResult_t beginQgzPipeline(CudaExec& e, const CollArgs& a, const CollPlan& coll, QgzPipeline* p) {
  ZPCHECK(ensureScratch(e, 0, coll.scratchBytes[0], a.stream, a.opName));
  ZPCHECK(ensureScratch(e, 1, coll.scratchBytes[1], a.stream, a.opName));
  if (!e.peersConnected) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    CUDACHECK(cudaStreamIsCapturing(a.stream, &status));
    if (status != cudaStreamCaptureStatusNone) {
      return ZP_ERR(zpInvalidUsage, "%s : first call inside graph capture: call zpCommReserve before capturing",
                    a.opName);
    }
    ZPCHECK(connectPeers(e, a.opName));
  }
  ZPCHECK(beginPipeline(e, a.stream, coll, &p->st));
  p->sendRegion = static_cast<char*>(e.scratch[0].ptr);
  p->recvRegion = static_cast<char*>(e.scratch[1].ptr);
  return zpSuccess;
}

// One hop (or one flat hop on uneven nodes). Where the plan works the own slot early (`keptLate`): the slice this
// rank keeps is quantized on the finish stage (or a side stream) while the others travel, straight into the
// received slot that the sum reads (recv.keptSlot), and is never sent. In the pair layout
// (Exchange::kPairGatherInPlace), each chunk receives into three slots: the outgoing slot in the middle, gathered in
// place, so that NCCL writes only the peer's slot (left of it on rank 1, right of it on rank 0), and the kept one
// at the other end: the two sources in rank order at slots 0 and 2.
zpResult_t qgzOneHop(CudaExec& e, const CollArgs& a, const CollPlan& coll, float divisor) {
  const int n = coll.ranks;
  const ChunkPlan& plan = coll.chunks;
  const HopPlan& hop = coll.hop[0];
  const bool keptLate = coll.ownEarly();
  const bool pairLayout = hop.exchange == Exchange::kPairGatherInPlace;
  const int self = coll.rank, other = 1 - self;  // other: pairLayout's peer
  QgzPipeline p(plan, coll.sendSlots, coll.recv.slots, a.bits, a.blockSize);
  ZPCHECK(beginQgzPipeline(e, a, coll, &p));
  const Stages& st = p.st;
  PipelineTrace trace(e, a.opName, coll.logicalBytes, plan.chunks, a.stream);
  const int* slices = e.qgz.sliceOfSlot.data();
  // Quantizes chunk c of slots [first, first + count) into `slots` (slot `first` at its start).
  auto quantizeRun = [&](int c, int first, int count, char* slots, KernelStream stream) {
    if (count <= 0) return zpSuccess;
    return quantizeSlots(a, self, slices + first, count, a.count, plan.offset(c), plan.elems(c), slots,
                         p.sendAt.slotBytes(c), stream);
  };

  // Step 1 (quantize stage): chunk c of every slice into its send slot (with keptLate, of every slice but the
  // kept one; with pairLayout, the peer's into the middle receive slot). In place is safe: the finish stage of
  // chunk c' writes only chunk c' of recvbuff, and chunk c' of every slice is quantized before.
  for (int c = 0; c < plan.chunks; ++c) {
    const size_t pb = p.sendAt.slotBytes(c);  // the same in both regions
    char* slots = p.sendRegion + p.sendAt.offset(c);
    trace.mark(PipelineTrace::kQuantize, c, false, st.quant.stream);
    if (!keptLate) {
      ZPCHECK(quantizeRun(c, 0, n, slots, st.quant));
    } else if (pairLayout) {
      ZPCHECK(quantizeRun(c, other, 1, p.recvRegion + p.recvAt.offset(c) + pb, st.quant));
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
    const int keptSlot = coll.recv.keptSlot;
    for (int c = 0; c < plan.chunks; ++c) {
      trace.mark(PipelineTrace::kOwn, c, false, st.own.stream);
      ZPCHECK(quantizeRun(c, self, 1, p.recvRegion + p.recvAt.offset(c) + keptSlot * p.recvAt.slotBytes(c), st.own));
      trace.mark(PipelineTrace::kOwn, c, true, st.own.stream);
    }
  }
  for (int c = 0; c < plan.chunks; ++c) {
    const size_t pb = p.sendAt.slotBytes(c);
    char* received = p.recvRegion + p.recvAt.offset(c);
    ZPCHECK(waitQuantized(e, st, c));
    trace.mark(PipelineTrace::kMove, c, false, st.move);
    // Step 2 (move): the all-to-all among the n ranks, one slot each.
    if (pairLayout) {
      ZPCHECK(
          ncclCheck(ncclAllGather(received + pb, received + other * pb, pb, ncclUint8, commOf(e, hop.comm), st.move),
                    a.opName, "ncclAllGather of a pair's slots"));
    } else {
      ZPCHECK(
          exchangeSlots(p.sendRegion + p.sendAt.offset(c), received, pb, hop, commOf(e, hop.comm), st.move, a.opName));
    }
    trace.mark(PipelineTrace::kMove, c, true, st.move);
    ZPCHECK(handOver(e, st, c));
    if (c == 0) ZPCHECK(joinOwnSlots(e, st));
    trace.mark(PipelineTrace::kFinish, c, false, st.finish.stream);
    // Step 3 (finish): the slot from rank j (j-th source) summed in rank order.
    const ReduceSources sources{received, coll.recv.sourceStride * pb, 0, n, 1};
    ZPCHECK(sumIntoRecv(a, plan, c, sources, divisor, st.finish));
    trace.mark(PipelineTrace::kFinish, c, true, st.finish.stream);
  }
  return endPipeline(e, st, trace);
}

// Two hops (N nodes of L ranks each): the intra-node all-to-all gives each local rank the N slices of its
// destinations from every local peer, summed and requantized into N partials; the inter-node all-to-all among the
// ranks of this local rank gives each destination its partial from every node.
zpResult_t qgzTwoHop(CudaExec& e, const CollArgs& a, const CollPlan& coll, float divisor) {
  const QgzPlan& q = e.qgz;
  const int n = q.nranks;
  const HopPlan &intra = coll.hop[0], &inter = coll.hop[1];
  const int N = inter.peers, L = intra.peers;
  const ChunkPlan& plan = coll.chunks;
  QgzPipeline p(plan, coll.sendSlots, coll.recv.slots, a.bits, a.blockSize);
  ZPCHECK(beginQgzPipeline(e, a, coll, &p));
  const Stages& st = p.st;
  PipelineTrace trace(e, a.opName, coll.logicalBytes, plan.chunks, a.stream);

  // Step 1 (quantize stage): chunk c of every slice into its send slot, in the plan's node-major order. In place
  // is safe: the finish stage of chunk c' writes only chunk c' of recvbuff, and chunk c' of every slice is
  // quantized before.
  for (int c = 0; c < plan.chunks; ++c) {
    trace.mark(PipelineTrace::kQuantize, c, false, st.quant.stream);
    ZPCHECK(quantizeSlots(a, e.topo.rank, q.sliceOfSlot.data(), n, a.count, plan.offset(c), plan.elems(c),
                          p.sendRegion + p.sendAt.offset(c), p.sendAt.slotBytes(c), st.quant));
    trace.mark(PipelineTrace::kQuantize, c, true, st.quant.stream);
    ZPCHECK(quantized(e, st, c));
  }
  for (int c = 0; c < plan.chunks; ++c) {
    const size_t cc = plan.elems(c);
    const size_t pb = p.sendAt.slotBytes(c);
    char* slots = p.sendRegion + p.sendAt.offset(c);
    char* received = p.recvRegion + p.recvAt.offset(c);
    ZPCHECK(waitQuantized(e, st, c));
    trace.mark(PipelineTrace::kMove, c, false, st.move);
    // Step 2 (move): the intra-node all-to-all: L peers, N slots each.
    const size_t peerBytes = intra.slotsPerPeer * pb;
    ZPCHECK(exchangeSlots(slots, received, peerBytes, intra, commOf(e, intra.comm), st.move, a.opName));
    // Step 3 (move): partial b = sum over local peers l (in order) of received slot l*N + b, requantized
    // into the front of this chunk's send region (its slots have left).
    // With gradient rounding, partial b draws as slice b of hop 1 of this rank and feeds back through its part
    // of the hop residual (b * count + offset on).
    const ReduceSources partials{received, peerBytes, pb, L, N};
    if (a.grad.any()) {
      const GradQuantLaunch g = gradLaunch(a, e.topo.rank, 1, 0, 1, plan.offset(c), a.grad.hopResidual, a.count);
      ZPCHECK(launchReduceRequantizeGrad(partials, cc, a.bits, a.blockSize, slots, pb, g, st.move));
    } else {
      ZPCHECK(launchReduceRequantize(partials, cc, a.bits, a.blockSize, slots, pb, st.move));
    }
    trace.mark(PipelineTrace::kMove, c, true, st.move);
    ZPCHECK(handOver(e, st, c));
    trace.mark(PipelineTrace::kFinish, c, false, st.finish.stream);
    // Step 4 (finish): the inter-node all-to-all among ranks of this local rank: partial b to node b.
    ZPCHECK(exchangeSlots(slots, received, pb, inter, commOf(e, inter.comm), st.finish.stream, a.opName));
    // Step 5 (finish): node a's partial, summed in node order, into recvbuff.
    const ReduceSources finals{received, pb, 0, N, 1};
    ZPCHECK(sumIntoRecv(a, plan, c, finals, divisor, st.finish));
    trace.mark(PipelineTrace::kFinish, c, true, st.finish.stream);
  }
  return endPipeline(e, st, trace);
}

}  // namespace

zpResult_t cudaQuantReduceScatter(CudaExec& e, const CollArgs& a) {
  CollPlan coll;
  ZPCHECK(planCall(e, a, &coll));
  const float divisor = a.op == zpAvg ? static_cast<float>(e.qgz.nranks) : 1.0f;
  switch (coll.path) {
    case PlanPath::kTwoHops:
      return qgzTwoHop(e, a, coll, divisor);
    case PlanPath::kDirect:
      return qgzDirect(e, a, coll, divisor);
    default:
      return qgzOneHop(e, a, coll, divisor);
  }
}

}  // namespace zp
