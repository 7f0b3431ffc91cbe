// The host backend with ranks as MPI processes (libzpccl_mpi.so, include/zpccl_mpi.h), run under mpirun with four
// ranks (tools/run-tests.sh): every collective of tests/transport_battery.h equals, byte for byte, what thread-ranks
// of the threaded host backend give on the same inputs (each process runs those threads itself), on three node
// layouts (two nodes of two, nodes whose ranks interleave, one node); arguments that differ are zpInvalidUsage on
// every rank and leave the communicator usable; the MPI communicator a transport duplicated is freed with it.
// Every test ends by agreeing across ranks, so that rank 0's report (the one CI reads) fails when any rank's did.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "include/zpccl.h"
#include "include/zpccl_mpi.h"
#include "tests/transport_battery.h"

namespace {

int gRank = 0, gSize = 1;

using Configure = std::function<void(int rank, zpConfig_t* config)>;

// Fails on rank 0 when a test failed on another rank.
void expectEveryRankPassed() {
  int mine = ::testing::Test::HasFailure() ? 1 : 0, any = 0;
  MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any && !mine) ADD_FAILURE() << "another rank failed (its output says which)";
}

void expectBitEqualToThreads(const Configure& configure, const char* layout) {
  zpConfig_t c = ZP_CONFIG_INITIALIZER;
  configure(gRank, &c);
  zpComm_t comm = nullptr;
  ASSERT_EQ(zpCommInitFromMpi(&comm, MPI_COMM_WORLD, &c), zpSuccess) << zpGetLastError(nullptr);
  zpBackend_t backend = zpBackendDefault;
  int count = 0, rank = -1;
  EXPECT_EQ(zpCommBackend(comm, &backend), zpSuccess);
  EXPECT_EQ(zpCommCount(comm, &count), zpSuccess);
  EXPECT_EQ(zpCommUserRank(comm, &rank), zpSuccess);
  EXPECT_EQ(backend, zpBackendHost);
  EXPECT_EQ(count, gSize);
  EXPECT_EQ(rank, gRank);
  const zptest::BatteryOutputs got = zptest::runBattery(gRank, gSize, comm);
  EXPECT_EQ(zpCommDestroy(comm), zpSuccess);
  zptest::expectSameOutputs(got, zptest::batteryOverThreads(gSize, configure)[gRank],
                            std::string(layout) + ", rank " + std::to_string(gRank));
}

TEST(MpiHost, TwoNodesBitEqualToThreads) {
  if (gSize % 2 == 0) expectBitEqualToThreads([](int, zpConfig_t* c) { c->ranksPerNode = 2; }, "two nodes");
  expectEveryRankPassed();
}

// Node of rank r: r % 2 reversed in the second half, so that a rank's peers across nodes are not in rank order.
TEST(MpiHost, InterleavedNodesBitEqualToThreads) {
  if (gSize % 2 == 0) {
    expectBitEqualToThreads([](int r, zpConfig_t* c) { c->nodeId = (r < gSize / 2) ? r % 2 : 1 - r % 2; },
                            "interleaved nodes");
  }
  expectEveryRankPassed();
}

TEST(MpiHost, OneNodeBitEqualToThreads) {
  expectBitEqualToThreads([](int, zpConfig_t* c) { c->nodeId = 0; }, "one node");
  expectEveryRankPassed();
}

// The last rank on a node of its own, the others on one node: the hierarchical paths fall back to flat ones (hpZ,
// which needs nodes of equal size, is left out of the battery).
TEST(MpiHost, UnevenNodesBitEqualToThreads) {
  if (gSize >= 3) expectBitEqualToThreads([](int r, zpConfig_t* c) { c->nodeId = r == gSize - 1 ? 1 : 0; }, "uneven");
  expectEveryRankPassed();
}

