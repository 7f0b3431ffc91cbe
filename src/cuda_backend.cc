#include "src/cuda_backend.h"

#include <cstring>
#include <vector>

#include "device/quantize.h"
#include "src/check.h"

namespace zp {

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

// The NCCL communicators of one zpccl communicator. intra, inter and hpz may alias world (or each other) when
// the group is the same; only owned, distinct ones are destroyed.
struct NcclComms {
  ncclComm_t world = nullptr;
  bool ownsWorld = true;
  ncclComm_t intra = nullptr;  // ranks of this node
  ncclComm_t inter = nullptr;  // ranks of this local rank, one per node
  ncclComm_t hpz = nullptr;    // this rank's hpZ group

  std::vector<ncclComm_t> owned() const {
    std::vector<ncclComm_t> out;
    for (ncclComm_t c : {intra, inter, hpz}) {
      bool seen = c == nullptr || c == world;
      for (ncclComm_t o : out) seen = seen || o == c;
      if (!seen) out.push_back(c);
    }
    if (ownsWorld && world != nullptr) out.push_back(world);
    return out;
  }
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(NcclComms comms, int device, cudaStream_t stream) : comms_(comms), device_(device), stream_(stream) {}
  ~CudaBackend() override { (void)finalize(true); }

  zpResult_t run(const CollArgs& a) override {
    DeviceGuard guard(device_);
    switch (a.kind) {
      case CollKind::kQuantize:
        return launchQuantize(a.sendbuff, a.recvbuff, a.count, a.type, a.bits, a.blockSize, a.stream);
      case CollKind::kDequantize:
        return launchDequantize(a.sendbuff, a.recvbuff, a.count, a.type, a.bits, a.blockSize, a.stream);
      default:
        return ZP_ERR(zpInvalidUsage, "%s : not implemented yet on the cuda backend", a.opName);
    }
  }

  zpResult_t reserve(size_t) override { return zpSuccess; }

  zpResult_t asyncError(zpResult_t* error) override {
    *error = zpSuccess;
    for (ncclComm_t c : {comms_.world, comms_.intra, comms_.inter, comms_.hpz}) {
      if (c == nullptr) continue;
      ncclResult_t state = ncclSuccess;
      NCCLCHECK(ncclCommGetAsyncError(c, &state));
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
    DeviceGuard guard(device_);
    zpResult_t res = zpSuccess;
    if (!abort && stream_ != nullptr && cudaStreamSynchronize(stream_) != cudaSuccess) {
      (void)cudaGetLastError();
      res = zpUnhandledCudaError;
    }
    for (ncclComm_t c : comms_.owned()) {
      ncclResult_t r = abort ? ncclCommAbort(c) : ncclCommDestroy(c);
      if (r != ncclSuccess && res == zpSuccess) res = static_cast<zpResult_t>(r);
    }
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    stream_ = nullptr;
    return res;
  }

  // Init adds the sub-communicators here as it splits them, so that a failure part-way frees what exists.
  NcclComms& comms() { return comms_; }

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
    if (attr.type == cudaMemoryTypeDevice && attr.device != device_) {
      *why = "is memory of another CUDA device than the communicator's";
      return false;
    }
    return true;
  }

