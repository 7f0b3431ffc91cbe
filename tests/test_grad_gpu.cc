// qgZ's gradient rounding on the GPU (include/zpccl.h, "Gradient rounding"), bit for bit against the host:
// host/philox.h's generator against cuRAND's curand_Philox4x32_10 on the device; stochastic rounding's integer form
// (host/quant_math.h's GPU path) against its threshold form over every float in range; the kernels (launchQuantizeGrad,
// launchReduceRequantizeGrad: payloads with their padding, and residuals) against host/quant_ref.h's
// quantizeGradRef over type x bits x block size x count x batch x rounding x residual x chunk offset; and
// zpQuantReduceScatterA2AEx2 and zpQuantAllReduceEx with stochastic rounding and error feedback on one-hop and
// two-hop layouts (processes sharing one GPU, each its own NCCL_HOSTID, over sockets), several calls in a row,
// outputs and residuals equal to the host backend's. Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "device/quantize.h"
#include "device/reduce.h"
#include "host/dtype.h"
#include "host/philox.h"
#include "host/quant_format.h"
#include "host/quant_ref.h"
#include "host/reduce_ref.h"
#include "include/zpccl.h"
#include "tests/child_test.h"
#include "tests/collective_check.h"
#include "tests/gpu_util.h"
#include "tests/grad_gpu_kernels.h"
#include "tests/host_ranks.h"

