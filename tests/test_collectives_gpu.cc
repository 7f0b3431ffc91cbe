// GPU suites of the three collectives and of the cuda-backend lifecycle: every result is compared bit for bit
// with the host backend run on the same inputs (the executable specification). Skips without GPUs.
#include <cuda.h>  // types of cuStreamWaitValue32 only: the test reaches it through the runtime
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "host/dtype.h"
#include "include/zpccl.h"
#include "tests/child_test.h"
#include "tests/collective_check.h"
#include "tests/gpu_util.h"
#include "tests/host_ranks.h"

namespace {

using zpcheck::Buffer;

constexpr unsigned char kSquatterByte = 0xa5;       // fills allocations that a replay must not touch
constexpr size_t kSquatterMiB[] = {1, 1, 2, 2, 4};  // their sizes: where freed 1 - 13 MiB buffers would be reused

enum class Op { kQwz, kHpz, kQgz, kAllReduce };

struct Case {
  Op op;
  zpDataType_t type;
  int bits;  // 0: the communicator's default
  size_t count;
  bool inPlace;
  zpRedOp_t redOp = zpSum;
  uint64_t seed = 7;      // of the inputs
  bool specials = false;  // NaN, +-Inf, the type's largest value and its smallest denormal among the inputs
};

std::string describe(const Case& c) {
  const char* names[] = {"qwZ", "hpZ", "qgZ", "all-reduce"};
  const bool reduces = c.op == Op::kQgz || c.op == Op::kAllReduce;
  return std::string(names[static_cast<int>(c.op)]) + " " + zp::typeName(c.type) + " bits " + std::to_string(c.bits) +
         " count " + std::to_string(c.count) + (c.inPlace ? " in place" : " out of place") +
         (reduces ? (c.redOp == zpAvg ? " avg" : " sum") : "");
}

// Elements of send and receive buffers per rank. For hpZ the group is every rank of the one-node layouts here
// (or the rank alone when each is its own node).
void sizes(const Case& c, int nranks, int group, size_t* sendElems, size_t* recvElems) {
  switch (c.op) {
    case Op::kQwz:
      *sendElems = c.count, *recvElems = c.count * nranks;
      break;
    case Op::kHpz:
      *sendElems = c.count, *recvElems = c.count * group;
      break;
    case Op::kQgz:
      *sendElems = c.count * nranks, *recvElems = c.count;
      break;
    case Op::kAllReduce:
      *sendElems = c.count, *recvElems = c.count;
      break;
  }
}

zpResult_t runCase(const Case& c, zpComm_t comm, const void* send, void* recv, cudaStream_t stream) {
  zpQuantOptions_t options = {c.bits, 0};
  switch (c.op) {
    case Op::kQwz:
      return zpQuantAllGatherEx(send, recv, c.count, c.type, &options, comm, stream);
    case Op::kHpz:
      return zpHierAllGatherEx(send, recv, c.count, c.type, c.bits ? &options : nullptr, comm, stream);
    case Op::kQgz:
      return zpQuantReduceScatterA2AEx(send, recv, c.count, c.type, c.redOp, &options, comm, stream);
    case Op::kAllReduce: {
      zpGradOptions_t grad = ZP_GRAD_OPTIONS_INITIALIZER;
      if (c.bits != 0) grad.bits = c.bits;
      return zpQuantAllReduceEx(send, recv, c.count, c.type, c.redOp, &grad, comm, stream);
    }
  }
  return zpInternalError;
}

// Where the send side lies inside the receive buffer for NCCL's in-place layouts (element offset), or -1.
long inPlaceOffset(const Case& c, int rank, int groupRank) {
  if (!c.inPlace) return -1;
  switch (c.op) {
    case Op::kQwz:
      return static_cast<long>(c.count) * rank;
    case Op::kHpz:
      return static_cast<long>(c.count) * groupRank;
    case Op::kQgz:
      return static_cast<long>(c.count) * rank;  // recvbuff inside sendbuff
    case Op::kAllReduce:
      return 0;  // sendbuff == recvbuff
  }
  return -1;
}

void fillInput(const Case& c, int rank, size_t elems, void* dst) {
  if (c.op == Op::kHpz && c.bits == 0) {
    zpcheck::fillBytes(dst, elems * zp::typeSize(c.type), c.seed, rank);
  } else {
    zpcheck::fillRandom(c.type, dst, elems, c.seed, rank);
  }
  if (!c.specials || elems == 0 || (c.op == Op::kHpz && c.bits == 0)) return;  // random bytes hold NaNs already
  const float largest = c.type == zpFloat16 ? 65504.0f : 3.0e38f;
  const float smallest = c.type == zpFloat16 ? 0x1p-24f : c.type == zpBfloat16 ? 0x1p-133f : 0x1p-149f;
  const float values[] = {NAN, INFINITY, -INFINITY, largest, -largest, smallest};
  std::mt19937_64 pick(c.seed * 31 + static_cast<uint64_t>(rank));
  for (float v : values) {
    if (pick() % 2) zpcheck::storeValue(c.type, dst, pick() % elems, v);
  }
}

// The host backend's output of every rank, for ranks laid out by `configure`.
std::vector<Buffer> hostExpected(const Case& c, int nranks, const zptest::ConfigureFn& configure) {
  std::vector<Buffer> out(nranks);
  zptest::runHostRanks(nranks, configure, [&](int rank, zpComm_t comm) {
    int group = 0;
    ASSERT_EQ(zpCommHpzSize(comm, &group), zpSuccess);
    size_t sendElems = 0, recvElems = 0;
    sizes(c, nranks, group, &sendElems, &recvElems);
    const size_t esz = zp::typeSize(c.type);
    Buffer send(sendElems * esz);
    fillInput(c, rank, sendElems, send.data());
    out[rank].resize(recvElems * esz);
    ASSERT_EQ(runCase(c, comm, send.data(), out[rank].data(), nullptr), zpSuccess) << zpGetLastError(comm);
  });
  return out;
}

// Runs `c` on the cuda communicator of this rank; returns the receive buffer (poisoned before the run).
// A case's device buffers on one rank: the input uploaded, the output poisoned.
struct CaseBuffers {
  char* devBig = nullptr;
  char* devOther = nullptr;
  void* send = nullptr;
  void* recv = nullptr;
  size_t sendBytes = 0, recvBytes = 0;
  bool inPlace = false;
  Buffer input;  // what `send` held before the call: an out-of-place call must leave it as it was
};

// Every device buffer of a case lies between two poisoned guards. A collective that writes past its output (or
// before it) leaves that output exact and corrupts a neighbour, which in a framework's caching allocator is
// another live tensor: the guards catch it where the comparison with the host cannot.
constexpr size_t kGuardBytes = 512;
constexpr unsigned char kGuardByte = 0x5c;

char* guardedMalloc(size_t bytes) {
  char* base = nullptr;
  if (cudaMalloc(&base, bytes + 2 * kGuardBytes) != cudaSuccess) return nullptr;
  if (cudaMemset(base, kGuardByte, bytes + 2 * kGuardBytes) != cudaSuccess) return nullptr;
  return base + kGuardBytes;
}

// Checks both guards of a guardedMalloc buffer of `bytes`, then frees it.
void guardedFree(char* p, size_t bytes, const char* what) {
  if (p == nullptr) return;
  std::vector<unsigned char> before(kGuardBytes), after(kGuardBytes);
  CUDA_ASSERT(cudaMemcpy(before.data(), p - kGuardBytes, kGuardBytes, cudaMemcpyDeviceToHost));
  CUDA_ASSERT(cudaMemcpy(after.data(), p + bytes, kGuardBytes, cudaMemcpyDeviceToHost));
  CUDA_ASSERT(cudaFree(p - kGuardBytes));
  const auto touched = [](const std::vector<unsigned char>& g) {
    return std::count_if(g.begin(), g.end(), [](unsigned char v) { return v != kGuardByte; });
  };
  EXPECT_EQ(touched(before), 0) << what << ": bytes written before the buffer";
  EXPECT_EQ(touched(after), 0) << what << ": bytes written past the end of the buffer (" << bytes << " bytes)";
}

void prepareCase(const Case& c, int rank, zpComm_t comm, CaseBuffers* b) {
  int nranks = 0, group = 0, groupRank = 0;
  ASSERT_EQ(zpCommCount(comm, &nranks), zpSuccess);
  ASSERT_EQ(zpCommHpzSize(comm, &group), zpSuccess);
  ASSERT_EQ(zpCommHpzRank(comm, &groupRank), zpSuccess);
  size_t sendElems = 0, recvElems = 0;
  sizes(c, nranks, group, &sendElems, &recvElems);
  const size_t esz = zp::typeSize(c.type);
  b->sendBytes = sendElems * esz;
  b->recvBytes = recvElems * esz;
  Buffer hostSend(b->sendBytes);
  fillInput(c, rank, sendElems, hostSend.data());
  const size_t big = std::max(b->sendBytes, b->recvBytes);
  b->devBig = guardedMalloc(big);
  ASSERT_NE(b->devBig, nullptr);
  CUDA_ASSERT(cudaMemset(b->devBig, 0xff, big));
  const long off = inPlaceOffset(c, rank, groupRank);
  b->inPlace = off >= 0;
  if (b->inPlace) {
    if (c.op == Op::kQgz) {
      b->send = b->devBig;
      b->recv = b->devBig + off * esz;
    } else {
      b->recv = b->devBig;
      b->send = b->devBig + off * esz;
    }
  } else {
    b->devOther = guardedMalloc(c.op == Op::kQgz ? b->recvBytes : b->sendBytes);
    ASSERT_NE(b->devOther, nullptr);
    if (c.op == Op::kQgz) {
      b->send = b->devBig;
      b->recv = b->devOther;
      CUDA_ASSERT(cudaMemset(b->devOther, 0xff, b->recvBytes));
    } else {
      b->send = b->devOther;
      b->recv = b->devBig;
    }
  }
  CUDA_ASSERT(cudaMemcpy(b->send, hostSend.data(), b->sendBytes, cudaMemcpyHostToDevice));
  b->input = std::move(hostSend);
  // The streams below do not wait for the legacy default stream, and a pageable cudaMemcpy may return before
  // its DMA lands: without this the collective could read the tail of its input before it arrives (seen once:
  // a qgZ rank's output wrong from one block to the end).
  CUDA_ASSERT(cudaDeviceSynchronize());
}

// Waits for `stream`, copies the output back and frees the buffers.
void collectCase(CaseBuffers* b, cudaStream_t stream, Buffer* result) {
  CUDA_ASSERT(cudaStreamSynchronize(stream));
  result->resize(b->recvBytes);
  CUDA_ASSERT(cudaMemcpy(result->data(), b->recv, b->recvBytes, cudaMemcpyDeviceToHost));
  if (!b->inPlace && b->sendBytes > 0) {
    Buffer input(b->sendBytes);
    CUDA_ASSERT(cudaMemcpy(input.data(), b->send, b->sendBytes, cudaMemcpyDeviceToHost));
    EXPECT_TRUE(std::memcmp(input.data(), b->input.data(), b->sendBytes) == 0) << "the call changed its input";
  }
  const size_t big = std::max(b->sendBytes, b->recvBytes);
  guardedFree(b->devBig, big, b->devOther == nullptr ? "in-place buffer" : b->send == b->devBig ? "send" : "recv");
  guardedFree(b->devOther, b->devBig == b->send ? b->recvBytes : b->sendBytes, b->devBig == b->send ? "recv" : "send");
  *b = CaseBuffers();
}

// Captures `c` on b's buffers into a graph on `stream`, after reserving scratch for `reserveBytes` (a call inside
// capture may not size it).
void captureCase(const Case& c, zpComm_t comm, const CaseBuffers& b, size_t reserveBytes, cudaStream_t stream,
                 cudaGraph_t* graph, cudaGraphExec_t* exec) {
  ASSERT_EQ(zpCommReserve(comm, reserveBytes), zpSuccess) << zpGetLastError(comm);
  CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const zpResult_t res = runCase(c, comm, b.send, b.recv, stream);
  CUDA_ASSERT(cudaStreamEndCapture(stream, graph));
  ASSERT_EQ(res, zpSuccess) << zpGetLastError(comm);
  CUDA_ASSERT(cudaGraphInstantiate(exec, *graph, 0));
}

void deviceRun(const Case& c, int rank, zpComm_t comm, Buffer* result, int replays = 0) {
  CaseBuffers b;
  prepareCase(c, rank, comm, &b);
  cudaStream_t stream;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  if (replays == 0) {
    ASSERT_EQ(runCase(c, comm, b.send, b.recv, stream), zpSuccess) << zpGetLastError(comm);
  } else {
    // Capture once (scratch reserved beforehand), replay on the same inputs: every replay must give the bits.
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    captureCase(c, comm, b, b.recvBytes * 2 + b.sendBytes, stream, &graph, &exec);
    if (::testing::Test::HasFatalFailure()) return;
    for (int i = 0; i < replays; ++i) {
      if (!b.inPlace) CUDA_ASSERT(cudaMemsetAsync(b.recv, 0xff, b.recvBytes, stream));
      CUDA_ASSERT(cudaGraphLaunch(exec, stream));
    }
    CUDA_ASSERT(cudaGraphExecDestroy(exec));
    CUDA_ASSERT(cudaGraphDestroy(graph));
  }
  collectCase(&b, stream, result);
  CUDA_ASSERT(cudaStreamDestroy(stream));
}

// One communicator over the first nranks GPUs, a thread each; body runs on every rank.
void runGpuRanks(int nranks, const zptest::ConfigureFn& configure, const zptest::RankFn& body) {
  zpUniqueId id;
  ASSERT_EQ(zpGetUniqueId(&id), zpSuccess);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < nranks; ++rank) {
    threads.emplace_back([&, rank] {
      ASSERT_EQ(cudaSetDevice(rank), cudaSuccess);
      zpConfig_t config = ZP_CONFIG_INITIALIZER;
      config.backend = zpBackendCuda;
      if (configure) configure(rank, &config);
      zpComm_t comm = nullptr;
      ASSERT_EQ(zpCommInitRankConfig(&comm, nranks, id, rank, &config), zpSuccess) << zpGetLastError(nullptr);
      body(rank, comm);
      EXPECT_EQ(zpCommDestroy(comm), zpSuccess) << zpGetLastError(nullptr);
    });
  }
  for (auto& t : threads) t.join();
}

