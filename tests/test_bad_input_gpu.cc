// The cuda backend's own buffer checks, as a table like test_bad_input.cc's (which covers every other argument
// on the host backend): every call with buffers refuses a host pointer ("host memory") and, with two GPUs, a
// buffer of GPU 1 passed to a communicator of GPU 0 ("another CUDA device"), with zpInvalidArgument and a
// message naming the call and the argument; after every row a good zpQuantAllGather on the same communicator
// succeeds and leaves zpGetLastError(comm) "". Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "include/zpccl.h"
#include "tests/buffer_calls.h"
#include "tests/gpu_util.h"

// In zptest: the table speaks of tests/buffer_calls.h's calls by their short names.
namespace zptest {
namespace {

constexpr size_t kCount = 1024;             // fp32 elements of the calls
constexpr size_t kBytes = size_t{1} << 16;  // every buffer: room for elements and payloads

// Device memory of one GPU, freed on that GPU.
class DeviceBuffer {
 public:
  DeviceBuffer(int device, size_t bytes) : device_(device) {
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(device);
    if (cudaMalloc(&ptr_, bytes) != cudaSuccess) ptr_ = nullptr;
    if (ptr_ != nullptr) cudaMemset(ptr_, 0, bytes);
    cudaDeviceSynchronize();
    cudaSetDevice(previous);
  }
  ~DeviceBuffer() {
    if (ptr_ == nullptr) return;
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(device_);
    cudaFree(ptr_);
    cudaSetDevice(previous);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  unsigned char* get() const { return static_cast<unsigned char*>(ptr_); }

 private:
  int device_;
  void* ptr_ = nullptr;
};

// Where a bad buffer comes from.
enum class Source { kHost, kOtherGpu };

// What a row's call gets: good device buffers of the communicator's GPU, and the bad buffer.
struct Ctx {
  zpComm_t comm;
  unsigned char* send;     // device, kBytes
  unsigned char* recv;     // device, kBytes
  unsigned char* payload;  // device, kBytes
  unsigned char* bad;      // host or another GPU's memory, kBytes
};

struct Row {
  std::string name;
  Source source;
  std::function<zpResult_t(const Ctx&)> call;
  zpResult_t code;
  std::vector<std::string> mention;
};

// The good buffers of a call: its payload where it takes one, else its elements.
const unsigned char* goodSend(Call call, const Ctx& c) { return sendIsPayload(call) ? c.payload : c.send; }
unsigned char* goodRecv(Call call, const Ctx& c) { return recvIsPayload(call) ? c.payload : c.recv; }

zpResult_t invoke(Call call, const void* send, void* recv, zpComm_t comm) {
  const zpQuantOptions_t options = {8, 256};
  switch (call) {
    case Call::kQuantize:
      return zpQuantize(send, recv, kCount, zpFloat32, 8, 256, comm, nullptr);
    case Call::kDequantize:
      return zpDequantize(send, recv, kCount, zpFloat32, 8, 256, comm, nullptr);
    case Call::kQwz:
      return zpQuantAllGather(send, recv, kCount, zpFloat32, comm, nullptr);
    case Call::kQwzEx:
      return zpQuantAllGatherEx(send, recv, kCount, zpFloat32, &options, comm, nullptr);
    case Call::kHpz:
      return zpHierAllGather(send, recv, kCount, zpFloat32, comm, nullptr);
    case Call::kHpzEx:  // the quantized mode
      return zpHierAllGatherEx(send, recv, kCount, zpFloat32, &options, comm, nullptr);
    case Call::kQgz:
      return zpQuantReduceScatterA2A(send, recv, kCount, zpFloat32, zpSum, comm, nullptr);
    case Call::kQgzEx:
      return zpQuantReduceScatterA2AEx(send, recv, kCount, zpFloat32, zpAvg, &options, comm, nullptr);
  }
  return zpInternalError;
}

std::vector<Row> table() {
  std::vector<Row> rows;
  for (Source source : {Source::kHost, Source::kOtherGpu}) {
    const char* fault = source == Source::kHost ? "host memory" : "another CUDA device";
    const std::string from = source == Source::kHost ? " in host memory" : " on GPU 1";
    for (Call call : kCalls) {
      rows.push_back({rowName(call) + " " + sendName(call) + from,
                      source,
                      [=](const Ctx& c) { return invoke(call, c.bad, goodRecv(call, c), c.comm); },
                      zpInvalidArgument,
                      {nameOf(call), sendName(call), fault}});
      rows.push_back({rowName(call) + " " + recvName(call) + from,
                      source,
                      [=](const Ctx& c) { return invoke(call, goodSend(call, c), c.bad, c.comm); },
                      zpInvalidArgument,
                      {nameOf(call), recvName(call), fault}});
    }
  }
  return rows;
}

bool mentions(const std::string& message, const std::string& what) { return message.find(what) != std::string::npos; }

// Runs the rows of `source` on a one-rank cuda communicator of GPU 0.
void runRows(Source source) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  zpUniqueId id;
  ASSERT_EQ(zpGetUniqueId(&id), zpSuccess) << zpGetLastError(nullptr);
  zpConfig_t config = ZP_CONFIG_INITIALIZER;
  config.backend = zpBackendCuda;
  zpComm_t comm = nullptr;
  ASSERT_EQ(zpCommInitRankConfig(&comm, 1, id, 0, &config), zpSuccess) << zpGetLastError(nullptr);
  {
    DeviceBuffer send(0, kBytes), recv(0, kBytes), payload(0, kBytes);
    std::vector<unsigned char> host(kBytes, 0);
    std::unique_ptr<DeviceBuffer> other;
    unsigned char* bad = host.data();
    if (source == Source::kOtherGpu) {
      other = std::make_unique<DeviceBuffer>(1, kBytes);
      bad = other->get();
    }
    ASSERT_NE(send.get(), nullptr);
    ASSERT_NE(recv.get(), nullptr);
    ASSERT_NE(payload.get(), nullptr);
    ASSERT_NE(bad, nullptr);
    const Ctx c{comm, send.get(), recv.get(), payload.get(), bad};
    auto goodCall = [&](const std::string& after) {
      ASSERT_EQ(zpQuantAllGather(send.get(), recv.get(), kCount, zpFloat32, comm, nullptr), zpSuccess)
          << "after " << after << ": " << zpGetLastError(comm);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "after " << after;
      EXPECT_STREQ(zpGetLastError(comm), "") << "after " << after;
    };
    goodCall("creation");
    int ran = 0;
    for (const Row& row : table()) {
      if (row.source != source) continue;
      SCOPED_TRACE(row.name);
      const zpResult_t res = row.call(c);
      const std::string message = zpGetLastError(comm);
      EXPECT_EQ(res, row.code) << message;
      for (const std::string& m : row.mention) EXPECT_TRUE(mentions(message, m)) << message << " lacks " << m;
      goodCall(row.name);
      ++ran;
    }
    std::printf("[ BadInputGpu ] %d rows\n", ran);
  }
  EXPECT_EQ(zpCommDestroy(comm), zpSuccess) << zpGetLastError(nullptr);
}

TEST(BadInputGpu, HostPointersAreRefused) {
  ZP_REQUIRE_GPUS(1);
  runRows(Source::kHost);
}

TEST(BadInputGpu, AnotherGpusMemoryIsRefused) {
  ZP_REQUIRE_GPUS(2);
  runRows(Source::kOtherGpu);
}

// zpQuantAllReduce on the cuda backend: host buffers are refused, as in any call, and the communicator stays usable
// for a call on device buffers (its results: test_collectives_gpu.cc, GpuAllReduce.*).
TEST(BadInputGpu, AllReduceRefusesHostBuffersAndStaysUsable) {
  ZP_REQUIRE_GPUS(1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  zpUniqueId id;
  ASSERT_EQ(zpGetUniqueId(&id), zpSuccess) << zpGetLastError(nullptr);
  zpConfig_t config = ZP_CONFIG_INITIALIZER;
  config.backend = zpBackendCuda;
  zpComm_t comm = nullptr;
  ASSERT_EQ(zpCommInitRankConfig(&comm, 1, id, 0, &config), zpSuccess) << zpGetLastError(nullptr);
  {
    DeviceBuffer send(0, kBytes), recv(0, kBytes);
    std::vector<unsigned char> host(kBytes, 0);
    EXPECT_EQ(zpQuantAllReduce(host.data(), recv.get(), kCount, zpFloat32, zpSum, comm, nullptr), zpInvalidArgument);
    EXPECT_TRUE(mentions(zpGetLastError(comm), "zpQuantAllReduce : sendbuff is host memory")) << zpGetLastError(comm);
    const zpGradOptions_t options = ZP_GRAD_OPTIONS_INITIALIZER;
    ASSERT_EQ(zpQuantAllReduceEx(send.get(), recv.get(), kCount, zpFloat32, zpSum, &options, comm, nullptr), zpSuccess)
        << zpGetLastError(comm);
    ASSERT_EQ(zpQuantAllReduce(send.get(), recv.get(), 0, zpFloat32, zpSum, comm, nullptr), zpSuccess)
        << zpGetLastError(comm);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_STREQ(zpGetLastError(comm), "");
  }
  EXPECT_EQ(zpCommDestroy(comm), zpSuccess) << zpGetLastError(nullptr);
}

}  // namespace
}  // namespace zptest

#include <nccl.h>

namespace {

// zpCommInitFromNccl checks its config like every init (the whole of it, size and version included, before any
// field is read), and a host backend cannot wrap an NCCL communicator; the caller's communicator stays usable.
TEST(BadInputGpu, InitFromNcclRefusesABadOrHostConfig) {
  ZP_REQUIRE_GPUS(1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ncclComm_t nccl = nullptr;
  int device = 0;
  ASSERT_EQ(ncclCommInitAll(&nccl, 1, &device), ncclSuccess);
  struct Row {
    const char* what;
    std::function<void(zpConfig_t*)> spoil;
    const char* message;
  };
  const Row rows[] = {
      {"host backend", [](zpConfig_t* c) { c->backend = zpBackendHost; },
       "zpCommInitFromNccl : config->backend host cannot wrap an NCCL communicator"},
      {"newer version", [](zpConfig_t* c) { c->version = ZPCCL_VERSION_CODE + 1; }, "config->version"},
      {"wrong size", [](zpConfig_t* c) { c->size = sizeof(zpConfig_t) + 8; }, "config size"},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.what);
    zpConfig_t config = ZP_CONFIG_INITIALIZER;
    row.spoil(&config);
    zpComm_t comm = reinterpret_cast<zpComm_t>(0x1);  // poisoned: a failed init sets it to NULL
    EXPECT_EQ(zpCommInitFromNccl(&comm, nccl, &config), zpInvalidArgument);
    EXPECT_EQ(comm, nullptr);
    const char* message = zpGetLastError(nullptr);
    EXPECT_NE(strstr(message, row.message), nullptr) << message;
  }
  zpComm_t comm = nullptr;
  ASSERT_EQ(zpCommInitFromNccl(&comm, nccl, nullptr), zpSuccess) << zpGetLastError(nullptr);
  EXPECT_EQ(zpCommDestroy(comm), zpSuccess);
  EXPECT_EQ(ncclCommDestroy(nccl), ncclSuccess);
}

}  // namespace
