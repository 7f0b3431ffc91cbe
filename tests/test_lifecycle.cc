// Communicator lifecycle on the host backend, the last-error contract, and bad input to the lifecycle calls.
#include <gtest/gtest.h>
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "include/zpccl.h"
#include "src/cuda/cuda_exec.h"
#include "tests/host_ranks.h"
#include "tests/stall_page.h"

namespace {

using zptest::runHostRanks;

bool mentions(const char* message, const char* what) { return message && strstr(message, what) != nullptr; }

class HostLifecycle : public ::testing::TestWithParam<int> {};

TEST_P(HostLifecycle, QueriesMatchOneNode) {
  const int nranks = GetParam();
  std::atomic<int> checked{0};
  runHostRanks(nranks, nullptr, [&](int rank, zpComm_t comm) {
    int value = -1;
    EXPECT_EQ(zpCommCount(comm, &value), zpSuccess);
    EXPECT_EQ(value, nranks);
    EXPECT_EQ(zpCommUserRank(comm, &value), zpSuccess);
    EXPECT_EQ(value, rank);
    EXPECT_EQ(zpCommCuDevice(comm, &value), zpSuccess);
    EXPECT_EQ(value, -1);
    zpBackend_t backend = zpBackendDefault;
    EXPECT_EQ(zpCommBackend(comm, &backend), zpSuccess);
    EXPECT_EQ(backend, zpBackendHost);
    EXPECT_EQ(zpCommNodeCount(comm, &value), zpSuccess);
    EXPECT_EQ(value, 1);  // all threads share one hostname
    EXPECT_EQ(zpCommLocalRank(comm, &value), zpSuccess);
    EXPECT_EQ(value, rank);
    EXPECT_EQ(zpCommLocalSize(comm, &value), zpSuccess);
    EXPECT_EQ(value, nranks);
    EXPECT_EQ(zpCommHpzSize(comm, &value), zpSuccess);
    EXPECT_EQ(value, nranks);
    checked++;
  });
  EXPECT_EQ(checked.load(), nranks);
}
INSTANTIATE_TEST_SUITE_P(Ranks, HostLifecycle, ::testing::Values(1, 2, 3, 4, 7, 8, 16));

struct Layout {
  int nranks;
  int ranksPerNode;
  int hpzSize;
};

class HostEmulatedLayout : public ::testing::TestWithParam<Layout> {};

TEST_P(HostEmulatedLayout, GroupsMatchTopology) {
  const Layout L = GetParam();
  runHostRanks(
      L.nranks,
      [&](int, zpConfig_t* c) {
        c->ranksPerNode = L.ranksPerNode;
        if (L.hpzSize) c->hpzSize = L.hpzSize;
      },
      [&](int rank, zpComm_t comm) {
        int nodes = 0, node = -1, localRank = -1, localSize = 0, hpzRank = -1, hpzSize = 0;
        ASSERT_EQ(zpCommNodeCount(comm, &nodes), zpSuccess);
        ASSERT_EQ(zpCommNodeRank(comm, &node), zpSuccess);
        ASSERT_EQ(zpCommLocalRank(comm, &localRank), zpSuccess);
        ASSERT_EQ(zpCommLocalSize(comm, &localSize), zpSuccess);
        ASSERT_EQ(zpCommHpzRank(comm, &hpzRank), zpSuccess);
        ASSERT_EQ(zpCommHpzSize(comm, &hpzSize), zpSuccess);
        const int hpz = L.hpzSize ? L.hpzSize : L.ranksPerNode;
        EXPECT_EQ(nodes, L.nranks / L.ranksPerNode);
        EXPECT_EQ(node, rank / L.ranksPerNode);
        EXPECT_EQ(localRank, rank % L.ranksPerNode);
        EXPECT_EQ(localSize, L.ranksPerNode);
        EXPECT_EQ(hpzSize, hpz);
        EXPECT_EQ(hpzRank, localRank % hpz);
      });
}
INSTANTIATE_TEST_SUITE_P(Layouts, HostEmulatedLayout,
                         ::testing::Values(Layout{1, 1, 0}, Layout{8, 8, 0}, Layout{2, 1, 0}, Layout{16, 4, 0},
                                           Layout{16, 8, 2}, Layout{16, 8, 4}, Layout{8, 2, 1}));

TEST(HostLifecycleLayouts, InterleavedAndUnevenNodesByNodeId) {
  // Ranks 0,2,4 on node "A" and 1,3 on node "B": not node-major, and uneven.
  runHostRanks(
      5, [](int rank, zpConfig_t* c) { c->nodeId = rank % 2 == 0 ? 17 : 3; },
      [](int rank, zpComm_t comm) {
        int nodes = 0, node = -1, localRank = -1, localSize = 0;
        ASSERT_EQ(zpCommNodeCount(comm, &nodes), zpSuccess);
        ASSERT_EQ(zpCommNodeRank(comm, &node), zpSuccess);
        ASSERT_EQ(zpCommLocalRank(comm, &localRank), zpSuccess);
        ASSERT_EQ(zpCommLocalSize(comm, &localSize), zpSuccess);
        EXPECT_EQ(nodes, 2);
        EXPECT_EQ(node, rank % 2);  // nodes are numbered by their lowest rank
        EXPECT_EQ(localRank, rank / 2);
        EXPECT_EQ(localSize, rank % 2 == 0 ? 3 : 2);
      });
}

TEST(HostLifecycleLayouts, TwoCommunicatorsAtOnce) {
  // Two independent worlds on the same threads' process: ids keep them apart.
  std::thread a([] { runHostRanks(4, nullptr, [](int, zpComm_t) {}); });
  std::thread b([] { runHostRanks(3, nullptr, [](int, zpComm_t) {}); });
  a.join();
  b.join();
}

// ---- bad input -----------------------------------------------------------------------------------------------

zpConfig_t hostConfig() {
  zpConfig_t c = ZP_CONFIG_INITIALIZER;
  c.backend = zpBackendHost;
  return c;
}

zpUniqueId newId() {
  zpUniqueId id;
  EXPECT_EQ(zpGetUniqueId(&id), zpSuccess);
  return id;
}

TEST(LifecycleBadInput, NullCommPointer) {
  zpConfig_t c = hostConfig();
  EXPECT_EQ(zpCommInitRankConfig(nullptr, 1, newId(), 0, &c), zpInvalidArgument);
  EXPECT_TRUE(mentions(zpGetLastError(nullptr), "zpCommInitRankConfig : comm is NULL"));
  EXPECT_EQ(zpCommInitRank(nullptr, 1, newId(), 0), zpInvalidArgument);
  EXPECT_TRUE(mentions(zpGetLastError(nullptr), "zpCommInitRank : comm is NULL"));
  EXPECT_EQ(zpGetUniqueId(nullptr), zpInvalidArgument);
  EXPECT_TRUE(mentions(zpGetLastError(nullptr), "zpGetUniqueId : uniqueId is NULL"));
}

TEST(LifecycleBadInput, RankCounts) {
  zpConfig_t c = hostConfig();
  zpComm_t comm = reinterpret_cast<zpComm_t>(0x1);  // poisoned: must be reset to NULL on failure
  for (int nranks : {0, -1, -2147483647}) {
    EXPECT_EQ(zpCommInitRankConfig(&comm, nranks, newId(), 0, &c), zpInvalidArgument);
    EXPECT_TRUE(mentions(zpGetLastError(nullptr), "nranks")) << zpGetLastError(nullptr);
  }
  for (int rank : {-1, 4, 100}) {
    EXPECT_EQ(zpCommInitRankConfig(&comm, 4, newId(), rank, &c), zpInvalidArgument);
    EXPECT_TRUE(mentions(zpGetLastError(nullptr), "rank")) << zpGetLastError(nullptr);
  }
}

TEST(LifecycleBadInput, ConfigFields) {
  zpComm_t comm = nullptr;
  struct Case {
    const char* name;
    void (*edit)(zpConfig_t*);
    zpResult_t code;
    const char* mention;
  };
  const Case cases[] = {
      {"magic", [](zpConfig_t* c) { c->magic = 0x1234; }, zpInvalidArgument, "magic"},
      {"size", [](zpConfig_t* c) { c->size = 8; }, zpInvalidArgument, "size"},
      {"backend", [](zpConfig_t* c) { c->backend = 9; }, zpInvalidArgument, "config->backend"},
      {"weightBits", [](zpConfig_t* c) { c->weightBits = 6; }, zpInvalidArgument, "config->weightBits"},
      {"gradBits", [](zpConfig_t* c) { c->gradBits = 16; }, zpInvalidArgument, "config->gradBits"},
      {"blockSize npot", [](zpConfig_t* c) { c->blockSize = 100; }, zpInvalidArgument, "config->blockSize"},
      {"blockSize small", [](zpConfig_t* c) { c->blockSize = 16; }, zpInvalidArgument, "config->blockSize"},
      {"blockSize big", [](zpConfig_t* c) { c->blockSize = 16384; }, zpInvalidArgument, "config->blockSize"},
      {"ranksPerNode", [](zpConfig_t* c) { c->ranksPerNode = 3; }, zpInvalidArgument, "ranksPerNode"},
      {"hpz",
       [](zpConfig_t* c) {
         c->ranksPerNode = 4;
         c->hpzSize = 3;
       },
       zpInvalidArgument, "hpzSize"},
      {"hpz zero", [](zpConfig_t* c) { c->hpzSize = 0; }, zpInvalidArgument, "hpzSize"},
      {"nodeId", [](zpConfig_t* c) { c->nodeId = -5; }, zpInvalidArgument, "nodeId"},
      {"blocking", [](zpConfig_t* c) { c->blocking = 0; }, zpInvalidUsage, "blocking"},
  };
  for (const Case& k : cases) {
    zpConfig_t c = hostConfig();
    k.edit(&c);
    EXPECT_EQ(zpCommInitRankConfig(&comm, 4, newId(), 0, &c), k.code) << k.name;
    const char* msg = zpGetLastError(nullptr);
    EXPECT_TRUE(mentions(msg, "zpCommInitRankConfig")) << k.name << ": " << msg;
    EXPECT_TRUE(mentions(msg, k.mention)) << k.name << ": " << msg;
    EXPECT_EQ(comm, nullptr) << k.name;
  }
}

TEST(LifecycleBadInput, HpzNotDividingANodeFoundAtInit) {
  // Nodes come from nodeId here, so the check runs on the exchanged layout, on every rank alike.
  std::vector<zpResult_t> results(4, zpSuccess);
  zpUniqueId id = newId();
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      zpConfig_t c = hostConfig();
      c.nodeId = r < 3 ? 0 : 1;  // nodes of 3 and 1
      c.hpzSize = 2;
      zpComm_t comm = nullptr;
      results[r] = zpCommInitRankConfig(&comm, 4, id, r, &c);
      if (results[r] == zpSuccess)
        zpCommDestroy(comm);
      else
        EXPECT_TRUE(mentions(zpGetLastError(nullptr), "hpzSize 2 does not divide")) << zpGetLastError(nullptr);
    });
  }
  for (auto& t : threads) t.join();
  for (zpResult_t res : results) EXPECT_EQ(res, zpInvalidArgument);
}