// Every case on one communicator (NCCL init costs far more than a small case), each compared with the host
// backend's output on the same inputs.
void checkAgainstHost(const std::vector<Case>& cases, int nranks, const zptest::ConfigureFn& configure,
                      int replays = 0) {
  std::vector<std::vector<Buffer>> expected;
  for (const Case& c : cases) expected.push_back(hostExpected(c, nranks, configure));
  std::vector<std::vector<Buffer>> actual(cases.size());
  for (auto& perRank : actual) perRank.resize(nranks);
  runGpuRanks(nranks, configure, [&](int rank, zpComm_t comm) {
    for (size_t i = 0; i < cases.size(); ++i) {
      SCOPED_TRACE(describe(cases[i]));
      deviceRun(cases[i], rank, comm, &actual[i][rank], replays);
    }
  });
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(describe(cases[i]));
    for (int r = 0; r < nranks; ++r) {
      ASSERT_EQ(actual[i][r].size(), expected[i][r].size()) << "rank " << r;
      EXPECT_TRUE(zpcheck::sameBits(actual[i][r].data(), expected[i][r].data(), actual[i][r].size(), 1))
          << "rank " << r;
    }
  }
}

std::vector<Case> sweep(Op op, std::initializer_list<size_t> counts) {
  std::vector<Case> cases;
  for (zpDataType_t type : zpcheck::kQuantTypes)
    for (int bits : {8, 4})
      for (size_t count : counts)
        for (bool inPlace : {false, true}) {
          cases.push_back({op, type, bits, count, inPlace});
          if (op == Op::kQgz || op == Op::kAllReduce) cases.push_back({op, type, bits, count, inPlace, zpAvg});
        }
  return cases;
}

