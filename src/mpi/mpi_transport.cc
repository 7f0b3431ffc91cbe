// libzpccl_mpi.so: the host backend's transport over MPI (include/zpccl_mpi.h), written against zpccl.h's public
// transport interface only. Each callback is one nonblocking MPI collective on a duplicate of the caller's
// communicator (MPI_Iallgather, MPI_Ialltoallv), polled until it completes or call->timeoutMs passes: MPI has no
// timeouts of its own, and zpccl's guarantee that a missing peer ends in an error needs one.
//
// A nonblocking collective cannot be cancelled, and until it completes MPI may use every argument it was given,
// the count and displacement arrays included. An exchange that timed out therefore keeps what it owns (its request
// and its arrays) in its transport's list of pending exchanges, tested at each later callback and freed once MPI says
// it completed; the buffers belong to zpccl, which never frees or reuses those of a failed callback. Later exchanges
// are started as usual: MPI matches a communicator's collectives in the order each rank starts them, so a late peer
// completes the pending ones first, then these.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "host/base/keep_for_good.h"
#include "include/zpccl_mpi.h"

#define ZP_MPI_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

// One exchange's request and what MPI may read through it until it completes.
struct Exchange {
  MPI_Request request = MPI_REQUEST_NULL;
  // MPI_Ialltoallv's arrays, in units of the exchange's datatype: send counts, send displacements, receive counts,
  // receive displacements, nranks each (empty for an all-gather).
  std::vector<int> arrays;
};

struct MpiContext {
  MPI_Comm comm = MPI_COMM_NULL;
  int nranks = 0;
  // Exchanges that timed out, their requests still active.
  std::vector<std::unique_ptr<Exchange>> pending;
  // The exchange the next callback uses: each completed one comes back here, so that a call allocates nothing.
  std::unique_ptr<Exchange> spare;
};

// The exchange a callback starts: the spare one, or a new one after the last went pending.
std::unique_ptr<Exchange> takeExchange(MpiContext* c) {
  return c->spare ? std::move(c->spare) : std::make_unique<Exchange>();
}

// Frees the pending exchanges that MPI completed since they timed out.
void reap(MpiContext* c) {
  std::vector<std::unique_ptr<Exchange>> stillPending, unknown;
  for (auto& x : c->pending) {
    int done = 0;
    if (MPI_Test(&x->request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
      unknown.push_back(std::move(x));
    } else if (!done) {
      stillPending.push_back(std::move(x));
    }
  }
  zp::keepForGood(&unknown);
  c->pending = std::move(stillPending);
}

// After a failed wait: an exchange whose request is still active stays pending; a request that completed in error
// was freed by MPI, and its exchange with it.
void park(MpiContext* c, std::unique_ptr<Exchange> x) {
  if (x->request != MPI_REQUEST_NULL) c->pending.push_back(std::move(x));
}

// "<what>: <MPI's error string>" into out (capacity bytes, cut short if need be).
void describe(int code, char* out, size_t capacity, const char* what) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) snprintf(text, sizeof(text), "MPI error %d", code);
  const std::string message = std::string(what) + ": " + text;
  const size_t n = std::min(message.size(), capacity - 1);
  memcpy(out, message.data(), n);
  out[n] = '\0';
}

