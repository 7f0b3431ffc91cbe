// Soak of the three collectives on the host backend: many iterations of random sizes (1 to a few thousand
// elements, block multiples and odd counts among them), random types, bits, block sizes (per call, or the
// communicator's), in place or not, on several layouts at once (1x2, 2x2, 1x3, 2x1 by ranksPerNode, and 2x2
// interleaved by nodeId), hpZ exact or in its quantized mode (zpHierAllGatherEx with bits), with NaN, +-Inf,
// denormal runs and values near the type's maximum injected into the quantized calls' data. Every
// iteration is checked against a reference computed here, independently of the backend's code:
//   qwZ: dequantizeRef(quantizeRef(shard r)) at slot r, on every rank;
//   hpZ: the exact bytes of the hpZ group's shards (quantized mode: dequantizeRef(quantizeRef(shard)) of each);
//   qgZ: the plan of host/qgz_plan.h, step by step (first quantization per slice; one hop: the sum in rank
//        order; two hops: the sum per node in local order, requantized, then the sum in node order), with
//        host/reduce_math.h's payloadElement and finishReduction, as tests/test_qgz_host.cc does;
// plus guard bytes after every output and an untouched sendbuff. Communicators are created once per layout and
// reused; host memory (VmRSS) must stay flat between the end of a warm-up and the end of the soak.
//
// Iterations per collective: ZP_SOAK_ITERS, default 10^4 (the soak; about 15 s on two cores, release
// build). ZP_SOAK_SEED changes the data and parameters; a failure names the layout, iteration and parameters.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "host/dtype.h"
#include "host/quant_format.h"
#include "host/quant_math.h"
#include "host/quant_ref.h"
#include "host/reduce_math.h"
#include "include/zpccl.h"
#include "tests/collective_check.h"

// Under AddressSanitizer VmRSS measures its quarantine of freed memory, not the library: LeakSanitizer checks
// for leaks there instead (tools/run-sanitizers.sh).
#if defined(__SANITIZE_ADDRESS__)
#define ZP_SOAK_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ZP_SOAK_UNDER_ASAN 1
#endif
#endif
#ifndef ZP_SOAK_UNDER_ASAN
#define ZP_SOAK_UNDER_ASAN 0
#endif

namespace {

using zpcheck::Buffer;
using zpcheck::bytesOf;

constexpr int kDefaultIters = 10000;             // per collective; see the header comment
constexpr size_t kMaxCount = ZP_MAX_BLOCK_SIZE;  // the largest count drawn (one block of the largest size)
constexpr size_t kGuard = 64;                    // poisoned bytes after every output
constexpr unsigned char kPoison = 0xa5;
constexpr long kRssGrowthLimitKb = 16 * 1024;

int64_t envInt(const char* name, int64_t def) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return def;
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 0);
  return end != text && *end == '\0' ? v : def;
}

long vmRssKb() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
  }
  return -1;
}

// ---- layouts -----------------------------------------------------------------------------------------------

struct Layout {
  const char* name;
  int nranks;
  int ranksPerNode;          // > 0: config.ranksPerNode
  std::vector<int> nodeIds;  // else config.nodeId per rank
};

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"1x2", 2, 2, {}},
      {"2x2", 4, 2, {}},
      {"1x3", 3, 3, {}},
      {"2x1", 2, 1, {}},
      {"2x2interleaved", 4, 0, {5, 9, 5, 9}},
  };
  return all;
}

using zpcheck::RefTopo;
RefTopo refTopo(const Layout& L) { return zpcheck::refTopo(L.nranks, L.ranksPerNode, L.nodeIds); }

// ---- one iteration's parameters, the same on every rank ------------------------------------------------------

enum Coll { kQwz = 0, kHpz = 1, kQgz = 2 };
const char* const kCollNames[] = {"qwZ", "hpZ", "qgZ"};

enum class Special { kNaN, kPosInf, kNegInf, kDenormalRun, kHuge, kHugeRun };

// Values [start, start + length) of one rank's input replaced by specials.
struct Injection {
  int rank;
  size_t start, length;
  Special kind;
};