// The all-reduce when ranks disagree, on two nodes: rank 1 passes another count, then count 0 (which alone would
// return at once); every rank refuses both naming the count, its recvbuff untouched, and the matching call after
// gives every rank the same bits.
TEST(MpiHost, AllReduceArgumentsThatDifferAreRefusedOnEveryRank) {
  if (gSize < 2) GTEST_SKIP() << "needs two ranks to disagree";
  zpConfig_t c = ZP_CONFIG_INITIALIZER;
  if (gSize % 2 == 0) c.ranksPerNode = 2;
  zpComm_t comm = nullptr;
  ASSERT_EQ(zpCommInitFromMpi(&comm, MPI_COMM_WORLD, &c), zpSuccess) << zpGetLastError(nullptr);
  const size_t count = 1000;
  std::vector<float> send(count), recv(count, -1.0f);
  for (size_t i = 0; i < count; ++i) send[i] = 0.001f * static_cast<float>((i * 7 + gRank * 13) % 101) - 0.05f;
  for (size_t odd : {count - 1, size_t(0)}) {
    const size_t mine = gRank == 1 ? odd : count;
    EXPECT_EQ(zpQuantAllReduce(send.data(), recv.data(), mine, zpFloat32, zpSum, comm, nullptr), zpInvalidUsage);
    const std::string want =
        "zpQuantAllReduce : ranks disagree on count: rank 0 passed 1000, rank 1 passed " + std::to_string(odd);
    EXPECT_STREQ(zpGetLastError(comm), want.c_str());
    EXPECT_EQ(recv[0], -1.0f);
    EXPECT_EQ(recv[count - 1], -1.0f);
  }
  ASSERT_EQ(zpQuantAllReduce(send.data(), recv.data(), count, zpFloat32, zpSum, comm, nullptr), zpSuccess)
      << zpGetLastError(comm);
  std::vector<float> all(count * gSize);
  MPI_Allgather(recv.data(), static_cast<int>(count), MPI_FLOAT, all.data(), static_cast<int>(count), MPI_FLOAT,
                MPI_COMM_WORLD);
  for (int r = 0; r < gSize; ++r) {
    EXPECT_EQ(memcmp(all.data() + r * count, recv.data(), count * sizeof(float)), 0) << "rank " << r << " differs";
  }
  EXPECT_EQ(zpCommDestroy(comm), zpSuccess);
  expectEveryRankPassed();
}

// Rank r passes sendcount 100 + r: every rank refuses the call, names the argument, and serves the next one.
TEST(MpiHost, ArgumentsThatDifferAreRefusedOnEveryRank) {
  if (gSize < 2) GTEST_SKIP() << "needs two ranks to disagree";
  zpComm_t comm = nullptr;
  ASSERT_EQ(zpCommInitFromMpi(&comm, MPI_COMM_WORLD, nullptr), zpSuccess) << zpGetLastError(nullptr);
  std::vector<float> send(200, 1.0f + gRank), recv(200 * gSize, -1.0f);
  EXPECT_EQ(zpQuantAllGather(send.data(), recv.data(), 100 + gRank, zpFloat32, comm, nullptr), zpInvalidUsage);
  EXPECT_STREQ(zpGetLastError(comm),
               "zpQuantAllGather : ranks disagree on sendcount: rank 0 passed 100, rank 1 passed 101");
  EXPECT_EQ(recv[0], -1.0f);
  ASSERT_EQ(zpQuantAllGather(send.data(), recv.data(), 100, zpFloat32, comm, nullptr), zpSuccess)
      << zpGetLastError(comm);
  for (int r = 0; r < gSize; ++r) EXPECT_NEAR(recv[r * 100], 1.0f + r, 1e-5f) << "rank " << r << "'s shard";
  EXPECT_EQ(zpCommDestroy(comm), zpSuccess);
  expectEveryRankPassed();
}

// The transport's duplicate of the communicator goes with the zpccl communicator (abort too), or by hand.
TEST(MpiHost, TheDuplicatedCommunicatorIsFreed) {
  zpTransport_t t;
  ASSERT_EQ(zpMpiTransportCreate(MPI_COMM_WORLD, &t), zpSuccess);
  EXPECT_EQ(t.nranks, gSize);
  EXPECT_EQ(t.rank, gRank);
  zpComm_t comm = nullptr;
  ASSERT_EQ(zpCommInitFromTransport(&comm, &t, nullptr), zpSuccess) << zpGetLastError(nullptr);
  EXPECT_EQ(zpCommAbort(comm), zpSuccess);
  ASSERT_EQ(zpMpiTransportCreate(MPI_COMM_WORLD, &t), zpSuccess);
  EXPECT_EQ(zpMpiTransportFree(&t), zpSuccess);
  EXPECT_EQ(zpMpiTransportFree(&t), zpInvalidArgument);  // freed already
  EXPECT_EQ(zpMpiTransportCreate(MPI_COMM_NULL, &t), zpInvalidArgument);
  zpConfig_t c = ZP_CONFIG_INITIALIZER;
  c.backend = zpBackendCuda;
  EXPECT_EQ(zpCommInitFromMpi(&comm, MPI_COMM_WORLD, &c), zpInvalidArgument);
  EXPECT_EQ(comm, nullptr);
  expectEveryRankPassed();
}

