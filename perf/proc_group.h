// The processes of one perf run and the little they exchange: unique ids, host names, per-size results.
// Three kinds: a lone process; processes meeting through files in a shared directory (-P/-I/-D, for runs
// without a usable mpirun, e.g. two processes with distinct NCCL_HOSTID emulating two nodes); and MPI ranks
// (built with ZP_PERF_MPI, launched by mpirun).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace zp {
namespace perf {

class ProcGroup {
 public:
  virtual ~ProcGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* kind() const = 0;
  // Every process passes `bytes` bytes; all[p * bytes ...] receives process p's. Called by all processes in
  // the same order, by one thread per process. False (with *error) on timeout, I/O error or size mismatch.
  virtual bool allGather(const void* mine, size_t bytes, void* all, std::string* error) = 0;
  // Ends the whole run at once (MPI_Abort under MPI), e.g. after a failed collective left peers waiting.
  [[noreturn]] virtual void abort(int code);

  // root's bytes to everyone (by default through allGather; MPI_Bcast under MPI).
  virtual bool broadcast(void* data, size_t bytes, int root, std::string* error);
  bool barrier(std::string* error);
};

std::unique_ptr<ProcGroup> makeSingleProcGroup();

// Files named after the exchange number in `dir`: each process writes its part to a temporary name and
// renames it (atomic), the others poll until every part is there or timeoutSeconds pass. The first exchange
// fixes a session number (process 0's random nonce) that names every later file, so files left by an earlier
// run in the same directory are never mistaken for this run's; still, give each run a fresh directory.
std::unique_ptr<ProcGroup> makeFileProcGroup(const std::string& dir, int nprocs, int index, double timeoutSeconds,
                                             std::string* error);

// True when this binary was built with MPI and this process was started by an MPI launcher (checked through
// the launcher's environment variables, so that a plain run never initializes MPI).
bool launchedByMpi();
// MPI_Init_thread (serialized: one thread per process talks to MPI at a time). Null with *error on failure.
std::unique_ptr<ProcGroup> makeMpiProcGroup(int* argc, char*** argv, std::string* error);

// Seconds a file rendezvous waits: $ZP_PERF_RENDEZVOUS_TIMEOUT, default 600.
double rendezvousTimeoutSeconds();

}  // namespace perf
}  // namespace zp
