// The cuda backend's lifecycle (NCCL communicators, streams, events, scratch) and its dispatch.
#include "src/cuda/cuda_backend.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "device/peer_window.h"
#include "device/quantize.h"
#include "device/reduce.h"
#include "host/base/check.h"
#include "host/base/params.h"
#include "host/dtype.h"
#include "host/quant_format.h"
#include "src/cuda/cuda_exec.h"
#include "src/cuda/nccl_check.h"
#include "src/cuda/watchdog.h"

namespace zp {

std::vector<ncclComm_t> NcclComms::all() const {
  std::vector<ncclComm_t> out;
  for (ncclComm_t c : {world, intra, inter, hpz}) {
    if (c != nullptr && std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
  }
  return out;
}

std::vector<ncclComm_t> NcclComms::owned() const {
  // The communicators split from world first, world (when it is ours) last.
  std::vector<ncclComm_t> out = all();
  out.erase(std::remove(out.begin(), out.end(), world), out.end());
  if (ownsWorld && world != nullptr) out.push_back(world);
  return out;
}

std::vector<ncclComm_t> NcclComms::ownedWorldFirst() const {
  std::vector<ncclComm_t> out = all();  // world first
  if (!ownsWorld) out.erase(std::remove(out.begin(), out.end(), world), out.end());
  return out;
}

zpResult_t cudaExecInit(CudaExec* e) {
  CUDACHECK(cudaStreamCreateWithFlags(&e->setupStream, cudaStreamNonBlocking));
  int least = 0, greatest = 0;
  CUDACHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  CUDACHECK(cudaStreamCreateWithPriority(&e->sideStream, cudaStreamNonBlocking, least));
  CUDACHECK(cudaStreamCreateWithPriority(&e->quantStream, cudaStreamNonBlocking, least));
  CUDACHECK(cudaStreamCreateWithPriority(&e->moveStream, cudaStreamNonBlocking, greatest));
  ZPCHECK(createGreenStreams(e->device, static_cast<int>(paramNcclSms()), least, &e->green));
  for (cudaEvent_t& ev : e->chunkReady) CUDACHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  for (cudaEvent_t& ev : e->quantReady) CUDACHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  CUDACHECK(cudaEventCreateWithFlags(&e->sideDone, cudaEventDisableTiming));
  CUDACHECK(cudaEventCreateWithFlags(&e->callStart, cudaEventDisableTiming));
  CUDACHECK(cudaEventCreateWithFlags(&e->capturedSideDone, cudaEventDisableTiming));
  CUDACHECK(cudaEventCreateWithFlags(&e->ownSlotDone, cudaEventDisableTiming));
  return zpSuccess;
}

zpResult_t cudaExecFree(CudaExec* e) {
  freePeerWindow(&e->peers);
  for (ScratchBuffer& s : e->scratch) {
    if (s.ptr != nullptr) (void)cudaFree(s.ptr);
    s = ScratchBuffer();
  }
  for (void* p : e->retiredScratch) (void)cudaFree(p);
  e->retiredScratch.clear();
  for (cudaEvent_t* events : {e->chunkReady, e->quantReady}) {
    for (int c = 0; c < kMaxPipelineChunks; ++c) {
      if (events[c] != nullptr) (void)cudaEventDestroy(events[c]);
      events[c] = nullptr;
    }
  }
  for (cudaEvent_t ev : e->traceEvents) (void)cudaEventDestroy(ev);
  e->traceEvents.clear();
  for (cudaEvent_t* ev : {&e->sideDone, &e->callStart, &e->capturedSideDone, &e->ownSlotDone}) {
    if (*ev != nullptr) (void)cudaEventDestroy(*ev);
    *ev = nullptr;
  }
  destroyGreenStreams(&e->green);
  for (cudaStream_t* st : {&e->sideStream, &e->quantStream, &e->moveStream, &e->setupStream}) {
    if (*st != nullptr) (void)cudaStreamDestroy(*st);
    *st = nullptr;
  }
  return zpSuccess;
}

namespace {

// Restores the caller's current device when it leaves scope.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&saved_) != cudaSuccess) saved_ = -1;
    if (saved_ != device) (void)cudaSetDevice(device);
  }
  ~DeviceGuard() {
    int now = -1;
    if (saved_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != saved_) (void)cudaSetDevice(saved_);
  }

 private:
  int saved_ = -1;
};

class CudaBackend final : public Backend {
 public:
  ~CudaBackend() override { (void)finalize(true); }

