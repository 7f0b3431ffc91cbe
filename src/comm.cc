#include "src/comm.h"

#include <unordered_map>

namespace zp {

namespace {

// Handles are kHandleTag + serial * kHandleStep: never NULL, never reused (2^52 serials), and far from the
// addresses a process maps, so that a handle mistaken for a pointer faults instead of reading someone's data.
constexpr uintptr_t kHandleTag = uintptr_t{0x7a70} << 48;  // "zp"
constexpr uintptr_t kHandleStep = 16;
static_assert(sizeof(uintptr_t) == 8, "handles are 64-bit serial numbers");

std::mutex gRegistryMutex;
uint64_t gLastSerial = 0;  // under gRegistryMutex
std::unordered_map<uintptr_t, Communicator*>& registry() {
  static auto* live = new std::unordered_map<uintptr_t, Communicator*>();  // never destroyed: safe in atexit paths
  return *live;
}

Communicator* liveLocked(zpComm_t handle) {
  if (handle == nullptr) return nullptr;
  auto it = registry().find(reinterpret_cast<uintptr_t>(handle));
  return it == registry().end() ? nullptr : it->second;
}

}  // namespace

zpComm_t registerComm(std::unique_ptr<Communicator> comm) {
  std::lock_guard<std::mutex> lock(gRegistryMutex);
  const uintptr_t id = kHandleTag + ++gLastSerial * kHandleStep;
  registry().emplace(id, comm.release());
  return reinterpret_cast<zpComm_t>(id);
}

Communicator* unregisterComm(zpComm_t handle) {
  std::lock_guard<std::mutex> lock(gRegistryMutex);
  Communicator* comm = liveLocked(handle);
  if (comm != nullptr) registry().erase(reinterpret_cast<uintptr_t>(handle));
  return comm;
}

bool isLiveComm(zpComm_t handle) {
  std::lock_guard<std::mutex> lock(gRegistryMutex);
  return liveLocked(handle) != nullptr;
}

bool storeLastError(zpComm_t handle, const std::string& message) {
  std::lock_guard<std::mutex> lock(gRegistryMutex);
  Communicator* comm = liveLocked(handle);
  if (comm == nullptr) return false;
  std::lock_guard<std::mutex> errorLock(comm->errorMutex);
  comm->lastError = message;
  return true;
}

bool copyLastError(zpComm_t handle, std::string* message) {
  std::lock_guard<std::mutex> lock(gRegistryMutex);
  Communicator* comm = liveLocked(handle);
  if (comm == nullptr) return false;
  std::lock_guard<std::mutex> errorLock(comm->errorMutex);
  *message = comm->lastError;
  return true;
}

CommUse::CommUse(zpComm_t handle) : comm_(nullptr) {
  std::lock_guard<std::mutex> lock(gRegistryMutex);
  comm_ = liveLocked(handle);
  if (comm_ != nullptr) comm_->users++;
}

CommUse::~CommUse() {
  if (comm_ == nullptr) return;
  std::lock_guard<std::mutex> lock(gRegistryMutex);
  if (--comm_->users == 0) comm_->usersDone.notify_all();
}

void waitUnused(Communicator* comm) {
  std::unique_lock<std::mutex> lock(gRegistryMutex);
  comm->usersDone.wait(lock, [comm] { return comm->users == 0; });
}

}  // namespace zp
