// Error plumbing. Internal functions return zpResult_t. The first failure records a message (naming the call
// and the argument) in a thread-local slot with ZP_ERR; the ABI boundary (api_guard.h) moves it to the
// communicator's last error. The check macros pass an error up, logging "-> code" with file:line at INFO.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "host/base/debug.h"
#include "include/zpccl.h"

namespace zp {

// Records a formatted message as this thread's pending error, logs it as a warning, and returns code.
zpResult_t setError(zpResult_t code, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));

// Resets this thread's pending error (the ABI boundary does, at the start of every call).
void clearPendingError();
// This thread's pending error message ("" when none).
const std::string& pendingError();

}  // namespace zp

#define ZP_ERR(code, ...) ::zp::setError((code), __FILE__, __LINE__, __VA_ARGS__)

#define ZPCHECK(call)                                                                         \
  do {                                                                                        \
    zpResult_t zpRes_ = (call);                                                               \
    if (zpRes_ != zpSuccess) {                                                                \
      ZP_INFO(::zp::kSubsysAll, "%s:%d -> %d", __FILE__, __LINE__, static_cast<int>(zpRes_)); \
      return zpRes_;                                                                          \
    }                                                                                         \
  } while (0)

#define ZPCHECKGOTO(call, res, label)                                                      \
  do {                                                                                     \
    (res) = (call);                                                                        \
    if ((res) != zpSuccess) {                                                              \
      ZP_INFO(::zp::kSubsysAll, "%s:%d -> %d", __FILE__, __LINE__, static_cast<int>(res)); \
      goto label;                                                                          \
    }                                                                                      \
  } while (0)

// Clears the sticky launch error after reading it, so one failure does not leak into the next launch.
#define CUDACHECK(call)                                                                                    \
  do {                                                                                                     \
    cudaError_t cudaErr_ = (call);                                                                         \
    if (cudaErr_ != cudaSuccess) {                                                                         \
      (void)cudaGetLastError();                                                                            \
      return ZP_ERR(zpUnhandledCudaError, "CUDA failure '%s' in %s", cudaGetErrorString(cudaErr_), #call); \
    }                                                                                                      \
  } while (0)

#define CUDACHECKGOTO(call, res, label)                                                                     \
  do {                                                                                                      \
    cudaError_t cudaErr_ = (call);                                                                          \
    if (cudaErr_ != cudaSuccess) {                                                                          \
      (void)cudaGetLastError();                                                                             \
      (res) = ZP_ERR(zpUnhandledCudaError, "CUDA failure '%s' in %s", cudaGetErrorString(cudaErr_), #call); \
      goto label;                                                                                           \
    }                                                                                                       \
  } while (0)

// NCCL calls: ncclCheck (src/cuda/nccl_check.h).
