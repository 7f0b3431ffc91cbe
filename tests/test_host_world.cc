// The host backend's meeting place (src/host/host_world.h) with short timeouts of its own: joins that give up leave
// no trace (neither in a world that later completes nor in the map of pending worlds), a huge nranks costs
// nothing until its ranks exist, a rank that failed waits until no peer reads what it published, and every rank
// learns why the world failed.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "host/base/check.h"
#include "include/zpccl.h"
#include "src/host/host_world.h"

namespace {

using zp::HostWorld;
using zp::RankInit;
using zp::WorldTimeouts;
using Clock = std::chrono::steady_clock;

bool mentions(const std::string& message, const char* what) { return message.find(what) != std::string::npos; }

zpUniqueId freshId() {
  static std::atomic<uint64_t> next{1};
  zpUniqueId id;
  memset(&id, 0, sizeof(id));
  const char tag[] = "host-world-test";
  memcpy(id.internal, tag, sizeof(tag));
  const uint64_t n = next++;
  memcpy(id.internal + 64, &n, sizeof(n));
  return id;
}

double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Joins `nranks` ranks of a fresh world on threads; all must succeed.
std::vector<std::shared_ptr<HostWorld>> joinAll(int nranks, const WorldTimeouts& timeouts) {
  const zpUniqueId id = freshId();
  std::vector<std::shared_ptr<HostWorld>> worlds(nranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks; ++r) {
    threads.emplace_back([&, r] {
      EXPECT_EQ(HostWorld::join(id, nranks, r, RankInit(), "join", timeouts, &worlds[r]), zpSuccess) << "rank " << r;
    });
  }
  for (auto& t : threads) t.join();
  return worlds;
}

// A rank whose init wait ends just as its peer arrives either leaves before the peer counts it (the peer then
// waits its own init timeout and fails with the init error) or finds the world complete: never a peer that
// succeeds in a world without it, which would then hang in its first collective.
TEST(HostWorld, ARankThatGivesUpIsNeverCountedByALaterArrival) {
  const WorldTimeouts timeouts{20, 60000};
  int bothJoined = 0, bothFailed = 0;
  for (int attempt = 0; attempt < 24; ++attempt) {
    const zpUniqueId id = freshId();
    std::shared_ptr<HostWorld> w0, w1;
    zpResult_t r0 = zpInternalError, r1 = zpInternalError;
    const auto start = Clock::now();
    std::thread first([&] { r0 = HostWorld::join(id, 2, 0, RankInit(), "join", timeouts, &w0); });
    // Around rank 0's deadline, on either side of it.
    std::this_thread::sleep_for(std::chrono::microseconds(17000 + 250 * attempt));
    r1 = HostWorld::join(id, 2, 1, RankInit(), "join", timeouts, &w1);
    first.join();
    ASSERT_EQ(r0 == zpSuccess, r1 == zpSuccess) << "attempt " << attempt << ": " << r0 << " " << r1;
    EXPECT_LT(secondsSince(start), 5.0);
    if (r0 == zpSuccess) {
      ++bothJoined;
      ASSERT_EQ(w0, w1);
      std::thread peer([&] { EXPECT_EQ(w1->barrier(1, "barrier"), zpSuccess); });
      EXPECT_EQ(w0->barrier(0, "barrier"), zpSuccess);
      peer.join();
    } else {
      ++bothFailed;
      EXPECT_EQ(r0, zpSystemError);
      EXPECT_EQ(r1, zpSystemError);
    }
  }
  EXPECT_EQ(bothJoined + bothFailed, 24);
}

TEST(HostWorld, FailedJoinsLeaveNoWorldBehind) {
  const size_t before = HostWorld::pendingCount();
  const WorldTimeouts timeouts{1, 1000};
  for (int i = 0; i < 300; ++i) {
    std::shared_ptr<HostWorld> w;
    ASSERT_EQ(HostWorld::join(freshId(), 4096, i % 4096, RankInit(), "join", timeouts, &w), zpSystemError);
    EXPECT_EQ(w, nullptr);
  }
  EXPECT_EQ(HostWorld::pendingCount(), before);
  // Two of three ranks, giving up one after the other: the second to leave drops the world.
  const zpUniqueId id = freshId();
  std::thread a([&] {
    std::shared_ptr<HostWorld> w;
    EXPECT_EQ(HostWorld::join(id, 3, 0, RankInit(), "join", WorldTimeouts{50, 1000}, &w), zpSystemError);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::shared_ptr<HostWorld> w;
  EXPECT_EQ(HostWorld::join(id, 3, 2, RankInit(), "join", WorldTimeouts{200, 1000}, &w), zpSystemError);
  a.join();
  EXPECT_EQ(HostWorld::pendingCount(), before);
}

// The message names the timeout's variable, its value, and which ranks joined. Rank 3 joins well inside rank 0's
// wait, and its own wait ends after rank 0's, so a loaded machine that delays either thread does not change the
// message.
TEST(HostWorld, AJoinThatGivesUpSaysWhoCameAndWhoDidNot) {
  const zpUniqueId id = freshId();
  std::string first;
  std::thread a([&] {
    std::shared_ptr<HostWorld> w;
    EXPECT_EQ(HostWorld::join(id, 5, 0, RankInit(), "zpCommInitRank", WorldTimeouts{1000, 1000}, &w), zpSystemError);
    first = zp::pendingError();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::shared_ptr<HostWorld> w;
  EXPECT_EQ(HostWorld::join(id, 5, 3, RankInit(), "zpCommInitRank", WorldTimeouts{3000, 1000}, &w), zpSystemError);
  a.join();
  EXPECT_EQ(
      first,
      "zpCommInitRank : only 2 of 5 ranks joined within ZP_INIT_TIMEOUT_MS=1000 ms (joined: 0,3; missing: 1-2,4): "
      "every rank must call it with the same unique id and nranks");
}

// A world of INT_MAX ranks holds no per-rank memory while it waits, and holds up no other init meanwhile.
TEST(HostWorld, AHugeRankCountCostsNothingUntilItsRanksExist) {
  std::atomic<bool> done{false};
  std::string message;
  std::thread huge([&] {
    std::shared_ptr<HostWorld> w;
    EXPECT_EQ(HostWorld::join(freshId(), INT_MAX, 0, RankInit(), "join", WorldTimeouts{1500, 1000}, &w), zpSystemError);
    message = zp::pendingError();
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto start = Clock::now();
  const auto worlds = joinAll(3, WorldTimeouts{10000, 10000});
  EXPECT_LT(secondsSince(start), 1.0);
  EXPECT_FALSE(done.load());  // the huge one still waits: the others did not wait behind it
  huge.join();
  EXPECT_TRUE(mentions(message, "only 1 of 2147483647 ranks joined")) << message;
  EXPECT_TRUE(mentions(message, "(joined: 0; missing: 1-2147483646)")) << message;
}

// Rank 1 gives up waiting for rank 0, which is still reading rank 1's published data. Rank 1's waitForReaders
// returns only after rank 0 said it is done, so rank 1 may free (here: overwrite) its data only then, and rank 0
// never sees it change. Both messages say what happened, and nobody speaks of an abort.
TEST(HostWorld, AFailedRankWaitsUntilNoPeerReadsWhatItPublished) {
  const auto worlds = joinAll(2, WorldTimeouts{10000, 100});
  std::vector<int> published(1 << 16, 7);
  std::atomic<int64_t> endedReadsAt{0}, readersGoneAt{0};
  std::string error0, error1;
  auto nowNs = [] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  };
  std::thread slowReader([&] {
    HostWorld& w = *worlds[0];
    ASSERT_EQ(w.exchange(0, nullptr, "zpTestCall"), zpSuccess);
    const int* peer = static_cast<const int*>(w.slot(1));
    std::vector<int> before(peer, peer + published.size());
    std::this_thread::sleep_for(std::chrono::milliseconds(400));  // past rank 1's timeout
    std::vector<int> after(peer, peer + published.size());
    EXPECT_EQ(before, after) << "the peer's data changed while this rank read it";
    EXPECT_EQ(after, std::vector<int>(published.size(), 7));
    endedReadsAt = nowNs();
    w.endReads(0);
    EXPECT_EQ(w.barrier(0, "zpTestCall"), zpRemoteError);
    error0 = zp::pendingError();
  });
  HostWorld& w = *worlds[1];
  zp::clearPendingError();  // the messages read here are this thread's first
  ASSERT_EQ(w.exchange(1, published.data(), "zpTestCall"), zpSuccess);
  w.endReads(1);
  EXPECT_EQ(w.barrier(1, "zpTestCall"), zpRemoteError);
  error1 = zp::pendingError();
  w.waitForReaders();
  readersGoneAt = nowNs();
  std::fill(published.begin(), published.end(), -1);  // what freeing it would do
  slowReader.join();
  EXPECT_GE(readersGoneAt.load(), endedReadsAt.load());
  EXPECT_EQ(error1,
            "zpTestCall : ranks 0 did not arrive within ZP_HOST_TIMEOUT_MS=100 ms; the communicator failed: abort or "
            "destroy it");
  EXPECT_EQ(error0,
            "zpTestCall : the communicator failed: rank 1 gave up waiting in zpTestCall for ranks 0, which did not "
            "arrive within ZP_HOST_TIMEOUT_MS=100 ms");
  EXPECT_FALSE(mentions(error0, "abort")) << error0;
}

TEST(HostWorld, AnAbortWakesEveryWaiterAndNamesItsRank) {
  const auto worlds = joinAll(3, WorldTimeouts{10000, 60000});
  std::string error0;
  std::thread waiter([&] {
    EXPECT_EQ(worlds[0]->barrier(0, "zpTestCall"), zpRemoteError);
    error0 = zp::pendingError();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto start = Clock::now();
  worlds[2]->abort(2);
  waiter.join();
  EXPECT_LT(secondsSince(start), 5.0);
  EXPECT_EQ(error0, "zpTestCall : the communicator was aborted (zpCommAbort on rank 2)");
  EXPECT_TRUE(worlds[1]->failed());
  EXPECT_EQ(worlds[1]->barrier(1, "zpOther"), zpRemoteError);
  worlds[1]->waitForReaders();  // nobody reads: returns at once
}

// One rank's init fails after the ranks met: every rank returns its error, the others naming it.
TEST(HostWorld, InitVerdictIsTheFailingRanks) {
  const auto worlds = joinAll(3, WorldTimeouts{10000, 10000});
  std::vector<zpResult_t> results(3, zpInternalError);
  std::vector<std::string> messages(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      const zpResult_t mine = r == 1 ? zpSystemError : zpSuccess;
      results[r] = worlds[r]->agreeOnInit(r, mine, r == 1 ? "zpTestInit : out of host memory" : "", "zpTestInit");
      messages[r] = zp::pendingError();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) EXPECT_EQ(results[r], zpSystemError) << "rank " << r;
  EXPECT_EQ(messages[0], "zpTestInit : rank 1 could not create its communicator (zpTestInit : out of host memory)");
  EXPECT_EQ(messages[2], messages[0]);
}

}  // namespace
