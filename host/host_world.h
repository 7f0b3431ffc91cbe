// The host backend's meeting place: thread-ranks of one process that called zpCommInitRank with the same
// unique id share one HostWorld. It offers what the host collectives need and nothing more: a barrier that
// can be aborted and times out, and a slot per rank to publish a pointer that peers read between barriers.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "include/zpccl.h"

namespace zp {

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

  // Waits for every rank (bounded by ZP_HOST_TIMEOUT_MS); zpRemoteError if the world was aborted or timed out.
  zpResult_t barrier(const char* call);

  // Wakes every waiter; their calls and all later ones fail with zpRemoteError.
  void abort();
  bool aborted() const { return aborted_.load(); }

 private:
  zpResult_t wait(const char* call, int64_t timeoutMs);

  const int nranks_;
  std::vector<const void*> slots_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::atomic<bool> aborted_{false};
  std::vector<bool> joined_;
  int joinedCount_ = 0;
};

}  // namespace zp