  CudaExec& exec() { return exec_; }

  // Starts watching the NCCL communicators once they all exist.
  void startWatchdog() {
    watchdog_ = std::make_unique<Watchdog>(exec_.device, exec_.comms.all(), paramTimeoutMs(),
                                           [this] { return stopNcclWork(); });
  }

  zpResult_t run(const CollArgs& a) override {
    DeviceGuard guard(exec_.device);
    switch (a.kind) {
      case CollKind::kQuantize:
        return launchQuantize(a.sendbuff, a.recvbuff, a.count, a.type, a.bits, a.blockSize, a.stream);
      case CollKind::kDequantize:
        return launchDequantize(a.sendbuff, a.recvbuff, a.count, a.type, a.bits, a.blockSize, a.stream);
      default:
        break;
    }
    std::shared_lock<std::shared_mutex> using_(ncclUse_);
    ZPCHECK(checkNotFailed(a.opName));
    zpResult_t res = zpInternalError;
    switch (a.kind) {
      case CollKind::kQuantAllGather:
        res = cudaQuantAllGather(exec_, a);
        break;
      case CollKind::kHierAllGather:
        res = cudaHierAllGather(exec_, a);
        break;
      case CollKind::kQuantReduceScatter:
        res = cudaQuantReduceScatter(exec_, a);
        break;
      case CollKind::kQuantAllReduce:
        res = cudaQuantAllReduce(exec_, a);
        break;
      default:
        return ZP_ERR(zpInternalError, "%s : unknown collective", a.opName);
    }
    if (res == zpSuccess && watchdog_) ZPCHECK(watchdog_->track(a.opName, a.stream));
    return res;
  }

  zpResult_t reserve(size_t maxBytes) override {
    DeviceGuard guard(exec_.device);
    std::shared_lock<std::shared_mutex> using_(ncclUse_);
    ZPCHECK(checkNotFailed("zpCommReserve"));
    return cudaReserve(exec_, maxBytes);
  }

  zpResult_t asyncError(zpResult_t* error) override {
    *error = zpSuccess;
    std::shared_lock<std::shared_mutex> using_(ncclUse_);
    if (watchdog_ && (*error = watchdog_->failure()) != zpSuccess) return zpSuccess;
    for (ncclComm_t comm : exec_.comms.all()) {
      ncclResult_t state = ncclSuccess;
      ZPCHECK(ncclCheck(ncclCommGetAsyncError(comm, &state), "zpCommGetAsyncError", "ncclCommGetAsyncError"));
      if (state != ncclSuccess) {
        *error = static_cast<zpResult_t>(state);
        return zpSuccess;
      }
    }
    return zpSuccess;
  }

  zpResult_t finalize(bool abort) override {
    if (finalized_) return zpSuccess;
    finalized_ = true;
    DeviceGuard guard(exec_.device);
    zpResult_t res = zpSuccess;
    // A failed communicator's work can never finish: it is aborted, whatever was asked.
    if (watchdog_) {
      watchdog_->stop();
      abort = abort || watchdog_->failure() != zpSuccess;
    }
    // Destroy waits for the work enqueued on the communicator; abort does not.
    if (!abort && exec_.sideDone != nullptr && cudaEventSynchronize(exec_.sideDone) != cudaSuccess) {
      (void)cudaGetLastError();
      res = zpUnhandledCudaError;
    }
    if (abort) cancelPeerReads(&exec_.peers);  // before NCCL unmaps the peers' windows
    if (!abort && !ncclAborted_) deregisterPeerWindow(&exec_.peers, exec_.comms.world);
    const std::vector<ncclComm_t> comms = abort ? exec_.comms.ownedWorldFirst() : exec_.comms.owned();
    for (ncclComm_t c : ncclAborted_ ? std::vector<ncclComm_t>() : comms) {
      ncclResult_t r = abort ? ncclCommAbort(c) : ncclCommDestroy(c);
      if (r != ncclSuccess && res == zpSuccess) res = static_cast<zpResult_t>(r);
    }
    if (!abort) (void)cudaDeviceSynchronize();  // the caller's streams may still read scratch
    watchdog_.reset();
    cudaExecFree(&exec_);
    return res;
  }