// libzpccl_mpi.so is a client of libzpccl.so and cannot set zpGetLastError: its own refusals name the call and the
// argument on stderr (as its MPI failures do). Local calls, on every rank alike.
TEST(MpiHost, BadArgumentsAreRefusedByNameOnStderr) {
  struct Bad {
    const char* message;
    std::function<zpResult_t()> call;
  };
  zpTransport_t t;
  zpComm_t comm = reinterpret_cast<zpComm_t>(0x1);
  const Bad bads[] = {
      {"zpMpiTransportCreate : transport is NULL", [] { return zpMpiTransportCreate(MPI_COMM_WORLD, nullptr); }},
      {"zpMpiTransportCreate : mpiComm is MPI_COMM_NULL", [&] { return zpMpiTransportCreate(MPI_COMM_NULL, &t); }},
      {"zpMpiTransportFree : transport is NULL", [] { return zpMpiTransportFree(nullptr); }},
      {"zpMpiTransportFree : transport holds no context of zpMpiTransportCreate",
       [] {
         zpTransport_t other = ZP_TRANSPORT_INITIALIZER;
         return zpMpiTransportFree(&other);
       }},
      {"zpCommInitFromMpi : comm is NULL", [] { return zpCommInitFromMpi(nullptr, MPI_COMM_WORLD, nullptr); }},
      {"zpCommInitFromMpi : mpiComm is MPI_COMM_NULL",
       [&] { return zpCommInitFromMpi(&comm, MPI_COMM_NULL, nullptr); }},
  };
  for (const Bad& bad : bads) {
    ::testing::internal::CaptureStderr();
    const zpResult_t res = bad.call();
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(res, zpInvalidArgument) << bad.message;
    EXPECT_NE(err.find(std::string("zpccl_mpi: ") + bad.message), std::string::npos)
        << bad.message << ": stderr was '" << err << "'";
  }
  EXPECT_EQ(comm, nullptr);  // a refused init sets *comm to NULL
  // Freed twice: the second is refused by name.
  ASSERT_EQ(zpMpiTransportCreate(MPI_COMM_WORLD, &t), zpSuccess);
  EXPECT_EQ(zpMpiTransportFree(&t), zpSuccess);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(zpMpiTransportFree(&t), zpInvalidArgument);
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("zpMpiTransportFree : transport holds no context"),
            std::string::npos);
  expectEveryRankPassed();
}

// Timed-out exchanges. The last rank comes late: the others' exchanges time out with their MPI operations still
// pending, the others go on (later exchanges, a failed collective, destroy), then tell the late rank to come and
// drive MPI's progress (MPI_Iprobe) until it says it is done. A pending nonblocking collective keeps using its
// buffers and its count and displacement arrays until it completes, so these tests check that what lands, lands as
// each exchange asked, and that nothing crashes or hangs. Open MPI reads the arrays when the operation starts, so
// on Open MPI they pass with arrays that are overwritten too; under valgrind (or an MPI that reads them later) they
// catch arrays reused or freed while pending.
constexpr long long kShortMs = 100;   // what the punctual ranks wait before giving up
constexpr long long kLongMs = 10000;  // what a rank waits for peers that are known to come
constexpr int kTagGo = 71, kTagDone = 72;

bool isLate() { return gRank == gSize - 1; }

