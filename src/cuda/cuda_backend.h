// The cuda backend: NCCL communicators (the world and its splits) and the device kernels.
#pragma once

#include <nccl.h>

#include <memory>

#include "host/base/backend.h"
#include "host/rank_init.h"
#include "host/topology.h"

namespace zp {

// Brings up the NCCL side of a communicator on the current CUDA device: the world communicator (created from
// id, or the caller's `callerComm`, which stays the caller's), the exchange of every rank's RankInit that gives
// *topo (settings that differ between ranks are zpInvalidUsage on every rank, before anything is split), and the
// intra-node, inter-node and hpZ sub-communicators split from the world.
zpResult_t cudaBackendCreate(ncclComm_t callerComm, const zpUniqueId& id, int nranks, int rank, const RankInit& mine,
                             const char* call, Topology* topo, int* cudaDev, std::unique_ptr<Backend>* backend);

// What decides whether zpccl's NCCL communicators get more channels than NCCL would pick: one node whose GPUs
// reach each other only through host shared memory (NCCL's SHM transport). zpccl's payloads are a half to a
// quarter of the bf16 baseline's bytes, and NCCL gives them fewer channels than that transport can use: more
// channels move them faster over shm (perf/RESULTS.md, qwZ shm), not over sockets.
struct ShmChannelFacts {
  int nodes;  // in zpccl's topology
  int nranks;
  int64_t shmMinCtas;      // ZP_SHM_MIN_CTAS
  int64_t ncclMinCtas;     // ZP_NCCL_MIN_CTAS (set: the world already has the channels it asked for)
  const char* p2pDisable;  // NCCL_P2P_DISABLE, or nullptr
  const char* shmDisable;  // NCCL_SHM_DISABLE, or nullptr
  bool callersWorld;       // zpCommInitFromNccl: the world is the caller's communicator
};

// The fewest channels to ask NCCL for, or 0 to leave NCCL's choice. Not for a caller's communicator: with NCCL's
// P2P disabled, a widened split of the caller's communicator can hang (GpuFromNccl), for a cause not known, and
// the caller's NCCL settings are the caller's choice.
int shmChannelsFor(const ShmChannelFacts& f);

}  // namespace zp