  // zpCommAbort from another thread: a call of this communicator waiting on the host gives up (src/cuda/host_wait.h).
  void interrupt() override { exec_.stopHostWaits = true; }

  bool bufferUsable(const void* ptr, const char** why) override {
    if (ptr == nullptr) {
      *why = "is NULL";
      return false;
    }
    cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
      (void)cudaGetLastError();
      *why = "is not a pointer CUDA knows";
      return false;
    }
    if (attr.type == cudaMemoryTypeUnregistered) {
      *why = "is host memory (the cuda backend needs device memory)";
      return false;
    }
    if (attr.type == cudaMemoryTypeDevice && attr.device != exec_.device) {
      *why = "is memory of another CUDA device than the communicator's";
      return false;
    }
    return true;
  }

 private:
  // The watchdog's way to end the NCCL kernels of a failed communicator, so that the caller's stream drains.
  // ncclCommRevoke (NCCL 2.28.7 and later) stops the work and keeps the communicators for zpCommAbort; it is looked
  // up at run time because older NCCL libraries lack it. Without it the communicators zpccl owns are aborted, once
  // no call is using them (false until then: the watchdog retries); a caller's communicator wrapped by
  // zpCommInitFromNccl is left to its owner.
  bool stopNcclWork() {
    using RevokeFn = ncclResult_t (*)(ncclComm_t, int);
    static const RevokeFn revoke = [] {
      Dl_info info;
      void* lib = nullptr;
      if (dladdr(reinterpret_cast<void*>(&ncclCommAbort), &info) != 0 && info.dli_fname != nullptr) {
        lib = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
      }
      return lib != nullptr ? reinterpret_cast<RevokeFn>(dlsym(lib, "ncclCommRevoke")) : nullptr;
    }();
    exec_.stopHostWaits = true;  // a call waiting on the host leaves (and releases ncclUse_)
    {
      DeviceGuard guard(exec_.device);  // the watchdog's thread
      cancelPeerReads(&exec_.peers);    // the direct-load kernels must not wait on, or touch, revoked peers' windows
    }
    if (revoke != nullptr) {
      for (ncclComm_t c : exec_.comms.all()) (void)revoke(c, 0);
      return true;
    }
    std::unique_lock<std::shared_mutex> exclusive(ncclUse_, std::try_to_lock);
    if (!exclusive.owns_lock()) return false;
    for (ncclComm_t c : exec_.comms.ownedWorldFirst()) (void)ncclCommAbort(c);
    ncclAborted_ = true;
    return true;
  }

  // After the watchdog saw a failure, every collective returns it at once.
  zpResult_t checkNotFailed(const char* call) {
    std::string why;
    if (!watchdog_) return zpSuccess;
    const zpResult_t failed = watchdog_->failure(&why);
    if (failed == zpSuccess) return zpSuccess;
    return ZP_ERR(failed, "%s : the communicator failed earlier (%s); abort or destroy it", call, why.c_str());
  }

  CudaExec exec_;
  std::unique_ptr<Watchdog> watchdog_;
  // Held shared by every call that uses the NCCL communicators, exclusively to abort them from the watchdog.
  std::shared_mutex ncclUse_;
  bool ncclAborted_ = false;  // by stopNcclWork: finalize must not touch them again
  bool finalized_ = false;
};