// ---- lifecycle ---------------------------------------------------------------------------------------------

TEST(GpuLifecycle, InitQueriesDestroyOnOneAndTwoGpus) {
  ZP_REQUIRE_GPUS(1);
  for (int nranks = 1; nranks <= std::min(2, zptest::gpuCount()); ++nranks) {
    std::atomic<int> ok{0};
    runGpuRanks(nranks, nullptr, [&](int rank, zpComm_t comm) {
      int value = -1;
      EXPECT_EQ(zpCommCount(comm, &value), zpSuccess);
      EXPECT_EQ(value, nranks);
      EXPECT_EQ(zpCommCuDevice(comm, &value), zpSuccess);
      EXPECT_EQ(value, rank);
      EXPECT_EQ(zpCommNodeCount(comm, &value), zpSuccess);
      EXPECT_EQ(value, 1);
      EXPECT_EQ(zpCommLocalSize(comm, &value), zpSuccess);
      EXPECT_EQ(value, nranks);
      zpResult_t async = zpInternalError;
      EXPECT_EQ(zpCommGetAsyncError(comm, &async), zpSuccess);
      EXPECT_EQ(async, zpSuccess);
      ok++;
    });
    EXPECT_EQ(ok.load(), nranks);
  }
}

TEST(GpuLifecycle, EmulatedTwoNodesSplitGroups) {
  ZP_REQUIRE_GPUS(2);
  runGpuRanks(
      2, [](int, zpConfig_t* c) { c->ranksPerNode = 1; },
      [](int rank, zpComm_t comm) {
        int nodes = 0, node = -1, local = -1, hpz = 0;
        EXPECT_EQ(zpCommNodeCount(comm, &nodes), zpSuccess);
        EXPECT_EQ(zpCommNodeRank(comm, &node), zpSuccess);
        EXPECT_EQ(zpCommLocalRank(comm, &local), zpSuccess);
        EXPECT_EQ(zpCommHpzSize(comm, &hpz), zpSuccess);
        EXPECT_EQ(nodes, 2);
        EXPECT_EQ(node, rank);
        EXPECT_EQ(local, 0);
        EXPECT_EQ(hpz, 1);
      });
}

TEST(GpuLifecycle, BadBuffersKeepTheCommunicatorUsable) {
  ZP_REQUIRE_GPUS(1);
  runGpuRanks(1, nullptr, [](int, zpComm_t comm) {
    std::vector<uint16_t> hostBuf(1024);
    void* dev = nullptr;
    ASSERT_EQ(cudaMalloc(&dev, 4096), cudaSuccess);
    EXPECT_EQ(zpQuantAllGather(hostBuf.data(), dev, 256, zpBfloat16, comm, nullptr), zpInvalidArgument);
    EXPECT_NE(strstr(zpGetLastError(comm), "sendbuff is host memory"), nullptr) << zpGetLastError(comm);
    EXPECT_EQ(zpQuantAllGather(dev, static_cast<char*>(dev) + 1, 256, zpBfloat16, comm, nullptr), zpInvalidArgument);
    EXPECT_EQ(zpQuantAllGather(dev, static_cast<char*>(dev) + 2048, 256, zpBfloat16, comm, nullptr), zpSuccess)
        << zpGetLastError(comm);
    EXPECT_STREQ(zpGetLastError(comm), "");
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaFree(dev);
  });
}

// ---- collectives against the host backend ---------------------------------------------------------------------

TEST(GpuQwz, MatchesHostBackendBitForBit) {
  ZP_REQUIRE_GPUS(2);
  checkAgainstHost(sweep(Op::kQwz, {1, 4097, 300001}), 2, nullptr);
}

TEST(GpuQgz, MatchesHostBackendBitForBit) {
  ZP_REQUIRE_GPUS(2);
  checkAgainstHost(sweep(Op::kQgz, {1, 257, 100003}), 2, nullptr);
}

TEST(GpuQgz, EmulatedTwoNodesMatchHost) {
  ZP_REQUIRE_GPUS(2);
  checkAgainstHost(sweep(Op::kQgz, {255, 70001}), 2, [](int, zpConfig_t* c) { c->ranksPerNode = 1; });
}

// The all-reduce: counts of n whole shards (worked where they lie) and others (through the padded copy), fewer
// elements than ranks included; every rank's output bit-identical to the host backend's, so to each other.
TEST(GpuAllReduce, MatchesHostBackendBitForBit) {
  ZP_REQUIRE_GPUS(2);
  checkAgainstHost(sweep(Op::kAllReduce, {1, 257, 4097, 131072, 100003}), 2, nullptr);
}

TEST(GpuAllReduce, EmulatedTwoNodesMatchHost) {
  ZP_REQUIRE_GPUS(2);
  checkAgainstHost(sweep(Op::kAllReduce, {255, 70001}), 2, [](int, zpConfig_t* c) { c->ranksPerNode = 1; });
}

TEST(GpuHpz, ExactOnOneNodeAndAsTwoNodes) {
  ZP_REQUIRE_GPUS(2);
  std::vector<Case> cases;
  for (zpDataType_t type : {zpInt8, zpBfloat16, zpFloat32, zpFloat64})
    for (bool inPlace : {false, true}) cases.push_back({Op::kHpz, type, 0, 100003, inPlace});
  cases.push_back({Op::kHpz, zpBfloat16, 8, 100003, false});  // the optional quantized mode
  cases.push_back({Op::kHpz, zpFloat16, 4, 4097, true});
  checkAgainstHost(cases, 2, nullptr);
  checkAgainstHost(cases, 2, [](int, zpConfig_t* c) { c->ranksPerNode = 1; });  // hpZ group of one: a copy
}

// A few calls of each collective, small enough to run under compute-sanitizer's tools in seconds (the sweeps
// above take minutes there): tools/gpu-check.sh runs them under memcheck, racecheck, initcheck and synccheck.
// NaN, Inf, huge values and denormals in the inputs, out of place and in place, on one node and as two. Buffers
// end exactly where their allocations do (deviceRun allocates each one at its size).
std::vector<Case> sanitizedCases() {
  std::vector<Case> cases = {
      {Op::kQwz, zpBfloat16, 8, 4097, false},       {Op::kQwz, zpFloat16, 4, 257, true},
      {Op::kQgz, zpBfloat16, 4, 4097, false},       {Op::kQgz, zpFloat32, 8, 255, true, zpAvg},
      {Op::kHpz, zpBfloat16, 0, 4097, false},       {Op::kHpz, zpFloat16, 8, 1001, true},
      {Op::kAllReduce, zpBfloat16, 4, 4097, false}, {Op::kAllReduce, zpFloat32, 8, 1024, true, zpAvg}};
  for (Case& c : cases) c.specials = true;
  return cases;
}
const auto kOneRankPerNode = [](int, zpConfig_t* c) { c->ranksPerNode = 1; };

TEST(GpuSanitized, EachCollectiveOnSmallCases) {
  ZP_REQUIRE_GPUS(2);
  const std::vector<Case> cases = sanitizedCases();
  checkAgainstHost(cases, 2, nullptr);
  checkAgainstHost({cases[2], cases[3], cases[6], cases[7]}, 2, kOneRankPerNode);
}

TEST(GpuPipeline, ChunkedLargeCallsMatchHost) {
  ZP_REQUIRE_GPUS(2);
  // Large enough for several pipeline chunks (64 MiB logical each by default).
  checkAgainstHost({{Op::kQwz, zpBfloat16, 8, size_t{40} << 20, false},
                    {Op::kQgz, zpBfloat16, 4, size_t{40} << 20, true},
                    {Op::kAllReduce, zpBfloat16, 4, (size_t{80} << 20) + 3, true}},
                   2, nullptr);
}