struct Iter {
  Coll coll;
  zpDataType_t type;
  size_t count;    // sendcount (all-gathers) or recvcount (qgZ)
  bool ex;         // the Ex call with options, else the plain call (the communicator's settings)
  bool quantized;  // qwZ, qgZ, and hpZ's quantized mode (its Ex call with options.bits set)
  zpQuantOptions_t options;
  int bits, blockSize;  // effective
  bool inPlace;
  zpRedOp_t op;
  uint64_t seed;
  std::vector<Injection> inj;
};

std::string describe(const Iter& it) {
  std::string s =
      std::string(kCollNames[it.coll]) + " " + zp::typeName(it.type) + " count " + std::to_string(it.count) +
      (it.ex ? " Ex{" + std::to_string(it.options.bits) + "," + std::to_string(it.options.blockSize) + "}" : " plain") +
      " bits " + std::to_string(it.bits) + " block " + std::to_string(it.blockSize) +
      (it.inPlace ? " in place" : " out of place") + (it.coll == kQgz ? std::string(" ") + zp::opName(it.op) : "") +
      " seed " + std::to_string(it.seed);
  for (const Injection& j : it.inj) {
    s += " inj{rank " + std::to_string(j.rank) + " [" + std::to_string(j.start) + "+" + std::to_string(j.length) +
         ") kind " + std::to_string(static_cast<int>(j.kind)) + "}";
  }
  return s;
}

size_t drawCount(std::mt19937_64& rng, int blockSize) {
  switch (rng() % 5) {
    case 0:
      return 1 + rng() % 40;  // tiny
    case 1:
      return blockSize * (1 + rng() % std::max<size_t>(1, 5000 / blockSize));  // whole blocks
    case 2: {                                                                  // a block multiple, plus or minus one
      const size_t c = blockSize * (1 + rng() % std::max<size_t>(1, 5000 / blockSize));
      return rng() % 2 ? c + 1 : c - 1;
    }
    default:
      return 1 + rng() % 5000;  // anything, odd counts among them
  }
}

Iter makeIter(uint64_t seed, Coll coll, int nranks, bool largest) {
  std::mt19937_64 rng(seed);
  Iter it{};
  it.coll = coll;
  it.seed = seed;
  const zpDataType_t quantTypes[] = {zpFloat16, zpBfloat16, zpFloat32};
  // hpZ: exact (plain, or Ex with bits 0) two times in three, else its quantized mode.
  const uint64_t hpzMode = rng() % 6;
  it.quantized = coll != kHpz || hpzMode < 2;
  it.type = it.quantized ? quantTypes[rng() % 3] : static_cast<zpDataType_t>(rng() % zpNumTypes);
  it.ex = coll == kHpz ? hpzMode < 3 : rng() % 4 != 0;
  it.bits = coll == kQgz ? 4 : coll == kQwz ? 8 : 0;
  it.blockSize = 256;
  if (it.ex) {
    it.options.bits = coll == kHpz ? (hpzMode < 2 ? 4 + 4 * static_cast<int>(hpzMode) : 0)
                                   : (rng() % 5 == 0 ? 0 : (rng() % 2 ? 4 : 8));
    it.options.blockSize = rng() % 5 == 0 ? 0 : 32 << (rng() % 9);
    if (it.options.bits) it.bits = it.options.bits;
    if (it.options.blockSize) it.blockSize = it.options.blockSize;
  }
  it.count = largest ? kMaxCount : std::min(kMaxCount, drawCount(rng, it.blockSize));
  if (largest) it.type = it.quantized ? zpFloat32 : zpFloat64;
  it.inPlace = rng() % 3 == 0;
  it.op = rng() % 2 ? zpAvg : zpSum;
  if (it.quantized && rng() % 5 < 3) {
    const size_t perRank = coll == kQgz ? it.count * nranks : it.count;
    const int n = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < n; ++k) {
      Injection j;
      j.rank = static_cast<int>(rng() % nranks);
      j.kind = static_cast<Special>(rng() % 6);
      j.start = rng() % perRank;
      const bool run = j.kind == Special::kDenormalRun || j.kind == Special::kHugeRun;
      j.length = std::min(perRank - j.start, run ? 1 + rng() % 600 : 1);
      it.inj.push_back(j);
    }
  }
  return it;
}

// ---- inputs ------------------------------------------------------------------------------------------------