TEST(LifecycleBadInput, UseAfterDestroyAndDoubleDestroy) {
  zpConfig_t c = hostConfig();
  zpComm_t comm = nullptr;
  ASSERT_EQ(zpCommInitRankConfig(&comm, 1, newId(), 0, &c), zpSuccess);
  ASSERT_EQ(zpCommDestroy(comm), zpSuccess);
  int count = -1;
  EXPECT_EQ(zpCommCount(comm, &count), zpInvalidArgument);
  EXPECT_EQ(count, -1);
  EXPECT_TRUE(mentions(zpGetLastError(nullptr), "zpCommCount : comm")) << zpGetLastError(nullptr);
  EXPECT_TRUE(mentions(zpGetLastError(comm), "not a live communicator"));
  EXPECT_EQ(zpCommDestroy(comm), zpInvalidArgument);
  EXPECT_TRUE(mentions(zpGetLastError(nullptr), "zpCommDestroy")) << zpGetLastError(nullptr);
  EXPECT_EQ(zpCommAbort(comm), zpInvalidArgument);
  zpResult_t async = zpSuccess;
  EXPECT_EQ(zpCommGetAsyncError(comm, &async), zpInvalidArgument);
}

// The allocator hands a destroyed communicator's memory to the next one; its handle must stay dead all the same:
// refused by every call, and a second destroy must not reach the communicator that now lives there.
TEST(LifecycleBadInput, DestroyedHandleStaysDeadWhenANewCommunicatorTakesItsPlace) {
  zpConfig_t c = hostConfig();
  std::vector<zpComm_t> seen;
  for (int round = 0; round < 50; ++round) {
    zpComm_t old = nullptr, next = nullptr;
    ASSERT_EQ(zpCommInitRankConfig(&old, 1, newId(), 0, &c), zpSuccess);
    ASSERT_EQ(zpCommDestroy(old), zpSuccess);
    ASSERT_EQ(zpCommInitRankConfig(&next, 1, newId(), 0, &c), zpSuccess);
    EXPECT_NE(old, next) << "round " << round;
    int count = -1;
    EXPECT_EQ(zpCommCount(old, &count), zpInvalidArgument) << "round " << round;
    EXPECT_EQ(count, -1);
    EXPECT_EQ(zpCommDestroy(old), zpInvalidArgument) << "round " << round;
    EXPECT_TRUE(mentions(zpGetLastError(nullptr), "not a live communicator")) << zpGetLastError(nullptr);
    // `next` was not destroyed by that: it answers, and its own destroy succeeds.
    EXPECT_EQ(zpCommCount(next, &count), zpSuccess) << zpGetLastError(next);
    EXPECT_EQ(count, 1);
    EXPECT_EQ(zpCommDestroy(next), zpSuccess) << zpGetLastError(nullptr);
    seen.push_back(old);
    seen.push_back(next);
  }
  // No handle is ever handed out twice.
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(std::adjacent_find(seen.begin(), seen.end()), seen.end());
}

