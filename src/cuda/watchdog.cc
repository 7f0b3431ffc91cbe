#include "src/cuda/watchdog.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>

#include "host/base/debug.h"

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

Watchdog::Watchdog(int device, std::vector<ncclComm_t> comms, int64_t timeoutMs, std::function<bool()> stopWork)
    : device_(device), comms_(std::move(comms)), timeoutMs_(timeoutMs), stopWork_(std::move(stopWork)), thread_([this] {
        loop();
      }) {}

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

void Watchdog::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
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
    if (stopping_ || workStopped_) continue;
    const bool failed = failure_ != zpSuccess;
    lock.unlock();
    bool stopped = false;
    if (failed) {
      stopped = stopWork_();
    } else {
      poll();
    }
    lock.lock();
    workStopped_ = workStopped_ || stopped;
  }
}

void Watchdog::poll() {
  for (ncclComm_t comm : comms_) {
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) continue;
    if (state != ncclSuccess && state != ncclInProgress) {
      std::lock_guard<std::mutex> lock(mutex_);
      failLocked(static_cast<zpResult_t>(state),
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
      failLocked(zpUnhandledCudaError, format("%s failed on the GPU: %s", oldest.opName, cudaGetErrorString(state)));
      return;
    }
    const auto waited =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - oldest.enqueued)
            .count();
    if (timeoutMs_ > 0 && waited > timeoutMs_) {
      failLocked(zpRemoteError,
                 format("%s has not completed %lld ms after it was enqueued (ZP_TIMEOUT_MS=%lld): a peer has likely "
                        "failed or stopped calling; the communicator's work was stopped",
                        oldest.opName, static_cast<long long>(waited), static_cast<long long>(timeoutMs_)));
    }
    return;
  }
}

void Watchdog::failLocked(zpResult_t code, std::string message) {
  if (failure_ != zpSuccess) return;
  failure_ = code;
  failureMessage_ = std::move(message);
  ZP_WARN("communicator failed: %s", failureMessage_.c_str());
  wake_.notify_all();  // the loop stops the work at its next turn
}

}  // namespace zp
