// The cuda backend: NCCL communicators (the world and its splits) and the device kernels.
#pragma once

#include <nccl.h>

#include <memory>

#include "host/topology.h"
#include "src/backend.h"

namespace zp {

// Brings up the NCCL side of a communicator on the current CUDA device: the world communicator (created from
// id, or the caller's `callerComm`, which stays the caller's), the node-key exchange that gives *topo, and the
// intra-node, inter-node and hpZ sub-communicators split from the world.
zpResult_t cudaBackendCreate(ncclComm_t callerComm, const zpUniqueId& id, int nranks, int rank, uint64_t nodeKey,
                             int hpzRequest, const char* call, Topology* topo, int* cudaDev,
                             std::unique_ptr<Backend>* backend);

}  // namespace zp