TEST(GpuGraphs, CapturedCollectivesReplayToTheSameBits) {
  ZP_REQUIRE_GPUS(2);
  checkAgainstHost({{Op::kQwz, zpFloat16, 8, 50001, false},
                    {Op::kQgz, zpBfloat16, 4, 50001, false, zpAvg},
                    {Op::kHpz, zpFloat32, 0, 50001, true},
                    {Op::kAllReduce, zpBfloat16, 4, 100003, false, zpAvg}},
                   2, nullptr, /*replays=*/5);
}

TEST(GpuGraphs, CapturedPipelinesReplayToTheSameBits) {
  ZP_REQUIRE_GPUS(2);
  // Two or more chunks: the captured graph holds the three stage streams, green-context ones included.
  checkAgainstHost(
      {{Op::kQwz, zpBfloat16, 4, size_t{36} << 20, true}, {Op::kQgz, zpFloat16, 8, size_t{36} << 20, false}}, 2,
      nullptr, /*replays=*/2);
}

// A graph captured before a later, larger call stays valid and replays to the host backend's bits on new inputs.
// On one rank the larger call grows the scratch memory, which retires the buffers the capture used instead of
// freeing them (NCCL's exchange over one rank is a copy, so the one-rank pipeline runs through scratch). On two
// ranks of one node the captured call is a direct-load call (src/cuda/peer_window.h): the larger call would grow the
// window, which is frozen instead, and it takes NCCL's path. Allocations made right after the larger call are where
// a freed buffer would be reused: the replay must leave them alone. A call of the captured size after the replay
// still takes the frozen window's direct path, whose flags the replay advanced.
void replayAfterLargerCall(int nranks) {
  for (Op op : {Op::kQgz, Op::kQwz}) {
    const Case captured{op, zpBfloat16, 4, size_t{1} << 20, false};
    Case larger = captured, replayed = captured;
    larger.count = size_t{24} << 20;  // scratch 1 MiB -> 13 MiB and more
    replayed.seed = 99;
    SCOPED_TRACE(describe(captured));
    const std::vector<Buffer> expected = hostExpected(replayed, nranks, nullptr);
    const std::vector<Buffer> expectedLarger = hostExpected(larger, nranks, nullptr);
    const std::vector<Buffer> expectedAfter = hostExpected(captured, nranks, nullptr);
    runGpuRanks(nranks, nullptr, [&](int rank, zpComm_t comm) {
      CaseBuffers b;
      prepareCase(captured, rank, comm, &b);
      cudaStream_t stream;
      CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      captureCase(captured, comm, b, b.recvBytes + b.sendBytes, stream, &graph, &exec);
      if (::testing::Test::HasFatalFailure()) return;

      Buffer output;
      deviceRun(larger, rank, comm, &output);  // grows the scratch, or would grow the window, that the graph holds
      EXPECT_TRUE(zpcheck::sameBits(output.data(), expectedLarger[rank].data(), output.size(), 1)) << "rank " << rank;
      std::vector<void*> squatters;
      for (size_t mib : kSquatterMiB) {
        void* p = nullptr;
        CUDA_ASSERT(cudaMalloc(&p, mib << 20));
        CUDA_ASSERT(cudaMemset(p, kSquatterByte, mib << 20));
        squatters.push_back(p);
      }

      Buffer input(b.sendBytes);
      fillInput(replayed, rank, b.sendBytes / zp::typeSize(replayed.type), input.data());
      CUDA_ASSERT(cudaMemcpy(b.send, input.data(), input.size(), cudaMemcpyHostToDevice));
      b.input = std::move(input);  // what the replay must leave in place
      CUDA_ASSERT(cudaMemset(b.recv, 0xff, b.recvBytes));
      CUDA_ASSERT(cudaGraphLaunch(exec, stream));
      collectCase(&b, stream, &output);
      EXPECT_TRUE(zpcheck::sameBits(output.data(), expected[rank].data(), output.size(), 1)) << "rank " << rank;
      size_t i = 0;
      for (size_t mib : kSquatterMiB) {
        std::vector<unsigned char> bytes(mib << 20);
        CUDA_ASSERT(cudaMemcpy(bytes.data(), squatters[i], bytes.size(), cudaMemcpyDeviceToHost));
        EXPECT_EQ(std::count(bytes.begin(), bytes.end(), kSquatterByte), static_cast<long>(bytes.size()))
            << "the replay wrote into memory allocated after the larger call (allocation " << i << ", rank " << rank
            << ")";
        CUDA_ASSERT(cudaFree(squatters[i++]));
      }
      deviceRun(captured, rank, comm, &output);
      EXPECT_TRUE(zpcheck::sameBits(output.data(), expectedAfter[rank].data(), output.size(), 1)) << "rank " << rank;
      CUDA_ASSERT(cudaGraphExecDestroy(exec));
      CUDA_ASSERT(cudaGraphDestroy(graph));
      CUDA_ASSERT(cudaStreamDestroy(stream));
    });
  }
}

TEST(GpuGraphs, GrowthAfterCaptureKeepsTheCapturedScratch) {
  ZP_REQUIRE_GPUS(1);
  replayAfterLargerCall(1);
}

TEST(GpuGraphs, LargerCallAfterCaptureFreezesTheDirectLoadWindow) {
  ZP_REQUIRE_GPUS(2);
  replayAfterLargerCall(2);
}

// Two communicators of the same two GPUs, each driven by a thread of its own on its own stream, with both calls
// in flight at once. As NCCL requires of concurrent communicators, every rank enqueues them in the same order (A,
// then B: B's thread waits until A's call is enqueued) and makes no device-synchronizing call (allocation, a
// legacy-stream memset or copy) while they run: a GPU may otherwise wait inside such a call for a kernel that
// waits for the other rank, which waits likewise (one thread uploading its inputs while the other's collective
// runs hangs that way).
TEST(GpuConcurrency, TwoCommunicatorsInFlightOnDifferentStreams) {
  ZP_REQUIRE_GPUS(2);
  const Case c{Op::kQwz, zpBfloat16, 8, 1 << 20, false};
  std::vector<Buffer> expected = hostExpected(c, 2, nullptr);
  std::vector<Buffer> a(2), b(2);
  zpUniqueId idA, idB;
  ASSERT_EQ(zpGetUniqueId(&idA), zpSuccess);
  ASSERT_EQ(zpGetUniqueId(&idB), zpSuccess);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      ASSERT_EQ(cudaSetDevice(rank), cudaSuccess);
      zpComm_t commA = nullptr, commB = nullptr;
      ASSERT_EQ(zpCommInitRank(&commA, 2, idA, rank), zpSuccess);
      ASSERT_EQ(zpCommInitRank(&commB, 2, idB, rank), zpSuccess);
      CaseBuffers bufA, bufB;
      prepareCase(c, rank, commA, &bufA);
      prepareCase(c, rank, commB, &bufB);
      const zptest::Stream ownA, ownB;
      const cudaStream_t streamA = ownA.get(), streamB = ownB.get();
      ASSERT_TRUE(streamA != nullptr && streamB != nullptr);
      std::atomic<bool> aEnqueued{false};
      std::thread other([&] {
        ASSERT_EQ(cudaSetDevice(rank), cudaSuccess);
        while (!aEnqueued.load()) std::this_thread::yield();
        EXPECT_EQ(runCase(c, commB, bufB.send, bufB.recv, streamB), zpSuccess) << zpGetLastError(commB);
      });
      EXPECT_EQ(runCase(c, commA, bufA.send, bufA.recv, streamA), zpSuccess) << zpGetLastError(commA);
      aEnqueued = true;
      other.join();
      collectCase(&bufA, streamA, &a[rank]);
      collectCase(&bufB, streamB, &b[rank]);
      EXPECT_EQ(zpCommDestroy(commA), zpSuccess);
      EXPECT_EQ(zpCommDestroy(commB), zpSuccess);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(zpcheck::sameBits(a[r].data(), expected[r].data(), a[r].size(), 1));
    EXPECT_TRUE(zpcheck::sameBits(b[r].data(), expected[r].data(), b[r].size(), 1));
  }
}

