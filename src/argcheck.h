// Every argument check of the ABI, in one place. Each failure returns zpInvalidArgument (a bad value) or
// zpInvalidUsage (a valid value the call cannot serve here), with a message "<call> : <argument> ...".
#pragma once

#include "host/base/backend.h"
#include "host/base/check.h"
#include "include/zpccl.h"
#include "src/comm.h"

namespace zp {

// comm must be a live communicator's handle (not NULL, not destroyed, not garbage).
zpResult_t checkComm(zpComm_t comm, const char* call);
zpResult_t checkNotNullComm(zpComm_t comm, const char* call);
// Runs fn(Communicator*) (returning zpResult_t) as a call on the handle's communicator: refused unless the handle
// is live, and marked in use meanwhile, so that a zpCommAbort or zpCommDestroy from another thread waits for it
// instead of freeing the communicator under it.
template <typename Fn>
zpResult_t whileInUse(zpComm_t comm, const char* call, Fn&& fn) {
  ZPCHECK(checkNotNullComm(comm, call));
  CommUse use(comm);
  if (use.get() == nullptr) return checkComm(comm, call);  // says why
  return fn(use.get());
}
// The call that this thread is inside on the handle's communicator (whileExclusive), or nullptr. A transport's
// callback runs inside one, on the calling thread: what it calls on the same communicator must not wait for that call.
const char* callInsideOn(zpComm_t comm);
// Marks this thread as inside `call` on `comm` for the object's life.
class InsideCall {
 public:
  InsideCall(zpComm_t comm, const char* call);
  ~InsideCall();
  InsideCall(const InsideCall&) = delete;
  InsideCall& operator=(const InsideCall&) = delete;
};
// whileInUse for a call that runs on the communicator (a collective, zpQuantize, zpCommReserve): as its only such call.
// Two would share its scratch memory and exchanges, so one communicator serves one thread at a time
// (include/zpccl.h); a call that finds another thread's running is refused with zpInvalidUsage and runs nothing, and
// so is one made from inside the communicator's own call (a transport callback).
template <typename Fn>
zpResult_t whileExclusive(zpComm_t comm, const char* call, Fn&& fn) {
  return whileInUse(comm, call, [&](Communicator* c) -> zpResult_t {
    if (const char* outer = callInsideOn(comm)) {
      return ZP_ERR(zpInvalidUsage,
                    "%s : called from inside %s on this communicator (from its transport's callback), which a "
                    "callback may not do: make the call after %s returns",
                    call, outer, outer);
    }
    const char* running = nullptr;
    if (!c->activeCall.compare_exchange_strong(running, call)) {
      return ZP_ERR(zpInvalidUsage,
                    "%s : another thread is in %s on this communicator, which serves one thread at a time: use one "
                    "communicator per thread, or take turns",
                    call, running);
    }
    struct Release {
      Communicator* comm;
      ~Release() { comm->activeCall.store(nullptr); }
    } release{c};
    InsideCall inside(comm, call);
    return fn(c);
  });
}
zpResult_t checkNotNull(const void* ptr, const char* call, const char* arg);
zpResult_t checkInitArgs(const zpComm_t* comm, int nranks, int rank, const char* call);
// A caller's transport (zpCommInitFromTransport): its header, its ranks and its callbacks.
zpResult_t checkTransport(const zpTransport_t* transport, const char* call);
// Validates config (NULL means defaults) and resolves every default. nranks is for ranksPerNode (0: not known yet,
// ranksPerNode is then not checked against it).
zpResult_t resolveConfig(const zpConfig_t* config, int nranks, const char* call, Settings* settings);
zpResult_t checkBits(int bits, const char* call, const char* arg);
zpResult_t checkBlockSize(int blockSize, const char* call, const char* arg);
zpResult_t checkRounding(int rounding, const char* call, const char* arg);
// Resolves bits and block size from comm and an optional per-call override, then checks a whole request:
// type, op, counts (no size_t overflow of any derived size), buffers (usable by the backend, aligned, not
// overlapping except in NCCL's in-place layout), stream, and that the layout can serve the collective.
zpResult_t checkCollArgs(Communicator* comm, const zpQuantOptions_t* options, CollArgs* args);
// The header of zpGradOptions_t (zpQuantReduceScatterA2AEx2's, zpQuantAllReduceEx's; NULL: none), and their bits and
// block size as the zpQuantOptions_t override that checkCollArgs takes (*quant).
zpResult_t checkGradOptionsHeader(const zpGradOptions_t* options, const char* call, zpQuantOptions_t* quant);
// After checkCollArgs: the rest of the gradient options (rounding, seed, residuals: type, count, buffer, alignment,
// overlap), resolved into args->grad with the communicator's defaults. The sequence number is the caller's.
zpResult_t checkGradArgs(Communicator* comm, const zpGradOptions_t* options, CollArgs* args);

}  // namespace zp
