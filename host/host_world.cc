#include "host/host_world.h"

#include <chrono>
#include <cstdio>
#include <map>
#include <string>

#include "host/dtype.h"
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

// The first field in which rank r's signature b differs from rank 0's a, as "<field>: rank 0 ... X, rank r
// ... Y"; empty when they agree. The kind comes first: the other fields only mean the same for one collective.
std::string disagreement(const CallSignature& a, const CallSignature& b, int r) {
  char buf[256];
  auto passed = [&](const char* field, const std::string& x, const std::string& y) {
    snprintf(buf, sizeof(buf), "%s: rank 0 passed %s, rank %d passed %s", field, x.c_str(), r, y.c_str());
    return std::string(buf);
  };
  if (a.kind != b.kind) {
    snprintf(buf, sizeof(buf), "the collective: rank 0 called %s, rank %d called %s", a.call, r, b.call);
    return buf;
  }
  if (a.count != b.count) {
    const char* name = a.kind == CollKind::kQuantReduceScatter ? "recvcount" : "sendcount";  // as the ABI names it
    return passed(name, std::to_string(a.count), std::to_string(b.count));
  }
  if (a.type != b.type) return passed("datatype", typeName(a.type), typeName(b.type));
  if (a.op != b.op) return passed("op", opName(a.op), opName(b.op));
  // bits and blockSize come from options or, when left 0 there, from each rank's config.
  if (a.bits != b.bits) return passed("bits", std::to_string(a.bits), std::to_string(b.bits));
  if (a.blockSize != b.blockSize) {
    return passed("blockSize", std::to_string(a.blockSize), std::to_string(b.blockSize));
  }
  return std::string();
}
}  // namespace

HostWorld::HostWorld(int nranks)
    : nranks_(nranks), slots_(nranks, nullptr), signatures_(nranks), joined_(nranks, false) {}

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

zpResult_t HostWorld::exchangeAgreed(int rank, const void* mine, const CallSignature& sig) {
  signatures_[rank] = sig;  // ordered before the peers' reads by the barrier's mutex, as the slot
  ZPCHECK(exchange(rank, mine, sig.call));
  for (int r = 1; r < nranks_; ++r) {
    const std::string why = disagreement(signatures_[0], signatures_[r], r);
    if (why.empty()) continue;
    // Every rank compares the same signatures, so every rank is here, for the same r: leave together.
    ZPCHECK(barrier(sig.call));
    return ZP_ERR(zpInvalidUsage, "%s : ranks disagree on %s", sig.call, why.c_str());
  }
  return zpSuccess;
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