// Largest finite value and smallest subnormal of a quantizable type.
float typeMax(zpDataType_t type) {
  return type == zpFloat16    ? 65504.0f
         : type == zpBfloat16 ? zp::bf16BitsToFloat(0x7f7f)
                              : std::numeric_limits<float>::max();
}
float typeMinSubnormal(zpDataType_t type) {
  return type == zpFloat16    ? std::ldexp(1.0f, -24)
         : type == zpBfloat16 ? std::ldexp(1.0f, -133)
                              : std::ldexp(1.0f, -149);
}

float specialValue(zpDataType_t type, Special kind, uint64_t h) {
  const float sign = (h >> 63) ? -1.0f : 1.0f;
  switch (kind) {
    case Special::kNaN:
      return std::numeric_limits<float>::quiet_NaN();
    case Special::kPosInf:
      return std::numeric_limits<float>::infinity();
    case Special::kNegInf:
      return -std::numeric_limits<float>::infinity();
    case Special::kDenormalRun: {
      const uint64_t maxMultiple = type == zpFloat16 ? 1023 : type == zpBfloat16 ? 127 : (1u << 23) - 1;
      return sign * static_cast<float>(1 + (h >> 8) % maxMultiple) * typeMinSubnormal(type);
    }
    default: {  // near the maximum: [1/2, 1] of it (rounding to the type never goes past it)
      const float u = 0.5f + 0.5f * static_cast<float>((h >> 11) & 0xffffff) / static_cast<float>(0xffffff);
      return sign * u * typeMax(type);
    }
  }
}

// Element i of rank's input (count elements for qwZ, nranks * count for qgZ).
float inputValue(const Iter& it, int rank, size_t i) {
  for (const Injection& j : it.inj) {
    if (j.rank == rank && i >= j.start && i < j.start + j.length) {
      return specialValue(it.type, j.kind, zpcheck::hash3(it.seed, rank, i));
    }
  }
  return zpcheck::randomValue(it.type, it.seed, rank, i);
}

// Elements [offset, offset + n) of rank's input.
void makeInput(const Iter& it, int rank, size_t offset, size_t n, void* dst) {
  if (!it.quantized) {  // exact hpZ: any bytes, NaN patterns included
    zpcheck::fillBytes(dst, n * bytesOf(it.type), it.seed, rank, offset * bytesOf(it.type));
    return;
  }
  for (size_t i = 0; i < n; ++i) zpcheck::storeValue(it.type, dst, i, inputValue(it, rank, offset + i));
}

// ---- references --------------------------------------------------------------------------------------------

// qwZ: the gathered tensor, identical on every rank.
void referenceQwz(const Iter& it, int nranks, unsigned char* out) {
  const size_t shard = it.count * bytesOf(it.type);
  Buffer in(shard), payload(zp::quantPayloadBytes(it.count, it.bits, it.blockSize));
  for (int r = 0; r < nranks; ++r) {
    makeInput(it, r, 0, it.count, in.data());
    zp::quantizeRef(in.data(), it.type, it.count, it.bits, it.blockSize, payload.data());
    zp::dequantizeRef(payload.data(), it.type, it.count, it.bits, it.blockSize, out + r * shard);
  }
}

// hpZ: the shards of this rank's node, in local order: as they are, or dequantize(quantize(shard)).
void referenceHpz(const Iter& it, const RefTopo& t, int rank, unsigned char* out) {
  const size_t shard = it.count * bytesOf(it.type);
  const auto& group = t.nodeRanks[t.nodeOf[rank]];
  Buffer in(shard), payload(it.quantized ? zp::quantPayloadBytes(it.count, it.bits, it.blockSize) : 0);
  for (size_t i = 0; i < group.size(); ++i) {
    if (!it.quantized) {
      makeInput(it, group[i], 0, it.count, out + i * shard);
      continue;
    }
    makeInput(it, group[i], 0, it.count, in.data());
    zp::quantizeRef(in.data(), it.type, it.count, it.bits, it.blockSize, payload.data());
    zp::dequantizeRef(payload.data(), it.type, it.count, it.bits, it.blockSize, out + i * shard);
  }
}

float element(const Iter& it, const unsigned char* payload, size_t i) {
  return it.bits == 8 ? zp::payloadElement<8>(payload, it.count, it.blockSize, i)
                      : zp::payloadElement<4>(payload, it.count, it.blockSize, i);
}

