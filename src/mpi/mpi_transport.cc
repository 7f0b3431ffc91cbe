// libzpccl_mpi.so: the host backend's transport over MPI (include/zpccl_mpi.h), written against zpccl.h's public
// transport interface only. Each callback is one nonblocking MPI collective on a duplicate of the caller's
// communicator (MPI_Iallgather, MPI_Ialltoallv), polled until it completes or call->timeoutMs passes: MPI has no
// timeouts of its own, and zpccl's guarantee that a missing peer ends in an error needs one.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "include/zpccl_mpi.h"

#define ZP_MPI_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

struct MpiContext {
  MPI_Comm comm = MPI_COMM_NULL;
  int nranks = 0;
  // Per-call arrays of MPI_Ialltoallv, in units of the call's datatype.
  std::vector<int> sendCounts, sendDispls, recvCounts, recvDispls;
};

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
      // The operation cannot be cancelled: it stays with MPI, and zpccl never frees its buffers.
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
  const size_t unit = unitOf({bytes});
  if (unit == 0) {
    snprintf(call->error, sizeof(call->error), "MPI_Iallgather: %zu bytes a rank is more than MPI can count", bytes);
    return 1;
  }
  MPI_Datatype type = typeOf(unit);
  MPI_Request request;
  const int n = static_cast<int>(bytes / unit);
  int rc = MPI_Iallgather(sendbuf, n, type, recvbuf, n, type, c->comm, &request);
  if (type != MPI_BYTE) MPI_Type_free(&type);
  if (rc != MPI_SUCCESS) {
    describe(rc, call->error, sizeof(call->error), "MPI_Iallgather");
    return 1;
  }
  rc = await(&request, call->timeoutMs, call, "MPI_Iallgather");
  if (rc == 0) call->received = bytes * static_cast<size_t>(c->nranks);
  return rc;
}

int allToAll(void* context, const void* sendbuf, const size_t* sendCounts, const size_t* sendOffsets, void* recvbuf,
             const size_t* recvCounts, const size_t* recvOffsets, zpTransportCall_t* call) {
  auto* c = static_cast<MpiContext*>(context);
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
  size_t received = 0;
  for (int r = 0; r < n; ++r) {
    c->sendCounts[r] = static_cast<int>(sendCounts[r] / unit);
    c->sendDispls[r] = static_cast<int>(sendOffsets[r] / unit);
    c->recvCounts[r] = static_cast<int>(recvCounts[r] / unit);
    c->recvDispls[r] = static_cast<int>(recvOffsets[r] / unit);
    received += recvCounts[r];
  }
  MPI_Datatype type = typeOf(unit);
  MPI_Request request;
  int rc = MPI_Ialltoallv(sendbuf, c->sendCounts.data(), c->sendDispls.data(), type, recvbuf, c->recvCounts.data(),
                          c->recvDispls.data(), type, c->comm, &request);
  if (type != MPI_BYTE) MPI_Type_free(&type);
  if (rc != MPI_SUCCESS) {
    describe(rc, call->error, sizeof(call->error), "MPI_Ialltoallv");
    return 1;
  }
  rc = await(&request, call->timeoutMs, call, "MPI_Ialltoallv");
  if (rc == 0) call->received = received;
  return rc;
}

void release(void* context) {
  auto* c = static_cast<MpiContext*>(context);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && c->comm != MPI_COMM_NULL) MPI_Comm_free(&c->comm);
  delete c;
}

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
  c->sendCounts.resize(c->nranks);
  c->sendDispls.resize(c->nranks);
  c->recvCounts.resize(c->nranks);
  c->recvDispls.resize(c->nranks);
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
  release(transport->context);
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
