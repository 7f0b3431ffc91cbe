// The cuda backend's watchdog: what turns a dead peer into an error instead of a hang.
//
// A collective returns once it is enqueued, so a peer that dies mid-collective leaves this rank's NCCL kernels
// waiting forever. The watchdog thread, one per communicator, polls two things:
//   - each NCCL communicator's async error (NCCL's socket transport sees a peer's connections close);
//   - the completion event recorded after each collective it was told about; one still pending ZP_TIMEOUT_MS
//     after its enqueue means a peer that stopped without closing anything (NVLink and shared memory).
// On the first failure it records the error and asks the backend to stop the NCCL communicators' work (see
// CudaBackend::stopNcclWork), which ends their kernels: the caller's stream drains, zpCommGetAsyncError reports
// the failure, and every later collective on the communicator returns it at once. Destroy or abort the
// communicator after that, as with NCCL.
#pragma once

#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "include/zpccl.h"

namespace zp {

class Watchdog {
 public:
  // comms: the distinct NCCL communicators to poll; timeoutMs <= 0 disables the timeout (async errors are still
  // polled). stopWork is called from the watchdog's thread after a failure, each poll until it returns true.
  Watchdog(int device, std::vector<ncclComm_t> comms, int64_t timeoutMs, std::function<bool()> stopWork);
  ~Watchdog();  // stops the thread; the caller destroys the communicators afterwards
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // After a collective was enqueued on stream (not capturing): its completion is watched from now on.
  zpResult_t track(const char* opName, cudaStream_t stream);

  // zpSuccess, or the failure seen; *message says what happened.
  zpResult_t failure(std::string* message = nullptr) const;

  // Ends the thread (before the communicators are destroyed or aborted).
  void stop();

 private:
  struct Pending {
    cudaEvent_t done;
    std::chrono::steady_clock::time_point enqueued;
    const char* opName;
  };
  void loop();
  void poll();
  void failLocked(zpResult_t code, std::string message);

  const int device_;
  const std::vector<ncclComm_t> comms_;
  const int64_t timeoutMs_;
  const std::function<bool()> stopWork_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  bool workStopped_ = false;
  zpResult_t failure_ = zpSuccess;
  std::string failureMessage_;
  std::deque<Pending> pending_;
  std::vector<cudaEvent_t> freeEvents_;
  std::thread thread_;
};

}  // namespace zp