// The punctual ranks tell the late rank to come.
void letTheLateRankCome() {
  if (isLate()) {
    for (int r = 0; r < gSize - 1; ++r) MPI_Recv(nullptr, 0, MPI_BYTE, r, kTagGo, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  } else {
    MPI_Send(nullptr, 0, MPI_BYTE, gSize - 1, kTagGo, MPI_COMM_WORLD);
  }
}

// On a punctual rank: drives MPI's progress until the late rank says it is done and `landed` holds (or kLongMs
// passes); returns whether `landed` held. On the late rank: says it is done.
bool progressUntilTheLateRankIsDone(const std::function<bool()>& landed) {
  if (isLate()) {
    for (int r = 0; r < gSize - 1; ++r) MPI_Send(nullptr, 0, MPI_BYTE, r, kTagDone, MPI_COMM_WORLD);
    return true;
  }
  MPI_Request done;
  MPI_Irecv(nullptr, 0, MPI_BYTE, gSize - 1, kTagDone, MPI_COMM_WORLD, &done);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kLongMs);
  int finished = 0, flag = 0;
  bool ok = false;
  while (std::chrono::steady_clock::now() < deadline) {
    MPI_Test(&done, &finished, MPI_STATUS_IGNORE);
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
    ok = landed();
    if (finished && ok) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!finished) {
    MPI_Cancel(&done);
    MPI_Wait(&done, MPI_STATUS_IGNORE);
  }
  EXPECT_TRUE(finished) << "rank " << gRank << ": the late rank did not say it was done within " << kLongMs << " ms";
  return ok;
}

// The byte that rank `from` sends rank `to` at position i of exchange `x`.
unsigned char byteOf(int x, int from, int to, size_t i) {
  return static_cast<unsigned char>(x * 61 + from * 13 + to * 7 + i);
}

// One all-to-all through the transport's callback, each exchange with its own shape: in exchange x, rank `to` gets
// 8 * (x + 1) + to bytes from every rank, at offsets spaced by a stride that also depends on x, so that exchanges
// that borrowed each other's counts or displacements would land other bytes elsewhere.
struct AllToAllCase {
  int x;
  std::vector<size_t> sendCounts, sendOffsets, recvCounts, recvOffsets;
  std::vector<unsigned char> send, recv;

  AllToAllCase(int exchange, int nranks, int rank) : x(exchange) {
    const size_t stride = 64 * static_cast<size_t>(x + 1) + 3 * x;
    auto countTo = [&](int to) { return 8 * static_cast<size_t>(x + 1) + to; };
    send.assign(stride * nranks, 0xEE);
    recv.assign(stride * nranks, 0xEE);
    for (int r = 0; r < nranks; ++r) {
      sendCounts.push_back(countTo(r));
      sendOffsets.push_back(stride * (nranks - 1 - r));  // reversed, unlike the receive side
      recvCounts.push_back(countTo(rank));
      recvOffsets.push_back(stride * r + x);
      for (size_t i = 0; i < countTo(r); ++i) send[sendOffsets[r] + i] = byteOf(x, rank, r, i);
    }
  }

  int run(const zpTransport_t& t, long long timeoutMs, zpTransportCall_t* call) {
    memset(call, 0, sizeof(*call));
    call->call = "test";
    call->timeoutMs = timeoutMs;
    return t.allToAll(t.context, send.data(), sendCounts.data(), sendOffsets.data(), recv.data(), recvCounts.data(),
                      recvOffsets.data(), call);
  }

  // Every rank's block where this exchange put it, and the poison elsewhere.
  bool landed(int nranks, int rank) const {
    std::vector<unsigned char> want(recv.size(), 0xEE);
    for (int r = 0; r < nranks; ++r) {
      for (size_t i = 0; i < recvCounts[r]; ++i) want[recvOffsets[r] + i] = byteOf(x, r, rank, i);
    }
    return want == recv;
  }
};

