// The host backend's timeouts, end to end through the ABI: ZP_INIT_TIMEOUT_MS and ZP_HOST_TIMEOUT_MS are read once
// per process, so each case runs in a child process of its own with short ones (tests/child_test.h). A missing
// rank's init names the variable and who came; the peers of a rank that gave up waiting say so (nobody aborted);
// and a rank that gave up does not return while a peer still copies its send buffer, so its caller may free it.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "include/zpccl.h"
#include "tests/child_test.h"
#include "tests/stall_page.h"

namespace {

const std::vector<std::string> kShortTimeouts = {"ZP_INIT_TIMEOUT_MS=200", "ZP_HOST_TIMEOUT_MS=200"};

bool mentions(const std::string& message, const char* what) { return message.find(what) != std::string::npos; }

zpConfig_t hostConfig() {
  zpConfig_t c = ZP_CONFIG_INITIALIZER;
  c.backend = zpBackendHost;
  return c;
}

void initRanks(int nranks, zpComm_t* comms) {
  zpUniqueId id;
  ASSERT_EQ(zpGetUniqueId(&id), zpSuccess);
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks; ++r) {
    threads.emplace_back([&, r] {
      zpConfig_t c = hostConfig();
      ASSERT_EQ(zpCommInitRankConfig(&comms[r], nranks, id, r, &c), zpSuccess) << zpGetLastError(nullptr);
    });
  }
  for (auto& t : threads) t.join();
}

TEST(HostTimeouts, AMissingRankAtInit) {
  zptest::expectChildPassed("HostTimeoutsChild.DISABLED_AMissingRankAtInit", kShortTimeouts);
}
TEST(HostTimeouts, PeersOfARankThatGaveUp) {
  zptest::expectChildPassed("HostTimeoutsChild.DISABLED_PeersOfARankThatGaveUp", kShortTimeouts);
}
TEST(HostTimeouts, ARankThatGaveUpWaitsForItsReaders) {
  zptest::expectChildPassed("HostTimeoutsChild.DISABLED_ARankThatGaveUpWaitsForItsReaders", kShortTimeouts);
}

// Rank 1 of 3 never comes; rank 2 comes 50 ms after rank 0, so rank 0 gives up first and sees it.
TEST(HostTimeoutsChild, DISABLED_AMissingRankAtInit) {
  zpUniqueId id;
  ASSERT_EQ(zpGetUniqueId(&id), zpSuccess);
  zpResult_t res[3] = {zpSuccess, zpSuccess, zpSuccess};
  std::string message[3];
  zpComm_t comms[3] = {nullptr, nullptr, nullptr};
  std::vector<std::thread> threads;
  for (int r : {0, 2}) {
    threads.emplace_back([&, r] {
      if (r == 2) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      zpConfig_t c = hostConfig();
      res[r] = zpCommInitRankConfig(&comms[r], 3, id, r, &c);
      message[r] = zpGetLastError(nullptr);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(res[0], zpSystemError);
  EXPECT_EQ(res[2], zpSystemError);
  EXPECT_EQ(comms[0], nullptr);
  EXPECT_EQ(message[0],
            "zpCommInitRankConfig : only 2 of 3 ranks joined within ZP_INIT_TIMEOUT_MS=200 ms (joined: 0,2; missing: "
            "1): every rank must call it with the same unique id and nranks");
  EXPECT_TRUE(mentions(message[2], "ZP_INIT_TIMEOUT_MS=200 ms (joined: 2; missing: 0-1)")) << message[2];
}

// Rank 0 calls a collective that rank 1 does not join in time: rank 0 names the missing rank and the timeout;
// rank 1's next call names what happened, and neither speaks of an abort.
TEST(HostTimeoutsChild, DISABLED_PeersOfARankThatGaveUp) {
  zpComm_t comms[2] = {nullptr, nullptr};
  initRanks(2, comms);
  std::vector<float> send(64, 1.0f), recv(128);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(zpQuantAllGather(send.data(), recv.data(), 64, zpFloat32, comms[0], nullptr), zpRemoteError);
  const std::string first = zpGetLastError(comms[0]);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(200));
  EXPECT_EQ(first,
            "zpQuantAllGather : ranks 1 did not arrive within ZP_HOST_TIMEOUT_MS=200 ms; the communicator failed: "
            "abort or destroy it");
  EXPECT_EQ(zpHierAllGather(send.data(), recv.data(), 64, zpFloat32, comms[1], nullptr), zpRemoteError);
  const std::string peer = zpGetLastError(comms[1]);
  EXPECT_EQ(peer,
            "zpHierAllGather : the communicator failed: rank 0 gave up waiting in zpQuantAllGather for ranks 1, which "
            "did not arrive within ZP_HOST_TIMEOUT_MS=200 ms");
  EXPECT_FALSE(mentions(peer, "abort")) << peer;
  for (zpComm_t comm : comms) {
    zpResult_t async = zpSuccess;
    EXPECT_EQ(zpCommGetAsyncError(comm, &async), zpSuccess);
    EXPECT_EQ(async, zpRemoteError);
    EXPECT_EQ(zpCommDestroy(comm), zpSuccess) << zpGetLastError(nullptr);
  }
}

// Exact hpZ publishes the caller's send buffer. Rank 1 is held in the middle of copying rank 0's (its recvbuff
// stalls 600 ms) while rank 0 gives up waiting for it after 200 ms. Rank 0's call returns only once rank 1 has
// copied on, so rank 0's caller may then overwrite its buffer and destroy its communicator: rank 1's copy holds
// rank 0's data, none of what came after.
TEST(HostTimeoutsChild, DISABLED_ARankThatGaveUpWaitsForItsReaders) {
  zpComm_t comms[2] = {nullptr, nullptr};
  initRanks(2, comms);
  const size_t count = size_t{1} << 18;
  std::vector<int32_t> send0(count, 1234), send1(count, 5678);
  zptest::StallPage recv1(2 * count * sizeof(int32_t), count / 2 * sizeof(int32_t), 600);
  std::vector<int32_t> recv0(2 * count);
  int64_t returned0 = 0;
  zpResult_t res[2] = {zpInternalError, zpInternalError};
  std::thread rank0([&] {
    res[0] = zpHierAllGather(send0.data(), recv0.data(), count, zpInt32, comms[0], nullptr);
    returned0 = zptest::StallPage::nowNs();
    std::fill(send0.begin(), send0.end(), -1);  // what the caller may do with its buffer now
    EXPECT_EQ(zpCommDestroy(comms[0]), zpSuccess) << zpGetLastError(nullptr);
  });
  res[1] = zpHierAllGather(send1.data(), recv1.data(), count, zpInt32, comms[1], nullptr);
  rank0.join();
  EXPECT_TRUE(recv1.stalled());
  EXPECT_EQ(res[0], zpRemoteError);
  EXPECT_EQ(res[1], zpRemoteError);
  EXPECT_GE(returned0, recv1.resumedNs()) << "rank 0 returned while rank 1 still copied its send buffer";
  const int32_t* out = static_cast<const int32_t*>(recv1.data());
  EXPECT_EQ(std::count(out, out + count, 1234), static_cast<long>(count)) << "rank 0's shard as rank 1 copied it";
  EXPECT_EQ(std::count(out + count, out + 2 * count, 5678), static_cast<long>(count));
  EXPECT_EQ(zpCommDestroy(comms[1]), zpSuccess) << zpGetLastError(nullptr);
}

}  // namespace