// All-gathers every rank's RankInit through the world communicator, as raw bytes. The host reads them at once,
// so an all-gather still in progress (a non-blocking caller's communicator) is an error.
zpResult_t exchangeRankInits(ncclComm_t world, int nranks, int rank, const RankInit& mine, cudaStream_t stream,
                             const char* call, std::vector<RankInit>* all) {
  constexpr size_t kBytes = sizeof(RankInit);
  unsigned char* dev = nullptr;
  CUDACHECK(cudaMalloc(&dev, kBytes * nranks));
  zpResult_t res = zpSuccess;
  all->assign(nranks, RankInit());
  // Zeroed first, so that the copy back never reads bytes that only NCCL wrote (compute-sanitizer initcheck
  // does not see them).
  CUDACHECKGOTO(cudaMemsetAsync(dev, 0, kBytes * nranks, stream), res, done);
  CUDACHECKGOTO(cudaMemcpyAsync(dev + rank * kBytes, &mine, kBytes, cudaMemcpyHostToDevice, stream), res, done);
  ZPCHECKGOTO(ncclCheck(ncclAllGather(dev + rank * kBytes, dev, kBytes, ncclUint8, world, stream), call,
                        "ncclAllGather of the ranks' init settings", NcclInProgress::kMustComplete),
              res, done);
  CUDACHECKGOTO(cudaMemcpyAsync(all->data(), dev, kBytes * nranks, cudaMemcpyDeviceToHost, stream), res, done);
  CUDACHECKGOTO(cudaStreamSynchronize(stream), res, done);
done:
  (void)cudaFree(dev);
  return res;
}

// Splits world by color into communicators of `members` ranks, ordered by key. The split is used at once.
// A communicator of one rank moves nothing over a link, yet NCCL would give it its most channels, each with small
// buffers that take a granule of device memory apiece (hundreds of MiB a communicator): it gets one channel.
zpResult_t splitComm(ncclComm_t world, int color, int key, int members, ncclComm_t* out, const char* call,
                     const char* what) {
  const std::string split = std::string("ncclCommSplit of the ") + what + " communicator";
  ncclConfig_t oneChannel = NCCL_CONFIG_INITIALIZER;
  oneChannel.minCTAs = 1;
  oneChannel.maxCTAs = 1;
  return ncclCheck(ncclCommSplit(world, color, key, out, members == 1 ? &oneChannel : nullptr), call, split.c_str(),
                   NcclInProgress::kMustComplete);
}

