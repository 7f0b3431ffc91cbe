// Where NCCL maps the ranks' symmetric windows in this process: the device side of src/cuda/peer_window.h.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <vector>

#include "device/kernel_stream.h"
#include "include/zpccl.h"

// meson.build passes the version of the nccl.h it found: another NCCL's headers earlier on the include path (a CUDA
// toolkit may carry its own) would compile the direct loads against other structs than those of the NCCL linked.
#if defined(ZP_NCCL_VERSION_CODE) && NCCL_VERSION_CODE != ZP_NCCL_VERSION_CODE
#error "the nccl.h included is not the one meson.build found: another NCCL's headers come first on the include path"
#endif

namespace zp {

/**
 * @brief The addresses at which this process sees the first byte of each of `ranks` ranks' windows of `window`
 *        (a window registered with NCCL_WIN_COLL_SYMMETRIC on a communicator whose ranks are all in NCCL's
 *        load/store-accessible team, so that rank r's window is NCCL's LSA peer r). NCCL only exposes them to
 *        device code (ncclGetLsaPointer), so one small kernel writes them to `deviceScratch` (room for `ranks`
 *        pointers) on `stream`, and the call waits for them.
 * @return zpSuccess; zpInvalidUsage when zpccl was built without NCCL's device headers (nccl_device.h).
 */
zpResult_t windowRankAddresses(ncclWindow_t window, int ranks, void* deviceScratch, cudaStream_t stream,
                               std::vector<uintptr_t>* addresses);

/**
 * @brief Enqueues on `stream` a kernel of one thread that waits until every peer's flag `sync.waitFor` in this
 *        rank's window has reached this rank's count of calls (device/peer_sync.h), or until the
 *        cancel word is set.
 */
zpResult_t launchPeerWait(const PeerSync& sync, cudaStream_t stream);

// Loads this file's kernels into the current device's context (see loadKernels, src/cuda/cuda_backend.cc).
zpResult_t loadPeerKernels();

}  // namespace zp
