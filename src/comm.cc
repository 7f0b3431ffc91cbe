#include "src/comm.h"

#include <condition_variable>
#include <unordered_set>

namespace zp {

namespace {
std::mutex gRegistryMutex;
std::unordered_set<const zpComm*>& registry() {
  static auto* live = new std::unordered_set<const zpComm*>();  // never destroyed: safe in atexit paths
  return *live;
}
bool liveLocked(const zpComm* comm) {
  return comm != nullptr && registry().count(comm) != 0 && comm->magic == kCommMagic;
}
}  // namespace

void registerComm(zpComm* comm) {
  std::lock_guard<std::mutex> lock(gRegistryMutex);
  registry().insert(comm);
}

bool unregisterComm(zpComm* comm) {
  std::lock_guard<std::mutex> lock(gRegistryMutex);
  if (!liveLocked(comm)) return false;
  registry().erase(comm);
  comm->magic = kCommDeadMagic;
  return true;
}

bool isLiveComm(const zpComm* comm) {
  std::lock_guard<std::mutex> lock(gRegistryMutex);
  return liveLocked(comm);
}

bool storeLastError(zpComm* comm, const std::string& message) {
  std::lock_guard<std::mutex> lock(gRegistryMutex);
  if (!liveLocked(comm)) return false;
  std::lock_guard<std::mutex> errorLock(comm->errorMutex);
  comm->lastError = message;
  return true;
}

bool copyLastError(zpComm* comm, std::string* message) {
  std::lock_guard<std::mutex> lock(gRegistryMutex);
  if (!liveLocked(comm)) return false;
  std::lock_guard<std::mutex> errorLock(comm->errorMutex);
  *message = comm->lastError;
  return true;
}

CommUse::CommUse(zpComm* comm) : comm_(nullptr) {
  std::lock_guard<std::mutex> lock(gRegistryMutex);
  if (liveLocked(comm)) {
    comm_ = comm;
    comm_->users++;
  }
}

CommUse::~CommUse() {
  if (comm_ == nullptr) return;
  std::lock_guard<std::mutex> lock(gRegistryMutex);
  if (--comm_->users == 0) comm_->usersDone.notify_all();
}

void waitUnused(zpComm* comm) {
  std::unique_lock<std::mutex> lock(gRegistryMutex);
  comm->usersDone.wait(lock, [comm] { return comm->users == 0; });
}

}  // namespace zp
