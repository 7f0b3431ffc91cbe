// The host backend's meeting place: thread-ranks of one process that called zpCommInitRank with the same
// unique id share one HostWorld. It offers what the host collectives need and nothing more: a barrier that
// can be aborted and times out, and a slot per rank to publish a pointer that peers read between barriers.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "include/zpccl.h"
#include "src/backend.h"

namespace zp {

// What every rank must have passed to a collective before any rank reads a peer's data: a rank that called
// another collective, or passed another count, type, op, bits or block size, would read its peers' buffers
// with the wrong sizes. Fields the collective ignores are left 0, so ranks compare field by field.
struct CallSignature {
  const char* call = nullptr;  // the ABI call, a string literal: peers name it in their messages
  CollKind kind = CollKind::kQuantize;
  size_t count = 0;
  int type = 0;       // zpDataType_t
  int op = 0;         // zpRedOp_t, reduce-scatter only
  int bits = 0;       // resolved (per-call option or config); 0 for exact hpZ
  int blockSize = 0;  // resolved; 0 where bits is 0
};

class HostWorld {
 public:
  explicit HostWorld(int nranks);

  // Joins the world keyed by id as `rank`, creating it if this rank is the first, and waits until all nranks
  // ranks have joined (bounded by ZP_INIT_TIMEOUT_MS).
  static zpResult_t join(const zpUniqueId& id, int nranks, int rank, const char* call,
                         std::shared_ptr<HostWorld>* world);

  int size() const { return nranks_; }

  // Publishes `mine` in this rank's slot, then waits for every rank to do the same. Until the next barrier,
  // slot(r) is rank r's published pointer, and what it points to must stay valid and unchanged.
  zpResult_t exchange(int rank, const void* mine, const char* call);
  const void* slot(int rank) const { return slots_[rank]; }

  // exchange() for a collective: also publishes sig and, after the barrier, compares every rank's signature
  // with rank 0's. On a difference every rank sees the same one, so all of them pass one more barrier (no rank
  // may publish its next call's signature while a peer still reads this one) and return zpInvalidUsage naming
  // the first differing field and both values; the world stays usable. On success, as exchange().
  zpResult_t exchangeAgreed(int rank, const void* mine, const CallSignature& sig);

  // Waits for every rank (bounded by ZP_HOST_TIMEOUT_MS); zpRemoteError if the world was aborted or timed out.
  zpResult_t barrier(const char* call);

  // Wakes every waiter; their calls and all later ones fail with zpRemoteError.
  void abort();
  bool aborted() const { return aborted_.load(); }

 private:
  zpResult_t wait(const char* call, int64_t timeoutMs);

  const int nranks_;
  std::vector<const void*> slots_;
  std::vector<CallSignature> signatures_;  // published beside slots_, under the same rules
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::atomic<bool> aborted_{false};
  std::vector<bool> joined_;
  int joinedCount_ = 0;
};

}  // namespace zp
