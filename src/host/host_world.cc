#include "src/host/host_world.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "host/base/check.h"
#include "host/base/params.h"
#include "host/dtype.h"

namespace zp {

namespace {
std::mutex gWorldsMutex;
// Worlds still gathering their ranks, by unique id. A world leaves the map once complete (so an id can be reused
// for a later communicator), or once the last rank waiting in it gave up.
std::map<std::string, std::shared_ptr<HostWorld>>& pendingWorlds() {
  static auto* worlds = new std::map<std::string, std::shared_ptr<HostWorld>>();
  return *worlds;
}

// The ranks of `sorted` (ascending, distinct) as ranges, "0-2,5,7-9", at most a few dozen ("..." after); with
// `complement`, the ranks of [0, nranks) that are not in it. Linear in sorted.size(), whatever nranks is.
std::string rankList(const std::vector<int>& sorted, int nranks, bool complement) {
  std::vector<std::pair<int, int>> ranges;  // [first, last]
  for (int r : sorted) {
    if (!ranges.empty() && ranges.back().second + 1 == r) {
      ranges.back().second = r;
    } else {
      ranges.emplace_back(r, r);
    }
  }
  if (complement) {
    std::vector<std::pair<int, int>> gaps;
    int next = 0;
    for (const auto& range : ranges) {
      if (range.first > next) gaps.emplace_back(next, range.first - 1);
      next = range.second + 1;
    }
    if (next < nranks) gaps.emplace_back(next, nranks - 1);
    ranges.swap(gaps);
  }
  std::string out;
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (i == 32) return out + ",...";
    out += (i ? "," : "") + std::to_string(ranges[i].first);
    if (ranges[i].second > ranges[i].first) out += "-" + std::to_string(ranges[i].second);
  }
  return out.empty() ? "none" : out;
}

std::chrono::milliseconds millis(int64_t ms) { return std::chrono::milliseconds(ms); }
}  // namespace

