// The host backend with ranks as MPI processes (libzpccl_mpi.so, include/zpccl_mpi.h), run under mpirun with four
// ranks (tools/run-tests.sh): every collective of tests/transport_battery.h equals, byte for byte, what thread-ranks
// of the threaded host backend give on the same inputs (each process runs those threads itself), on three node
// layouts (two nodes of two, nodes whose ranks interleave, one node); arguments that differ are zpInvalidUsage on
// every rank and leave the communicator usable; the MPI communicator a transport duplicated is freed with it.
// Every test ends by agreeing across ranks, so that rank 0's report (the one CI reads) fails when any rank's did.
#include <gtest/gtest.h>
#include <mpi.h>

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
    if (gSize > 1) {
      const std::string want =
          "zpQuantAllReduce : ranks disagree on count: rank 0 passed 1000, rank 1 passed " + std::to_string(odd);
      EXPECT_STREQ(zpGetLastError(comm), want.c_str());
    }
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
  zpComm_t comm = nullptr;
  ASSERT_EQ(zpCommInitFromMpi(&comm, MPI_COMM_WORLD, nullptr), zpSuccess) << zpGetLastError(nullptr);
  std::vector<float> send(200, 1.0f + gRank), recv(200 * gSize, -1.0f);
  EXPECT_EQ(zpQuantAllGather(send.data(), recv.data(), 100 + gRank, zpFloat32, comm, nullptr), zpInvalidUsage);
  if (gSize > 1) {
    EXPECT_STREQ(zpGetLastError(comm),
                 "zpQuantAllGather : ranks disagree on sendcount: rank 0 passed 100, rank 1 passed 101");
  }
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
