// The host backend: ranks are threads of one process, buffers are host memory, calls block until done. It
// runs the same plans and the same quantization math as the cuda backend, so the two agree bit for bit: it is
// the executable specification of every collective.
#pragma once

#include <memory>

#include "host/backend/host_world.h"
#include "host/topology.h"
#include "src/include/backend.h"

namespace zp {

// Joins the world of `id` with this rank's RankInit and compares every rank's; on success *topo holds the layout
// seen by `rank`. Every rank leaves with the same verdict: when the ranks' settings differ, all of them return
// zpInvalidUsage naming the setting and both values, and when one rank's init fails after they met, the others
// return its error.
zpResult_t hostBackendCreate(const zpUniqueId& id, int nranks, int rank, const RankInit& mine, const char* call,
                             Topology* topo, std::unique_ptr<Backend>* backend);

}  // namespace zp