namespace {

using zpcheck::Buffer;

constexpr unsigned char kPoison = 0x5a;

// ---- Philox against cuRAND -------------------------------------------------------------------------------------

TEST(GpuGradPhilox, MatchesCurandAndTheHost) {
  ZP_REQUIRE_GPUS(1);
  std::mt19937_64 rng(3);
  std::vector<uint32_t> in;
  // Random123's known-answer inputs first, then random counters and keys (the all-ones corner included).
  const uint32_t kats[3][6] = {{0, 0, 0, 0, 0, 0},
                               {~0u, ~0u, ~0u, ~0u, ~0u, ~0u},
                               {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u}};
  for (const auto& k : kats) in.insert(in.end(), k, k + 6);
  for (int i = 0; i < 4093 * 6; ++i) in.push_back(static_cast<uint32_t>(rng()));
  const size_t n = in.size() / 6;
  std::vector<uint32_t> curand(4 * n), zpDev(4 * n);
  CUDA_ASSERT(zptest::philoxOnDevice(in.data(), n, curand.data(), zpDev.data()));
  EXPECT_EQ(curand[0], 0x6627e8d5u);  // Random123's answer for the zero counter and key
  for (size_t i = 0; i < n; ++i) {
    const uint32_t* c = in.data() + 6 * i;
    const zp::Philox4x32 host = zp::philox4x32_10(zp::Philox4x32{{c[0], c[1], c[2], c[3]}}, c[4], c[5]);
    for (int w = 0; w < 4; ++w) {
      ASSERT_EQ(zpDev[4 * i + w], curand[4 * i + w]) << "device, counter " << i << " word " << w;
      ASSERT_EQ(host.v[w], curand[4 * i + w]) << "host, counter " << i << " word " << w;
    }
  }
}

// stochasticCodeOfQuotient's GPU path (a rounded-up addition) against the threshold form on the GPU, over every float
// in [2^-17, 127] and its negative at the draws where either could change its rounding (the host's path: QuantMath).
TEST(GpuGradKernels, StochasticIntegerFormIsTheThresholdForm) {
  ZP_REQUIRE_GPUS(1);
  for (float qmax : {127.0f, 7.0f}) {
    const uint32_t first = zp::floatBits(0x1p-17f), last = zp::floatBits(qmax == 7.0f ? 8.0f : 127.0f);
    unsigned long long checked = 0, bad = 0;
    CUDA_ASSERT(zptest::stochasticFormsOnDevice(first, last, qmax, &checked, &bad));
    EXPECT_EQ(checked, 8ull * (last - first + 1)) << "qmax " << qmax;
    EXPECT_EQ(bad, 0ull) << "qmax " << qmax;
  }
}

// ---- kernels against the reference -------------------------------------------------------------------------------

void fillGradInput(zpDataType_t type, void* dst, size_t count, std::mt19937_64& rng, bool specials) {
  zpcheck::fillRandom(type, dst, count, rng(), 0);
  if (!specials || count < 600) return;
  zpcheck::storeValue(type, dst, rng() % count, NAN);
  zpcheck::storeValue(type, dst, rng() % count, INFINITY);
  for (size_t i = 0; i < count && i < 300; ++i) zpcheck::storeValue(type, dst, i, 0.0f);  // zero blocks
  // Elements far below their block's absmax (2^-24, fp16's smallest): quotients under 2^-16, where stochastic
  // rounding's quotient from the reciprocal must still give the division's codes (host/quant_math.h).
  for (size_t i = 300; i < 340; i += 3) zpcheck::storeValue(type, dst, i, (i & 1) ? 0x1p-24f : -0x1p-24f);
}

std::vector<uint16_t> randomResidual(size_t n, std::mt19937_64& rng) {
  std::vector<uint16_t> r(n);
  std::normal_distribution<float> d(0.0f, 0.01f);
  for (auto& v : r) v = zp::floatToBf16BitsRn(d(rng));
  return r;
}

struct KernelCase {
  zpDataType_t type;
  int bits, block;
  size_t count;
  int batch;
  bool stochastic, feedback;
  size_t firstElem;
  size_t inputOffset;  // elements: 1 misaligns every group of the input, 0 aligns those of aligned segments
};

std::string describe(const KernelCase& c) {
  return std::string(zp::typeName(c.type)) + " bits " + std::to_string(c.bits) + " block " + std::to_string(c.block) +
         " count " + std::to_string(c.count) + " batch " + std::to_string(c.batch) + (c.stochastic ? " SR" : "") +
         (c.feedback ? " EF" : "") + " first " + std::to_string(c.firstElem) + " offset " +
         std::to_string(c.inputOffset);
}

std::vector<KernelCase> kernelCases() {
  std::vector<KernelCase> cases;
  for (zpDataType_t type : {zpFloat32, zpBfloat16, zpFloat16})
    for (int bits : {4, 8})
      for (int block : {32, 64, 256, 1024, 8192})  // 1, 2, 8, 32 lanes a block; beyond the groups a lane keeps
        for (size_t count : {size_t{1}, size_t{257}, size_t{8193}, size_t{100003}})
          for (int mode = 0; mode < 3; ++mode) {
            const bool sr = mode != 1, ef = mode != 0;
            const size_t offset = (mode + (count > 1000)) % 2;
            cases.push_back(
                {type, bits, block, count, count > 10000 ? 3 : 2, sr, ef, mode == 2 ? 3u * block : 0u, offset});
          }
  return cases;
}

TEST(GpuGradKernels, QuantizeMatchesTheReferenceBitForBit) {
  ZP_REQUIRE_GPUS(1);
  std::mt19937_64 rng(11);
  for (const KernelCase& c : kernelCases()) {
    SCOPED_TRACE(describe(c));
    const size_t esz = zp::typeSize(c.type), pb = zp::quantPayloadBytes(c.count, c.bits, c.block);
    const size_t strideElems = c.count + 5, payloadStride = pb + 32;  // gaps between segments stay untouched;
    // segment s starts (c.count + 5) s elements in: 16-byte aligned for some counts, not for others
    const size_t inElems = strideElems * c.batch + c.inputOffset;
    Buffer in(inElems * esz);
    fillGradInput(c.type, in.data(), inElems, rng, true);
    std::vector<uint16_t> res = randomResidual(strideElems * c.batch, rng), resRef = res;
    std::vector<unsigned char> want(payloadStride * c.batch, kPoison), got(want.size());
    zp::GradQuant g;
    g.stochastic = c.stochastic;
    g.key = zp::GradRandomKey{12345u, 6u, 2u, 0u};
    g.firstElem = c.firstElem;
    for (int s = 0; s < c.batch; ++s) {
      zp::GradQuant h = g;
      h.slice = 7 + 2 * s;
      h.residual = c.feedback ? resRef.data() + s * strideElems : nullptr;
      zp::quantizeGradRef(in.data() + (c.inputOffset + s * strideElems) * esz, c.type, c.count, c.bits, c.block, h,
                          want.data() + s * payloadStride);
    }
    char *dIn = nullptr, *dPayload = nullptr;
    uint16_t* dRes = nullptr;
    CUDA_ASSERT(cudaMalloc(&dIn, in.size()));
    CUDA_ASSERT(cudaMalloc(&dPayload, got.size()));
    CUDA_ASSERT(cudaMalloc(&dRes, res.size() * 2));
    CUDA_ASSERT(cudaMemcpy(dIn, in.data(), in.size(), cudaMemcpyHostToDevice));
    CUDA_ASSERT(cudaMemset(dPayload, kPoison, got.size()));
    CUDA_ASSERT(cudaMemcpy(dRes, res.data(), res.size() * 2, cudaMemcpyHostToDevice));
    zp::GradQuantLaunch launch;
    launch.stochastic = c.stochastic;
    launch.key = g.key;
    launch.slice0 = 7;
    launch.sliceStride = 2;
    launch.firstElem = c.firstElem;
    launch.residual = c.feedback ? dRes : nullptr;
    launch.residualStrideElems = strideElems;
    ASSERT_EQ(zp::launchQuantizeGrad(dIn + c.inputOffset * esz, dPayload, c.count, c.type, c.bits, c.block, launch,
                                     zp::KernelStream(), c.batch, strideElems, payloadStride),
              zpSuccess);
    CUDA_ASSERT(cudaDeviceSynchronize());
    CUDA_ASSERT(cudaMemcpy(got.data(), dPayload, got.size(), cudaMemcpyDeviceToHost));
    CUDA_ASSERT(cudaMemcpy(res.data(), dRes, res.size() * 2, cudaMemcpyDeviceToHost));
    EXPECT_TRUE(zpcheck::sameBits(got.data(), want.data(), got.size(), 1)) << "payloads";
    EXPECT_TRUE(zpcheck::sameBits(res.data(), resRef.data(), res.size(), 2)) << "residuals";
    cudaFree(dIn);
    cudaFree(dPayload);
    cudaFree(dRes);
  }
}

TEST(GpuGradKernels, ReduceRequantizeMatchesTheReferenceBitForBit) {
  ZP_REQUIRE_GPUS(1);
  std::mt19937_64 rng(12);
  for (int bits : {4, 8})
    for (int block : {32, 256, 8192})
      for (size_t count : {size_t{1}, size_t{8193}, size_t{65536}, size_t{100003}})  // 65536: aligned residuals
        for (int sources : {1, 2, 3})
          for (int mode = 0; mode < 3; ++mode) {
            const int batch = 1 + (sources + mode) % 3;
            const bool sr = mode != 1, ef = mode != 0;
            const size_t first = mode == 2 ? 2u * block : 0u;
            SCOPED_TRACE("bits " + std::to_string(bits) + " block " + std::to_string(block) + " count " +
                         std::to_string(count) + " sources " + std::to_string(sources) + " batch " +
                         std::to_string(batch) + " mode " + std::to_string(mode));
            const size_t pb = zp::quantPayloadBytes(count, bits, block);
            // The layout of qgZ's first hop: source s of segment g at g * pb + s * batch * pb.
            std::vector<unsigned char> src(pb * sources * batch);
            std::vector<float> x(count);
            for (int k = 0; k < sources * batch; ++k) {
              zpcheck::fillRandom(zpFloat32, x.data(), count, rng(), k);
              if (k == 1 && count > 600) x[count / 2] = NAN;
              // A third source 2^30 times smaller: where the others' codes cancel, sums far below the block's
              // absmax, whose quotients from the reciprocal must still give the division's codes.
              if (k / batch == 2) {
                for (float& v : x) v = std::ldexp(v, -30);
              }
              zp::quantizeRef(x.data(), zpFloat32, count, bits, block, src.data() + k * pb);
            }
            std::vector<uint16_t> res = randomResidual(count * batch, rng), resRef = res;
            std::vector<unsigned char> want(pb * batch, kPoison), got(want.size());
            std::vector<float> sum(count);
            zp::GradQuant g;
            g.stochastic = sr;
            g.key = zp::GradRandomKey{99u, 5u, 3u, 1u};
            g.firstElem = first;
            for (int seg = 0; seg < batch; ++seg) {
              std::vector<const unsigned char*> ptrs;
              for (int s = 0; s < sources; ++s) ptrs.push_back(src.data() + seg * pb + s * batch * pb);
              zp::sumPayloadsRef(ptrs, count, bits, block, 0, count, sum.data());
              zp::GradQuant h = g;
              h.slice = seg;
              h.residual = ef ? resRef.data() + seg * count : nullptr;
              zp::quantizeGradRef(sum.data(), zpFloat32, count, bits, block, h, want.data() + seg * pb);
            }
            unsigned char *dSrc = nullptr, *dOut = nullptr;
            uint16_t* dRes = nullptr;
            CUDA_ASSERT(cudaMalloc(&dSrc, src.size()));
            CUDA_ASSERT(cudaMalloc(&dOut, got.size()));
            CUDA_ASSERT(cudaMalloc(&dRes, res.size() * 2));
            CUDA_ASSERT(cudaMemcpy(dSrc, src.data(), src.size(), cudaMemcpyHostToDevice));
            CUDA_ASSERT(cudaMemset(dOut, kPoison, got.size()));
            CUDA_ASSERT(cudaMemcpy(dRes, res.data(), res.size() * 2, cudaMemcpyHostToDevice));
            zp::GradQuantLaunch launch;
            launch.stochastic = sr;
            launch.key = g.key;
            launch.firstElem = first;
            launch.residual = ef ? dRes : nullptr;
            launch.residualStrideElems = count;
            const zp::ReduceSources rs{dSrc, pb * batch, pb, sources, batch};
            ASSERT_EQ(zp::launchReduceRequantizeGrad(rs, count, bits, block, dOut, pb, launch, zp::KernelStream()),
                      zpSuccess);
            CUDA_ASSERT(cudaDeviceSynchronize());
            CUDA_ASSERT(cudaMemcpy(got.data(), dOut, got.size(), cudaMemcpyDeviceToHost));
            CUDA_ASSERT(cudaMemcpy(res.data(), dRes, res.size() * 2, cudaMemcpyDeviceToHost));
            EXPECT_TRUE(zpcheck::sameBits(got.data(), want.data(), got.size(), 1)) << "payloads";
            EXPECT_TRUE(zpcheck::sameBits(res.data(), resRef.data(), res.size(), 2)) << "residuals";
            cudaFree(dSrc);
            cudaFree(dOut);
            cudaFree(dRes);
          }
}

// ---- the collective: processes sharing one GPU, each its own host ------------------------------------------------

const char* kChildEnv = "ZP_GRAD_TEST_CHILD";
const char* kIdFileEnv = "ZP_GRAD_TEST_ID_FILE";
const char* kNodesEnv = "ZP_GRAD_TEST_NODES";  // node of each rank: "0,0,1,1"

std::vector<int> nodesFromEnv() {
  std::vector<int> nodes;
  std::stringstream list(getenv(kNodesEnv));
  for (std::string item; std::getline(list, item, ',');) nodes.push_back(std::stoi(item));
  return nodes;
}

struct GradCase {
  zpDataType_t type;
  int bits;
  size_t count;  // qgZ's recvcount; the all-reduce's tensor is count x nranks elements, as qgZ's sendbuff
  zpRedOp_t op;
  bool stochastic, feedback, inPlace;
  bool allReduce = false;  // zpQuantAllReduceEx instead of zpQuantReduceScatterA2AEx2
};

// Elements of a call's output.
size_t recvElems(const GradCase& c, int nranks) { return c.allReduce ? c.count * nranks : c.count; }

// Elements of a call's hop residual on this communicator's layout.
size_t hopElems(const GradCase& c, zpComm_t comm) {
  int n = 0;
  EXPECT_EQ(zpCommCount(comm, &n), zpSuccess);
  size_t slice = c.count, hop = 0;
  if (c.allReduce) {
    EXPECT_EQ(zpQuantAllReduceShardCount(c.count * n, 0, &slice, comm), zpSuccess);
  }
  EXPECT_EQ(zpGradHopResidualCount(slice, &hop, comm), zpSuccess);
  return hop;
}

// One call of `c` (its output into `recv`, or in place when c.inPlace: see inPlaceRecv).
zpResult_t callCase(const GradCase& c, int nranks, const void* send, void* recv, const zpGradOptions_t* o,
                    zpComm_t comm, cudaStream_t stream) {
  if (c.allReduce) return zpQuantAllReduceEx(send, recv, c.count * nranks, c.type, c.op, o, comm, stream);
  return zpQuantReduceScatterA2AEx2(send, recv, c.count, c.type, c.op, o, comm, stream);
}

// The output's place in the send buffer in place: the all-reduce's whole tensor, qgZ's rank's slice.
void* inPlaceRecv(const GradCase& c, int rank, void* send) {
  return static_cast<char*>(send) + (c.allReduce ? 0 : rank * c.count * zp::typeSize(c.type));
}

// One rank's state over a run of calls: residuals carried from call to call, outputs of each call.
struct RankRun {
  std::vector<uint16_t> res, hop;
  std::vector<Buffer> outs;
};

void fillCall(const GradCase& c, int rank, int call, int nranks, void* dst) {
  zpcheck::fillRandom(c.type, dst, c.count * nranks, 500 + call, rank);
}

constexpr int kCalls = 3;
constexpr int kSeed = 2718;

const GradCase kGradCases[] = {
    {zpBfloat16, 4, 100003, zpSum, true, true, false},  // chunked (ZP_CHUNK_BYTES below), both hops fed back
    {zpFloat32, 8, 257, zpAvg, true, false, true},      // SR alone, in place
    {zpFloat16, 4, 4097, zpSum, false, true, false},    // EF alone, nearest
    {zpBfloat16, 8, 1, zpSum, true, true, true},        // a single element
    // The all-reduce: a tensor of n whole shards and others (the padded copies, residual included).
    {zpBfloat16, 4, 100003, zpSum, true, true, false, true},
    {zpFloat32, 8, 1024, zpAvg, true, false, true, true},
    {zpFloat16, 4, 4097, zpSum, false, true, true, true},
};
constexpr size_t kGradCaseCount = sizeof(kGradCases) / sizeof(kGradCases[0]);

zpGradOptions_t optionsOf(const GradCase& c, void* res, size_t resCount, void* hop, size_t hopCount) {
  zpGradOptions_t o = ZP_GRAD_OPTIONS_INITIALIZER;
  o.bits = c.bits;
  o.rounding = c.stochastic ? zpRoundStochastic : zpRoundNearest;
  if (c.feedback) {
    o.residual = res;
    o.residualCount = resCount;
    o.hopResidual = hopCount ? hop : nullptr;
    o.hopResidualCount = hopCount;
  }
  return o;
}

// The host backend's run of every case (kCalls calls each, in order, on one communicator: the sequence numbers
// run on across cases, as on the cuda one) on the layout: runs[case][rank].
std::vector<std::vector<RankRun>> hostRuns(const std::vector<int>& nodes) {
  const int n = static_cast<int>(nodes.size());
  std::vector<std::vector<RankRun>> runs(kGradCaseCount);
  for (auto& perRank : runs) perRank.resize(n);  // (Buffer does not copy)
  zptest::runHostRanks(
      n,
      [&](int rank, zpConfig_t* cfg) {
        cfg->nodeId = nodes[rank];
        cfg->gradSeed = kSeed;
      },
      [&](int rank, zpComm_t comm) {
        for (size_t i = 0; i < kGradCaseCount; ++i) {
          const GradCase& c = kGradCases[i];
          const size_t hop = hopElems(c, comm);
          const size_t esz = zp::typeSize(c.type), outElems = recvElems(c, n);
          RankRun& r = runs[i][rank];
          r.res.assign(c.feedback ? c.count * n : 0, 0);
          r.hop.assign(c.feedback ? hop : 0, 0);
          for (int call = 0; call < kCalls; ++call) {
            Buffer send(c.count * n * esz);
            fillCall(c, rank, call, n, send.data());
            const zpGradOptions_t o = optionsOf(c, r.res.data(), r.res.size(), r.hop.data(), r.hop.size());
            Buffer out(outElems * esz);
            void* recv = c.inPlace ? inPlaceRecv(c, rank, send.data()) : out.data();
            ASSERT_EQ(callCase(c, n, send.data(), recv, &o, comm, nullptr), zpSuccess) << zpGetLastError(comm);
            std::memcpy(out.data(), recv, outElems * esz);
            r.outs.push_back(std::move(out));
          }
        }
      });
  return runs;
}

// This rank's cuda run of `c`, compared with the host backend's call by call.
void checkCudaRank(const GradCase& c, int rank, zpComm_t comm, const RankRun& want) {
  int n = 0;
  ASSERT_EQ(zpCommCount(comm, &n), zpSuccess);
  const size_t hop = hopElems(c, comm);
  if (c.feedback) {
    ASSERT_EQ(hop, want.hop.size());
  }
  const size_t esz = zp::typeSize(c.type), sendBytes = c.count * n * esz, outElems = recvElems(c, n);
  char *dSend = nullptr, *dRecv = nullptr;
  uint16_t *dRes = nullptr, *dHop = nullptr;
  CUDA_ASSERT(cudaMalloc(&dSend, sendBytes));
  CUDA_ASSERT(cudaMalloc(&dRecv, outElems * esz));
  CUDA_ASSERT(cudaMalloc(&dRes, c.count * n * 2));
  CUDA_ASSERT(cudaMalloc(&dHop, hop * 2 + 2));
  CUDA_ASSERT(cudaMemset(dRes, 0, c.count * n * 2));
  CUDA_ASSERT(cudaMemset(dHop, 0, hop * 2 + 2));
  cudaStream_t stream;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int call = 0; call < kCalls; ++call) {
    SCOPED_TRACE("call " + std::to_string(call));
    Buffer send(sendBytes);
    fillCall(c, rank, call, n, send.data());
    CUDA_ASSERT(cudaMemcpy(dSend, send.data(), sendBytes, cudaMemcpyHostToDevice));
    CUDA_ASSERT(cudaMemset(dRecv, 0xff, outElems * esz));  // poison
    CUDA_ASSERT(cudaDeviceSynchronize());
    const zpGradOptions_t o = optionsOf(c, dRes, c.count * n, dHop, hop);
    void* recv = c.inPlace ? inPlaceRecv(c, rank, dSend) : dRecv;
    ASSERT_EQ(callCase(c, n, dSend, recv, &o, comm, stream), zpSuccess) << zpGetLastError(comm);
    CUDA_ASSERT(cudaStreamSynchronize(stream));
    Buffer out(outElems * esz);
    CUDA_ASSERT(cudaMemcpy(out.data(), recv, outElems * esz, cudaMemcpyDeviceToHost));
    EXPECT_TRUE(zpcheck::sameBits(out.data(), want.outs[call].data(), outElems, c.type)) << "output";
  }
  if (c.feedback) {
    std::vector<uint16_t> res(c.count * n), hopRes(hop);
    CUDA_ASSERT(cudaMemcpy(res.data(), dRes, res.size() * 2, cudaMemcpyDeviceToHost));
    CUDA_ASSERT(cudaMemcpy(hopRes.data(), dHop, hop * 2, cudaMemcpyDeviceToHost));
    EXPECT_TRUE(zpcheck::sameBits(res.data(), want.res.data(), res.size(), 2)) << "residual";
    EXPECT_TRUE(zpcheck::sameBits(hopRes.data(), want.hop.data(), hop, 2)) << "hop residual";
  }
  // A residual in host memory: refused by name, the communicator still usable (the next case runs on it).
  if (c.feedback) {
    std::vector<uint16_t> hostRes(c.count * n);
    zpGradOptions_t o = ZP_GRAD_OPTIONS_INITIALIZER;
    o.residual = hostRes.data();
    o.residualCount = hostRes.size();
    EXPECT_EQ(callCase(c, n, dSend, dRecv, &o, comm, stream), zpInvalidArgument);
    const std::string call = c.allReduce ? "zpQuantAllReduceEx" : "zpQuantReduceScatterA2AEx2";
    EXPECT_TRUE(zpcheck::mentions(zpGetLastError(comm), (call + " : options->residual").c_str()))
        << zpGetLastError(comm);
  }
  CUDA_ASSERT(cudaStreamDestroy(stream));
  cudaFree(dSend);
  cudaFree(dRecv);
  cudaFree(dRes);
  cudaFree(dHop);
}