 private:
  NcclComms comms_;
  const int device_;
  cudaStream_t stream_;  // internal work: setup exchanges
  bool finalized_ = false;
};

// All-gathers one 64-bit key per rank through the world communicator.
zpResult_t exchangeNodeKeys(ncclComm_t world, int nranks, int rank, uint64_t key, cudaStream_t stream,
                            std::vector<uint64_t>* keys) {
  uint64_t* dev = nullptr;
  CUDACHECK(cudaMalloc(&dev, sizeof(uint64_t) * nranks));
  zpResult_t res = zpSuccess;
  keys->assign(nranks, 0);
  CUDACHECKGOTO(cudaMemcpyAsync(dev + rank, &key, sizeof(key), cudaMemcpyHostToDevice, stream), res, done);
  if (ncclAllGather(dev + rank, dev, 1, ncclUint64, world, stream) != ncclSuccess) {
    res = ZP_ERR(zpSystemError, "node-key all-gather failed");
    goto done;
  }
  CUDACHECKGOTO(cudaMemcpyAsync(keys->data(), dev, sizeof(uint64_t) * nranks, cudaMemcpyDeviceToHost, stream), res,
                done);
  CUDACHECKGOTO(cudaStreamSynchronize(stream), res, done);
done:
  (void)cudaFree(dev);
  return res;
}

// Splits world by color (ranks ordered by key).
zpResult_t splitComm(ncclComm_t world, int color, int key, ncclComm_t* out, const char* what) {
  ncclResult_t r = ncclCommSplit(world, color, key, out, nullptr);
  if (r != ncclSuccess) {
    return ZP_ERR(static_cast<zpResult_t>(r), "ncclCommSplit of the %s communicator failed: %s", what,
                  ncclGetErrorString(r));
  }
  return zpSuccess;
}

}  // namespace

zpResult_t cudaBackendCreate(ncclComm_t callerComm, const zpUniqueId& id, int nranks, int rank, uint64_t nodeKey,
                             int hpzRequest, const char* call, Topology* topo, int* cudaDev,
                             std::unique_ptr<Backend>* backend) {
  int device = -1;
  int deviceCount = 0;
  if (cudaGetDeviceCount(&deviceCount) != cudaSuccess || deviceCount == 0) {
    (void)cudaGetLastError();
    return ZP_ERR(zpInvalidUsage, "%s : the cuda backend needs a CUDA device and none is visible", call);
  }
  NcclComms comms;
  if (callerComm != nullptr) {
    NCCLCHECK(ncclCommCuDevice(callerComm, &device));
    CUDACHECK(cudaSetDevice(device));
    comms.world = callerComm;
    comms.ownsWorld = false;
  } else {
    CUDACHECK(cudaGetDevice(&device));
    static_assert(sizeof(ncclUniqueId) == sizeof(zpUniqueId), "a zpUniqueId carries an ncclUniqueId");
    ncclUniqueId ncclId;
    memcpy(&ncclId, &id, sizeof(ncclId));
    ncclResult_t r = ncclCommInitRank(&comms.world, nranks, ncclId, rank);
    if (r != ncclSuccess) {
      return ZP_ERR(static_cast<zpResult_t>(r), "%s : ncclCommInitRank failed: %s (%s)", call,
                    ncclGetErrorString(r), ncclGetLastError(nullptr));
    }
  }
  cudaStream_t stream = nullptr;
  CUDACHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // From here on the backend owns what was created, and frees it if a later step fails.
  auto created = std::make_unique<CudaBackend>(comms, device, stream);
  std::vector<uint64_t> keys;
  ZPCHECK(exchangeNodeKeys(comms.world, nranks, rank, nodeKey, stream, &keys));
  Topology t;
  ZPCHECK(buildTopology(keys, rank, hpzRequest, call, &t));

  // Splits are collective over the world: every rank takes the same branches, since all see the same keys.
  NcclComms& c = created->comms();
  if (t.nodes == 1) {
    c.intra = c.world;
  } else {
    ZPCHECK(splitComm(c.world, t.node, rank, &c.intra, "intra-node"));
    if (t.localSize == 1 && t.even) {
      c.inter = c.world;
    } else {
      ZPCHECK(splitComm(c.world, t.localRank, rank, &c.inter, "inter-node"));
    }
  }
  if (t.hpzSize == t.localSize) {
    c.hpz = c.intra;
  } else {
    ZPCHECK(splitComm(c.world, t.hpzGroup, rank, &c.hpz, "hpZ"));
  }
  *topo = t;
  *cudaDev = device;
  *backend = std::move(created);
  return zpSuccess;
}

}  // namespace zp