TEST(LifecycleBadInput, GarbageAndNullHandles) {
  alignas(64) unsigned char garbage[512];
  memset(garbage, 0xab, sizeof(garbage));
  auto bogus = reinterpret_cast<zpComm_t>(garbage);
  int value = 0;
  EXPECT_EQ(zpCommCount(bogus, &value), zpInvalidArgument);
  EXPECT_EQ(zpCommDestroy(bogus), zpInvalidArgument);
  EXPECT_EQ(zpCommCount(nullptr, &value), zpInvalidArgument);
  EXPECT_TRUE(mentions(zpGetLastError(nullptr), "zpCommCount : comm is NULL"));
  EXPECT_EQ(zpCommDestroy(nullptr), zpInvalidArgument);
  EXPECT_EQ(zpCommReserve(nullptr, 1024), zpInvalidArgument);
}

TEST(LastError, PerCommunicatorAndNeverStale) {
  zpConfig_t c = hostConfig();
  zpComm_t comm = nullptr;
  ASSERT_EQ(zpCommInitRankConfig(&comm, 1, newId(), 0, &c), zpSuccess);
  EXPECT_STREQ(zpGetLastError(comm), "");
  EXPECT_EQ(zpCommCount(comm, nullptr), zpInvalidArgument);
  EXPECT_TRUE(mentions(zpGetLastError(comm), "zpCommCount : count is NULL")) << zpGetLastError(comm);
  // The communicator stays usable, and a good call clears its last error.
  int count = 0;
  EXPECT_EQ(zpCommCount(comm, &count), zpSuccess);
  EXPECT_EQ(count, 1);
  EXPECT_STREQ(zpGetLastError(comm), "");
  zpResult_t async = zpInternalError;
  EXPECT_EQ(zpCommGetAsyncError(comm, &async), zpSuccess);
  EXPECT_EQ(async, zpSuccess);
  EXPECT_EQ(zpCommDestroy(comm), zpSuccess);
}

