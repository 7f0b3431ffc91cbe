// Helpers for the GPU suites: skip cleanly (never crash) on a machine without a usable CUDA device.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

namespace zptest {

// Number of CUDA devices usable by this process; 0 when there is no driver or no device.
inline int gpuCount() {
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return n;
  }();
  return count;
}

// A non-blocking stream of the current device, destroyed with the object; get() is null when it could not be made.
class Stream {
 public:
  Stream() {
    if (cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) != cudaSuccess) stream_ = nullptr;
  }
  ~Stream() {
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace zptest

#define ZP_REQUIRE_GPUS(n)                                                                \
  do {                                                                                    \
    if (::zptest::gpuCount() < (n)) GTEST_SKIP() << "needs " << (n) << " CUDA device(s)"; \
  } while (0)

#define CUDA_ASSERT(call)                                                  \
  do {                                                                     \
    cudaError_t e_ = (call);                                               \
    ASSERT_EQ(e_, cudaSuccess) << #call << ": " << cudaGetErrorString(e_); \
  } while (0)
