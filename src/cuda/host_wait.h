// Host waits inside a call that holds its communicator.
//
// A call that waits on the host for GPU work (before a buffer grows, for an exchange with the peers) holds the
// communicator meanwhile: zpCommAbort from another thread waits for it to leave, and so does the watchdog when it
// must abort NCCL's communicators itself (NCCL without ncclCommRevoke), which is the only thing that ends a kernel
// waiting for a dead peer. A wait that blocked in the driver would then never end. These waits poll instead, and
// give up once `stop` is set: by the watchdog when the communicator failed, or by an abort (Backend::interrupt).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "include/zpccl.h"

namespace zp {

enum class WaitEnd { kDone, kFailed, kStopped, kTimedOut };

// Polls `query` (a cudaStreamQuery or cudaEventQuery of something) until it stops answering cudaErrorNotReady, `stop`
// (may be null) is set, or `seconds` have passed. Never blocks in the driver. A failed query's error is cleared.
template <class Query>
WaitEnd pollUntilDone(Query query, const std::atomic<bool>* stop, double seconds) {
  const auto start = std::chrono::steady_clock::now();
  for (int polls = 0;; ++polls) {
    const cudaError_t r = query();
    if (r == cudaSuccess) return WaitEnd::kDone;
    if (r != cudaErrorNotReady) {
      (void)cudaGetLastError();
      return WaitEnd::kFailed;
    }
    if (stop != nullptr && stop->load(std::memory_order_relaxed)) return WaitEnd::kStopped;
    const std::chrono::duration<double> waited = std::chrono::steady_clock::now() - start;
    if (waited.count() > seconds) return WaitEnd::kTimedOut;
    // The first polls only yield: most waits end within microseconds (a memset, a small exchange).
    if (polls < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
}

// Waits for every piece of work enqueued on `stream` (or up to `event`) so far. zpRemoteError when `stop` ended the
// wait, zpUnhandledCudaError when the work failed; the message names `call` and `what` was waited for.
zpResult_t waitOnHost(cudaStream_t stream, const std::atomic<bool>* stop, const char* call, const char* what);
zpResult_t waitOnHost(cudaEvent_t event, const std::atomic<bool>* stop, const char* call, const char* what);

}  // namespace zp
