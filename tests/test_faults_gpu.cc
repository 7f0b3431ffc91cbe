// Faults on two GPUs (issue 10): a peer killed in the middle of each collective, and zpCommAbort from another
// thread while a collective is in flight. Either way the surviving rank's work must end (no hang) with an error
// that zpCommGetAsyncError reports, and the GPU must stay usable. Skips without two GPUs.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "include/zpccl.h"
#include "tests/child_test.h"
#include "tests/gpu_util.h"

namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

enum Op { kQwz = 0, kHpz = 1, kQgz = 2 };
const char* opName(int op) {
  return op == kQwz ? "zpQuantAllGather" : op == kHpz ? "zpHierAllGather" : "zpQuantReduceScatterA2A";
}

// Device buffers for one rank of a two-rank call of `count` elements per rank (bf16).
struct Buffers {
  void* send = nullptr;
  void* recv = nullptr;
  explicit Buffers(size_t count) {
    EXPECT_EQ(cudaMalloc(&send, 2 * count * 2), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&recv, 2 * count * 2), cudaSuccess);
    EXPECT_EQ(cudaMemset(send, 0x3c, 2 * count * 2), cudaSuccess);  // finite bf16 values
  }
  ~Buffers() {
    cudaFree(send);
    cudaFree(recv);
  }
};

zpResult_t callOp(int op, const Buffers& b, size_t count, zpComm_t comm, cudaStream_t stream) {
  switch (op) {
    case kQwz:
      return zpQuantAllGather(b.send, b.recv, count, zpBfloat16, comm, stream);
    case kHpz:
      return zpHierAllGather(b.send, b.recv, count, zpBfloat16, comm, stream);
    default:
      return zpQuantReduceScatterA2A(b.send, b.recv, count, zpBfloat16, zpSum, comm, stream);
  }
}