// Two exchanges of different shapes time out on the punctual ranks; a third, once the late rank came, succeeds on
// every rank, and the first two's blocks land as each asked.
TEST(MpiHost, TimedOutExchangesLandAsEachAskedAndLaterOnesWork) {
  if (gSize < 2) GTEST_SKIP() << "needs a late rank and a punctual one";
  zpTransport_t t;
  ASSERT_EQ(zpMpiTransportCreate(MPI_COMM_WORLD, &t), zpSuccess);
  AllToAllCase first(1, gSize, gRank), second(2, gSize, gRank), third(3, gSize, gRank);
  zpTransportCall_t call;
  if (!isLate()) {
    for (AllToAllCase* x : {&first, &second}) {
      EXPECT_NE(x->run(t, kShortMs, &call), 0) << "exchange " << x->x << " returned without the late rank";
      EXPECT_NE(std::string(call.error).find("MPI_Ialltoallv did not complete within 100 ms"), std::string::npos)
          << call.error;
    }
  }
  letTheLateRankCome();
  if (isLate()) {
    for (AllToAllCase* x : {&first, &second}) {
      EXPECT_EQ(x->run(t, kLongMs, &call), 0) << call.error;
      EXPECT_TRUE(x->landed(gSize, gRank)) << "exchange " << x->x;
    }
  }
  EXPECT_TRUE(progressUntilTheLateRankIsDone([&] { return first.landed(gSize, gRank) && second.landed(gSize, gRank); }))
      << "rank " << gRank << ": a timed-out exchange's blocks did not land where it asked";
  EXPECT_EQ(third.run(t, kLongMs, &call), 0) << call.error;
  EXPECT_EQ(call.received, third.recvCounts[0] * gSize);
  EXPECT_TRUE(third.landed(gSize, gRank));
  EXPECT_EQ(zpMpiTransportFree(&t), zpSuccess);
  expectEveryRankPassed();
}

// An all-gather and an all-to-all still pending when the transport is freed: the free says so on stderr and keeps
// what they use, the late rank's exchanges complete against them, and their blocks land.
TEST(MpiHost, ExchangesPendingAtFreeKeepTheirMemory) {
  if (gSize < 2) GTEST_SKIP() << "needs a late rank and a punctual one";
  zpTransport_t t;
  ASSERT_EQ(zpMpiTransportCreate(MPI_COMM_WORLD, &t), zpSuccess);
  AllToAllCase scatter(4, gSize, gRank);
  std::vector<unsigned char> mine(24), all(24 * gSize, 0xEE);
  for (size_t i = 0; i < mine.size(); ++i) mine[i] = byteOf(5, gRank, 0, i);
  auto gathered = [&] {
    for (int r = 0; r < gSize; ++r) {
      for (size_t i = 0; i < mine.size(); ++i) {
        if (all[r * mine.size() + i] != byteOf(5, r, 0, i)) return false;
      }
    }
    return true;
  };
  zpTransportCall_t call;
  auto exchange = [&](long long timeoutMs) {
    memset(&call, 0, sizeof(call));
    call.timeoutMs = timeoutMs;
    const int gatherRc = t.allGather(t.context, mine.data(), all.data(), mine.size(), &call);
    const int scatterRc = scatter.run(t, timeoutMs, &call);
    return std::make_pair(gatherRc, scatterRc);
  };
  if (!isLate()) {
    const auto rc = exchange(kShortMs);
    EXPECT_NE(rc.first, 0) << "the all-gather returned without the late rank";
    EXPECT_NE(rc.second, 0) << "the all-to-all returned without the late rank";
    ::testing::internal::CaptureStderr();
    EXPECT_EQ(zpMpiTransportFree(&t), zpSuccess);
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("zpccl_mpi: zpMpiTransportFree : 2 exchanges that timed out are still pending"),
              std::string::npos)
        << "stderr was '" << err << "'";
  }
  letTheLateRankCome();
  if (isLate()) {
    const auto rc = exchange(kLongMs);
    EXPECT_EQ(rc.first, 0);
    EXPECT_EQ(rc.second, 0) << call.error;
    EXPECT_TRUE(gathered());
    EXPECT_TRUE(scatter.landed(gSize, gRank));
    EXPECT_EQ(zpMpiTransportFree(&t), zpSuccess);
  }
  EXPECT_TRUE(progressUntilTheLateRankIsDone([&] { return gathered() && scatter.landed(gSize, gRank); }))
      << "rank " << gRank << ": an exchange pending at free did not land";
  expectEveryRankPassed();
}

// The MPI transport with every exchange's timeout set by the test once init is done (0: the library's own).
struct ShortTimeouts {
  zpTransport_t inner;
  long long timeoutMs = 0;

