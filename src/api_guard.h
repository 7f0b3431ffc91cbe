// The C boundary: exported symbols, and the wrapper every ABI function runs inside. C++ inside may throw; here
// exceptions become result codes, and the pending error message moves to the communicator's last error (or
// to the thread's, when the call has no valid communicator), so zpGetLastError is never stale.
#pragma once

#include <exception>
#include <new>
#include <utility>

#include "host/base/check.h"

#define ZP_EXPORT extern "C" __attribute__((visibility("default")))

namespace zp {

// Stores the outcome of an ABI call where zpGetLastError finds it and returns result.
zpResult_t finishCall(zpComm_t comm, zpResult_t result);
// Empties the message that zpGetLastError(NULL) returns in this thread.
void clearThreadError();

// Runs body (returning zpResult_t) with the pending error cleared, exceptions caught, and the outcome recorded
// on *commSlot (read after body, so an init can record on the communicator it created).
template <typename Body>
zpResult_t guardedCall(const char* call, const zpComm_t* commSlot, Body&& body) {
  clearPendingError();
  zpResult_t result;
  try {
    result = body();
  } catch (const std::bad_alloc&) {
    result = ZP_ERR(zpSystemError, "%s : out of host memory", call);
  } catch (const std::exception& e) {
    result = ZP_ERR(zpInternalError, "%s : unexpected exception: %s", call, e.what());
  } catch (...) {
    result = ZP_ERR(zpInternalError, "%s : unexpected exception", call);
  }
  return finishCall(commSlot ? *commSlot : nullptr, result);
}

// guardedCall for an init, which has no communicator on entry: its outcome is the thread's too (zpGetLastError(NULL)),
// so that a success leaves no earlier failure's message there.
template <typename Body>
zpResult_t guardedInit(const char* call, zpComm_t* out, Body&& body) {
  const zpResult_t result = guardedCall(call, out, std::forward<Body>(body));
  if (result == zpSuccess) clearThreadError();
  return result;
}

}  // namespace zp
