// A zpTransport_t (include/zpccl.h) among threads of this process, for the tests of the host backend over a caller's
// transport: it copies every byte, as a transport between processes does, honours call->timeoutMs, and lets a test
// make one rank's callbacks fail, return short data, or leave (as a killed process's connections close: its peers'
// callbacks fail at once). It is a test double written against the header alone: the library's own threaded
// transport (src/host/) is not used.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "include/zpccl.h"

namespace zptest {

class LoopbackHub {
 public:
  // A fault of one rank's callbacks, counted from 1 over every callback that rank makes (init's included).
  struct Fault {
    int call = 0;        // which of its callbacks (0: none)
    bool error = false;  // returns an error after its exchange
    size_t shortBy = 0;  // reports this many bytes fewer than it received
    bool leave = false;  // leaves before the exchange: its peers' callbacks fail, its own too
  };

  explicit LoopbackHub(int nranks) : nranks_(nranks), ends_(nranks), posted_(nranks) {
    for (int r = 0; r < nranks; ++r) ends_[r] = End{this, r, Fault(), 0, 0};
  }

  // Rank r's transport; nranks and rank as the hub has them unless a test changes them.
  zpTransport_t transport(int r) {
    zpTransport_t t = ZP_TRANSPORT_INITIALIZER;
    t.nranks = nranks_;
    t.rank = r;
    t.context = &ends_[r];
    t.allGather = &LoopbackHub::allGather;
    t.allToAll = &LoopbackHub::allToAll;
    t.finalize = &LoopbackHub::finalize;
    return t;
  }

  void setFault(int r, const Fault& f) { ends_[r].fault = f; }
  int callbacks(int r) const { return ends_[r].calls; }
  int finalized(int r) const { return ends_[r].finalized; }

 private:
  struct End {
    LoopbackHub* hub;
    int rank;
    Fault fault;
    int calls;
    int finalized;
  };
  // What a rank posted for the exchange in progress.
  struct Post {
    const unsigned char* send = nullptr;
    const size_t* counts = nullptr;  // all-to-all: bytes for each rank; nullptr: an all-gather of `bytes`
    const size_t* offsets = nullptr;
    size_t bytes = 0;
  };

  static int allGather(void* context, const void* sendbuf, void* recvbuf, size_t bytes, zpTransportCall_t* call) {
    End& e = *static_cast<End*>(context);
    Post p;
    p.send = static_cast<const unsigned char*>(sendbuf);
    p.bytes = bytes;
    return e.hub->exchange(
        e, p,
        [&](int peer, const Post& q, std::string* why) {
          if (q.counts != nullptr || q.bytes != bytes) {
            *why = "rank " + std::to_string(peer) + " made another exchange";
            return size_t(0);
          }
          memcpy(static_cast<unsigned char*>(recvbuf) + peer * bytes, q.send, bytes);
          return bytes;
        },
        call);
  }

  static int allToAll(void* context, const void* sendbuf, const size_t* sendCounts, const size_t* sendOffsets,
                      void* recvbuf, const size_t* recvCounts, const size_t* recvOffsets, zpTransportCall_t* call) {
    End& e = *static_cast<End*>(context);
    Post p;
    p.send = static_cast<const unsigned char*>(sendbuf);
    p.counts = sendCounts;
    p.offsets = sendOffsets;
    return e.hub->exchange(
        e, p,
        [&](int peer, const Post& q, std::string* why) {
          if (q.counts == nullptr || q.counts[e.rank] != recvCounts[peer]) {
            *why = "rank " + std::to_string(peer) + " sends another count";
            return size_t(0);
          }
          memcpy(static_cast<unsigned char*>(recvbuf) + recvOffsets[peer], q.send + q.offsets[e.rank],
                 recvCounts[peer]);
          return recvCounts[peer];
        },
        call);
  }

  static void finalize(void* context) { static_cast<End*>(context)->finalized++; }

  // Posts p, waits for every rank, copies from each with `take` (peer, its post, why) -> bytes, and waits again so
  // that nobody changes its send buffer while a peer copies it.
  template <class Take>
  int exchange(End& e, const Post& p, Take&& take, zpTransportCall_t* call) {
    const int n = ++e.calls;
    const bool faulty = e.fault.call == n;
    std::unique_lock<std::mutex> lock(mutex_);
    if (faulty && e.fault.leave) {
      broken_ = "rank " + std::to_string(e.rank) + " left";
      cv_.notify_all();
    }
    if (!broken_.empty()) return fail(call, broken_);
    posted_[e.rank] = p;
    if (!wait(lock, call)) return fail(call, broken_);
    size_t received = 0;
    std::string why;
    lock.unlock();  // the posts stay as they are until the next barrier
    for (int peer = 0; peer < nranks_ && why.empty(); ++peer) received += take(peer, posted_[peer], &why);
    lock.lock();
    if (!wait(lock, call)) return fail(call, broken_);
    if (!why.empty()) return fail(call, why);
    call->received = received - std::min(received, faulty ? e.fault.shortBy : size_t(0));
    if (faulty && e.fault.error) return fail(call, "injected failure");
    return 0;
  }

  // A barrier that times out (breaking the hub, as a timed-out engine closes its connections) or sees it broken.
  bool wait(std::unique_lock<std::mutex>& lock, zpTransportCall_t* call) {
    const unsigned long long generation = generation_;
    if (++arrived_ == nranks_) {
      arrived_ = 0;
      generation_++;
      cv_.notify_all();
      return true;
    }
    auto done = [&] { return generation_ != generation || !broken_.empty(); };
    if (call->timeoutMs > 0) {
      cv_.wait_for(lock, std::chrono::milliseconds(call->timeoutMs), done);
    } else {
      cv_.wait(lock, done);
    }
    if (generation_ != generation) return true;
    if (broken_.empty()) {
      broken_ = "timed out after " + std::to_string(call->timeoutMs) + " ms";
      cv_.notify_all();
    }
    return false;
  }

  static int fail(zpTransportCall_t* call, const std::string& why) {
    snprintf(call->error, sizeof(call->error), "%s", why.c_str());
    return 1;
  }

  const int nranks_;
  std::vector<End> ends_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<Post> posted_;
  int arrived_ = 0;
  unsigned long long generation_ = 0;
  std::string broken_;  // once set, every callback fails with it
};

}  // namespace zptest
