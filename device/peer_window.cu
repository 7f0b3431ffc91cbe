#include "device/peer_window.h"
#include "host/base/check.h"

#if ZP_HAVE_NCCL_DEVICE
// NCCL's device headers trip -Wunused-parameter; they are not ours to change.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include <nccl_device.h>
#pragma GCC diagnostic pop
#endif

namespace zp {

#if ZP_HAVE_NCCL_DEVICE
namespace {
__global__ void rankAddressesKernel(ncclWindow_t window, int ranks, uintptr_t* out) {
  for (int r = threadIdx.x; r < ranks; r += blockDim.x)
    out[r] = reinterpret_cast<uintptr_t>(ncclGetLsaPointer(window, 0, r));
}
}  // namespace
#endif

namespace {
__global__ void peerWaitKernel(const PeerSync s) { (void)waitForPeers(s); }
}  // namespace

zpResult_t launchPeerWait(const PeerSync& sync, cudaStream_t stream) {
  if (sync.waitFor == PeerSync::kNone) return zpSuccess;
  peerWaitKernel<<<1, 1, 0, stream>>>(sync);
  CUDACHECK(cudaGetLastError());
  return zpSuccess;
}

zpResult_t loadPeerKernels() {
#if ZP_HAVE_NCCL_DEVICE
  ZPCHECK(loadKernel<rankAddressesKernel>());
#endif
  return loadKernel<peerWaitKernel>();
}

zpResult_t windowRankAddresses(ncclWindow_t window, int ranks, void* deviceScratch, cudaStream_t stream,
                               std::vector<uintptr_t>* addresses) {
#if ZP_HAVE_NCCL_DEVICE
  auto* out = static_cast<uintptr_t*>(deviceScratch);
  rankAddressesKernel<<<1, 128, 0, stream>>>(window, ranks, out);
  CUDACHECK(cudaGetLastError());
  addresses->assign(static_cast<size_t>(ranks), 0);
  CUDACHECK(cudaMemcpyAsync(addresses->data(), out, ranks * sizeof(uintptr_t), cudaMemcpyDeviceToHost, stream));
  CUDACHECK(cudaStreamSynchronize(stream));
  return zpSuccess;
#else
  (void)window, (void)ranks, (void)deviceScratch, (void)stream, (void)addresses;
  return ZP_ERR(zpInvalidUsage, "windowRankAddresses : zpccl was built without NCCL's device headers");
#endif
}

}  // namespace zp
