#include "host/host_world.h"

#include <chrono>
#include <map>
#include <string>

#include "src/check.h"
#include "src/params.h"

namespace zp {

namespace {
std::mutex gWorldsMutex;
// Worlds still gathering their ranks, by unique id. A world leaves the map once complete, so an id can be
// reused for a later communicator.
std::map<std::string, std::shared_ptr<HostWorld>>& pendingWorlds() {
  static auto* worlds = new std::map<std::string, std::shared_ptr<HostWorld>>();
  return *worlds;
}
}  // namespace

HostWorld::HostWorld(int nranks) : nranks_(nranks), slots_(nranks, nullptr), joined_(nranks, false) {}

zpResult_t HostWorld::join(const zpUniqueId& id, int nranks, int rank, const char* call,
                           std::shared_ptr<HostWorld>* world) {
  const std::string key(id.internal, sizeof(id.internal));
  std::shared_ptr<HostWorld> w;
  {
    std::lock_guard<std::mutex> lock(gWorldsMutex);
    auto& worlds = pendingWorlds();
    auto it = worlds.find(key);
    if (it == worlds.end()) it = worlds.emplace(key, std::make_shared<HostWorld>(nranks)).first;
    w = it->second;
    if (w->nranks_ != nranks) {
      return ZP_ERR(zpInvalidUsage, "%s : nranks %d differs from the %d given by another rank with this unique id",
                    call, nranks, w->nranks_);
    }
    std::lock_guard<std::mutex> worldLock(w->mutex_);
    if (w->joined_[rank]) {
      return ZP_ERR(zpInvalidUsage, "%s : rank %d already joined with this unique id", call, rank);
    }
    w->joined_[rank] = true;
    if (++w->joinedCount_ == nranks) worlds.erase(it);
  }
  zpResult_t res = w->wait(call, paramInitTimeoutMs());
  if (res != zpSuccess) {
    // Give the slot back so that a retry with the same id can succeed once the missing ranks arrive.
    std::lock_guard<std::mutex> lock(gWorldsMutex);
    std::lock_guard<std::mutex> worldLock(w->mutex_);
    w->joined_[rank] = false;
    w->joinedCount_--;
    w->arrived_--;
    return ZP_ERR(zpSystemError, "%s : not all %d ranks joined the host backend within ZP_INIT_TIMEOUT_MS=%lld ms",
                  call, nranks, static_cast<long long>(paramInitTimeoutMs()));
  }
  *world = std::move(w);
  return zpSuccess;
}

zpResult_t HostWorld::wait(const char* call, int64_t timeoutMs) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (aborted_) return ZP_ERR(zpRemoteError, "%s : the communicator was aborted", call);
  const uint64_t myGeneration = generation_;
  if (++arrived_ == nranks_) {
    arrived_ = 0;
    generation_++;
    cv_.notify_all();
    return zpSuccess;
  }
  const bool done =
      cv_.wait_for(lock, std::chrono::milliseconds(timeoutMs), [&] { return generation_ != myGeneration || aborted_; });
  if (generation_ != myGeneration) return zpSuccess;
  if (aborted_) return ZP_ERR(zpRemoteError, "%s : the communicator was aborted while waiting for peers", call);
  (void)done;
  return ZP_ERR(zpRemoteError, "%s : peers did not arrive within %lld ms", call, static_cast<long long>(timeoutMs));
}

zpResult_t HostWorld::exchange(int rank, const void* mine, const char* call) {
  slots_[rank] = mine;  // ordered before the peers' reads by the barrier's mutex
  return barrier(call);
}

zpResult_t HostWorld::barrier(const char* call) {
  zpResult_t res = wait(call, paramHostTimeoutMs());
  // A rank that gave up has left the count inconsistent: nobody can rely on this world any more.
  if (res != zpSuccess) abort();
  return res;
}

void HostWorld::abort() {
  std::lock_guard<std::mutex> lock(mutex_);
  aborted_ = true;
  cv_.notify_all();
}

}  // namespace zp