// Loads every kernel of device/ into the current device's context, once per device and process: each launcher's
// dispatch runs with KernelStream::loadOnly over every type, bits, block size and alignment, which loads the kernel it
// would launch. CUDA loads kernels lazily by default (CUDA_MODULE_LOADING=LAZY), and loading one may wait for the
// whole device: the first launch of a kernel while another stream waits (a kernel waiting for a peer in its window,
// an NCCL kernel waiting for a peer, a stream the caller holds) would then wait with it, maybe forever.
zpResult_t loadKernels(int device) {
  static std::mutex mutex;
  static std::vector<bool> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  if (device < static_cast<int>(loaded.size()) && loaded[device]) return zpSuccess;
  const auto start = std::chrono::steady_clock::now();
  KernelStream load;
  load.loadOnly = true;
  // Any addresses aligned as the kernels need (nothing is launched); `+ esz` gives the misaligned variants.
  char* const at = reinterpret_cast<char*>(uintptr_t{1} << 20);
  for (zpDataType_t type : {zpFloat16, zpBfloat16, zpFloat32}) {
    const size_t esz = typeSize(type);
    for (int bits : {ZP_BITS_INT4, ZP_BITS_INT8}) {
      for (size_t offset : {size_t{0}, esz}) {
        for (int blockSize = kMinBlockSize; blockSize <= kMaxBlockSize; blockSize *= 2) {
          ZPCHECK(launchQuantize(at + offset, at, blockSize, type, bits, blockSize, load));
        }
        ZPCHECK(launchDequantize(at, at + offset, kMinBlockSize, type, bits, kMinBlockSize, load));
      }
      for (int sources : {1, 8}) {  // the few-sources finish and the general one
        ZPCHECK(launchReduceFinish({at, kPayloadAlign, kPayloadAlign, sources, 1}, kMinBlockSize, bits, kMinBlockSize,
                                   type, 1.0f, at, 0, load));
      }
    }
  }
  for (int bits : {ZP_BITS_INT4, ZP_BITS_INT8}) {
    ZPCHECK(launchReduceRequantize({at, kPayloadAlign, kPayloadAlign, 2, 1}, kMinBlockSize, bits, kMinBlockSize, at,
                                   kPayloadAlign, load));
  }
  // qgZ's gradient rounding (its launchers load every variant of rounding and residual).
  const GradQuantLaunch grad;
  for (int bits : {ZP_BITS_INT4, ZP_BITS_INT8}) {
    for (zpDataType_t type : {zpFloat16, zpBfloat16, zpFloat32}) {
      ZPCHECK(launchQuantizeGrad(at, at, kMinBlockSize, type, bits, kMinBlockSize, grad, load));
    }
    ZPCHECK(launchReduceRequantizeGrad({at, kPayloadAlign, kPayloadAlign, 2, 1}, kMinBlockSize, bits, kMinBlockSize, at,
                                       kPayloadAlign, grad, load));
  }
  ZPCHECK(loadPeerKernels());
  if (device >= static_cast<int>(loaded.size())) loaded.resize(device + 1, false);
  loaded[device] = true;
  ZP_INFO(kSubsysInit, "device/ kernels loaded on device %d in %.1f ms", device,
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  return zpSuccess;
}

// Asks NCCL for at least `channels` CTAs (channels) per collective. NCCL refuses a minimum without a maximum (its
// "undefined" maximum fails the min <= max check), so the maximum is raised to at least NCCL's usual 32.
void askForChannels(ncclConfig_t* config, int channels) {
  config->minCTAs = channels;
  config->maxCTAs = std::max(channels, 32);
}

// Replaces the world communicator, which zpccl made, by a split of it with at least `channels` channels (its own
// splits inherit them), and destroys the original.
zpResult_t widenWorld(NcclComms* c, int rank, int channels, const char* call) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  askForChannels(&config, channels);
  ncclComm_t wide = nullptr;
  const std::string split = "ncclCommSplit with " + std::to_string(channels) + " channels (ZP_SHM_MIN_CTAS)";
  ZPCHECK(
      ncclCheck(ncclCommSplit(c->world, 0, rank, &wide, &config), call, split.c_str(), NcclInProgress::kMustComplete));
  (void)ncclCommDestroy(c->world);
  c->world = wide;
  return zpSuccess;
}

}  // namespace

int shmChannelsFor(const ShmChannelFacts& f) {
  const bool overShm = f.nodes == 1 && f.nranks > 1 && ncclSwitchOn(f.p2pDisable) && !ncclSwitchOn(f.shmDisable);
  if (!overShm || f.shmMinCtas <= 0 || f.ncclMinCtas > 0 || f.callersWorld) return 0;
  return static_cast<int>(std::min<int64_t>(f.shmMinCtas, 32));
}

