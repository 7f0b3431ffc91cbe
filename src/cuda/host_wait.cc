#include "src/cuda/host_wait.h"

#include <limits>

#include "host/base/check.h"

namespace zp {

namespace {

template <class Query>
zpResult_t waitFor(Query query, const std::atomic<bool>* stop, const char* call, const char* what) {
  cudaError_t last = cudaSuccess;
  const auto recorded = [&] { return last = query(); };
  switch (pollUntilDone(recorded, stop, std::numeric_limits<double>::infinity())) {
    case WaitEnd::kDone:
      return zpSuccess;
    case WaitEnd::kStopped:
      return ZP_ERR(zpRemoteError, "%s : stopped waiting for %s: the communicator failed or is being aborted", call,
                    what);
    case WaitEnd::kFailed:
    case WaitEnd::kTimedOut:
      break;
  }
  return ZP_ERR(zpUnhandledCudaError, "%s : waiting for %s: CUDA failure '%s'", call, what, cudaGetErrorString(last));
}

}  // namespace

zpResult_t waitOnHost(cudaStream_t stream, const std::atomic<bool>* stop, const char* call, const char* what) {
  return waitFor([stream] { return cudaStreamQuery(stream); }, stop, call, what);
}

zpResult_t waitOnHost(cudaEvent_t event, const std::atomic<bool>* stop, const char* call, const char* what) {
  return waitFor([event] { return cudaEventQuery(event); }, stop, call, what);
}

}  // namespace zp
