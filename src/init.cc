// Communicator lifecycle and queries.
#include <nccl.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "host/base/check.h"
#include "host/base/params.h"
#include "src/api_guard.h"
#include "src/argcheck.h"
#include "src/comm.h"
#include "src/cuda/cuda_backend.h"
#include "src/cuda/nccl_check.h"
#include "src/host/host_backend.h"

namespace zp {

namespace {

bool cudaDeviceVisible() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return count > 0;
}

zpResult_t resolveBackend(zpBackend_t requested, const char* call, zpBackend_t* backend) {
  if (requested != zpBackendDefault) {
    *backend = requested;
    return zpSuccess;
  }
  const std::string& env = paramBackend();
  if (env == "host") {
    *backend = zpBackendHost;
  } else if (env == "cuda") {
    *backend = zpBackendCuda;
  } else if (env.empty()) {
    *backend = cudaDeviceVisible() ? zpBackendCuda : zpBackendHost;
  } else {
    return ZP_ERR(zpInvalidArgument, "%s : ZP_BACKEND='%s' must be cuda or host", call, env.c_str());
  }
  return zpSuccess;
}

// What this rank brings to init (host/rank_init.h). The node key puts ranks on one node: an explicit node id, an
// emulated block of ranks, or the host hash; tags keep the three kinds of key apart.
RankInit rankInitOf(const Settings& s, int rank) {
  RankInit r;
  if (s.nodeId >= 0) {
    r.layout = kLayoutNodeId;
    r.nodeKey = 0x4e4f444500000000ull | static_cast<uint32_t>(s.nodeId);
  } else if (s.ranksPerNode > 0) {
    r.layout = kLayoutRanksPerNode;
    r.nodeKey = 0x424c4f4b00000000ull | static_cast<uint32_t>(rank / s.ranksPerNode);
  } else {
    r.layout = kLayoutHostHash;
    r.nodeKey = hostHash();
  }
  r.ranksPerNode = s.ranksPerNode;
  r.hpzSize = s.hpzSize;
  r.weightBits = s.weightBits;
  r.gradBits = s.gradBits;
  r.blockSize = s.blockSize;
  return r;
}

// One of three ways in: a unique id (thread-ranks of the host backend, or the cuda backend), a caller's NCCL
// communicator, or a caller's transport (the host backend's ranks as processes).
zpResult_t commInit(zpComm_t* out, ncclComm_t callerComm, const zpTransport_t* transport, int nranks,
                    const zpUniqueId& id, int rank, const zpConfig_t* config, const char* call) {
  auto comm = std::make_unique<Communicator>();
  ZPCHECK(resolveConfig(config, nranks, call, &comm->settings));
  // qgZ's rounding and seed: the config's, else the environment's (ZP_GRAD_ROUNDING, ZP_GRAD_SEED).
  if (comm->settings.gradRounding < 0) comm->settings.gradRounding = static_cast<int>(paramGradRounding());
  if (comm->settings.gradSeed < 0) comm->settings.gradSeed = static_cast<int>(paramGradSeed());
  if (transport != nullptr && comm->settings.backend == zpBackendCuda) {
    return ZP_ERR(zpInvalidArgument,
                  "%s : config->backend cuda cannot run over a transport (host memory only): leave it "
                  "unset or set zpBackendHost",
                  call);
  }
  const zpBackend_t requested = callerComm ? zpBackendCuda : transport ? zpBackendHost : comm->settings.backend;
  ZPCHECK(resolveBackend(requested, call, &comm->settings.backend));
  const Settings& s = comm->settings;
  const RankInit mine = rankInitOf(s, rank);
  if (s.backend == zpBackendHost) {
    std::unique_ptr<HostTransport> meeting;
    if (transport != nullptr) {
      ZPCHECK(openCallbackTransport(*transport, mine, call, &meeting));
    } else {
      ZPCHECK(joinThreadTransport(id, nranks, rank, mine, call, &meeting));
    }
    ZPCHECK(hostBackendCreate(std::move(meeting), rank, mine, call, &comm->topo, &comm->backend));
  } else {
    ZPCHECK(cudaBackendCreate(callerComm, id, nranks, rank, mine, call, &comm->topo, &comm->cudaDev, &comm->backend));
  }
  const Topology& t = comm->topo;
  ZP_INFO(kSubsysInit, "%s : %s backend, %s", call, s.backend == zpBackendHost ? "host" : "cuda", t.describe().c_str());
  if (!t.even && rank == 0) {
    ZP_WARN("%s : nodes of uneven sizes (%s): hierarchical paths fall back to flat ones and hpZ is unavailable", call,
            t.describe().c_str());
  }
  *out = registerComm(std::move(comm));
  return zpSuccess;
}

zpResult_t commFree(zpComm_t handle, bool abort, const char* call) {
  ZPCHECK(checkComm(handle, call));
  // Freeing waits for the calls running on the communicator, this thread's own among them.
  if (const char* outer = callInsideOn(handle)) {
    return ZP_ERR(zpInvalidUsage,
                  "%s : called from inside %s on this communicator (from its transport's callback), which it would "
                  "wait for forever: return an error from the callback (the call then fails on every rank) and %s "
                  "the communicator after %s returns",
                  call, outer, abort ? "abort" : "destroy", outer);
  }
  Communicator* comm = unregisterComm(handle);
  if (comm == nullptr) {
    return ZP_ERR(zpInvalidArgument, "%s : comm %p was destroyed by another thread", call, static_cast<void*>(handle));
  }
  // No new call can start now; an abort wakes the calls already running, and both wait for them to leave.
  if (abort) comm->backend->interrupt();
  waitUnused(comm);
  zpResult_t res = comm->backend->finalize(abort);
  delete comm;
  if (res != zpSuccess) return ZP_ERR(res, "%s : releasing the communicator's resources failed", call);
  return zpSuccess;
}

// Reads a field only after the handle is known to be live, and with the communicator in use (whileInUse). arg: the
// output's name in zpccl.h.
template <typename T, typename Get>
zpResult_t query(zpComm_t comm, T* out, const char* call, const char* arg, Get get) {
  return whileInUse(comm, call, [&](const Communicator* live) -> zpResult_t {
    ZPCHECK(checkNotNull(out, call, arg));
    *out = get(live);
    return zpSuccess;
  });
}

}  // namespace
}  // namespace zp