// Waits for stream up to `seconds`; true when it drained.
bool drains(cudaStream_t stream, double seconds) {
  const auto start = Clock::now();
  while (secondsSince(start) < seconds) {
    const cudaError_t e = cudaStreamQuery(stream);
    if (e != cudaErrorNotReady) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// The GPU still works after the failure: memory, a kernel-free copy, and a fresh one-rank communicator's
// collective.
void expectGpuUsable() {
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 1 << 20), cudaSuccess);
  EXPECT_EQ(cudaMemset(p, 1, 1 << 20), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(p);
  zpUniqueId id;
  ASSERT_EQ(zpGetUniqueId(&id), zpSuccess);
  zpComm_t solo = nullptr;
  ASSERT_EQ(zpCommInitRank(&solo, 1, id, 0), zpSuccess) << zpGetLastError(nullptr);
  Buffers b(4096);
  EXPECT_EQ(zpQuantAllGather(b.send, b.recv, 4096, zpBfloat16, solo, nullptr), zpSuccess) << zpGetLastError(solo);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(zpCommDestroy(solo), zpSuccess);
}

// ---- a peer killed mid-collective (two processes) --------------------------------------------------------------

const char* kRoleEnv = "ZP_FAULT_ROLE";  // "survivor" (rank 0) or "victim" (rank 1)
const char* kOpEnv = "ZP_FAULT_OP";
const char* kIdFileEnv = "ZP_FAULT_ID_FILE";
const char* kStartedFileEnv = "ZP_FAULT_STARTED_FILE";  // the survivor's big call is enqueued
// "1": the ranks reserve for the big call first, so that the victim's call is enqueued behind its stalled stream
// and the victim dies with its part not yet started. "0": no reserve and no stall (a growth would wait out the
// stall, and the whole transfer then ran before the victim died): the victim dies as soon as both calls are
// enqueued, most often mid-transfer.
const char* kPendingEnv = "ZP_FAULT_VICTIM_PENDING";
constexpr int kTimeoutMs = 3000;          // ZP_TIMEOUT_MS of the children
constexpr size_t kBigCount = 32u << 20;   // elements per rank of the call the victim dies in
constexpr size_t kSmallCount = 1u << 16;  // a first call both finish: connections are up

void blockStream(void* seconds) {
  std::this_thread::sleep_for(std::chrono::duration<double>(*static_cast<double*>(seconds)));
}

// Runs in each child (skipped in a normal run).
TEST(GpuFaults, Child) {
  const char* role = getenv(kRoleEnv);
  if (role == nullptr) GTEST_SKIP() << "runs only inside GpuFaults.PeerKilledMidCollective";
  const bool victim = std::string(role) == "victim";
  const int op = atoi(getenv(kOpEnv));
  zpUniqueId id;
  std::ifstream in(getenv(kIdFileEnv), std::ios::binary);
  ASSERT_TRUE(in.read(id.internal, sizeof(id.internal)));
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);  // CUDA_VISIBLE_DEVICES picks this process's GPU
  zpComm_t comm = nullptr;
  ASSERT_EQ(zpCommInitRank(&comm, 2, id, victim ? 1 : 0), zpSuccess) << zpGetLastError(nullptr);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  Buffers b(kBigCount);
  ASSERT_EQ(callOp(op, b, kSmallCount, comm, stream), zpSuccess) << zpGetLastError(comm);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  // Sizes, with the peer present, what the big call needs. On one node its direct-load window is registered with
  // every rank (a host rendezvous, like NCCL's first use of a connection), which the call would otherwise do.
  const char* pending = getenv(kPendingEnv);
  const bool pendingVictim = pending != nullptr && std::string(pending) == "1";
  if (pendingVictim) {
    ASSERT_EQ(zpCommReserve(comm, kBigCount * 2 * 2), zpSuccess) << zpGetLastError(comm);
  }

  const std::string startedFile = getenv(kStartedFileEnv);
  if (victim) {
    // Pending: enqueue the big call behind a stalled stream, so that this rank dies with its part of the call
    // pending while the survivor's part is already running.
    static double stall = 5.0;
    if (pendingVictim) {
      ASSERT_EQ(cudaLaunchHostFunc(stream, blockStream, &stall), cudaSuccess);
    }
    ASSERT_EQ(callOp(op, b, kBigCount, comm, stream), zpSuccess) << zpGetLastError(comm);
    const auto start = Clock::now();
    while (access(startedFile.c_str(), F_OK) != 0 && secondsSince(start) < 60) {
      std::this_thread::sleep_for(std::chrono::milliseconds(pendingVictim ? 5 : 1));
    }
    if (pendingVictim) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    raise(SIGKILL);
  }

  const auto start = Clock::now();
  ASSERT_EQ(callOp(op, b, kBigCount, comm, stream), zpSuccess) << zpGetLastError(comm);
  std::ofstream(startedFile).put('1');
  // The watchdog stops the call within ZP_TIMEOUT_MS plus a poll; NCCL's sockets may report the peer sooner.
  const bool drained = drains(stream, kTimeoutMs / 1000.0 + 20);
  EXPECT_TRUE(drained) << opName(op) << " still running " << secondsSince(start) << " s after its peer died";
  const double seconds = secondsSince(start);
  zpResult_t async = zpSuccess;
  ASSERT_EQ(zpCommGetAsyncError(comm, &async), zpSuccess);
  printf("[ fault    ] %s: peer killed, stream drained after %.2f s, async error %d (%s)\n", opName(op), seconds, async,
         zpGetErrorString(async));
  if (async == zpSuccess && !pendingVictim) {
    // The transfer ended before the victim died: the next call meets the dead peer instead.
    ASSERT_EQ(callOp(op, b, kSmallCount, comm, stream), zpSuccess) << zpGetLastError(comm);
    EXPECT_TRUE(drains(stream, kTimeoutMs / 1000.0 + 20)) << "the next call still runs after its peer died";
    ASSERT_EQ(zpCommGetAsyncError(comm, &async), zpSuccess);
    printf("[ fault    ] %s: the call ended first; the next one failed with async error %d (%s)\n", opName(op), async,
           zpGetErrorString(async));
  }
  EXPECT_NE(async, zpSuccess) << "zpCommGetAsyncError reports nothing after the peer died";
  // Later calls fail at once with the same error, and say why.
  EXPECT_EQ(callOp(op, b, kSmallCount, comm, stream), async);
  EXPECT_NE(std::string(zpGetLastError(comm)).find("failed earlier"), std::string::npos) << zpGetLastError(comm);
  const auto abortStart = Clock::now();
  EXPECT_EQ(zpCommAbort(comm), zpSuccess) << zpGetLastError(nullptr);
  EXPECT_LT(secondsSince(abortStart), 10.0) << "zpCommAbort of the failed communicator";
  EXPECT_TRUE(drains(stream, 5)) << "the stream is still blocked after zpCommAbort";
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  expectGpuUsable();
}