std::string callDisagreement(const CallSignature& a, const CallSignature& b, int r) {
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
    // As the ABI names it.
    const char* name = a.kind == CollKind::kQuantReduceScatter ? "recvcount"
                       : a.kind == CollKind::kQuantAllReduce   ? "count"
                                                               : "sendcount";
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

WorldTimeouts WorldTimeouts::fromParams() { return WorldTimeouts{paramInitTimeoutMs(), paramHostTimeoutMs()}; }

HostWorld::HostWorld(int nranks, const WorldTimeouts& timeouts) : nranks_(nranks), timeouts_(timeouts) {}

zpResult_t HostWorld::join(const zpUniqueId& id, int nranks, int rank, const RankInit& mine, const char* call,
                           const WorldTimeouts& timeouts, std::shared_ptr<HostWorld>* world) {
  const std::string key(id.internal, sizeof(id.internal));
  std::shared_ptr<HostWorld> w;
  bool last = false;
  {
    std::lock_guard<std::mutex> lock(gWorldsMutex);
    auto& worlds = pendingWorlds();
    auto it = worlds.find(key);
    if (it == worlds.end()) it = worlds.emplace(key, std::make_shared<HostWorld>(nranks, timeouts)).first;
    w = it->second;
    std::lock_guard<std::mutex> worldLock(w->mutex_);
    // Callers that cannot form one communicator: this one is refused, and so are the ranks waiting in the world
    // (they leave at once instead of waiting out ZP_INIT_TIMEOUT_MS); the id is free again for a later init.
    if (w->nranks_ != nranks) {
      w->refuseLocked("nranks " + std::to_string(w->nranks_) + " differs from the " + std::to_string(nranks) +
                      " of rank " + std::to_string(rank) + ", which came with the same unique id");
      worlds.erase(it);
      return ZP_ERR(zpInvalidUsage, "%s : nranks %d differs from the %d given by another rank with this unique id",
                    call, nranks, w->nranks_);
    }
    if (w->joined_.count(rank) != 0) {
      w->refuseLocked("a second caller joined as rank " + std::to_string(rank) + " with the same unique id");
      worlds.erase(it);
      return ZP_ERR(zpInvalidUsage, "%s : rank %d already joined with this unique id", call, rank);
    }
    w->joined_.emplace(rank, mine);
    if (static_cast<int>(w->joined_.size()) == nranks) {
      worlds.erase(it);
      w->completing_ = true;  // from here on no rank gives up: the world is complete
      last = true;
    }
  }
  if (last) {
    ZPCHECK(w->complete(call));
    *world = std::move(w);
    return zpSuccess;
  }
  std::unique_lock<std::mutex> lock(w->mutex_);
  if (w->cv_.wait_for(lock, millis(w->timeouts_.initMs), [&] { return w->completing_ || !w->refused_.empty(); })) {
    if (!w->refused_.empty()) return ZP_ERR(zpInvalidUsage, "%s : %s", call, w->refused_.c_str());
    w->cv_.wait(lock, [&] { return w->complete_; });
    if (w->failed_) return w->failedError(call);
    lock.unlock();
    *world = std::move(w);
    return zpSuccess;
  }
  // Gave up, under the world's lock: the last rank to join either sees this rank gone or finds the world
  // complete, never a world that counts a rank which has left.
  std::vector<int> present;
  for (const auto& joined : w->joined_) present.push_back(joined.first);
  const std::string joined = rankList(present, nranks, false);
  const std::string missing = rankList(present, nranks, true);
  const size_t count = w->joined_.size();
  w->joined_.erase(rank);
  const bool others = !w->joined_.empty();
  lock.unlock();
  if (!others) {  // nobody waits in it any more: drop it, unless a rank has joined meanwhile
    std::lock_guard<std::mutex> global(gWorldsMutex);
    std::lock_guard<std::mutex> worldLock(w->mutex_);
    auto& worlds = pendingWorlds();
    auto it = worlds.find(key);
    if (it != worlds.end() && it->second == w && w->joined_.empty()) worlds.erase(it);
  }
  return ZP_ERR(zpSystemError,
                "%s : only %zu of %d ranks joined within ZP_INIT_TIMEOUT_MS=%lld ms (joined: %s; missing: %s): every "
                "rank must call it with the same unique id and nranks",
                call, count, nranks, static_cast<long long>(w->timeouts_.initMs), joined.c_str(), missing.c_str());
}

size_t HostWorld::pendingCount() {
  std::lock_guard<std::mutex> lock(gWorldsMutex);
  return pendingWorlds().size();
}

zpResult_t HostWorld::complete(const char* call) {
  std::unique_lock<std::mutex> lock(mutex_);
  bool allocated = true;
  try {
    inits_.reserve(nranks_);
    for (const auto& joined : joined_) inits_.push_back(joined.second);  // in rank order: the map's
    slots_.assign(nranks_, nullptr);
    signatures_.resize(nranks_);
    verdicts_.assign(nranks_, zpSuccess);
    verdictMessages_.resize(nranks_);
    arrivedIn_.assign(nranks_, 0);
    reading_.assign(nranks_, 0);
  } catch (const std::bad_alloc&) {
    allocated = false;
    failLocked("failed: out of host memory for its per-rank state");
  }
  joined_.clear();
  complete_ = true;
  cv_.notify_all();
  if (!allocated) return ZP_ERR(zpSystemError, "%s : out of host memory for the state of %d ranks", call, nranks_);
  return zpSuccess;
}

void HostWorld::refuseLocked(const std::string& why) {
  refused_ = why;
  cv_.notify_all();
}

zpResult_t HostWorld::failedError(const char* call) const {
  return ZP_ERR(zpRemoteError, "%s : the communicator %s", call, failure_.c_str());
}

void HostWorld::failLocked(const std::string& why) {
  if (!failed_) {
    failure_ = why;
    failed_ = true;
  }
  cv_.notify_all();
}

void HostWorld::fail(const std::string& why) {
  std::lock_guard<std::mutex> lock(mutex_);
  failLocked(why);
}

void HostWorld::abort(int rank) { fail("was aborted (zpCommAbort on rank " + std::to_string(rank) + ")"); }

std::string HostWorld::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

zpResult_t HostWorld::wait(int rank, const char* call, bool reads) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (failed_) return failedError(call);
  const uint64_t generation = generation_;
  arrivedIn_[rank] = generation + 1;
  if (++arrived_ == nranks_) {
    arrived_ = 0;
    generation_++;
    if (reads) {  // every rank is here, done with any earlier reads: all of them read now
      std::fill(reading_.begin(), reading_.end(), 1);
      readers_ = nranks_;
    }
    cv_.notify_all();
    return zpSuccess;
  }
  cv_.wait_for(lock, millis(timeouts_.hostMs), [&] { return generation_ != generation || failed_; });
  if (generation_ != generation) return zpSuccess;
  // Leaves as if it had never arrived: no later arrival can complete this barrier with it counted.
  arrived_--;
  arrivedIn_[rank] = 0;
  if (failed_) return failedError(call);
  std::vector<int> arrived{rank};  // this rank counts as arrived: the list is of the others
  for (int r = 0; r < nranks_; ++r) {
    if (r != rank && arrivedIn_[r] == generation + 1) arrived.push_back(r);
  }
  std::sort(arrived.begin(), arrived.end());
  const std::string missing = rankList(arrived, nranks_, true);
  const long long ms = static_cast<long long>(timeouts_.hostMs);
  failLocked("failed: rank " + std::to_string(rank) + " gave up waiting in " + call + " for ranks " + missing +
             ", which did not arrive within ZP_HOST_TIMEOUT_MS=" + std::to_string(ms) + " ms");
  return ZP_ERR(zpRemoteError,
                "%s : ranks %s did not arrive within ZP_HOST_TIMEOUT_MS=%lld ms; the communicator failed: abort or "
                "destroy it",
                call, missing.c_str(), ms);
}

