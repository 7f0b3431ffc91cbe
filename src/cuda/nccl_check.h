// One check for every NCCL call: ncclResult_t as zpResult_t (they share their values), with a message naming the
// zpccl call, the NCCL function and NCCL's own last error.
#pragma once

#include <nccl.h>

#include "host/base/check.h"
#include "include/zpccl.h"

namespace zp {

// What ncclInProgress means where an NCCL function returns it. NCCL returns it from a non-blocking communicator
// (ncclConfig_t.blocking = 0) while the operation is still under way. zpccl's own communicators are blocking
// (config->blocking 0 is refused), but zpCommInitFromNccl takes the caller's communicator as it is, so each call
// site says which it is:
//   kEnqueued: the call enqueues work on a stream (a collective, a group, point-to-point) or queries a
//     communicator: in progress means accepted, and a failure that follows reaches zpCommGetAsyncError (the
//     watchdog reads ncclCommGetAsyncError), as NCCL's own non-blocking users see it. Not an error.
//   kMustComplete: the host uses what the call made right away (a communicator made or split at init, the
//     ranks' settings read back from an all-gather, memory from ncclMemAlloc, a registered window, a
//     deregistration before the free): in progress means it is not there yet, an error.
enum class NcclInProgress { kEnqueued, kMustComplete };

// zpSuccess for ncclSuccess (and ncclInProgress when kEnqueued); otherwise records "<call> : <what> failed:
// <NCCL's error string> (<NCCL's last error>)<hint>" and returns the code.
inline zpResult_t ncclCheck(ncclResult_t r, const char* call, const char* what,
                            NcclInProgress inProgress = NcclInProgress::kEnqueued, const char* hint = "") {
  if (r == ncclSuccess || (r == ncclInProgress && inProgress == NcclInProgress::kEnqueued)) return zpSuccess;
  return ZP_ERR(static_cast<zpResult_t>(r), "%s : %s failed: %s (%s)%s", call, what, ncclGetErrorString(r),
                ncclGetLastError(nullptr), hint);
}

}  // namespace zp