// Runs in each child process (skipped in a normal run): one rank on the shared GPU, its own host id.
TEST(GpuGradQgz, Child) {
  const char* child = getenv(kChildEnv);
  if (child == nullptr) GTEST_SKIP() << "runs only inside the other GpuGradQgz tests";
  const int rank = atoi(child);
  zpUniqueId id;
  std::ifstream(getenv(kIdFileEnv), std::ios::binary).read(id.internal, sizeof(id.internal));
  const std::vector<int> nodes = nodesFromEnv();
  const std::vector<std::vector<RankRun>> expected = hostRuns(nodes);
  zpConfig_t config = ZP_CONFIG_INITIALIZER;
  config.nodeId = nodes[rank];
  config.gradSeed = kSeed;
  zpComm_t comm = nullptr;
  ASSERT_EQ(zpCommInitRankConfig(&comm, static_cast<int>(nodes.size()), id, rank, &config), zpSuccess)
      << zpGetLastError(nullptr);
  for (size_t i = 0; i < kGradCaseCount; ++i) {
    const GradCase& c = kGradCases[i];
    SCOPED_TRACE(std::string(c.allReduce ? "all-reduce " : "qgZ ") + zp::typeName(c.type) + " bits " +
                 std::to_string(c.bits) + " count " + std::to_string(c.count) + " rank " + std::to_string(rank));
    checkCudaRank(c, rank, comm, expected[i][rank]);
  }
  EXPECT_EQ(zpCommDestroy(comm), zpSuccess);
}

