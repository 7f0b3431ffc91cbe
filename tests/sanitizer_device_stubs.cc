// Host-only stand-ins for the CUDA kernel launchers (device/quantize.h, device/reduce.h, launchPeerWait of
// device/peer_window.h), linked in place of device/ by a host-only build (-Ddevice_kernels=false, device/meson.build):
// the sanitizer and fuzz builds of tools/run-sanitizers.sh, made with clang and without nvcc. The cuda backend is
// not exercised there (no GPU); should it be reached anyway, every launch fails cleanly.
#include "device/peer_window.h"
#include "device/quantize.h"
#include "device/reduce.h"

namespace zp {

zpResult_t launchQuantize(const void*, void*, size_t, zpDataType_t, int, int, KernelStream, int, size_t, size_t) {
  return zpInternalError;
}

zpResult_t launchQuantizeGrad(const void*, void*, size_t, zpDataType_t, int, int, const GradQuantLaunch&, KernelStream,
                              int, size_t, size_t) {
  return zpInternalError;
}

zpResult_t launchDequantize(const void*, void*, size_t, zpDataType_t, int, int, KernelStream, int, size_t, size_t) {
  return zpInternalError;
}

zpResult_t launchReduceRequantize(const ReduceSources&, size_t, int, int, void*, size_t, KernelStream) {
  return zpInternalError;
}

zpResult_t launchReduceRequantizeGrad(const ReduceSources&, size_t, int, int, void*, size_t, const GradQuantLaunch&,
                                      KernelStream) {
  return zpInternalError;
}

zpResult_t launchReduceFinish(const ReduceSources&, size_t, int, int, zpDataType_t, float, void*, size_t,
                              KernelStream) {
  return zpInternalError;
}

zpResult_t launchPeerWait(const PeerSync&, cudaStream_t) { return zpInternalError; }
zpResult_t loadPeerKernels() { return zpInternalError; }

}  // namespace zp
