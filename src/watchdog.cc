#include "src/watchdog.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>

#include "src/debug.h"

// NCCL 2.28 added ncclCommRevoke; a weak reference lets zpccl run on an older 2.28 library, where the pointer is
// NULL and a failure is only reported (the caller's zpCommAbort then stops the kernels).
#pragma weak ncclCommRevoke

namespace zp {

namespace {
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  char text[512];
  va_list args;
  va_start(args, fmt);
  vsnprintf(text, sizeof(text), fmt, args);
  va_end(args);
  return text;
}
}  // namespace

Watchdog::Watchdog(int device, std::vector<ncclComm_t> comms, int64_t timeoutMs)
    : device_(device), comms_(std::move(comms)), timeoutMs_(timeoutMs), thread_([this] { loop(); }) {}

Watchdog::~Watchdog() {
  stop();
  for (const Pending& p : pending_) (void)cudaEventDestroy(p.done);
  for (cudaEvent_t ev : freeEvents_) (void)cudaEventDestroy(ev);
}

zpResult_t Watchdog::track(const char* opName, cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    (void)cudaGetLastError();
    return zpSuccess;  // not a stream we can watch; the call itself already succeeded
  }
  if (capture != cudaStreamCaptureStatusNone) return zpSuccess;  // a graph's replays are the caller's to watch
  std::lock_guard<std::mutex> lock(mutex_);
  cudaEvent_t ev = nullptr;
  if (!freeEvents_.empty()) {
    ev = freeEvents_.back();
    freeEvents_.pop_back();
  } else if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) {
    (void)cudaGetLastError();
    return zpSuccess;  // unwatched, not failed
  }
  if (cudaEventRecord(ev, stream) != cudaSuccess) {
    (void)cudaGetLastError();
    freeEvents_.push_back(ev);
    return zpSuccess;
  }
  pending_.push_back(Pending{ev, std::chrono::steady_clock::now(), opName});
  return zpSuccess;
}

zpResult_t Watchdog::failure(std::string* message) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (message != nullptr) *message = failureMessage_;
  return failure_;
}

bool Watchdog::revoked() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return revoked_;
}

void Watchdog::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::loop() {
  (void)cudaSetDevice(device_);
  // Poll often enough to honour a short timeout, rarely enough to cost nothing.
  const int64_t pollMs = std::clamp<int64_t>(timeoutMs_ > 0 ? timeoutMs_ / 20 : 100, 5, 100);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, std::chrono::milliseconds(pollMs), [this] { return stopping_; });
    if (stopping_ || failure_ != zpSuccess) continue;
    lock.unlock();
    poll();
    lock.lock();
  }
}

void Watchdog::poll() {
  for (ncclComm_t comm : comms_) {
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) continue;
    if (state != ncclSuccess && state != ncclInProgress) {
      fail(static_cast<zpResult_t>(state),
           format("NCCL reported an asynchronous error on one of the communicator's NCCL communicators: %s (%s)",
                  ncclGetErrorString(state), ncclGetLastError(comm)));
      return;
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  while (!pending_.empty()) {
    Pending& oldest = pending_.front();
    const cudaError_t state = cudaEventQuery(oldest.done);
    if (state == cudaSuccess) {
      freeEvents_.push_back(oldest.done);
      pending_.pop_front();
      continue;
    }
    if (state != cudaErrorNotReady) {
      (void)cudaGetLastError();
      failure_ = zpUnhandledCudaError;
      failureMessage_ = format("%s failed on the GPU: %s", oldest.opName, cudaGetErrorString(state));
      revokeLocked();
      return;
    }
    const auto waited =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - oldest.enqueued)
            .count();
    if (timeoutMs_ > 0 && waited > timeoutMs_) {
      failure_ = zpRemoteError;
      failureMessage_ = format(
          "%s has not completed %lld ms after it was enqueued (ZP_TIMEOUT_MS=%lld): a peer has likely failed or "
          "stopped calling; the communicator's work was stopped",
          oldest.opName, static_cast<long long>(waited), static_cast<long long>(timeoutMs_));
      revokeLocked();
    }
    return;
  }
}

void Watchdog::fail(zpResult_t code, std::string message) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (failure_ != zpSuccess) return;
  failure_ = code;
  failureMessage_ = std::move(message);
  revokeLocked();
}

void Watchdog::revokeLocked() {
  ZP_WARN("communicator failed: %s", failureMessage_.c_str());
  if (revoked_ || ncclCommRevoke == nullptr) return;
  for (ncclComm_t comm : comms_) (void)ncclCommRevoke(comm, 0);
  revoked_ = true;
}

}  // namespace zp