zpResult_t HostWorld::exchange(int rank, const void* mine, const char* call) {
  slots_[rank] = mine;  // ordered before the peers' reads by the barrier's mutex
  return wait(rank, call, true);
}

void HostWorld::endReads(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (reading_.empty() || !reading_[rank]) return;
  reading_[rank] = 0;
  if (--readers_ == 0) readersDone_.notify_all();
}

void HostWorld::waitForReaders() {
  std::unique_lock<std::mutex> lock(mutex_);
  readersDone_.wait(lock, [&] { return readers_ == 0; });
}

zpResult_t HostWorld::exchangeAgreed(int rank, const void* mine, const CallSignature& sig) {
  signatures_[rank] = sig;  // ordered before the peers' reads by the barrier's mutex, as the slot
  ZPCHECK(exchange(rank, mine, sig.call));
  for (int r = 1; r < nranks_; ++r) {
    const std::string why = callDisagreement(signatures_[0], signatures_[r], r);
    if (why.empty()) continue;
    // Every rank compares the same signatures, so every rank is here, for the same r: leave together.
    endReads(rank);
    ZPCHECK(barrier(rank, sig.call));
    return ZP_ERR(zpInvalidUsage, "%s : ranks disagree on %s", sig.call, why.c_str());
  }
  return zpSuccess;
}

zpResult_t HostWorld::barrier(int rank, const char* call) { return wait(rank, call, false); }

zpResult_t HostWorld::agreeOnInit(int rank, zpResult_t mine, const std::string& message, const char* call) {
  verdicts_[rank] = mine;  // ordered before the peers' reads by the barrier's mutex
  verdictMessages_[rank] = message;
  ZPCHECK(barrier(rank, call));
  if (mine != zpSuccess) return mine;  // its own message is the pending one
  for (int r = 0; r < nranks_; ++r) {
    if (verdicts_[r] != zpSuccess) {
      return ZP_ERR(verdicts_[r], "%s : rank %d could not create its communicator (%s)", call, r,
                    verdictMessages_[r].c_str());
    }
  }
  return zpSuccess;
}

}  // namespace zp