// Holds a stream at a point until the test opens it: the stream waits (cuStreamWaitValue32, a stream memory
// operation, reached through the runtime's driver entry points) for a device word that open() sets from a third
// stream. Lets a test see what another stream does while the held one cannot move.
class StreamGate {
 public:
  StreamGate() {
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", reinterpret_cast<void**>(&wait_), 12000,
                                         cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      wait_ = nullptr;
    }
    if (cudaMalloc(&word_, sizeof(*word_)) != cudaSuccess || cudaMemset(word_, 0, sizeof(*word_)) != cudaSuccess ||
        cudaStreamCreateWithFlags(&opener_, cudaStreamNonBlocking) != cudaSuccess) {
      wait_ = nullptr;
    }
  }
  ~StreamGate() {
    open();
    (void)cudaFree(word_);
    (void)cudaStreamDestroy(opener_);
  }
  bool usable() const { return wait_ != nullptr; }
  // `stream` stops here until open().
  bool hold(cudaStream_t stream) {
    return wait_(reinterpret_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(word_), 1,
                 CU_STREAM_WAIT_VALUE_GEQ) == CUDA_SUCCESS;
  }
  void open() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (word_ == nullptr || opened_) return;
    opened_ = cudaMemsetAsync(word_, 1, 1, opener_) == cudaSuccess && cudaStreamSynchronize(opener_) == cudaSuccess;
  }

 private:
  using WaitFn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
  WaitFn wait_ = nullptr;
  unsigned int* word_ = nullptr;
  cudaStream_t opener_ = nullptr;
  std::mutex mutex_;  // open() may come from two threads
  bool opened_ = false;
};