zpResult_t cudaBackendCreate(ncclComm_t callerComm, const zpUniqueId& id, int nranks, int rank, const RankInit& mine,
                             const char* call, Topology* topo, int* cudaDev, std::unique_ptr<Backend>* backend) {
  int deviceCount = 0;
  if (cudaGetDeviceCount(&deviceCount) != cudaSuccess || deviceCount == 0) {
    (void)cudaGetLastError();
    return ZP_ERR(zpInvalidUsage, "%s : the cuda backend needs a CUDA device and none is visible", call);
  }
  // From here on the backend owns what is created, and frees it if a later step fails.
  auto created = std::make_unique<CudaBackend>();
  CudaExec& e = created->exec();
  NcclComms& c = e.comms;
  if (callerComm != nullptr) {
    ZPCHECK(ncclCheck(ncclCommCuDevice(callerComm, &e.device), call, "ncclCommCuDevice"));
    CUDACHECK(cudaSetDevice(e.device));
    c.world = callerComm;
    c.ownsWorld = false;
  } else {
    CUDACHECK(cudaGetDevice(&e.device));
    static_assert(sizeof(ncclUniqueId) == sizeof(zpUniqueId), "a zpUniqueId carries an ncclUniqueId");
    ncclUniqueId ncclId;
    memcpy(&ncclId, &id, sizeof(ncclId));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    if (paramNetChannelsPerPeer() > 0) config.nChannelsPerNetPeer = static_cast<int>(paramNetChannelsPerPeer());
    if (paramNcclMinCtas() > 0) askForChannels(&config, static_cast<int>(paramNcclMinCtas()));
    const zpResult_t res = ncclCheck(ncclCommInitRankConfig(&c.world, nranks, ncclId, rank, &config), call,
                                     "ncclCommInitRank", NcclInProgress::kMustComplete);
    if (res != zpSuccess) {
      c.world = nullptr;
      return res;
    }
  }
  ZPCHECK(cudaExecInit(&e));
  ZPCHECK(loadKernels(e.device));
  CUDACHECK(cudaDeviceGetAttribute(&e.sms, cudaDevAttrMultiProcessorCount, e.device));
  // Every rank sees the same RankInits: all of them refuse a disagreement, or build the same layout, before any
  // collective split that a rank leaving here would leave its peers waiting in.
  std::vector<RankInit> inits;
  ZPCHECK(exchangeRankInits(c.world, nranks, rank, mine, e.setupStream, call, &inits));
  const std::string why = initDisagreement(inits);
  if (!why.empty()) return ZP_ERR(zpInvalidUsage, "%s : ranks disagree on %s", call, why.c_str());
  ZPCHECK(buildTopology(nodeKeysOf(inits), rank, mine.hpzSize, call, &e.topo));
  const Topology& t = e.topo;
  const int shmChannels =
      shmChannelsFor({t.nodes, t.nranks, paramShmMinCtas(), paramNcclMinCtas(), std::getenv("NCCL_P2P_DISABLE"),
                      std::getenv("NCCL_SHM_DISABLE"), callerComm != nullptr});
  if (shmChannels > 0) {
    ZPCHECK(widenWorld(&c, rank, shmChannels, call));
    e.shmChannels = true;
    ZP_INFO(kSubsysInit, "one node over host shared memory: NCCL gets at least %d channels (ZP_SHM_MIN_CTAS)",
            shmChannels);
  }

  // Splits are collective over the world: every rank takes the same branches, since all see the same keys.
  // Intra-node ranks are ordered by local rank, inter-node ranks by node index.
  if (t.nodes == 1) {
    c.intra = c.world;
  } else {
    ZPCHECK(splitComm(c.world, t.node, t.localRank, t.localSize, &c.intra, call, "intra-node"));
    ZPCHECK(splitComm(c.world, t.localRank, t.node, t.nodes, &c.inter, call, "inter-node"));
  }
  // Every rank must take the same branch: uneven layouts (hpZ unusable anyway) never split an hpZ group.
  if (!t.hpzUsable || t.hpzSize == t.localSize) {
    c.hpz = c.intra;
  } else {
    ZPCHECK(splitComm(c.world, t.hpzGroup, t.hpzRank, t.hpzSize, &c.hpz, call, "hpZ"));
  }
  e.qgz = makeQgzPlan(t);
  ZPCHECK(initPeerWindow(c.world, t.nranks, t.rank, t.nodes, e.setupStream, &e.peers));
  created->startWatchdog();
  *topo = t;
  *cudaDev = e.device;
  *backend = std::move(created);
  return zpSuccess;
}

}  // namespace zp
