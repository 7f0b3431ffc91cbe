// What the cuda backend's collectives work with: the NCCL communicators, the side stream and events of the
// chunk pipelines, and the communicator's scratch memory. Lifecycle in cuda_backend.cc; the pipelines in
// pipeline.h, the collectives in gathers.cc, qgz.cc and all_reduce.cc.
#pragma once

#include <nccl.h>

#include <atomic>
#include <vector>

#include "host/base/backend.h"
#include "host/chunk_plan.h"
#include "host/qgz_plan.h"
#include "host/topology.h"
#include "src/cuda/green_context.h"
#include "src/cuda/peer_window.h"

namespace zp {

// The NCCL communicators of one zpccl communicator. intra, inter and hpz may alias world (or each other) when
// the group is the same; only owned, distinct ones are destroyed.
struct NcclComms {
  ncclComm_t world = nullptr;
  bool ownsWorld = true;
  ncclComm_t intra = nullptr;  // ranks of this node
  ncclComm_t inter = nullptr;  // ranks of this local rank, one per node (multi-node layouts)
  ncclComm_t hpz = nullptr;    // this rank's hpZ group

  // The distinct communicators this object must destroy, in the order to destroy them: the split ones, then world.
  std::vector<ncclComm_t> owned() const;
  // The same in the order to abort them: world (when owned) first. An abort frees device memory, which waits for
  // every kernel on the device; while world's kernel still waits for a dead peer (over sockets the world spans the
  // nodes, the split communicators do not), aborting a split communicator first never returns.
  std::vector<ncclComm_t> ownedWorldFirst() const;
  // Every distinct communicator, the caller's world included.
  std::vector<ncclComm_t> all() const;
};

// Device memory owned by the communicator. It only grows, and never inside graph capture. A buffer that a
// captured call used may serve that graph's replays for as long as the caller keeps the graph, which zpccl cannot
// see: growing it retires it (kept until the communicator is freed) instead of freeing it.
struct ScratchBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  bool captured = false;  // a call captured in a graph uses ptr
};

// The communicator's scratch buffers: the pipelines' send and receive slots (0, 1), and the all-reduce's padded
// copies of a tensor whose count is not n whole shards and of its residual (all_reduce.cc).
enum : int { kScratchAllReduceTensor = 2, kScratchAllReduceResidual = 3, kScratchBuffers = 4 };

struct CudaExec {
  NcclComms comms;
  int device = -1;
  int sms = 0;  // the device's SMs
  Topology topo;
  QgzPlan qgz;
  cudaStream_t setupStream = nullptr;  // init-time exchanges
  // The chunk pipelines run three stages on three streams: quantize (quantStream), move (moveStream, where
  // NCCL runs), finish (sideStream: dequantize, reduce, or the second hop), so that chunk c+1 is quantized and
  // chunk c-1 finished while chunk c travels. moveStream has the device's highest priority and the other two
  // its lowest, so that NCCL's few long-lived CTAs get SMs first when any free up (priorities alone do not make
  // the stages overlap over NVLink: the green context below does).
  //
  // The quantized gathers (qwZ, hpZ's quantized mode) run their quantize and finish stages on the green
  // context's streams when there is one (an SM share that leaves ZP_NCCL_SMS SMs free, src/cuda/green_context.h):
  // NCCL's CTAs each need a nearly empty SM, which priorities alone cannot give them while our grids fill every
  // SM. qgZ keeps every SM (qgz.cc says why).
  cudaStream_t quantStream = nullptr;
  cudaStream_t moveStream = nullptr;
  cudaStream_t sideStream = nullptr;
  GreenStreams green;
  cudaEvent_t callStart = nullptr;                  // the call's start on the caller's stream: the stages wait
  cudaEvent_t quantReady[kMaxPipelineChunks] = {};  // chunk c quantized
  cudaEvent_t chunkReady[kMaxPipelineChunks] = {};  // chunk c moved (recorded on moveStream)
  cudaEvent_t sideDone = nullptr;                   // the finish stage done: the caller's stream waits on it
  // The same join inside graph capture: sideDone is never recorded there, since an event last recorded in a
  // capture cannot be waited for or synchronized outside it (the next call and zpCommDestroy do both).
  cudaEvent_t capturedSideDone = nullptr;
  cudaEvent_t ownSlotDone = nullptr;  // a one-chunk call's own slot worked on a side stream (pipeline.h)
  ScratchBuffer scratch[kScratchBuffers];
  std::vector<void*> retiredScratch;     // grown out of after a capture used them; freed with the communicator
  PeerWindow peers;                      // direct loads among the ranks of one NVLink domain (src/cuda/peer_window.h)
  std::vector<cudaEvent_t> traceEvents;  // ZP_TRACE_PIPELINE: timing events, created on first use
  bool peersConnected = false;           // every point-to-point peer connected (needed before graph capture)
  // Set when the communicator failed (the watchdog) or is being aborted: ends the host waits of a call
  // (src/cuda/host_wait.h), so that the call leaves and lets the abort proceed.
  std::atomic<bool> stopHostWaits{false};
  bool shmChannels = false;  // one node over host shared memory, on ZP_SHM_MIN_CTAS channels
};

zpResult_t cudaExecInit(CudaExec* exec);
zpResult_t cudaExecFree(CudaExec* exec);

// Grows scratch so that collectives of up to maxBytes logical output bytes need no allocation.
zpResult_t cudaReserve(CudaExec& exec, size_t maxBytes);

zpResult_t cudaQuantAllGather(CudaExec& exec, const CollArgs& a);
zpResult_t cudaHierAllGather(CudaExec& exec, const CollArgs& a);
zpResult_t cudaQuantReduceScatter(CudaExec& exec, const CollArgs& a);
zpResult_t cudaQuantAllReduce(CudaExec& exec, const CollArgs& a);

}  // namespace zp