// fp32 sums, in the order given, of the payloads' elements, with the block rule.
std::vector<float> sumInOrder(const Iter& it, const std::vector<const unsigned char*>& terms) {
  std::vector<float> sum(it.count);
  for (size_t i = 0; i < it.count; ++i) {
    float acc = element(it, terms[0], i);
    for (size_t k = 1; k < terms.size(); ++k) acc = zp::addRn(acc, element(it, terms[k], i));
    sum[i] = acc;
  }
  zpcheck::applyBlockRule(&sum, it.blockSize);
  return sum;
}

// qgZ: the output of destination d, by the plan of host/qgz_plan.h.
void referenceQgz(const Iter& it, const RefTopo& t, int nranks, int d, unsigned char* out) {
  const size_t pb = zp::quantPayloadBytes(it.count, it.bits, it.blockSize);
  std::vector<Buffer> first(nranks);
  Buffer slice(it.count * bytesOf(it.type));
  for (int r = 0; r < nranks; ++r) {
    makeInput(it, r, static_cast<size_t>(d) * it.count, it.count, slice.data());
    first[r].resize(pb);
    zp::quantizeRef(slice.data(), it.type, it.count, it.bits, it.blockSize, first[r].data());
  }
  std::vector<float> sum;
  if (!t.twoHop) {
    std::vector<const unsigned char*> terms;
    for (int r = 0; r < nranks; ++r) terms.push_back(first[r].data());
    sum = sumInOrder(it, terms);
  } else {
    const size_t nodes = t.nodeRanks.size();
    std::vector<Buffer> partial(nodes);
    std::vector<const unsigned char*> partials;
    for (size_t a = 0; a < nodes; ++a) {
      std::vector<const unsigned char*> terms;
      for (int r : t.nodeRanks[a]) terms.push_back(first[r].data());
      const std::vector<float> p = sumInOrder(it, terms);
      partial[a].resize(pb);
      zp::quantizeRef(p.data(), zpFloat32, it.count, it.bits, it.blockSize, partial[a].data());
      partials.push_back(partial[a].data());
    }
    sum = sumInOrder(it, partials);
  }
  const float divisor = it.op == zpAvg ? static_cast<float>(nranks) : 1.0f;
  for (size_t i = 0; i < it.count; ++i) {
    switch (it.type) {
      case zpFloat16: {
        const uint16_t b = zp::finishReduction<zp::Fp16Type>(sum[i], divisor);
        std::memcpy(out + 2 * i, &b, 2);
        break;
      }
      case zpBfloat16: {
        const uint16_t b = zp::finishReduction<zp::Bf16Type>(sum[i], divisor);
        std::memcpy(out + 2 * i, &b, 2);
        break;
      }
      default: {
        const uint32_t b = zp::finishReduction<zp::Fp32Type>(sum[i], divisor);
        std::memcpy(out + 4 * i, &b, 4);
        break;
      }
    }
  }
}

// ---- one iteration on one rank -----------------------------------------------------------------------------