// Waits for `request` until it completes or timeoutMs passes (0: for good). MPI_Test drives MPI's progress; the
// sleep between tests grows to a millisecond so that a long wait leaves the processor to the peers.
int await(MPI_Request* request, long long timeoutMs, zpTransportCall_t* call, const char* what) {
  if (timeoutMs <= 0) {
    const int rc = MPI_Wait(request, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) describe(rc, call->error, sizeof(call->error), what);
    return rc == MPI_SUCCESS ? 0 : 1;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
  auto pause = std::chrono::microseconds(5);
  for (;;) {
    int done = 0;
    const int rc = MPI_Test(request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      describe(rc, call->error, sizeof(call->error), what);
      return 1;
    }
    if (done) return 0;
    if (std::chrono::steady_clock::now() >= deadline) {
      // The operation cannot be cancelled: it stays with MPI, its exchange pending (park), and zpccl never frees
      // its buffers.
      snprintf(call->error, sizeof(call->error), "%s did not complete within %lld ms", what, timeoutMs);
      return 1;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

// The largest unit (a power of two up to 4 KiB) dividing every count and offset, so that MPI's int counts cover
// larger exchanges; 0 when some count in units would still not fit an int.
size_t unitOf(const std::vector<size_t>& values) {
  size_t g = 0;
  for (size_t v : values) g = std::gcd(g, v);
  size_t unit = 4096;
  while (unit > 1 && g % unit != 0) unit /= 2;
  for (size_t v : values) {
    if (v / unit > static_cast<size_t>(INT32_MAX)) return 0;
  }
  return unit;
}

// A datatype of `unit` bytes (MPI_BYTE for 1); freed by the caller when it is not MPI_BYTE.
MPI_Datatype typeOf(size_t unit) {
  if (unit == 1) return MPI_BYTE;
  MPI_Datatype t;
  MPI_Type_contiguous(static_cast<int>(unit), MPI_BYTE, &t);
  MPI_Type_commit(&t);
  return t;
}

int allGather(void* context, const void* sendbuf, void* recvbuf, size_t bytes, zpTransportCall_t* call) {
  auto* c = static_cast<MpiContext*>(context);
  if (!c->pending.empty()) reap(c);
  const size_t unit = unitOf({bytes});
  if (unit == 0) {
    snprintf(call->error, sizeof(call->error), "MPI_Iallgather: %zu bytes a rank is more than MPI can count", bytes);
    return 1;
  }
  auto x = takeExchange(c);
  MPI_Datatype type = typeOf(unit);
  const int n = static_cast<int>(bytes / unit);
  int rc = MPI_Iallgather(sendbuf, n, type, recvbuf, n, type, c->comm, &x->request);
  if (type != MPI_BYTE) MPI_Type_free(&type);  // MPI keeps it for the operation
  if (rc != MPI_SUCCESS) {
    describe(rc, call->error, sizeof(call->error), "MPI_Iallgather");
    return 1;
  }
  rc = await(&x->request, call->timeoutMs, call, "MPI_Iallgather");
  if (rc != 0) {
    park(c, std::move(x));
    return rc;
  }
  call->received = bytes * static_cast<size_t>(c->nranks);
  c->spare = std::move(x);
  return 0;
}

int allToAll(void* context, const void* sendbuf, const size_t* sendCounts, const size_t* sendOffsets, void* recvbuf,
             const size_t* recvCounts, const size_t* recvOffsets, zpTransportCall_t* call) {
  auto* c = static_cast<MpiContext*>(context);
  if (!c->pending.empty()) reap(c);
  const int n = c->nranks;
  std::vector<size_t> all;
  all.reserve(4 * n);
  all.insert(all.end(), sendCounts, sendCounts + n);
  all.insert(all.end(), sendOffsets, sendOffsets + n);
  all.insert(all.end(), recvCounts, recvCounts + n);
  all.insert(all.end(), recvOffsets, recvOffsets + n);
  const size_t unit = unitOf(all);
  if (unit == 0) {
    snprintf(call->error, sizeof(call->error), "MPI_Ialltoallv: an exchange larger than MPI can count");
    return 1;
  }
  // The arrays in units, in the order of `all`: each exchange owns its own, for as long as MPI may read them.
  auto x = takeExchange(c);
  x->arrays.resize(all.size());
  for (size_t i = 0; i < all.size(); ++i) x->arrays[i] = static_cast<int>(all[i] / unit);
  const int* units = x->arrays.data();
  size_t received = 0;
  for (int r = 0; r < n; ++r) received += recvCounts[r];
  MPI_Datatype type = typeOf(unit);
  int rc = MPI_Ialltoallv(sendbuf, units, units + n, type, recvbuf, units + 2 * n, units + 3 * n, type, c->comm,
                          &x->request);
  if (type != MPI_BYTE) MPI_Type_free(&type);  // MPI keeps it for the operation
  if (rc != MPI_SUCCESS) {
    describe(rc, call->error, sizeof(call->error), "MPI_Ialltoallv");
    return 1;
  }
  rc = await(&x->request, call->timeoutMs, call, "MPI_Ialltoallv");
  if (rc != 0) {
    park(c, std::move(x));
    return rc;
  }
  call->received = received;
  c->spare = std::move(x);
  return 0;
}

// Frees the transport, never what a pending exchange holds: waiting for one could last for good (its peer may never
// come), so one still pending is kept for the life of the process, and stderr says so once per transport. MPI frees
// the duplicate communicator itself once its pending operations complete.
void releaseAs(void* context, const char* call) {
  auto* c = static_cast<MpiContext*>(context);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    if (!c->pending.empty()) reap(c);
    if (c->comm != MPI_COMM_NULL) MPI_Comm_free(&c->comm);
  }
  if (!c->pending.empty()) {
    fprintf(stderr,
            "zpccl_mpi: %s : %zu exchanges that timed out are still pending in MPI: their memory is kept for the "
            "life of the process\n",
            call, c->pending.size());
    zp::keepForGood(&c->pending);
  }
  delete c;
}

// The transport's finalize callback: zpCommDestroy or zpCommAbort of the communicator that holds it.
void release(void* context) { releaseAs(context, "zpCommDestroy or zpCommAbort"); }

zpResult_t mpiFailed(int code, const char* what) {
  char text[MPI_MAX_ERROR_STRING + 64];
  describe(code, text, sizeof(text), what);
  fprintf(stderr, "zpccl_mpi: %s\n", text);
  return zpSystemError;
}

// A refusal of this library's own: zpGetLastError belongs to libzpccl.so, so the message, "<call> : <why>", goes to
// stderr, as MPI's failures do.
zpResult_t refuse(zpResult_t code, const char* call, const char* why) {
  fprintf(stderr, "zpccl_mpi: %s : %s\n", call, why);
  return code;
}

zpResult_t createTransport(MPI_Comm mpiComm, zpTransport_t* transport, const char* call) {
  if (transport == nullptr) return refuse(zpInvalidArgument, call, "transport is NULL");
  if (mpiComm == MPI_COMM_NULL) return refuse(zpInvalidArgument, call, "mpiComm is MPI_COMM_NULL");
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return refuse(zpInvalidUsage, call, "MPI is not initialized (MPI_Init)");
  auto* c = new (std::nothrow) MpiContext();
  if (c == nullptr) return refuse(zpSystemError, call, "out of host memory");
  int rank = 0, rc = MPI_Comm_dup(mpiComm, &c->comm);
  if (rc != MPI_SUCCESS) {
    delete c;
    return mpiFailed(rc, (std::string(call) + " : MPI_Comm_dup").c_str());
  }
  // Errors come back as codes (the callbacks turn them into zpccl's errors) instead of ending the job.
  MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
  MPI_Comm_size(c->comm, &c->nranks);
  MPI_Comm_rank(c->comm, &rank);
  zpTransport_t t = ZP_TRANSPORT_INITIALIZER;
  t.nranks = c->nranks;
  t.rank = rank;
  t.context = c;
  t.allGather = allGather;
  t.allToAll = allToAll;
  t.finalize = release;
  *transport = t;
  return zpSuccess;
}

}  // namespace

ZP_MPI_EXPORT zpResult_t zpMpiTransportCreate(MPI_Comm mpiComm, zpTransport_t* transport) {
  return createTransport(mpiComm, transport, "zpMpiTransportCreate");
}

ZP_MPI_EXPORT zpResult_t zpMpiTransportFree(zpTransport_t* transport) {
  const char* call = "zpMpiTransportFree";
  if (transport == nullptr) return refuse(zpInvalidArgument, call, "transport is NULL");
  if (transport->finalize != release || transport->context == nullptr) {
    return refuse(zpInvalidArgument, call,
                  "transport holds no context of zpMpiTransportCreate (freed already, or never made by it)");
  }
  releaseAs(transport->context, call);
  transport->context = nullptr;
  return zpSuccess;
}

ZP_MPI_EXPORT zpResult_t zpCommInitFromMpi(zpComm_t* comm, MPI_Comm mpiComm, zpConfig_t* config) {
  const char* call = "zpCommInitFromMpi";
  if (comm == nullptr) return refuse(zpInvalidArgument, call, "comm is NULL");
  *comm = nullptr;
  zpTransport_t t;
  const zpResult_t created = createTransport(mpiComm, &t, call);
  if (created != zpSuccess) return created;
  const zpResult_t res = zpCommInitFromTransport(comm, &t, config);
  if (res != zpSuccess) zpMpiTransportFree(&t);
  return res;
}