// Spawns one child per rank of `nodes`, all on GPU 0 with distinct NCCL_HOSTIDs (regime net: NCCL talks over
// sockets).
void runGradProcesses(const char* nodes) {
  ZP_REQUIRE_GPUS(1);
  if (getenv(kChildEnv)) GTEST_SKIP();
  int nranks = 1;
  for (const char* p = nodes; *p; ++p) nranks += *p == ',';
  zpUniqueId id;
  ASSERT_EQ(zpGetUniqueId(&id), zpSuccess);
  const std::string idFile = "/tmp/zpccl-grad-test-id-" + std::to_string(getpid());
  std::ofstream(idFile, std::ios::binary).write(id.internal, sizeof(id.internal));
  zptest::runConcurrentChildren("GpuGradQgz.Child", nranks, [&](int k) {
    std::vector<std::string> env = zptest::regimeEnv(zptest::Regime::kNet, k);
    env.insert(env.end(), {std::string(kChildEnv) + "=" + std::to_string(k), std::string(kIdFileEnv) + "=" + idFile,
                           std::string(kNodesEnv) + "=" + nodes, "CUDA_VISIBLE_DEVICES=0"});
    env.push_back("ZP_CHUNK_BYTES=262144");  // the first case's pipeline: several chunks, each starting inside a slice
    return env;
  });
  unlink(idFile.c_str());
}

TEST(GpuGradQgz, OneHopFourRanksOnOneGpu) { runGradProcesses("0,1,2,3"); }
TEST(GpuGradQgz, TwoNodesOfTwoOnOneGpu) { runGradProcesses("0,0,1,1"); }
TEST(GpuGradQgz, ThreeNodesOfTwoOnOneGpu) { runGradProcesses("0,0,1,1,2,2"); }

}  // namespace