using zp::guardedCall;

ZP_EXPORT zpResult_t zpGetUniqueId(zpUniqueId* uniqueId) {
  return guardedCall("zpGetUniqueId", nullptr, [&]() -> zpResult_t {
    ZPCHECK(zp::checkNotNull(uniqueId, "zpGetUniqueId", "uniqueId"));
    memset(uniqueId, 0, sizeof(*uniqueId));
    // With a GPU the id must be NCCL's (the cuda backend bootstraps from it). Without one, any unique bytes do:
    // the host backend only uses the id as a meeting key.
    if (zp::paramBackend() != "host" && zp::cudaDeviceVisible()) {
      ncclUniqueId id;
      ncclResult_t r = ncclGetUniqueId(&id);
      if (r == ncclSuccess) {
        memcpy(uniqueId, &id, sizeof(id));
        return zpSuccess;
      }
      ZP_INFO(zp::kSubsysInit, "ncclGetUniqueId failed (%s); using a host-backend id", ncclGetErrorString(r));
    }
    std::random_device entropy;
    const char tag[] = "zpccl-host";
    memcpy(uniqueId->internal, tag, sizeof(tag));
    for (size_t i = sizeof(tag); i + 4 <= sizeof(uniqueId->internal); i += 4) {
      const uint32_t word = entropy();
      memcpy(uniqueId->internal + i, &word, 4);
    }
    return zpSuccess;
  });
}

ZP_EXPORT zpResult_t zpCommInitRankConfig(zpComm_t* comm, int nranks, zpUniqueId commId, int rank, zpConfig_t* config) {
  return zp::guardedInit("zpCommInitRankConfig", comm, [&]() -> zpResult_t {
    ZPCHECK(zp::checkNotNull(comm, "zpCommInitRankConfig", "comm"));
    *comm = nullptr;  // on every failure, as NCCL does
    ZPCHECK(zp::checkInitArgs(comm, nranks, rank, "zpCommInitRankConfig"));
    return zp::commInit(comm, nullptr, nullptr, nranks, commId, rank, config, "zpCommInitRankConfig");
  });
}

ZP_EXPORT zpResult_t zpCommInitRank(zpComm_t* comm, int nranks, zpUniqueId commId, int rank) {
  return zp::guardedInit("zpCommInitRank", comm, [&]() -> zpResult_t {
    ZPCHECK(zp::checkNotNull(comm, "zpCommInitRank", "comm"));
    *comm = nullptr;  // on every failure, as NCCL does
    ZPCHECK(zp::checkInitArgs(comm, nranks, rank, "zpCommInitRank"));
    return zp::commInit(comm, nullptr, nullptr, nranks, commId, rank, nullptr, "zpCommInitRank");
  });
}

