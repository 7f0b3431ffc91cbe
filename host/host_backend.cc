#include "host/host_backend.h"

#include <vector>

#include "host/quant_ref.h"
#include "src/check.h"

namespace zp {

namespace {

class HostBackend final : public Backend {
 public:
  HostBackend(std::shared_ptr<HostWorld> world, int rank) : world_(std::move(world)), rank_(rank) {}

  zpResult_t run(const CollArgs& a) override {
    if (world_->aborted()) return ZP_ERR(zpRemoteError, "%s : the communicator was aborted", a.opName);
    switch (a.kind) {
      case CollKind::kQuantize:
        quantizeRef(a.sendbuff, a.type, a.count, a.bits, a.blockSize, a.recvbuff);
        return zpSuccess;
      case CollKind::kDequantize:
        dequantizeRef(a.sendbuff, a.type, a.count, a.bits, a.blockSize, a.recvbuff);
        return zpSuccess;
      default:
        return ZP_ERR(zpInvalidUsage, "%s : not implemented yet on the host backend", a.opName);
    }
  }

  zpResult_t reserve(size_t) override { return zpSuccess; }

  zpResult_t asyncError(zpResult_t* error) override {
    *error = world_->aborted() ? zpRemoteError : zpSuccess;
    return zpSuccess;
  }

  zpResult_t finalize(bool abort) override {
    if (abort) world_->abort();
    return zpSuccess;
  }

  bool bufferUsable(const void* ptr, const char** why) override {
    if (ptr == nullptr) {
      *why = "is NULL";
      return false;
    }
    return true;
  }

 private:
  std::shared_ptr<HostWorld> world_;
  const int rank_;
};

}  // namespace

zpResult_t hostBackendCreate(const zpUniqueId& id, int nranks, int rank, uint64_t nodeKey, int hpzRequest,
                             const char* call, Topology* topo, std::unique_ptr<Backend>* backend) {
  std::shared_ptr<HostWorld> world;
  ZPCHECK(HostWorld::join(id, nranks, rank, call, &world));
  // Every rank reads every rank's key between the two barriers.
  ZPCHECK(world->exchange(rank, &nodeKey, call));
  std::vector<uint64_t> keys(nranks);
  for (int r = 0; r < nranks; ++r) keys[r] = *static_cast<const uint64_t*>(world->slot(r));
  ZPCHECK(world->barrier(call));
  ZPCHECK(buildTopology(keys, rank, hpzRequest, call, topo));
  *backend = std::make_unique<HostBackend>(std::move(world), rank);
  return zpSuccess;
}

}  // namespace zp
