// The host backend: buffers are host memory, calls block until done. It runs the same plans and the same
// quantization math as the cuda backend, so the two agree bit for bit: it is the executable specification of every
// collective. Its ranks meet and move bytes through a HostTransport (transport.h): threads of one process, or
// processes over the caller's callbacks.
#pragma once

#include <memory>

#include "host/base/backend.h"
#include "host/topology.h"
#include "src/host/transport.h"

namespace zp {

// Compares every rank's RankInit, as the ranks met over `transport`; on success *topo holds the layout seen by `rank`
// and *backend runs its collectives over the transport. Every rank leaves with the same verdict: when the ranks'
// settings differ, all of them return zpInvalidUsage naming the setting and both values, and when one rank's init
// fails after they met, the others return its error.
zpResult_t hostBackendCreate(std::unique_ptr<HostTransport> transport, int rank, const RankInit& mine, const char* call,
                             Topology* topo, std::unique_ptr<Backend>* backend);

}  // namespace zp