// One communicator, calls on two streams: a call on stream B starts only after the previous call on stream A (they
// share the communicator's scratch), also when that one was a call of one chunk, which runs wholly on A. Stream A
// is held before its qwZ; B's qgZ must still be pending after B had ample time, and both match the host.
TEST(GpuConcurrency, OneCommunicatorOnTwoStreamsKeepsItsScratchInOrder) {
  ZP_REQUIRE_GPUS(1);
  const Case gather{Op::kQwz, zpBfloat16, 8, 4096, false}, reduce{Op::kQgz, zpBfloat16, 4, 4096, false};
  const std::vector<Buffer> expectGather = hostExpected(gather, 1, nullptr),
                            expectReduce = hostExpected(reduce, 1, nullptr);
  runGpuRanks(1, nullptr, [&](int rank, zpComm_t comm) {
    StreamGate gate;
    if (!gate.usable()) GTEST_SKIP() << "cuStreamWaitValue32 not available";
    // Scratch sized and peers connected first: those are host waits, which would wait for the held stream.
    ASSERT_EQ(zpCommReserve(comm, 64 << 20), zpSuccess) << zpGetLastError(comm);
    CaseBuffers a, b;
    prepareCase(gather, rank, comm, &a);
    prepareCase(reduce, rank, comm, &b);
    const zptest::Stream ownA, ownB;
    const cudaStream_t streamA = ownA.get(), streamB = ownB.get();
    ASSERT_TRUE(streamA != nullptr && streamB != nullptr);
    ASSERT_TRUE(gate.hold(streamA));
    // Should an enqueue below wait for the held stream (it must not), the gate opens after a while: the test then
    // fails instead of hanging.
    std::atomic<bool> enqueued{false}, forced{false};
    std::thread safety([&] {
      for (int i = 0; i < 200 && !enqueued; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (!enqueued) forced = true, gate.open();
    });
    const zpResult_t gatherRes = runCase(gather, comm, a.send, a.recv, streamA);
    const zpResult_t reduceRes = runCase(reduce, comm, b.send, b.recv, streamB);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const cudaError_t bState = cudaStreamQuery(streamB);
    enqueued = true;
    safety.join();
    EXPECT_FALSE(forced.load()) << "an enqueue waited for the held stream";
    EXPECT_EQ(gatherRes, zpSuccess) << zpGetLastError(comm);
    EXPECT_EQ(reduceRes, zpSuccess) << zpGetLastError(comm);
    EXPECT_EQ(bState, cudaErrorNotReady) << "stream B ran while the call before it on A waited";
    gate.open();
    Buffer gathered, reduced;
    collectCase(&a, streamA, &gathered);
    collectCase(&b, streamB, &reduced);
    EXPECT_TRUE(zpcheck::sameBits(gathered.data(), expectGather[0].data(), gathered.size(), 1));
    EXPECT_TRUE(zpcheck::sameBits(reduced.data(), expectReduce[0].data(), reduced.size(), 1));
  });
}

// A call that must wait on the host (here: scratch grows, behind work on a stream that cannot move) gives up
// once another thread aborts the communicator, instead of keeping the abort waiting for it forever (the abort
// waits for running calls to leave; src/cuda/host_wait.h). The held stream is opened only after the call returned.
TEST(GpuAbort, AbortEndsACallWaitingOnTheHost) {
  ZP_REQUIRE_GPUS(1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  zpUniqueId id;
  ASSERT_EQ(zpGetUniqueId(&id), zpSuccess);
  zpConfig_t config = ZP_CONFIG_INITIALIZER;
  config.backend = zpBackendCuda;
  zpComm_t comm = nullptr;
  ASSERT_EQ(zpCommInitRankConfig(&comm, 1, id, 0, &config), zpSuccess) << zpGetLastError(nullptr);
  StreamGate gate;
  if (!gate.usable()) {
    EXPECT_EQ(zpCommDestroy(comm), zpSuccess);
    GTEST_SKIP() << "cuStreamWaitValue32 not available";
  }
  const size_t small = 4096, large = 8 << 20;  // bf16 elements: scratch for the first, then it must grow
  char *send = nullptr, *recv = nullptr;
  CUDA_ASSERT(cudaMalloc(&send, large * 2));
  CUDA_ASSERT(cudaMalloc(&recv, large * 2));
  CUDA_ASSERT(cudaMemset(send, 0, large * 2));
  cudaStream_t stream;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ASSERT_EQ(zpQuantAllGather(send, recv, small, zpBfloat16, comm, stream), zpSuccess) << zpGetLastError(comm);
  CUDA_ASSERT(cudaStreamSynchronize(stream));
  ASSERT_TRUE(gate.hold(stream));
  ASSERT_EQ(zpQuantAllGather(send, recv, small, zpBfloat16, comm, stream), zpSuccess) << zpGetLastError(comm);
  // Should the call not give up, the gate opens anyway after a while (then the timing check below fails).
  std::atomic<bool> returned{false};
  std::thread safety([&] {
    for (int i = 0; i < 200 && !returned; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    gate.open();
  });
  std::atomic<int> aborted{-1};
  std::thread abort([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    aborted = zpCommAbort(comm);  // returns once the held stream drains (freeing memory waits for the device)
  });
  const auto start = std::chrono::steady_clock::now();
  const zpResult_t res = zpQuantAllGather(send, recv, large, zpBfloat16, comm, stream);
  const std::string message = zpGetLastError(nullptr);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  returned = true;
  gate.open();
  abort.join();
  safety.join();
  EXPECT_EQ(res, zpRemoteError);
  EXPECT_NE(message.find("zpQuantAllGather : stopped waiting for"), std::string::npos) << message;
  EXPECT_LT(seconds, 5.0);
  EXPECT_EQ(aborted.load(), zpSuccess);
  CUDA_ASSERT(cudaStreamSynchronize(stream));
  CUDA_ASSERT(cudaStreamDestroy(stream));
  CUDA_ASSERT(cudaFree(send));
  CUDA_ASSERT(cudaFree(recv));
}

// ---- a caller's NCCL communicator -----------------------------------------------------------------------------

}  // namespace

#include <nccl.h>

namespace {

TEST(GpuFromNccl, WrapsTheCallersCommunicatorAndLeavesItAlive) {
  ZP_REQUIRE_GPUS(2);
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  const Case c{Op::kQgz, zpFloat32, 8, 4099, false};
  std::vector<Buffer> expected = hostExpected(c, 2, nullptr);
  std::vector<Buffer> actual(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      ASSERT_EQ(cudaSetDevice(rank), cudaSuccess);
      ncclComm_t nccl = nullptr;
      ASSERT_EQ(ncclCommInitRank(&nccl, 2, id, rank), ncclSuccess);
      zpComm_t comm = nullptr;
      ASSERT_EQ(zpCommInitFromNccl(&comm, nccl, nullptr), zpSuccess) << zpGetLastError(nullptr);
      deviceRun(c, rank, comm, &actual[rank]);
      EXPECT_EQ(zpCommDestroy(comm), zpSuccess);
      // The caller's communicator still works after ours is gone.
      float* buf = nullptr;
      ASSERT_EQ(cudaMalloc(&buf, 2 * sizeof(float)), cudaSuccess);
      EXPECT_EQ(ncclAllReduce(buf, buf, 2, ncclFloat32, ncclSum, nccl, nullptr), ncclSuccess);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      cudaFree(buf);
      EXPECT_EQ(ncclCommDestroy(nccl), ncclSuccess);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(zpcheck::sameBits(actual[r].data(), expected[r].data(), actual[r].size(), 1));
}

// ---- processes with distinct NCCL_HOSTIDs: several nodes -----------------------------------------------------

const char* kChildEnv = "ZP_TEST_CHILD_RANK";
const char* kIdFileEnv = "ZP_TEST_ID_FILE";
const char* kTwoNodesEnv = "ZP_TEST_AS_TWO_NODES";

// In a child process of runNodeProcesses: its index (kChildEnv) and the unique id its parent wrote to the file
// named by kIdFileEnv. -1 in a normal run, where the child tests skip.
int childIndex(zpUniqueId* id) {
  const char* text = getenv(kChildEnv);
  if (text == nullptr) return -1;
  std::ifstream in(getenv(kIdFileEnv), std::ios::binary);
  EXPECT_TRUE(in.read(id->internal, sizeof(id->internal))) << "no unique id in " << getenv(kIdFileEnv);
  return atoi(text);
}

// One rank's part of a case, run in a process or thread of its own: its output equals the host backend's
// (`expected`, this rank's buffer) bit for bit.
void expectRankMatchesHost(const Case& c, int rank, zpComm_t comm, const Buffer& expected) {
  Buffer actual;
  deviceRun(c, rank, comm, &actual);
  ASSERT_EQ(actual.size(), expected.size());
  EXPECT_TRUE(zpcheck::sameBits(actual.data(), expected.data(), actual.size(), 1));
}

// Runs in each child process (skipped in a normal run): one rank on its own GPU and host id.
TEST(GpuTwoProcesses, Child) {
  zpUniqueId id;
  const int rank = childIndex(&id);
  if (rank < 0) GTEST_SKIP() << "runs only inside GpuTwoProcesses.SeenAsTwoNodes";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);  // CUDA_VISIBLE_DEVICES picks this process's GPU
  zpComm_t comm = nullptr;
  ASSERT_EQ(zpCommInitRank(&comm, 2, id, rank), zpSuccess) << zpGetLastError(nullptr);
  int nodes = 0, node = -1;
  EXPECT_EQ(zpCommNodeCount(comm, &nodes), zpSuccess);
  EXPECT_EQ(zpCommNodeRank(comm, &node), zpSuccess);
  EXPECT_EQ(nodes, 2);
  EXPECT_EQ(node, rank);
  for (const Case& c : {Case{Op::kQwz, zpBfloat16, 8, 100003, false}, Case{Op::kQgz, zpFloat16, 4, 100003, true},
                        Case{Op::kHpz, zpFloat32, 0, 1001, false}}) {
    SCOPED_TRACE(describe(c));
    std::vector<Buffer> expected = hostExpected(c, 2, [](int, zpConfig_t* cfg) { cfg->ranksPerNode = 1; });
    expectRankMatchesHost(c, rank, comm, expected[rank]);
  }
  EXPECT_EQ(zpCommDestroy(comm), zpSuccess);
}

// Where runNodeProcesses' children run. Child k of n, with `gpus` GPUs each:
enum class Placement {
  kOwnHost,    // its own GPUs [k * gpus, (k + 1) * gpus) and its own NCCL_HOSTID: NCCL and zpccl see n hosts
  kOneHost,    // its own GPUs, no NCCL_HOSTID: one host, so the processes talk over NVLink
  kSharedGpus  // GPUs [0, gpus), shared with the other children, and its own NCCL_HOSTID. NCCL refuses two ranks
               // of one host on one GPU, not two of different hosts: the host ids let more ranks than GPUs meet
               // (over sockets, each GPU time-sliced among its processes), to test layouts with few GPUs.
};

// Spawns `processes` child processes running `filter`, placed as `placement` says, a child that is a host of its own
// in the link regime of its GPUs (zptest::regimeEnv): "net" with one, every transfer over sockets; "2x2" with
// several, NVLink between them inside its node. Each reads the unique id from a file. Waits for every child and
// expects each to exit 0.
void runNodeProcesses(const char* filter, int processes, int gpus, Placement placement = Placement::kOwnHost) {
  zpUniqueId id;
  ASSERT_EQ(zpGetUniqueId(&id), zpSuccess);
  const std::string idFile = "/tmp/zpccl-test-id-" + std::to_string(getpid());
  std::ofstream(idFile, std::ios::binary).write(id.internal, sizeof(id.internal));
  zptest::runConcurrentChildren(filter, processes, [&](int k) {
    const int firstGpu = placement == Placement::kSharedGpus ? 0 : k * gpus;
    std::string visible;
    for (int g = 0; g < gpus; ++g) visible += (g ? "," : "") + std::to_string(firstGpu + g);
    std::vector<std::string> env = {std::string(kChildEnv) + "=" + std::to_string(k),
                                    std::string(kIdFileEnv) + "=" + idFile, "CUDA_VISIBLE_DEVICES=" + visible};
    if (placement != Placement::kOneHost) {
      const auto regime = gpus == 1 ? zptest::Regime::kNet : zptest::Regime::kNodesOfSeveral;
      for (std::string& e : zptest::regimeEnv(regime, k)) env.push_back(std::move(e));
    }
    return env;
  });
  unlink(idFile.c_str());
}

// A GPU each, or one shared GPU when that is all there is (over sockets either way).
TEST(GpuTwoProcesses, SeenAsTwoNodes) {
  ZP_REQUIRE_GPUS(1);
  if (getenv(kChildEnv)) GTEST_SKIP();
  runNodeProcesses("GpuTwoProcesses.Child", 2, 1,
                   zptest::gpuCount() >= 2 ? Placement::kOwnHost : Placement::kSharedGpus);
}

// The sanitized cases with one process per GPU (one host, NVLink between them; or, below, two hosts on one GPU), the
// shape gpu-check's sanitizer runs use: racecheck, and initcheck with the green context on, stall the in-process
// version, whose two GPUs' NCCL kernels must run at the same time; each process of this one drives one GPU.
TEST(GpuSanitized, Child) {
  zpUniqueId id;
  const int rank = childIndex(&id);
  if (rank < 0) GTEST_SKIP() << "runs only inside the other GpuSanitized tests";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);  // CUDA_VISIBLE_DEVICES picks this process's GPU
  // A unique id serves one communicator: the parent runs the children once per layout.
  const bool asTwoNodes = getenv(kTwoNodesEnv) != nullptr;
  const zptest::ConfigureFn layout = asTwoNodes ? zptest::ConfigureFn(kOneRankPerNode) : nullptr;
  zpConfig_t config = ZP_CONFIG_INITIALIZER;
  if (layout) layout(rank, &config);
  zpComm_t comm = nullptr;
  ASSERT_EQ(zpCommInitRankConfig(&comm, 2, id, rank, &config), zpSuccess) << zpGetLastError(nullptr);
  // Two hosts (NCCL_HOSTID, over sockets) are two nodes whatever the config: every case runs there.
  const bool ownHosts = getenv("NCCL_HOSTID") != nullptr;
  for (const Case& c : sanitizedCases()) {
    // As in EachCollectiveOnSmallCases.
    if (asTwoNodes && !ownHosts && c.op != Op::kQgz && c.op != Op::kAllReduce) continue;
    SCOPED_TRACE(describe(c) + (asTwoNodes ? " as two nodes" : ""));
    expectRankMatchesHost(c, rank, comm, hostExpected(c, 2, layout)[rank]);
  }
  EXPECT_EQ(zpCommDestroy(comm), zpSuccess);
}

TEST(GpuSanitized, EachCollectiveInTwoProcesses) {
  ZP_REQUIRE_GPUS(2);
  if (getenv(kChildEnv)) GTEST_SKIP();
  runNodeProcesses("GpuSanitized.Child", 2, 1, Placement::kOneHost);
  setenv(kTwoNodesEnv, "1", 1);  // the children inherit it: zpccl's two-node layout over the same NVLink
  runNodeProcesses("GpuSanitized.Child", 2, 1, Placement::kOneHost);
  unsetenv(kTwoNodesEnv);
}

// The same cases as two nodes of one rank sharing one GPU (distinct host ids, over sockets), for the tools when
// only one GPU is lent: the multi-node paths (qgZ's pair gather, the own slot worked early with
// ZP_OWN_SLOT_EARLY_BYTES=0, as gpu-check's sanitizer steps set it; hpZ's group of one) and every kernel they
// launch, in place and out.
TEST(GpuSanitized, EachCollectiveAsTwoNodesOnOneGpu) {
  ZP_REQUIRE_GPUS(1);
  if (getenv(kChildEnv)) GTEST_SKIP();
  setenv(kTwoNodesEnv, "1", 1);
  runNodeProcesses("GpuSanitized.Child", 2, 1, Placement::kSharedGpus);
  unsetenv(kTwoNodesEnv);
}

// ---- several nodes of several ranks (issue 9) ---------------------------------------------------------------

const char* kNodeSizesEnv = "ZP_TEST_NODE_SIZES";               // ranks of each node, node-major: "2,2"
const char* kRanksPerProcessEnv = "ZP_TEST_RANKS_PER_PROCESS";  // 1, or 2 (a process a node of two)
const char* kInterleavedEnv = "ZP_TEST_NODES_INTERLEAVED";      // 1: rank r on node r % nodes (equal sizes)

std::vector<int> nodeSizesFromEnv() {
  std::vector<int> sizes;
  std::stringstream list(getenv(kNodeSizesEnv));
  for (std::string item; std::getline(list, item, ',');) sizes.push_back(std::stoi(item));
  return sizes;
}

// The ranks of the layout ZP_TEST_NODE_SIZES, node-major (or interleaved: ZP_TEST_NODES_INTERLEAVED); a child
// process runs ZP_TEST_RANKS_PER_PROCESS of them, a thread and a visible GPU each. With two a process, each process
// is a node of two (its NCCL_HOSTID): qgZ takes its two hops (NVLink inside the node, sockets across) and hpZ
// gathers over the node's two GPUs. With one a process, NCCL sees a host per rank and the config's nodeId groups
// them into zpccl's nodes: every hop goes over sockets, but the code paths are the layout's: two hops over even
// nodes, the flat one-hop path over uneven ones (where hpZ is unavailable and not called). Every output is compared
// with the host backend's in the same layout.
TEST(GpuLayouts, Child) {
  zpUniqueId id;
  const int process = childIndex(&id);
  if (process < 0) GTEST_SKIP() << "runs only inside the other GpuLayouts tests";
  const int perProcess = atoi(getenv(kRanksPerProcessEnv));
  ASSERT_TRUE(perProcess == 1 || perProcess == 2) << kRanksPerProcessEnv << " must be 1 or 2";
  const std::vector<int> sizes = nodeSizesFromEnv();
  std::vector<int> nodeOf;
  for (size_t node = 0; node < sizes.size(); ++node) nodeOf.insert(nodeOf.end(), sizes[node], static_cast<int>(node));
  const int nranks = static_cast<int>(nodeOf.size());
  const bool even = std::count(sizes.begin(), sizes.end(), sizes[0]) == static_cast<long>(sizes.size());
  if (getenv(kInterleavedEnv) != nullptr) {
    ASSERT_TRUE(even && perProcess == 1) << kInterleavedEnv << " takes nodes of equal sizes, a rank a process";
    for (int r = 0; r < nranks; ++r) nodeOf[r] = r % static_cast<int>(sizes.size());
  }
  const auto layout = [&](int rank, zpConfig_t* cfg) { cfg->nodeId = nodeOf[rank]; };
  std::vector<Case> cases = {{Op::kQwz, zpBfloat16, 8, 100003, false},
                             {Op::kQwz, zpFloat16, 4, 4097, true},
                             {Op::kQgz, zpBfloat16, 4, 100003, false},
                             {Op::kQgz, zpFloat32, 8, 257, true, zpAvg},
                             {Op::kQgz, zpFloat16, 4, 1, false},
                             {Op::kAllReduce, zpBfloat16, 4, 100003, false},
                             {Op::kAllReduce, zpFloat32, 8, 4096, true, zpAvg}};
  cases[2].specials = true;
  cases[5].specials = true;
  if (even) {
    cases.insert(cases.end(), {{Op::kHpz, zpBfloat16, 0, 100003, false},
                               {Op::kHpz, zpInt8, 0, 4097, true},
                               {Op::kHpz, zpFloat16, 8, 4097, false}});
  }
  std::vector<std::vector<Buffer>> expected;
  for (const Case& c : cases) expected.push_back(hostExpected(c, nranks, layout));
  std::vector<std::thread> threads;
  for (int local = 0; local < perProcess; ++local) {
    threads.emplace_back([&, local] {
      const int rank = perProcess * process + local;
      ASSERT_EQ(cudaSetDevice(local), cudaSuccess);
      // Two ranks a process: the host ids make the nodes. One: only the config can.
      zpConfig_t config = ZP_CONFIG_INITIALIZER;
      if (perProcess == 1) layout(rank, &config);
      zpComm_t comm = nullptr;
      ASSERT_EQ(zpCommInitRankConfig(&comm, nranks, id, rank, &config), zpSuccess) << zpGetLastError(nullptr);
      int nodes = 0, localSize = 0, hpz = 0;
      EXPECT_EQ(zpCommNodeCount(comm, &nodes), zpSuccess);
      EXPECT_EQ(zpCommLocalSize(comm, &localSize), zpSuccess);
      EXPECT_EQ(nodes, static_cast<int>(sizes.size()));
      EXPECT_EQ(localSize, sizes[nodeOf[rank]]);
      if (even) {
        EXPECT_EQ(zpCommHpzSize(comm, &hpz), zpSuccess);
        EXPECT_EQ(hpz, sizes[0]);
      }
      for (size_t i = 0; i < cases.size(); ++i) {
        SCOPED_TRACE(describe(cases[i]) + " rank " + std::to_string(rank));
        expectRankMatchesHost(cases[i], rank, comm, expected[i][rank]);
      }
      EXPECT_EQ(zpCommDestroy(comm), zpSuccess);
    });
  }
  for (auto& t : threads) t.join();
}

// Runs the layout `nodeSizes` in child processes of `perProcess` ranks each, where at least `gpus` GPUs are.
void runLayout(const char* nodeSizes, int perProcess, Placement placement, int gpus) {
  ZP_REQUIRE_GPUS(gpus);
  if (getenv(kChildEnv)) GTEST_SKIP();
  int nranks = 0;
  for (const char* c = nodeSizes; *c; ++c) nranks += *c == ',' ? 0 : *c - '0';  // one-digit sizes
  // The children inherit both.
  setenv(kNodeSizesEnv, nodeSizes, 1);
  setenv(kRanksPerProcessEnv, std::to_string(perProcess).c_str(), 1);
  runNodeProcesses("GpuLayouts.Child", nranks / perProcess, perProcess, placement);
  unsetenv(kNodeSizesEnv);
  unsetenv(kRanksPerProcessEnv);
}

// Two nodes of two as the layout deploys: two processes of two GPUs each.
TEST(GpuLayouts, TwoNodesOfTwoOnFourGpus) { runLayout("2,2", 2, Placement::kOwnHost, 4); }

// Two such processes sharing two GPUs: NVLink inside each node, sockets between nodes, as on four GPUs.
TEST(GpuLayouts, TwoNodesOfTwoOnTwoGpus) { runLayout("2,2", 2, Placement::kSharedGpus, 2); }

// The rest: a process per rank, all sharing one GPU, every hop over sockets.
TEST(GpuLayouts, TwoNodesOfTwoOnOneGpu) { runLayout("2,2", 1, Placement::kSharedGpus, 1); }

// Two nodes of two whose ranks interleave (node 0: ranks 0 and 2): the two-hop paths' slots and groups in an order
// other than the ranks'.
TEST(GpuLayouts, InterleavedNodesOfTwoOnOneGpu) {
  setenv(kInterleavedEnv, "1", 1);
  runLayout("2,2", 1, Placement::kSharedGpus, 1);
  unsetenv(kInterleavedEnv);
}

// Two hops over three nodes: each inter-node all-to-all has two peers.
TEST(GpuLayouts, ThreeNodesOfTwoOnOneGpu) { runLayout("2,2,2", 1, Placement::kSharedGpus, 1); }

// Uneven nodes: the flat one-hop paths.
TEST(GpuLayouts, UnevenNodesOnOneGpu) { runLayout("2,1", 1, Placement::kSharedGpus, 1); }

// Two nodes of two again, every call cut into chunks of 64 KiB (the children and their host references read the
// tunables afresh): qgZ's two hops and the all-reduce's two-hop gather pipelined over several chunks.
TEST(GpuLayouts, TwoNodesOfTwoInChunksOnOneGpu) {
  setenv("ZP_CHUNK_BYTES", "65536", 1);
  setenv("ZP_MAX_CHUNKS", "16", 1);
  runLayout("2,2", 1, Placement::kSharedGpus, 1);
  unsetenv("ZP_CHUNK_BYTES");
  unsetenv("ZP_MAX_CHUNKS");
}

// ---- reliability (issue 10): replays on changing data, and a soak ---------------------------------------------

// The first call of each collective captured in a graph (scratch reserved beforehand), then replayed 1000 times
// on changing data: before each replay the inputs are rewritten in place, and every replay's output is checked
// against the host backend on the same inputs.
TEST(GpuReliability, CapturedFirstCallReplayedOnChangingData) {
  ZP_REQUIRE_GPUS(2);
  const int replays = getenv("ZP_GRAPH_REPLAYS") ? atoi(getenv("ZP_GRAPH_REPLAYS")) : 1000;
  for (Case base :
       {Case{Op::kQwz, zpBfloat16, 8, 1031, false}, Case{Op::kQgz, zpFloat16, 4, 1031, true, zpAvg},
        Case{Op::kHpz, zpFloat32, 0, 1031, false}, Case{Op::kAllReduce, zpBfloat16, 4, 1031, false, zpAvg}}) {
    SCOPED_TRACE(describe(base));
    std::vector<std::vector<Buffer>> expected(replays);
    for (int k = 0; k < replays; ++k) {
      Case c = base;
      c.seed = 1000 + k;
      expected[k] = hostExpected(c, 2, nullptr);
    }
    std::atomic<int> wrong{0};
    runGpuRanks(2, nullptr, [&](int rank, zpComm_t comm) {
      size_t sendElems = 0, recvElems = 0;
      sizes(base, 2, 2, &sendElems, &recvElems);
      const size_t esz = zp::typeSize(base.type);
      char* big = nullptr;
      char* other = nullptr;
      ASSERT_EQ(cudaMalloc(&big, std::max(sendElems, recvElems) * esz), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&other, std::max(sendElems, recvElems) * esz), cudaSuccess);
      const long off = inPlaceOffset(base, rank, rank);
      void* send = base.op == Op::kQgz ? static_cast<void*>(big) : (off >= 0 ? big + off * esz : other);
      void* recv = base.op == Op::kQgz ? (off >= 0 ? big + off * esz : other) : static_cast<void*>(big);
      cudaStream_t stream;
      ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
      ASSERT_EQ(zpCommReserve(comm, 1 << 20), zpSuccess) << zpGetLastError(comm);
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
      const zpResult_t captured = runCase(base, comm, send, recv, stream);
      ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
      ASSERT_EQ(captured, zpSuccess) << zpGetLastError(comm);
      ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
      Buffer input(sendElems * esz), output(recvElems * esz);
      for (int k = 0; k < replays; ++k) {
        Case c = base;
        c.seed = 1000 + k;
        fillInput(c, rank, sendElems, input.data());
        ASSERT_EQ(cudaMemcpyAsync(send, input.data(), input.size(), cudaMemcpyHostToDevice, stream), cudaSuccess);
        if (off < 0) {
          ASSERT_EQ(cudaMemsetAsync(recv, 0xff, output.size(), stream), cudaSuccess);
        }
        ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
        ASSERT_EQ(cudaMemcpyAsync(output.data(), recv, output.size(), cudaMemcpyDeviceToHost, stream), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        if (memcmp(output.data(), expected[k][rank].data(), output.size()) != 0 && wrong++ < 3) {
          ADD_FAILURE() << "replay " << k << " rank " << rank << " differs from the host backend";
        }
      }
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      cudaStreamDestroy(stream);
      cudaFree(big);
      cudaFree(other);
    });
    EXPECT_EQ(wrong.load(), 0);
  }
}

// 10^3 random calls (collective, type, bits, size, in place, op, data with NaN, Inf, huge values and denormals in
// half of them) on two GPUs, each bit-equal to the host backend; device memory stays flat once scratch has grown to the
// largest size.
TEST(GpuReliability, SoakOfRandomCallsStaysExactAndFlat) {
  ZP_REQUIRE_GPUS(2);
  const int iterations = getenv("ZP_GPU_SOAK_ITERS") ? atoi(getenv("ZP_GPU_SOAK_ITERS")) : 1000;
  std::mt19937_64 rng(2026);
  std::vector<Case> cases;
  const zpDataType_t exactTypes[] = {zpInt8, zpInt32, zpFloat16, zpBfloat16, zpFloat32, zpFloat64};
  for (int i = 0; i < iterations; ++i) {
    Case c{static_cast<Op>(rng() % 4),
           zpcheck::kQuantTypes[rng() % 3],
           rng() % 2 ? 8 : 4,
           1 + rng() % 5000,
           rng() % 2 == 0,
           rng() % 2 ? zpSum : zpAvg,
           5000 + static_cast<uint64_t>(i)};
    if (c.op == Op::kHpz) {
      c.type = exactTypes[rng() % 6];
      c.bits = 0;
    }
    c.specials = rng() % 2 == 0;
    if (i == 0) c.count = 5000;  // the largest first: scratch grows once
    cases.push_back(c);
  }
  size_t freeBefore = 0, freeAfter = 0, total = 0;
  checkAgainstHost({cases[0]}, 2, nullptr);
  ASSERT_EQ(cudaMemGetInfo(&freeBefore, &total), cudaSuccess);
  checkAgainstHost(cases, 2, nullptr);
  ASSERT_EQ(cudaMemGetInfo(&freeAfter, &total), cudaSuccess);
  EXPECT_LT(static_cast<double>(freeBefore) - static_cast<double>(freeAfter), 64.0 * (1 << 20))
      << "device memory grew across the soak";
}

}  // namespace