// zpGetLastError(NULL) is the outcome of the thread's last call made without a live communicator: a failed init's
// message stays only until the thread's next init, which clears it when it succeeds.
TEST(LastError, TheThreadsMessageIsClearedByASuccessfulInit) {
  zpConfig_t c = hostConfig();
  zpComm_t comm = nullptr;
  c.blockSize = 48;
  ASSERT_EQ(zpCommInitRankConfig(&comm, 1, newId(), 0, &c), zpInvalidArgument);
  EXPECT_TRUE(mentions(zpGetLastError(nullptr), "config->blockSize 48")) << zpGetLastError(nullptr);
  c = hostConfig();
  ASSERT_EQ(zpCommInitRankConfig(&comm, 1, newId(), 0, &c), zpSuccess);
  EXPECT_STREQ(zpGetLastError(nullptr), "");
  EXPECT_STREQ(zpGetLastError(comm), "");
  EXPECT_EQ(zpCommDestroy(comm), zpSuccess);
  // The same through zpCommInitRank, after a failed zpCommInitRank.
  ASSERT_EQ(zpCommInitRank(&comm, 0, newId(), 0), zpInvalidArgument);
  EXPECT_TRUE(mentions(zpGetLastError(nullptr), "zpCommInitRank : nranks 0")) << zpGetLastError(nullptr);
  ASSERT_EQ(zpCommInitRank(&comm, 1, newId(), 0), zpSuccess) << zpGetLastError(nullptr);
  EXPECT_STREQ(zpGetLastError(nullptr), "");
  EXPECT_EQ(zpCommDestroy(comm), zpSuccess);
}