// Runs `it` on this rank and checks it; returns "" or what went wrong.
std::string runIteration(const Iter& it, const RefTopo& t, int nranks, int rank, zpComm_t comm) {
  const size_t es = bytesOf(it.type), shard = it.count * es;
  const int hpz = static_cast<int>(t.nodeRanks[t.nodeOf[rank]].size());
  const int hpzRank = t.localOf[rank];
  size_t sendElems = it.count, recvElems = it.count;
  int inPlaceSlot = 0;  // the slot of the send side inside the receive side (all-gathers) or the reverse (qgZ)
  switch (it.coll) {
    case kQwz:
      recvElems = it.count * nranks, inPlaceSlot = rank;
      break;
    case kHpz:
      recvElems = it.count * hpz, inPlaceSlot = hpzRank;
      break;
    case kQgz:
      sendElems = it.count * nranks, inPlaceSlot = rank;
      break;
  }
  Buffer input(sendElems * es);
  makeInput(it, rank, 0, sendElems, input.data());
  // Out of place: separate send and receive buffers. In place: one buffer, the smaller side inside the larger.
  const size_t bigBytes = std::max(sendElems, recvElems) * es;
  Buffer big(bigBytes + kGuard), send(it.inPlace ? 0 : sendElems * es);
  big.poison(kPoison);
  const void* sendPtr;
  unsigned char* recvPtr;
  unsigned char* out;  // where the result lands
  if (!it.inPlace) {
    std::memcpy(send.data(), input.data(), sendElems * es);
    sendPtr = send.data();
    recvPtr = out = big.data();
  } else if (it.coll == kQgz) {
    std::memcpy(big.data(), input.data(), sendElems * es);
    sendPtr = big.data();
    recvPtr = out = big.data() + inPlaceSlot * shard;
  } else {
    std::memcpy(big.data() + inPlaceSlot * shard, input.data(), shard);
    sendPtr = big.data() + inPlaceSlot * shard;
    recvPtr = out = big.data();
  }
  zpResult_t res = zpInternalError;
  switch (it.coll) {
    case kQwz:
      res = it.ex ? zpQuantAllGatherEx(sendPtr, recvPtr, it.count, it.type, &it.options, comm, nullptr)
                  : zpQuantAllGather(sendPtr, recvPtr, it.count, it.type, comm, nullptr);
      break;
    case kHpz:
      res = it.ex ? zpHierAllGatherEx(sendPtr, recvPtr, it.count, it.type, &it.options, comm, nullptr)
                  : zpHierAllGather(sendPtr, recvPtr, it.count, it.type, comm, nullptr);
      break;
    case kQgz:
      res = it.ex ? zpQuantReduceScatterA2AEx(sendPtr, recvPtr, it.count, it.type, it.op, &it.options, comm, nullptr)
                  : zpQuantReduceScatterA2A(sendPtr, recvPtr, it.count, it.type, it.op, comm, nullptr);
      break;
  }
  if (res != zpSuccess) return std::string("returned ") + zpGetErrorString(res) + ": " + zpGetLastError(comm);
  if (std::strcmp(zpGetLastError(comm), "") != 0) return std::string("last error not cleared: ") + zpGetLastError(comm);
  Buffer expected(recvElems * es);
  switch (it.coll) {
    case kQwz:
      referenceQwz(it, nranks, expected.data());
      break;
    case kHpz:
      referenceHpz(it, t, rank, expected.data());
      break;
    case kQgz:
      referenceQgz(it, t, nranks, rank, expected.data());
      break;
  }
  const ::testing::AssertionResult same = zpcheck::sameBits(out, expected.data(), recvElems, es);
  if (!same) return std::string("differs from the reference: ") + same.message();
  const ::testing::AssertionResult guard = zpcheck::allBytesAre(big.data() + bigBytes, kGuard, kPoison);
  if (!guard) return std::string("wrote past its output: ") + guard.message();
  if (!it.inPlace && std::memcmp(send.data(), input.data(), sendElems * es) != 0) return "changed its sendbuff";
  return "";
}

// ---- the soak ----------------------------------------------------------------------------------------------

// Threads wait here until the main thread has looked (at VmRSS) and opens it.
class Gate {
 public:
  void arriveAndWait() {
    std::unique_lock<std::mutex> lock(mutex_);
    ++arrived_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
  }
  void waitFor(int threads) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return arrived_ == threads; });
  }
  void open() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  bool open_ = false;
};

