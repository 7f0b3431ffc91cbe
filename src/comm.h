// The communicator behind a zpComm_t handle.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "host/topology.h"
#include "include/zpccl.h"
#include "src/backend.h"

namespace zp {

constexpr uint64_t kCommMagic = 0x7a70636f6d6d2121ull;      // "zpcomm!!"
constexpr uint64_t kCommDeadMagic = 0x646561642d636f6dull;  // "dead-com", written at destroy

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
};

}  // namespace zp

struct zpComm {
  uint64_t magic = zp::kCommMagic;
  zp::Settings settings;
  zp::Topology topo;
  int cudaDev = -1;
  std::unique_ptr<zp::Backend> backend;
  std::mutex errorMutex;
  std::string lastError;
  // Calls running on this communicator: zpCommAbort from another thread waits for them (after waking them)
  // before freeing it.
  int users = 0;
  std::condition_variable usersDone;  // under the registry lock
};

namespace zp {

// Live-handle registry: a handle is valid only between registerComm and unregisterComm, so a destroyed or
// garbage handle is refused without being dereferenced.
void registerComm(zpComm* comm);
bool unregisterComm(zpComm* comm);
bool isLiveComm(const zpComm* comm);
// Under the registry lock (so a concurrent destroy cannot free comm meanwhile); false if comm is not live.
bool storeLastError(zpComm* comm, const std::string& message);
bool copyLastError(zpComm* comm, std::string* message);

// Marks a call as running on comm, if comm is live, so that a concurrent zpCommAbort does not free it under the
// call; the mark ends with the object.
class CommUse {
 public:
  explicit CommUse(zpComm* comm);
  ~CommUse();
  CommUse(const CommUse&) = delete;
  CommUse& operator=(const CommUse&) = delete;
  bool held() const { return comm_ != nullptr; }

 private:
  zpComm* comm_;
};

// After unregisterComm: waits until no call runs on comm any more.
void waitUnused(zpComm* comm);

}  // namespace zp