TEST(LastError, ErrorStringsAndVersion) {
  EXPECT_STREQ(zpGetErrorString(zpSuccess), "no error");
  for (int r = 1; r < zpNumResults; ++r) EXPECT_GT(strlen(zpGetErrorString(static_cast<zpResult_t>(r))), 5u);
  EXPECT_STREQ(zpGetErrorString(static_cast<zpResult_t>(99)), "unknown result code");
  int version = 0;
  EXPECT_EQ(zpGetVersion(&version), zpSuccess);
  EXPECT_EQ(version, ZPCCL_VERSION_CODE);
}

TEST(HostAbort, AbortWakesNoOneAndFreesTheHandle) {
  zpConfig_t c = hostConfig();
  zpComm_t comm = nullptr;
  ASSERT_EQ(zpCommInitRankConfig(&comm, 1, newId(), 0, &c), zpSuccess);
  EXPECT_EQ(zpCommAbort(comm), zpSuccess);
  int count = 0;
  EXPECT_EQ(zpCommCount(comm, &count), zpInvalidArgument);
}

}  // namespace

namespace {

// A collective blocked on a peer that never comes returns zpRemoteError promptly once another thread aborts
// its communicator (which then waits for the call to leave before freeing anything), and the peer sees the
// abort through zpCommGetAsyncError and its own next call.
TEST(HostAbort, AbortFromAnotherThreadWakesABlockedCollective) {
  zpUniqueId id;
  ASSERT_EQ(zpGetUniqueId(&id), zpSuccess);
  zpComm_t comms[2] = {nullptr, nullptr};
  std::vector<std::thread> init;
  for (int r = 0; r < 2; ++r) {
    init.emplace_back([&, r] {
      zpConfig_t c = ZP_CONFIG_INITIALIZER;
      c.backend = zpBackendHost;
      ASSERT_EQ(zpCommInitRankConfig(&comms[r], 2, id, r, &c), zpSuccess);
    });
  }
  for (auto& t : init) t.join();
  ASSERT_NE(comms[0], nullptr);
  ASSERT_NE(comms[1], nullptr);

  std::vector<float> send(256, 1.0f), recv(512, 0.0f);
  std::atomic<int> result{-1};
  std::string message;  // the failed call's, read in its own thread (the comm is gone by then)
  const auto start = std::chrono::steady_clock::now();
  std::thread blocked([&] {
    // Rank 1 never joins this call: rank 0 waits for it.
    result = zpQuantAllGather(send.data(), recv.data(), 256, zpFloat32, comms[0], nullptr);
    message = zpGetLastError(nullptr);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(zpCommAbort(comms[0]), zpSuccess) << zpGetLastError(nullptr);
  blocked.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(result.load(), zpRemoteError);
  EXPECT_LT(seconds, 5.0);
  EXPECT_TRUE(mentions(message.c_str(), "zpQuantAllGather : the communicator was aborted")) << message;

  zpResult_t async = zpSuccess;
  EXPECT_EQ(zpCommGetAsyncError(comms[1], &async), zpSuccess);
  EXPECT_EQ(async, zpRemoteError);
  EXPECT_EQ(zpQuantAllGather(send.data(), recv.data(), 256, zpFloat32, comms[1], nullptr), zpRemoteError);
  EXPECT_EQ(zpCommDestroy(comms[1]), zpSuccess);
}

// Two host-backend ranks of one communicator, created on threads.
void initTwo(zpComm_t comms[2]) {
  zpUniqueId id;
  ASSERT_EQ(zpGetUniqueId(&id), zpSuccess);
  std::vector<std::thread> init;
  for (int r = 0; r < 2; ++r) {
    init.emplace_back([&, r] {
      zpConfig_t c = hostConfig();
      ASSERT_EQ(zpCommInitRankConfig(&comms[r], 2, id, r, &c), zpSuccess);
    });
  }
  for (auto& t : init) t.join();
  ASSERT_NE(comms[0], nullptr);
  ASSERT_NE(comms[1], nullptr);
}

// An abort ends the aborted rank's call while a peer may still be dequantizing the payload that rank published in
// its scratch memory: the abort must not free it under the peer. Rank 1 is held in the middle of reading rank 0's
// payload (its recvbuff stalls) while rank 0 waits for it and another thread aborts rank 0: the abort returns only
// once rank 1 has read on, and rank 1's output holds rank 0's shard.
TEST(HostAbort, AbortNeverFreesWhatAPeerStillReads) {
  // Blocks from 64 KiB up are mapped apart and unmapped when freed (glibc; the sanitizers' allocator reports the
  // read itself), so that a read of freed scratch memory faults instead of passing unseen.
  mallopt(M_MMAP_THRESHOLD, 64 << 10);
  const size_t count = size_t{1} << 18;                                              // payloads of ~256 KiB
  std::vector<float> send0(count, 127.0f), send1(count, -254.0f), recv0(2 * count);  // dequantized exactly
  zpComm_t comms[2] = {nullptr, nullptr};
  initTwo(comms);
  zptest::StallPage recv1(2 * count * sizeof(float), count / 2 * sizeof(float), 300);
  zpResult_t res[2] = {zpInternalError, zpInternalError};
  std::thread rank0(
      [&] { res[0] = zpQuantAllGather(send0.data(), recv0.data(), count, zpFloat32, comms[0], nullptr); });
  std::thread rank1(
      [&] { res[1] = zpQuantAllGather(send1.data(), recv1.data(), count, zpFloat32, comms[1], nullptr); });
  while (!recv1.stalled()) std::this_thread::yield();
  EXPECT_EQ(zpCommAbort(comms[0]), zpSuccess) << zpGetLastError(nullptr);
  const int64_t abortReturned = zptest::StallPage::nowNs();
  rank0.join();
  rank1.join();
  EXPECT_GT(recv1.resumedNs(), 0);
  EXPECT_GE(abortReturned, recv1.resumedNs()) << "the abort returned while rank 1 still read rank 0's payload";
  EXPECT_EQ(res[0], zpRemoteError);
  EXPECT_EQ(res[1], zpRemoteError);  // its closing barrier saw the abort
  const float* out = static_cast<const float*>(recv1.data());
  EXPECT_EQ(out[0], 127.0f);
  EXPECT_EQ(out[count - 1], 127.0f);
  EXPECT_EQ(out[count], -254.0f);
  EXPECT_EQ(zpCommDestroy(comms[1]), zpSuccess) << zpGetLastError(nullptr);
  mallopt(M_MMAP_THRESHOLD, 128 << 10);  // glibc's default
}

// One communicator serves one thread at a time (include/zpccl.h): a call made while another thread's call runs on the
// same communicator would share its scratch memory and exchanges (two threads' gathers on one communicator came back
// with each other's data). It is refused with zpInvalidUsage naming both calls, and runs nothing; the queries and
// zpCommGetAsyncError still answer. A thread is held inside zpQuantAllGather (its recvbuff stalls) while the main
// thread calls.
TEST(HostThreads, ASecondThreadsCallOnABusyCommunicatorIsRefused) {
  zpConfig_t c = hostConfig();
  zpComm_t comm = nullptr;
  ASSERT_EQ(zpCommInitRankConfig(&comm, 1, newId(), 0, &c), zpSuccess);
  const size_t count = 4096;
  std::vector<float> send(count, 127.0f), other(count, -3.0f), otherOut(count, 5.0f);
  std::vector<unsigned char> payload(65536);
  zptest::StallPage recv(count * sizeof(float), 0, 300);
  zpResult_t first = zpInternalError;
  std::thread busy([&] { first = zpQuantAllGather(send.data(), recv.data(), count, zpFloat32, comm, nullptr); });
  while (!recv.stalled()) std::this_thread::yield();
  struct Second {
    const char* call;
    std::function<zpResult_t()> fn;
  };
  const Second seconds[] = {
      {"zpQuantAllGather",
       [&] { return zpQuantAllGather(other.data(), otherOut.data(), count, zpFloat32, comm, nullptr); }},
      {"zpQuantReduceScatterA2A",
       [&] { return zpQuantReduceScatterA2A(other.data(), otherOut.data(), count, zpFloat32, zpSum, comm, nullptr); }},
      {"zpQuantize", [&] { return zpQuantize(other.data(), payload.data(), count, zpFloat32, 8, 256, comm, nullptr); }},
      {"zpCommReserve", [&] { return zpCommReserve(comm, 1 << 20); }},
  };
  for (const Second& second : seconds) {
    EXPECT_EQ(second.fn(), zpInvalidUsage) << second.call;
    const char* msg = zpGetLastError(comm);
    EXPECT_TRUE(mentions(msg, (std::string(second.call) + " : another thread is in zpQuantAllGather").c_str()))
        << second.call << ": " << msg;
  }
  EXPECT_EQ(otherOut, std::vector<float>(count, 5.0f)) << "a refused call wrote its recvbuff";
  int n = 0;
  EXPECT_EQ(zpCommCount(comm, &n), zpSuccess);  // queries answer meanwhile
  EXPECT_EQ(n, 1);
  busy.join();
  EXPECT_EQ(first, zpSuccess) << zpGetLastError(comm);
  const float* out = static_cast<const float*>(recv.data());
  EXPECT_EQ(out[0], 127.0f);
  EXPECT_EQ(out[count - 1], 127.0f);
  // Free again: the next call runs.
  EXPECT_EQ(zpQuantAllGather(other.data(), otherOut.data(), count, zpFloat32, comm, nullptr), zpSuccess)
      << zpGetLastError(comm);
  EXPECT_EQ(otherOut, std::vector<float>(count, -3.0f));
  EXPECT_EQ(zpCommDestroy(comm), zpSuccess);
}

// Queries, zpCommGetAsyncError, zpCommReserve and zpHierSecondaryShard racing a destroy from another thread either
// see the live communicator (right answers) or refuse the dead handle: never a read of freed memory (the
// sanitizer build, tools/run-sanitizers.sh, reports one), since each holds the communicator in use while it reads.
TEST(HostAbort, CallsRacingDestroyNeverReadAFreedCommunicator) {
  for (int round = 0; round < 200; ++round) {
    zpConfig_t c = hostConfig();
    zpComm_t comm = nullptr;
    ASSERT_EQ(zpCommInitRankConfig(&comm, 1, newId(), 0, &c), zpSuccess);
    std::atomic<bool> started{false};
    int unexpected = 0, calls = 0;
    std::thread caller([&] {
      for (bool live = true; live; ++calls) {
        started = true;
        int count = -1;
        zpResult_t async = zpInternalError;
        size_t offset = 1, shard = 0;
        const zpResult_t r[4] = {zpCommCount(comm, &count), zpCommGetAsyncError(comm, &async),
                                 zpCommReserve(comm, 1 << 20), zpHierSecondaryShard(64, &offset, &shard, comm)};
        for (zpResult_t x : r) {
          if (x != zpSuccess && x != zpInvalidArgument) unexpected++;
          if (x == zpInvalidArgument) live = false;
        }
        if (r[0] == zpSuccess && count != 1) unexpected++;
        // An abort under way is what the communicator reports while the call still sees it.
        if (r[1] == zpSuccess && async != zpSuccess && !(round % 2 == 1 && async == zpRemoteError)) unexpected++;
        if (r[3] == zpSuccess && (offset != 0 || shard != 64)) unexpected++;
      }
    });
    while (!started) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::microseconds(round % 50));
    ASSERT_EQ(round % 2 == 0 ? zpCommDestroy(comm) : zpCommAbort(comm), zpSuccess);
    caller.join();
    EXPECT_EQ(unexpected, 0) << "round " << round << " after " << calls << " calls";
  }
}

// The orders in which the cuda backend ends its NCCL communicators (src/cuda/cuda_exec.h): destroyed split ones first
// and world last, aborted world first (an abort of a split one waits for world's kernel), a caller's world never,
// an alias of world once. Fake handles: nothing here calls NCCL.
TEST(NcclCommsOrder, DestroyWorldLastAbortWorldFirst) {
  const auto comm = [](uintptr_t v) { return reinterpret_cast<ncclComm_t>(v); };
  using Comms = std::vector<ncclComm_t>;
  zp::NcclComms c;
  c.world = comm(1);
  c.intra = comm(1);  // one node: the node's ranks are world's
  c.inter = comm(2);
  c.hpz = comm(3);
  EXPECT_EQ(c.all(), (Comms{comm(1), comm(2), comm(3)}));
  EXPECT_EQ(c.owned(), (Comms{comm(2), comm(3), comm(1)}));
  EXPECT_EQ(c.ownedWorldFirst(), (Comms{comm(1), comm(2), comm(3)}));
  c.ownsWorld = false;  // zpCommInitFromNccl: the caller's
  EXPECT_EQ(c.owned(), (Comms{comm(2), comm(3)}));
  EXPECT_EQ(c.ownedWorldFirst(), (Comms{comm(2), comm(3)}));
}

}  // namespace
