// The communicator behind a zpComm_t handle, and the registry that maps handles to live communicators.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "host/base/backend.h"
#include "host/topology.h"
#include "include/zpccl.h"

namespace zp {

// A config with every default resolved.
struct Settings {
  zpBackend_t backend = zpBackendDefault;
  int ranksPerNode = 0;  // 0: group by node key
  int nodeId = -1;       // -1: host hash
  int hpzSize = 0;       // 0: whole node
  int weightBits = 8;
  int gradBits = 4;
  int blockSize = 256;
  int blocking = 1;
  int gradRounding = -1;  // zpRounding_t; -1 until resolved: ZP_GRAD_ROUNDING
  int gradSeed = -1;      // -1 until resolved: ZP_GRAD_SEED
};

struct Communicator {
  Settings settings;
  Topology topo;
  int cudaDev = -1;
  std::unique_ptr<Backend> backend;
  // qgZ calls that passed their argument checks: the sequence number of stochastic rounding (include/zpccl.h).
  std::atomic<uint32_t> gradSequence{0};
  // The call that holds the communicator (whileExclusive), nullptr when none: one communicator serves one thread at a
  // time.
  std::atomic<const char*> activeCall{nullptr};
  std::mutex errorMutex;
  std::string lastError;
  // Calls running on this communicator: zpCommAbort from another thread waits for them (after waking them)
  // before freeing it.
  int users = 0;
  std::condition_variable usersDone;  // under the registry lock
};

// Live-handle registry. A zpComm_t is not the communicator's address but an id that the registry hands out once
// and never again (a 64-bit serial number behind a tag), so a destroyed handle stays refused whatever the allocator
// does with the freed communicator's memory, and a garbage or forged handle is refused without being dereferenced.

// Takes ownership of comm and returns its new handle.
zpComm_t registerComm(std::unique_ptr<Communicator> comm);
// Ends the handle: later calls refuse it. Returns the communicator (nullptr when the handle was not live), which
// the caller frees once no call uses it (waitUnused).
Communicator* unregisterComm(zpComm_t handle);
bool isLiveComm(zpComm_t handle);
// Under the registry lock (so a concurrent destroy cannot free the communicator meanwhile); false if not live.
bool storeLastError(zpComm_t handle, const std::string& message);
bool copyLastError(zpComm_t handle, std::string* message);

// Marks a call as running on the handle's communicator, if the handle is live, so that a concurrent zpCommAbort
// does not free it under the call; the mark ends with the object.
class CommUse {
 public:
  explicit CommUse(zpComm_t handle);
  ~CommUse();
  CommUse(const CommUse&) = delete;
  CommUse& operator=(const CommUse&) = delete;
  Communicator* get() const { return comm_; }

 private:
  Communicator* comm_;
};

// After unregisterComm: waits until no call runs on comm any more.
void waitUnused(Communicator* comm);

}  // namespace zp