TEST(SoakHost, RandomCallsMatchTheReferenceAndMemoryStaysFlat) {
  const int64_t iters = std::max<int64_t>(1, envInt("ZP_SOAK_ITERS", kDefaultIters));
  const uint64_t seed = static_cast<uint64_t>(envInt("ZP_SOAK_SEED", 20240611));
  const std::vector<Layout>& all = layouts();
  const int nLayouts = static_cast<int>(all.size());
  std::printf("[ SoakHost ] %lld iterations per collective over %d layouts, seed %llu (ZP_SOAK_ITERS, ZP_SOAK_SEED)\n",
              static_cast<long long>(iters), nLayouts, static_cast<unsigned long long>(seed));

  // Layout l runs perLayout[l] iterations of each collective, interleaved in a shuffled order, the first
  // warmup[l] of them (starting with the largest count) before the memory baseline.
  std::vector<std::vector<Coll>> order(nLayouts);
  std::vector<int> warmup(nLayouts);
  for (int l = 0; l < nLayouts; ++l) {
    const int64_t n = iters / nLayouts + (l < iters % nLayouts ? 1 : 0);
    std::vector<Coll> seq;
    for (int64_t k = 0; k < n; ++k) seq.insert(seq.end(), {kQwz, kHpz, kQgz});
    std::mt19937_64 rng(zpcheck::hash3(seed, l, 0xc011));
    std::shuffle(seq.begin() + std::min<size_t>(3, seq.size()), seq.end(), rng);
    order[l] = seq;
    warmup[l] = static_cast<int>(std::min<size_t>(seq.size(), std::max<size_t>(6, seq.size() / 10)));
  }

  int threads = 0;
  for (const Layout& L : all) threads += L.nranks;
  Gate warm, done;
  std::atomic<long> failures{0};
  std::vector<std::array<std::atomic<long>, 3>> ran(nLayouts);
  for (auto& r : ran)
    for (auto& c : r) c = 0;
  std::mutex reportMutex;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (int l = 0; l < nLayouts; ++l) {
    const Layout& L = all[l];
    const RefTopo topo = refTopo(L);
    zpUniqueId id;
    ASSERT_EQ(zpGetUniqueId(&id), zpSuccess);
    for (int rank = 0; rank < L.nranks; ++rank) {
      workers.emplace_back([&, l, rank, id, topo] {
        const Layout& L = all[l];
        zpConfig_t config = ZP_CONFIG_INITIALIZER;
        config.backend = zpBackendHost;
        if (L.ranksPerNode > 0)
          config.ranksPerNode = L.ranksPerNode;
        else
          config.nodeId = L.nodeIds[rank];
        zpComm_t comm = nullptr;
        const zpResult_t init = zpCommInitRankConfig(&comm, L.nranks, id, rank, &config);
        EXPECT_EQ(init, zpSuccess) << L.name << " rank " << rank << ": " << zpGetLastError(nullptr);
        const std::vector<Coll>& seq = order[l];
        for (size_t i = 0; i < seq.size() && init == zpSuccess; ++i) {
          if (static_cast<int>(i) == warmup[l]) warm.arriveAndWait();
          const Iter it = makeIter(zpcheck::hash3(seed, l, i), seq[i], L.nranks, i < 3);
          const std::string problem = runIteration(it, topo, L.nranks, rank, comm);
          if (rank == 0) ran[l][seq[i]]++;
          if (!problem.empty() && failures++ < 10) {
            std::lock_guard<std::mutex> lock(reportMutex);
            ADD_FAILURE() << L.name << " rank " << rank << " iteration " << i << " " << describe(it) << ": " << problem;
          }
        }
        if (init != zpSuccess || static_cast<int>(seq.size()) <= warmup[l]) warm.arriveAndWait();
        done.arriveAndWait();
        if (init == zpSuccess) {
          EXPECT_EQ(zpCommDestroy(comm), zpSuccess) << zpGetLastError(nullptr);
        }
      });
    }
  }
  warm.waitFor(threads);
  const long rssWarm = vmRssKb();
  warm.open();
  done.waitFor(threads);
  const long rssEnd = vmRssKb();
  done.open();
  for (auto& w : workers) w.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  long perColl[3] = {0, 0, 0};
  for (int l = 0; l < nLayouts; ++l)
    for (int c = 0; c < 3; ++c) perColl[c] += ran[l][c];
  std::printf(
      "[ SoakHost ] qwZ %ld, hpZ %ld, qgZ %ld iterations in %.1f s; VmRSS %ld kB after warm-up, %ld kB at the end\n",
      perColl[0], perColl[1], perColl[2], seconds, rssWarm, rssEnd);
  for (int c = 0; c < 3; ++c) EXPECT_EQ(perColl[c], iters) << kCollNames[c];
  EXPECT_EQ(failures.load(), 0) << "iterations that failed (the first 10 are reported above)";
  if (ZP_SOAK_UNDER_ASAN) {
    std::printf("[ SoakHost ] AddressSanitizer build: VmRSS not checked (LeakSanitizer checks leaks)\n");
    return;
  }
  ASSERT_GT(rssWarm, 0) << "no VmRSS in /proc/self/status";
  EXPECT_LT(rssEnd - rssWarm, kRssGrowthLimitKb) << "host memory grew from " << rssWarm << " kB to " << rssEnd << " kB";
}

}  // namespace