ZP_EXPORT zpResult_t zpCommInitFromNccl(zpComm_t* comm, struct ncclComm* ncclComm, zpConfig_t* config) {
  return zp::guardedInit("zpCommInitFromNccl", comm, [&]() -> zpResult_t {
    const char* call = "zpCommInitFromNccl";
    ZPCHECK(zp::checkNotNull(comm, call, "comm"));
    *comm = nullptr;
    ZPCHECK(zp::checkNotNull(ncclComm, call, "ncclComm"));
    // The config is checked whole before NCCL is asked anything (the rank count, NCCL's, only by commInit), so that
    // its errors are named as its own, whatever the layout of the config (0.1's too).
    zp::Settings requested;
    ZPCHECK(zp::resolveConfig(config, 0, call, &requested));
    if (requested.backend == zpBackendHost) {
      return ZP_ERR(zpInvalidArgument, "%s : config->backend host cannot wrap an NCCL communicator", call);
    }
    int nranks = 0, rank = 0;
    ZPCHECK(zp::ncclCheck(ncclCommCount(ncclComm, &nranks), call, "ncclCommCount"));
    ZPCHECK(zp::ncclCheck(ncclCommUserRank(ncclComm, &rank), call, "ncclCommUserRank"));
    zpUniqueId unused;
    memset(&unused, 0, sizeof(unused));
    return zp::commInit(comm, ncclComm, nullptr, nranks, unused, rank, config, call);
  });
}

ZP_EXPORT zpResult_t zpCommInitFromTransport(zpComm_t* comm, const zpTransport_t* transport, zpConfig_t* config) {
  return zp::guardedInit("zpCommInitFromTransport", comm, [&]() -> zpResult_t {
    const char* call = "zpCommInitFromTransport";
    ZPCHECK(zp::checkNotNull(comm, call, "comm"));
    *comm = nullptr;
    ZPCHECK(zp::checkTransport(transport, call));
    zpUniqueId unused;
    memset(&unused, 0, sizeof(unused));
    return zp::commInit(comm, nullptr, transport, transport->nranks, unused, transport->rank, config, call);
  });
}

ZP_EXPORT zpResult_t zpCommDestroy(zpComm_t comm) {
  // The outcome is recorded for the thread: the communicator is gone afterwards.
  return guardedCall("zpCommDestroy", nullptr, [&] { return zp::commFree(comm, false, "zpCommDestroy"); });
}

ZP_EXPORT zpResult_t zpCommAbort(zpComm_t comm) {
  return guardedCall("zpCommAbort", nullptr, [&] { return zp::commFree(comm, true, "zpCommAbort"); });
}

ZP_EXPORT zpResult_t zpCommGetAsyncError(zpComm_t comm, zpResult_t* asyncError) {
  return guardedCall("zpCommGetAsyncError", &comm, [&]() -> zpResult_t {
    return zp::whileInUse(comm, "zpCommGetAsyncError", [&](zp::Communicator* c) -> zpResult_t {
      ZPCHECK(zp::checkNotNull(asyncError, "zpCommGetAsyncError", "asyncError"));
      return c->backend->asyncError(asyncError);
    });
  });
}

ZP_EXPORT zpResult_t zpCommReserve(zpComm_t comm, size_t maxBytes) {
  return guardedCall("zpCommReserve", &comm, [&]() -> zpResult_t {
    return zp::whileExclusive(comm, "zpCommReserve",
                              [&](zp::Communicator* c) { return c->backend->reserve(maxBytes); });
  });
}

#define ZP_QUERY(fn, type, arg, field)                                                                     \
  ZP_EXPORT zpResult_t fn(const zpComm_t comm, type* arg) {                                                \
    return guardedCall(#fn, &comm, [&] {                                                                   \
      return zp::query<type>(comm, arg, #fn, #arg,                                                         \
                             [](const zp::Communicator* live) { return static_cast<type>(live->field); }); \
    });                                                                                                    \
  }
ZP_QUERY(zpCommCount, int, count, topo.nranks)
ZP_QUERY(zpCommUserRank, int, rank, topo.rank)
ZP_QUERY(zpCommCuDevice, int, device, cudaDev)
ZP_QUERY(zpCommBackend, zpBackend_t, backend, settings.backend)
ZP_QUERY(zpCommNodeCount, int, nodes, topo.nodes)
ZP_QUERY(zpCommNodeRank, int, node, topo.node)
ZP_QUERY(zpCommLocalRank, int, localRank, topo.localRank)
ZP_QUERY(zpCommLocalSize, int, localSize, topo.localSize)
ZP_QUERY(zpCommHpzRank, int, hpzRank, topo.hpzRank)
ZP_QUERY(zpCommHpzSize, int, hpzSize, topo.hpzSize)
#undef ZP_QUERY
