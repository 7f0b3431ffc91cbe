// Result strings, versions, and the per-thread pending error that the ABI boundary hands to zpGetLastError.
#include <cstdarg>
#include <cstdio>
#include <string>

#include "host/base/check.h"
#include "src/api_guard.h"
#include "src/comm.h"

namespace zp {

namespace {
thread_local std::string tPendingError;
thread_local std::string tNoCommError;    // last failure of this thread's calls without a valid communicator
thread_local std::string tReturnedError;  // storage behind the pointer zpGetLastError returns
}  // namespace

zpResult_t setError(zpResult_t code, const char* file, int line, const char* fmt, ...) {
  char msg[1024];
  va_list args;
  va_start(args, fmt);
  vsnprintf(msg, sizeof(msg), fmt, args);
  va_end(args);
  // Keep the first (innermost) message: it names the call and argument; later ones only add "-> code".
  if (tPendingError.empty()) tPendingError = msg;
  logMessage(kLogWarn, kSubsysAll, file, line, "%s", msg);
  return code;
}

void clearPendingError() { tPendingError.clear(); }

const std::string& pendingError() { return tPendingError; }

zpResult_t finishCall(zpComm_t comm, zpResult_t result) {
  if (result != zpSuccess && tPendingError.empty()) tPendingError = "unspecified error";
  const std::string message = result == zpSuccess ? std::string() : tPendingError;
  if (comm == nullptr || !storeLastError(comm, message)) tNoCommError = message;
  tPendingError.clear();
  return result;
}

void clearThreadError() { tNoCommError.clear(); }

}  // namespace zp

ZP_EXPORT zpResult_t zpGetVersion(int* version) {
  zp::clearPendingError();
  if (version == nullptr) return zp::finishCall(nullptr, ZP_ERR(zpInvalidArgument, "zpGetVersion : version is NULL"));
  *version = ZPCCL_VERSION_CODE;
  return zp::finishCall(nullptr, zpSuccess);
}

ZP_EXPORT const char* zpGetErrorString(zpResult_t result) {
  switch (result) {
    case zpSuccess:
      return "no error";
    case zpUnhandledCudaError:
      return "unhandled cuda error (run with ZP_DEBUG=INFO for details)";
    case zpSystemError:
      return "unhandled system error (run with ZP_DEBUG=INFO for details)";
    case zpInternalError:
      return "internal error - please report this issue to the zpccl developers";
    case zpInvalidArgument:
      return "invalid argument (run with ZP_DEBUG=WARN for details)";
    case zpInvalidUsage:
      return "invalid usage (run with ZP_DEBUG=WARN for details)";
    case zpRemoteError:
      return "remote process exited or there was a network error";
    case zpInProgress:
      return "zpccl operation in progress";
    default:
      return "unknown result code";
  }
}

ZP_EXPORT const char* zpGetLastError(zpComm_t comm) {
  if (comm == nullptr) {
    zp::tReturnedError = zp::tNoCommError;
  } else if (!zp::copyLastError(comm, &zp::tReturnedError)) {
    zp::tReturnedError = "zpGetLastError : comm is not a live communicator (destroyed or garbage)";
  }
  return zp::tReturnedError.c_str();
}
