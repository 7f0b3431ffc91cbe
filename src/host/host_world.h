// The host backend's meeting place: thread-ranks of one process that called zpCommInitRank with the same
// unique id share one HostWorld. It offers what the host collectives need and nothing more: a barrier that
// can be aborted and times out, and a slot per rank to publish a pointer that peers read between barriers.
//
// What a rank publishes (its scratch memory, or the caller's send buffer) must outlive every peer's read of it,
// also when the call fails: a rank that gave up waiting, or whose communicator is being aborted, may leave while
// a slower peer still copies from its memory. So the world counts the ranks that read the slots (from the
// exchange that published them until each reader says it is done), and a failed call waits for that count to
// reach zero before it returns and lets its memory go (waitForReaders). Readers only copy and compute, never
// wait, so that wait is short, and a peer that is gone is not a reader.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "host/base/backend.h"
#include "host/rank_init.h"
#include "include/zpccl.h"

namespace zp {

// What every rank must have passed to a collective before any rank reads a peer's data: a rank that called
// another collective, or passed another count, type, op, bits or block size, would read its peers' buffers
// with the wrong sizes. Fields the collective ignores are left 0, so ranks compare field by field.
struct CallSignature {
  const char* call = nullptr;  // the ABI call, a string literal: peers name it in their messages
  CollKind kind = CollKind::kQuantize;
  size_t count = 0;
  int type = 0;       // zpDataType_t
  int op = 0;         // zpRedOp_t, the reductions only
  int bits = 0;       // resolved (per-call option or config); 0 for exact hpZ
  int blockSize = 0;  // resolved; 0 where bits is 0
};

// The first field in which rank r's signature b differs from rank 0's a, as "<field>: rank 0 ... X, rank r ... Y";
// empty when they agree. The kind comes first: the other fields only mean the same for one collective.
std::string callDisagreement(const CallSignature& a, const CallSignature& b, int r);

// How long a world's waits last, in milliseconds (kMaxWaitMs: as good as forever).
struct WorldTimeouts {
  int64_t initMs;  // for all ranks to join (ZP_INIT_TIMEOUT_MS)
  int64_t hostMs;  // at each barrier of a collective (ZP_HOST_TIMEOUT_MS)
  static WorldTimeouts fromParams();
};

class HostWorld {
 public:
  HostWorld(int nranks, const WorldTimeouts& timeouts);

  // Joins the world keyed by id as `rank` with its RankInit, creating the world if this rank is the first, and
  // waits until all nranks ranks have joined (bounded by timeouts.initMs, the first joiner's). A rank that gives
  // up leaves as if it had never come, in one step that no arriving rank can see halfway; the world is dropped
  // once no rank waits in it. A caller with another nranks, or a rank that already joined, is refused with
  // zpInvalidUsage, and so are the ranks waiting in the world, at once. A world holds no per-rank memory until every
  // rank has joined, so a huge nranks costs nothing until that many ranks exist.
  static zpResult_t join(const zpUniqueId& id, int nranks, int rank, const RankInit& mine, const char* call,
                         const WorldTimeouts& timeouts, std::shared_ptr<HostWorld>* world);
  // Worlds still gathering their ranks (for tests: failed inits must not leave theirs behind).
  static size_t pendingCount();

  int size() const { return nranks_; }
  // Every rank's RankInit, in rank order, once join succeeded.
  const std::vector<RankInit>& inits() const { return inits_; }

  // Publishes `mine` in this rank's slot, then waits for every rank to do the same. On success every rank reads
  // the slots (slot(r) is rank r's pointer, and what it points to must stay valid and unchanged) until it calls
  // endReads.
  zpResult_t exchange(int rank, const void* mine, const char* call);
  const void* slot(int rank) const { return slots_[rank]; }
  // This rank no longer reads the slots. Idempotent.
  void endReads(int rank);

  // exchange() for a collective: also publishes sig and, after the barrier, compares every rank's signature
  // with rank 0's. On a difference every rank sees the same one, so all of them end their reads, pass one more
  // barrier (no rank may publish its next call's signature while a peer still reads this one) and return
  // zpInvalidUsage naming the first differing field and both values; the world stays usable. On success, as
  // exchange().
  zpResult_t exchangeAgreed(int rank, const void* mine, const CallSignature& sig);

  // Waits for every rank (bounded by ZP_HOST_TIMEOUT_MS). zpRemoteError if the world failed, or when this rank
  // gives up waiting: the world then fails, naming the ranks that did not come.
  zpResult_t barrier(int rank, const char* call);

  // After a failed call, before what this rank published may be freed or handed back to its caller: waits
  // until no rank reads the slots.
  void waitForReaders();

  // Fails the world: every waiter wakes, and its calls and all later ones return zpRemoteError naming `why`
  // (the first failure is kept).
  void fail(const std::string& why);
  // fail() for zpCommAbort on `rank`.
  void abort(int rank);
  bool failed() const { return failed_.load(); }
  // Why the world failed ("" while it has not).
  std::string failure() const;

  // Init's last step: every rank publishes whether its init succeeded; all return the verdict of the lowest
  // failing rank (its own when it failed), so that they leave init alike.
  zpResult_t agreeOnInit(int rank, zpResult_t mine, const std::string& message, const char* call);

 private:
  zpResult_t wait(int rank, const char* call, bool reads);
  zpResult_t failedError(const char* call) const;  // under mutex_
  void failLocked(const std::string& why);
  zpResult_t complete(const char* call);  // by the last rank to join
  // Refuses the ranks waiting to join (under mutex_, the world out of the pending map): they return zpInvalidUsage
  // naming `why`.
  void refuseLocked(const std::string& why);

  const int nranks_;
  const WorldTimeouts timeouts_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  // Until every rank has joined (under mutex_): who has, with what.
  std::map<int, RankInit> joined_;
  bool completing_ = false;  // the last rank joined and sets up the per-rank state
  bool complete_ = false;    // done: every rank may go on
  std::string refused_;      // why callers with this id cannot form a world ("" unless refused)
  // Per-rank state, from completion on.
  std::vector<RankInit> inits_;
  std::vector<const void*> slots_;
  std::vector<CallSignature> signatures_;  // published beside slots_, under the same rules
  std::vector<zpResult_t> verdicts_;       // agreeOnInit's, the same way
  std::vector<std::string> verdictMessages_;
  std::vector<uint64_t> arrivedIn_;  // the barrier generation (+1) each rank last arrived in; under mutex_
  std::vector<char> reading_;        // under mutex_
  int readers_ = 0;                  // ranks with reading_ set
  std::condition_variable readersDone_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::atomic<bool> failed_{false};
  std::string failure_;  // under mutex_
};

}  // namespace zp