// Spawns the two children of one case and checks how each ended.
// With `ncclPipeline`, NCCL moves the payloads on one node too (no direct loads), in a pipeline of two chunks.
void killCase(int op, bool net, bool pending, bool ncclPipeline = false) {
  SCOPED_TRACE(std::string(opName(op)) + (net ? " over sockets (two nodes)" : " over NVLink (one node)") +
               (ncclPipeline ? ", NCCL's pipeline" : "") +
               (pending ? ", the victim's part not started" : ", the victim killed mid-transfer"));
  zpUniqueId id;
  ASSERT_EQ(zpGetUniqueId(&id), zpSuccess);
  const std::string idFile = "/tmp/zpccl-fault-id-" + std::to_string(getpid());
  std::ofstream(idFile, std::ios::binary).write(id.internal, sizeof(id.internal));
  pid_t pids[2];
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<std::string> env;
    env.push_back(std::string(kRoleEnv) + "=" + (rank == 0 ? "survivor" : "victim"));
    env.push_back(std::string(kOpEnv) + "=" + std::to_string(op));
    env.push_back(std::string(kIdFileEnv) + "=" + idFile);
    env.push_back(std::string(kStartedFileEnv) + "=" + idFile + ".started");
    env.push_back("ZP_TIMEOUT_MS=" + std::to_string(kTimeoutMs));
    env.push_back(std::string(kPendingEnv) + "=" + (pending ? "1" : "0"));
    // A GPU each; over sockets with one GPU, both share it (their distinct host ids let NCCL accept that).
    env.push_back("CUDA_VISIBLE_DEVICES=" + std::to_string(rank % zptest::gpuCount()));
    if (ncclPipeline) env.push_back("ZP_DIRECT_MIN_BYTES=-1");
    if (net) {
      for (std::string& e : zptest::regimeEnv(zptest::Regime::kNet, rank)) env.push_back(std::move(e));
    }
    pids[rank] = zptest::spawnSelf("GpuFaults.Child", env);
    ASSERT_GT(pids[rank], 0);
  }
  // No child may outlive a generous deadline: a hang is a failure, not a stuck suite.
  int status[2] = {0, 0};
  bool done[2] = {false, false};
  const auto start = Clock::now();
  while (!(done[0] && done[1]) && secondsSince(start) < 120) {
    for (int r = 0; r < 2; ++r) {
      if (!done[r] && waitpid(pids[r], &status[r], WNOHANG) == pids[r]) done[r] = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (int r = 0; r < 2; ++r) {
    if (!done[r]) {
      kill(pids[r], SIGKILL);
      waitpid(pids[r], &status[r], 0);
      ADD_FAILURE() << (r == 0 ? "the survivor" : "the victim") << " hung and was killed after 120 s";
    }
  }
  unlink(idFile.c_str());
  unlink((idFile + ".started").c_str());
  EXPECT_TRUE(WIFSIGNALED(status[1]) && WTERMSIG(status[1]) == SIGKILL) << "victim status " << status[1];
  EXPECT_TRUE(WIFEXITED(status[0]) && WEXITSTATUS(status[0]) == 0) << "survivor status " << status[0];
}

TEST(GpuFaults, PeerKilledMidCollective) {
  ZP_REQUIRE_GPUS(2);
  if (getenv(kRoleEnv)) GTEST_SKIP();
  for (int op : {kQwz, kHpz, kQgz}) killCase(op, /*net=*/false, /*pending=*/true);
}

// The same over NCCL's pipeline on one node (two chunks, each an NCCL kernel of its own, as over sockets below):
// the watchdog ends them (ncclCommRevoke where NCCL has it, else an abort) and the stream drains.
TEST(GpuFaults, PeerKilledMidNcclPipeline) {
  ZP_REQUIRE_GPUS(2);
  if (getenv(kRoleEnv)) GTEST_SKIP();
  for (int op : {kQwz, kQgz}) killCase(op, /*net=*/false, /*pending=*/true, /*ncclPipeline=*/true);
}

// Over sockets (two nodes of one GPU each, or of one shared GPU; hpZ's group is then the rank alone, with no peer
// to lose). Without ncclCommRevoke (NCCL before 2.28.7) the watchdog aborts the communicators, and the order
// matters: an abort frees device memory, which waits for the device's kernels, world's among them, still waiting
// for the dead peer. Aborting a split communicator first (hpZ's one-rank group) never returns (NCCL_DEBUG=INFO:
// "Abort START", no end); world is aborted first (NcclComms::ownedWorldFirst), and the survivor's stream drains.
TEST(GpuFaults, PeerKilledOverSockets) {
  ZP_REQUIRE_GPUS(1);
  if (getenv(kRoleEnv)) GTEST_SKIP();
  for (int op : {kQwz, kQgz}) killCase(op, /*net=*/true, /*pending=*/true);
}

// The victim killed mid-transfer (without zpCommReserve, its calls size their scratch themselves). Its stream is
// not stalled as in the pending case: the call's scratch growth would wait the stall out, and its part would run
// whole before it died. It dies as soon as both calls are enqueued; when the transfer still ends first, the
// survivor's next call meets the dead peer, and must fail and drain the same way.
TEST(GpuFaults, PeerKilledOverSocketsMidTransfer) {
  ZP_REQUIRE_GPUS(1);
  if (getenv(kRoleEnv)) GTEST_SKIP();
  for (int op : {kQwz, kQgz}) killCase(op, /*net=*/true, /*pending=*/false);
}

// ---- zpCommAbort from another thread while a collective is in flight ------------------------------------------

TEST(GpuFaults, AbortFromAnotherThreadStopsAnInFlightCollective) {
  ZP_REQUIRE_GPUS(2);
  if (getenv(kRoleEnv)) GTEST_SKIP();
  for (int op : {kQwz, kHpz, kQgz}) {
    SCOPED_TRACE(opName(op));
    zpUniqueId id;
    ASSERT_EQ(zpGetUniqueId(&id), zpSuccess);
    zpComm_t comms[2] = {nullptr, nullptr};
    std::vector<std::thread> init;
    // Both ranks make one small call first (NCCL connects peers on first use, on the host, with both present) and
    // reserve for the big one (its direct-load window is registered with every rank, also on the host).
    for (int rank = 0; rank < 2; ++rank) {
      init.emplace_back([&, rank] {
        ASSERT_EQ(cudaSetDevice(rank), cudaSuccess);
        ASSERT_EQ(zpCommInitRank(&comms[rank], 2, id, rank), zpSuccess) << zpGetLastError(nullptr);
        Buffers b(kSmallCount);
        ASSERT_EQ(callOp(op, b, kSmallCount, comms[rank], nullptr), zpSuccess) << zpGetLastError(comms[rank]);
        ASSERT_EQ(zpCommReserve(comms[rank], kBigCount * 2 * 2), zpSuccess) << zpGetLastError(comms[rank]);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      });
    }
    for (auto& t : init) t.join();
    ASSERT_TRUE(comms[0] != nullptr && comms[1] != nullptr);

    // Rank 0 calls; rank 1 never does, so rank 0's call waits for it on the GPU.
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    {
      Buffers b(kBigCount);
      ASSERT_EQ(callOp(op, b, kBigCount, comms[0], stream), zpSuccess) << zpGetLastError(comms[0]);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      ASSERT_EQ(cudaStreamQuery(stream), cudaErrorNotReady) << "the call finished without its peer";

      zpResult_t aborted = zpInternalError;
      double abortSeconds = 0;
      std::thread other([&] {
        const auto start = Clock::now();
        aborted = zpCommAbort(comms[0]);
        abortSeconds = secondsSince(start);
      });
      other.join();
      EXPECT_EQ(aborted, zpSuccess) << zpGetLastError(nullptr);
      EXPECT_LT(abortSeconds, 10.0) << "zpCommAbort took too long";
      EXPECT_TRUE(drains(stream, 5)) << "the stream is still blocked after zpCommAbort";
      printf("[ abort    ] %s: zpCommAbort returned after %.3f s\n", opName(op), abortSeconds);
    }
    EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
    zpResult_t async = zpSuccess;
    EXPECT_EQ(zpCommGetAsyncError(comms[0], &async), zpInvalidArgument) << "an aborted handle is refused";
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    EXPECT_EQ(zpCommAbort(comms[1]), zpSuccess) << zpGetLastError(nullptr);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    expectGpuUsable();
  }
}

}  // namespace