  static ShortTimeouts* of(void* context) { return static_cast<ShortTimeouts*>(context); }
  void shorten(zpTransportCall_t* call) const {
    if (timeoutMs != 0) call->timeoutMs = timeoutMs;
  }
  static int allGather(void* context, const void* sendbuf, void* recvbuf, size_t bytes, zpTransportCall_t* call) {
    of(context)->shorten(call);
    const zpTransport_t& t = of(context)->inner;
    return t.allGather(t.context, sendbuf, recvbuf, bytes, call);
  }
  static int allToAll(void* context, const void* sendbuf, const size_t* sendCounts, const size_t* sendOffsets,
                      void* recvbuf, const size_t* recvCounts, const size_t* recvOffsets, zpTransportCall_t* call) {
    of(context)->shorten(call);
    const zpTransport_t& t = of(context)->inner;
    return t.allToAll(t.context, sendbuf, sendCounts, sendOffsets, recvbuf, recvCounts, recvOffsets, call);
  }
  static void finalize(void* context) { zpMpiTransportFree(&of(context)->inner); }
};

// A collective whose exchanges time out on the punctual ranks fails there with zpRemoteError naming the timeout;
// later calls fail at once, destroy succeeds and says that the pending exchanges' memory is kept. The late rank's
// call then completes its exchanges against the pending ones (or times out itself) and fails alike.
TEST(MpiHost, ACommunicatorWhoseTransportTimedOutFailsClearly) {
  if (gSize < 2) GTEST_SKIP() << "needs a late rank and a punctual one";
  ShortTimeouts wrap;
  ASSERT_EQ(zpMpiTransportCreate(MPI_COMM_WORLD, &wrap.inner), zpSuccess);
  zpTransport_t t = ZP_TRANSPORT_INITIALIZER;
  t.nranks = wrap.inner.nranks;
  t.rank = wrap.inner.rank;
  t.context = &wrap;
  t.allGather = ShortTimeouts::allGather;
  t.allToAll = ShortTimeouts::allToAll;
  t.finalize = ShortTimeouts::finalize;
  zpComm_t comm = nullptr;
  ASSERT_EQ(zpCommInitFromTransport(&comm, &t, nullptr), zpSuccess) << zpGetLastError(nullptr);
  wrap.timeoutMs = kShortMs;
  const size_t count = 4096;
  std::vector<float> send(count, 1.0f + gRank), recv(count * gSize, -1.0f);
  auto gather = [&] { return zpQuantAllGather(send.data(), recv.data(), count, zpFloat32, comm, nullptr); };
  if (!isLate()) {
    EXPECT_EQ(gather(), zpRemoteError);
    const std::string first = zpGetLastError(comm);
    EXPECT_NE(first.find("zpQuantAllGather : rank "), std::string::npos) << first;
    EXPECT_NE(first.find("did not complete within 100 ms"), std::string::npos) << first;
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(gather(), zpRemoteError);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(kShortMs))
        << "a call on the failed communicator waited";
    const std::string later = zpGetLastError(comm);
    EXPECT_NE(later.find("zpQuantAllGather : the communicator failed: rank "), std::string::npos) << later;
    ::testing::internal::CaptureStderr();
    EXPECT_EQ(zpCommDestroy(comm), zpSuccess);
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("exchanges that timed out are still pending"), std::string::npos)
        << "stderr was '" << err << "'";
  }
  letTheLateRankCome();
  if (isLate()) {
    EXPECT_EQ(gather(), zpRemoteError);
    const std::string why = zpGetLastError(comm);
    EXPECT_NE(why.find("did not complete within 100 ms"), std::string::npos) << why;
    EXPECT_EQ(zpCommDestroy(comm), zpSuccess);
  }
  progressUntilTheLateRankIsDone([] { return true; });
  expectEveryRankPassed();
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &gRank);
  MPI_Comm_size(MPI_COMM_WORLD, &gSize);
  ::testing::InitGoogleTest(&argc, argv);
  if (gRank != 0) {
    // One report: rank 0's, which every test makes fail when another rank's did. InitGoogleTest has made the
    // report's writer from --gtest_output already (clearing the flag now would leave it): every rank would write
    // the same file at once, interleaving their reports.
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_xml_generator());
  }
  const int failed = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any;
}
