// zpQuantAllReduce on the host backend, against a reference written here from include/zpccl.h's "Quantized
// all-reduce" (the shards, then qgZ's reduce-scatter of each shard and qwZ's gather of the reduced shards, built from
// the block format's reference functions, not from the backend's code): bit-equal to it on every rank, every rank's
// output bit-identical, deterministic, the same in place, within the header's error bound of the float64 sum; a NaN
// or Inf in one rank's input, or an overflow, makes exactly its block NaN on every rank; the gradient options equal
// qgZ's on zero-padded shards followed by qwZ's gather; bad input and ranks that disagree are refused by name, the
// communicator usable after.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include "host/quant_format.h"
#include "host/quant_math.h"
#include "host/quant_ref.h"
#include "host/reduce_math.h"
#include "include/zpccl.h"
#include "tests/collective_check.h"
#include "tests/host_layout.h"
#include "tests/host_ranks.h"

namespace {

using zpcheck::Buffer;
using zpcheck::bytesOf;
using zpcheck::mentions;
using zpcheck::sameBits;
using zptest::runHostRanks;

// ---- layouts ---------------------------------------------------------------------------------------------------

using zptest::configure;
using zptest::labels;
using zptest::Layout;
using zptest::layoutName;
using zptest::refTopo;

const std::vector<Layout>& allLayouts() {
  static const std::vector<Layout> layouts = {
      {"n1x1", 1, 1, {}},
      {"n1x2", 2, 2, {}},
      {"n1x4", 4, 4, {}, true},
      {"n2x1", 2, 1, {}},
      {"n4x1", 4, 1, {}},
      {"n2x2", 4, 2, {}, true},
      {"n3x2", 6, 2, {}},
      {"n2x4", 8, 4, {}},
      {"interleaved2x3", 6, 0, labels(6, 2)},
      // Node 0 holds ranks 0 and 3: local rank 1's ranks run backwards, so the two-hop gather finishes slot by slot.
      {"crossed2x2", 4, 0, {0, 1, 1, 0}},
      {"uneven3p1", 4, 0, {0, 0, 0, 1}, true},
      {"uneven2p1", 3, 0, {7, 3, 7}},
  };
  return layouts;
}

// ---- inputs ----------------------------------------------------------------------------------------------------

struct Injection {
  int rank = -1;
  size_t index = 0;
  float value = 0.0f;
};

struct Spec {
  zpDataType_t type = zpFloat32;
  size_t count = 0;
  int bits = 4, blockSize = 256;
  zpRedOp_t op = zpSum;
  uint64_t seed = 0;
  std::vector<Injection> inj;  // values overridden in some ranks' inputs
};

// Rank r's whole input (count elements).
void makeInput(const Spec& s, int rank, void* dst) {
  zpcheck::fillRandom(s.type, dst, s.count, s.seed, rank);
  for (const Injection& j : s.inj) {
    if (j.rank == rank) zpcheck::storeValue(s.type, dst, j.index, j.value);
  }
}

std::string describe(const Spec& s) {
  return std::string(zp::typeName(s.type)) + " count " + std::to_string(s.count) + " int" + std::to_string(s.bits) +
         " block " + std::to_string(s.blockSize) + " " + zp::opName(s.op);
}

// ---- the reference -----------------------------------------------------------------------------------------------

// The full shard as the header states it, in its other form: ceil(ceil(c / n) / G) = ceil(c / (n G)).
size_t shardOf(size_t count, int n, int blockSize) {
  const size_t group = static_cast<size_t>(n) * blockSize;
  return (count + group - 1) / group * blockSize;
}

float element(const unsigned char* payload, size_t count, const Spec& s, size_t i) {
  return s.bits == 8 ? zp::payloadElement<8>(payload, count, s.blockSize, i)
                     : zp::payloadElement<4>(payload, count, s.blockSize, i);
}

void finishInto(zpDataType_t type, float sum, float divisor, void* out, size_t i) {
  auto* o = static_cast<unsigned char*>(out);
  if (type == zpFloat16) {
    const uint16_t b = zp::finishReduction<zp::Fp16Type>(sum, divisor);
    std::memcpy(o + 2 * i, &b, 2);
  } else if (type == zpBfloat16) {
    const uint16_t b = zp::finishReduction<zp::Bf16Type>(sum, divisor);
    std::memcpy(o + 2 * i, &b, 2);
  } else {
    const uint32_t b = zp::finishReduction<zp::Fp32Type>(sum, divisor);
    std::memcpy(o + 4 * i, &b, 4);
  }
}

struct Expected {
  Buffer out;                 // count elements, the same on every rank
  std::vector<double> exact;  // the float64 sum (Avg: mean) of the typed inputs
  std::vector<double> bound;  // the header's bound on |out - exact|
};

// Sums payloads element by element in fp32, in the order given, with qgZ's block rule.
std::vector<float> sumPayloads(const std::vector<const unsigned char*>& terms, size_t len, const Spec& s) {
  std::vector<float> sum(len);
  for (size_t i = 0; i < len; ++i) {
    float acc = element(terms[0], len, s, i);
    for (size_t k = 1; k < terms.size(); ++k) acc = zp::addRn(acc, element(terms[k], len, s, i));
    sum[i] = acc;
  }
  zpcheck::applyBlockRule(&sum, s.blockSize);
  return sum;
}

Expected reference(const zpcheck::RefTopo& topo, const Spec& s) {
  const int n = static_cast<int>(topo.nodeOf.size());
  const size_t es = bytesOf(s.type), shard = shardOf(s.count, n, s.blockSize);
  std::vector<Buffer> inputs(n);
  for (int r = 0; r < n; ++r) {
    inputs[r].resize(s.count * es);
    makeInput(s, r, inputs[r].data());
  }
  Expected e;
  e.out.resize(s.count * es);
  const float divisor = s.op == zpAvg ? static_cast<float>(n) : 1.0f;
  for (int d = 0; d < n; ++d) {
    const size_t begin = std::min(s.count, d * shard), len = std::min(s.count, begin + shard) - begin;
    if (len == 0) continue;
    const size_t pb = zp::quantPayloadBytes(len, s.bits, s.blockSize);
    // The reduce-scatter: every rank's part of shard d quantized on its own...
    std::vector<Buffer> first(n);
    for (int r = 0; r < n; ++r) {
      first[r].resize(pb);
      zp::quantizeRef(inputs[r].data() + begin * es, s.type, len, s.bits, s.blockSize, first[r].data());
    }
    // ...summed in rank order (one hop), or per node in local order, requantized, then in node order (two hops)...
    std::vector<float> sum;
    if (!topo.twoHop) {
      std::vector<const unsigned char*> terms;
      for (int r = 0; r < n; ++r) terms.push_back(first[r].data());
      sum = sumPayloads(terms, len, s);
    } else {
      std::vector<Buffer> partials(topo.nodeRanks.size());
      std::vector<const unsigned char*> finals;
      for (size_t a = 0; a < topo.nodeRanks.size(); ++a) {
        std::vector<const unsigned char*> terms;
        for (int r : topo.nodeRanks[a]) terms.push_back(first[r].data());
        const std::vector<float> partial = sumPayloads(terms, len, s);
        partials[a].resize(pb);
        zp::quantizeRef(partial.data(), zpFloat32, len, s.bits, s.blockSize, partials[a].data());
        finals.push_back(partials[a].data());
      }
      sum = sumPayloads(finals, len, s);
    }
    // ...divided and rounded to the type: the reduced shard; then quantized and dequantized by every rank alike.
    Buffer reduced(len * es), payload(pb);
    for (size_t i = 0; i < len; ++i) finishInto(s.type, sum[i], divisor, reduced.data(), i);
    zp::quantizeRef(reduced.data(), s.type, len, s.bits, s.blockSize, payload.data());
    zp::dequantizeRef(payload.data(), s.type, len, s.bits, s.blockSize, e.out.data() + begin * es);
  }
  // The bound, per block of the tensor (include/zpccl.h).
  const double q = zp::quantMax(s.bits);
  const double u = s.type == zpFloat32 ? 0x1p-24 : s.type == zpFloat16 ? 0x1p-11 : 0x1p-8;
  e.exact.assign(s.count, 0.0);
  e.bound.assign(s.count, 0.0);
  for (size_t b0 = 0; b0 < s.count; b0 += s.blockSize) {
    const size_t b1 = std::min(s.count, b0 + s.blockSize);
    double A = 0.0, M = 0.0;
    for (int r = 0; r < n; ++r) {
      double most = 0.0;
      for (size_t i = b0; i < b1; ++i)
        most = std::max(most, std::fabs(zpcheck::loadValue(s.type, inputs[r].data(), i)));
      A += most;
    }
    for (size_t i = b0; i < b1; ++i) {
      for (int r = 0; r < n; ++r) e.exact[i] += zpcheck::loadValue(s.type, inputs[r].data(), i);
      M = std::max(M, std::fabs(e.exact[i]));
    }
    const double E = topo.twoHop ? A / (2 * q) * (2 + 1 / (2 * q)) : A / (2 * q);
    const double bound = E + (M + E) * (1 / (2 * q) + 3 * u) + (n + 1) * 0x1p-16 * A;
    for (size_t i = b0; i < b1; ++i) {
      if (s.op == zpAvg) e.exact[i] /= n;
      e.bound[i] = s.op == zpAvg ? bound / n : bound;
    }
  }
  return e;
}

// out within the bound, element by element, outside [skipBegin, skipEnd); every checked element finite. *worst gets
// the largest error / bound seen.
::testing::AssertionResult withinBound(const Spec& s, const Expected& e, const void* out, size_t skipBegin = 0,
                                       size_t skipEnd = 0, double* worst = nullptr) {
  for (size_t i = 0; i < s.count; ++i) {
    if (i >= skipBegin && i < skipEnd) continue;
    const double o = zpcheck::loadValue(s.type, out, i);
    if (!std::isfinite(o)) return ::testing::AssertionFailure() << "element " << i << " is not finite: " << o;
    const double err = std::fabs(o - e.exact[i]);
    if (worst != nullptr && e.bound[i] > 0) *worst = std::max(*worst, err / e.bound[i]);
    if (!(err <= e.bound[i])) {
      return ::testing::AssertionFailure() << "element " << i << ": out " << o << ", float64 result " << e.exact[i]
                                           << ", error " << err << " > bound " << e.bound[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// ---- calls -------------------------------------------------------------------------------------------------------

struct Setting {
  const char* name;
  bool ex;
  int bits, blockSize;  // 0: the communicator's
};

const Setting kSettings[] = {
    {"plain", false, 0, 0},
    {"ex{8,32}", true, 8, 32},
    {"ex{4,8192}", true, 4, 8192},
    {"ex{8,-}", true, 8, 0},
};

zpResult_t callAllReduce(const Setting& st, const void* send, void* recv, const Spec& s, zpComm_t comm) {
  if (!st.ex) return zpQuantAllReduce(send, recv, s.count, s.type, s.op, comm, nullptr);
  zpGradOptions_t o = ZP_GRAD_OPTIONS_INITIALIZER;
  if (st.bits) o.bits = st.bits;
  if (st.blockSize) o.blockSize = st.blockSize;
  return zpQuantAllReduceEx(send, recv, s.count, s.type, s.op, &o, comm, nullptr);
}

// The communicator's defaults: gradBits 4, blocks of 256.
Spec makeSpec(const Setting& st, zpDataType_t type, size_t count, zpRedOp_t op, uint64_t seed) {
  Spec s;
  s.type = type;
  s.count = count;
  s.bits = st.bits ? st.bits : 4;
  s.blockSize = st.blockSize ? st.blockSize : 256;
  s.op = op;
  s.seed = seed;
  return s;
}

// ---- reference, every rank alike, determinism, in place, bound ------------------------------------------------

class AllReduceLayout : public ::testing::TestWithParam<Layout> {};

TEST_P(AllReduceLayout, BitEqualToReferenceOnEveryRankDeterministicInPlaceAndWithinBound) {
  const Layout L = GetParam();
  const zpcheck::RefTopo topo = refTopo(L);
  const int n = L.nranks;
  struct Case {
    Spec spec;
    const Setting* setting;
    Expected expected;
  };
  std::vector<Case> cases;
  uint64_t seed = 9100 + 100 * n;
  // 1; fewer elements than ranks; around a block; more ranks' worth of blocks than there are, so that the last
  // shards are partial or empty; a multiple of n blocks (every shard full).
  const size_t counts[] = {1, 3, 255, 257, 1000, 4099, static_cast<size_t>(n) * 512};
  for (zpDataType_t type : zpcheck::kQuantTypes) {
    for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ++ci) {
      for (size_t si = 0; si < sizeof(kSettings) / sizeof(kSettings[0]); ++si) {
        const Spec s = makeSpec(kSettings[si], type, counts[ci], (ci + si) % 2 ? zpAvg : zpSum, ++seed);
        cases.push_back({s, &kSettings[si], reference(topo, s)});
      }
    }
  }
  if (L.large) {
    for (const Spec& s : {makeSpec(kSettings[0], zpBfloat16, 100003, zpAvg, ++seed),
                          makeSpec(kSettings[1], zpFloat32, 100003, zpSum, ++seed)}) {
      cases.push_back({s, &kSettings[s.bits == 8 ? 1 : 0], reference(topo, s)});
    }
  }
  std::vector<std::vector<Buffer>> outputs(n);  // per rank, per case
  std::vector<double> worst(n, 0.0);
  std::atomic<int> finished{0};
  runHostRanks(
      n, [&](int rank, zpConfig_t* c) { configure(L, rank, c); },
      [&](int rank, zpComm_t comm) {
        for (const Case& c : cases) {
          const Spec& s = c.spec;
          SCOPED_TRACE("rank " + std::to_string(rank) + " " + describe(s) + " " + c.setting->name);
          const size_t bytes = s.count * bytesOf(s.type);
          Buffer send(bytes), recv(bytes);
          makeInput(s, rank, send.data());
          ASSERT_EQ(callAllReduce(*c.setting, send.data(), recv.data(), s, comm), zpSuccess) << zpGetLastError(comm);
          EXPECT_STREQ(zpGetLastError(comm), "");
          EXPECT_TRUE(sameBits(recv.data(), c.expected.out.data(), s.count, s.type)) << "differs from the reference";
          EXPECT_TRUE(withinBound(s, c.expected, recv.data(), 0, 0, &worst[rank]));
          Buffer again(bytes);
          ASSERT_EQ(callAllReduce(*c.setting, send.data(), again.data(), s, comm), zpSuccess) << zpGetLastError(comm);
          EXPECT_TRUE(sameBits(again.data(), recv.data(), s.count, s.type)) << "not deterministic";
          Buffer inplace(bytes);
          std::memcpy(inplace.data(), send.data(), bytes);
          ASSERT_EQ(callAllReduce(*c.setting, inplace.data(), inplace.data(), s, comm), zpSuccess)
              << zpGetLastError(comm);
          EXPECT_TRUE(sameBits(inplace.data(), recv.data(), s.count, s.type)) << "in place differs";
          outputs[rank].push_back(std::move(recv));
        }
        finished++;
      });
  ASSERT_EQ(finished.load(), n);
  // Every rank's output bit-identical to rank 0's (the reference is one buffer for all; this says it directly).
  for (int r = 1; r < n; ++r) {
    for (size_t k = 0; k < cases.size(); ++k) {
      EXPECT_TRUE(sameBits(outputs[r][k].data(), outputs[0][k].data(), cases[k].spec.count, cases[k].spec.type))
          << "rank " << r << " differs from rank 0 in " << describe(cases[k].spec);
    }
  }
  // The bound is approached (error / bound), or it would check nothing.
  const double worstAll = *std::max_element(worst.begin(), worst.end());
  EXPECT_GT(worstAll, 0.2) << "the error bound is never approached: is it too loose?";
  EXPECT_LE(worstAll, 1.0);
}

INSTANTIATE_TEST_SUITE_P(AllReduce, AllReduceLayout, ::testing::ValuesIn(allLayouts()), layoutName);

// The reference itself on one case worked by hand: two ranks, count 1, fp32, int4. Each rank's one-element block
// quantizes to +-7 * (|x| / 7), the sum of the two is the reduced shard (rank 0's), which quantizes the same way.
TEST(AllReduceReference, TwoRanksOneElementByHand) {
  Spec s;
  s.count = 1;
  s.bits = 4;
  s.blockSize = 32;
  s.seed = 5;
  const Expected e = reference(zpcheck::refTopo(2, 2, {}), s);
  float x[2];
  for (int r = 0; r < 2; ++r) {
    Buffer in(4);
    makeInput(s, r, in.data());
    std::memcpy(&x[r], in.data(), 4);
  }
  auto roundTrip = [](float v) { return (v < 0 ? -7.0f : 7.0f) * (std::fabs(v) / 7.0f); };
  float got;
  std::memcpy(&got, e.out.data(), 4);
  EXPECT_EQ(zp::floatBits(got), zp::floatBits(roundTrip(roundTrip(x[0]) + roundTrip(x[1]))));
}

TEST(AllReduceShards, ShardCountIsWholeBlocksOfTheRanksShare) {
  runHostRanks(
      8, [](int, zpConfig_t* c) { c->ranksPerNode = 4; },
      [](int, zpComm_t comm) {
        struct Row {
          size_t count;
          int blockSize;
          size_t shard;
        };
        // The header's example (1000, 8 ranks, 256: ranks 0-2 reduce 256, rank 3 232, the rest none), and more.
        const Row rows[] = {{0, 256, 0},      {1, 256, 256},  {1000, 256, 256},    {2048, 256, 256},
                            {2049, 256, 512}, {1000, 0, 256}, {100003, 32, 12512}, {8 * 8192, 8192, 8192}};
        for (const Row& row : rows) {
          size_t shard = 0;
          ASSERT_EQ(zpQuantAllReduceShardCount(row.count, row.blockSize, &shard, comm), zpSuccess)
              << zpGetLastError(comm);
          EXPECT_EQ(shard, row.shard) << row.count << " " << row.blockSize;
          EXPECT_EQ(shard, shardOf(row.count, 8, row.blockSize ? row.blockSize : 256));
        }
        size_t shard = 0;
        EXPECT_EQ(zpQuantAllReduceShardCount(100, 48, &shard, comm), zpInvalidArgument);
        EXPECT_TRUE(mentions(zpGetLastError(comm), "zpQuantAllReduceShardCount : blockSize 48"))
            << zpGetLastError(comm);
        EXPECT_EQ(zpQuantAllReduceShardCount(100, 0, nullptr, comm), zpInvalidArgument);
        EXPECT_TRUE(mentions(zpGetLastError(comm), "zpQuantAllReduceShardCount : shardCount is NULL"));
        EXPECT_EQ(zpQuantAllReduceShardCount(SIZE_MAX / 8, 0, &shard, comm), zpInvalidArgument);
        EXPECT_TRUE(mentions(zpGetLastError(comm), "overflows")) << zpGetLastError(comm);
      });
}

TEST(AllReduceEdge, CountZeroSucceedsAndLeavesRecvbuffUntouched) {
  runHostRanks(
      4, [](int, zpConfig_t* c) { c->ranksPerNode = 2; },
      [](int rank, zpComm_t comm) {
        Buffer send(256), recv(256);
        zpcheck::fillRandom(zpFloat32, send.data(), 64, 3, rank);
        recv.poison(0xa5);
        EXPECT_EQ(zpQuantAllReduce(send.data(), recv.data(), 0, zpFloat32, zpSum, comm, nullptr), zpSuccess);
        EXPECT_TRUE(zpcheck::allBytesAre(recv.data(), recv.size(), 0xa5));
        EXPECT_EQ(zpQuantAllReduceEx(nullptr, nullptr, 0, zpBfloat16, zpAvg, nullptr, comm, nullptr), zpSuccess);
        EXPECT_STREQ(zpGetLastError(comm), "");
      });
}

// ---- NaN, Inf and overflow -------------------------------------------------------------------------------------

// A NaN or +-Inf in one element of one rank's input: the tensor's block that holds it is all NaN on every rank
// (whichever shard, hop or rank it lies in), every other element finite and within the bound.
class AllReduceSpecials : public ::testing::TestWithParam<Layout> {};

TEST_P(AllReduceSpecials, TheBlockOfTheSpecialIsNaNOnEveryRankTheRestFinite) {
  const Layout L = GetParam();
  const zpcheck::RefTopo topo = refTopo(L);
  const int n = L.nranks;
  const size_t count = 1500;  // blocks of 256: shards of 256 or more; the last block partial
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()};
  const size_t where[] = {0, 300, 1499, 767};
  struct Case {
    Spec spec;
    const Setting* setting;
    Expected expected;
    size_t begin, end;  // the poisoned block
  };
  std::vector<Case> cases;
  uint64_t seed = 300;
  for (zpDataType_t type : zpcheck::kQuantTypes) {
    for (size_t k = 0; k < 3; ++k) {
      for (size_t w = 0; w < 4; ++w) {
        const Setting* st = &kSettings[(k + w) % 2];
        Spec s = makeSpec(*st, type, count, (w & 1) ? zpAvg : zpSum, ++seed);
        s.inj.push_back(Injection{static_cast<int>((w + k) % n), where[w], specials[k]});
        const size_t begin = where[w] / s.blockSize * s.blockSize;
        cases.push_back({s, st, reference(topo, s), begin, std::min(count, begin + s.blockSize)});
      }
    }
  }
  runHostRanks(
      n, [&](int rank, zpConfig_t* c) { configure(L, rank, c); },
      [&](int rank, zpComm_t comm) {
        for (const Case& c : cases) {
          const Spec& s = c.spec;
          SCOPED_TRACE("rank " + std::to_string(rank) + " " + describe(s) + " special " +
                       std::to_string(s.inj[0].value) + " from rank " + std::to_string(s.inj[0].rank) + " at " +
                       std::to_string(s.inj[0].index));
          Buffer send(count * bytesOf(s.type)), recv(count * bytesOf(s.type));
          makeInput(s, rank, send.data());
          ASSERT_EQ(callAllReduce(*c.setting, send.data(), recv.data(), s, comm), zpSuccess) << zpGetLastError(comm);
          EXPECT_TRUE(sameBits(recv.data(), c.expected.out.data(), count, s.type));
          for (size_t i = c.begin; i < c.end; ++i) {
            ASSERT_TRUE(zpcheck::isNaNBits(s.type, zpcheck::loadBits(s.type, recv.data(), i))) << "element " << i;
          }
          EXPECT_TRUE(withinBound(s, c.expected, recv.data(), c.begin, c.end));
        }
      });
}

INSTANTIATE_TEST_SUITE_P(AllReduce, AllReduceSpecials,
                         ::testing::Values(Layout{"n1x1", 1, 1, {}}, Layout{"n1x2", 2, 2, {}}, Layout{"n2x1", 2, 1, {}},
                                           Layout{"n2x2", 4, 2, {}}, Layout{"n3x2", 6, 2, {}},
                                           Layout{"interleaved2x3", 6, 0, labels(6, 2)},
                                           Layout{"uneven3p1", 4, 0, {0, 0, 0, 1}}),
                         layoutName);

// Sums beyond a range, on one hop and two: an fp32 sum that overflows (fp32, bf16 inputs) and a sum finite in fp32
// but beyond fp16's range both make their block NaN on every rank (qgZ's +-Inf element of fp16 is a block holding
// Inf when the gather quantizes it), and leave every other element finite.
TEST(AllReduceOverflow, ASumBeyondTheRangeMakesItsBlockNaNOnEveryRank) {
  struct Shape {
    const char* name;
    int nranks, ranksPerNode;
  };
  const Shape shapes[] = {{"1 node of 4", 4, 4}, {"4 nodes of 1", 4, 1}, {"2 nodes of 2", 4, 2}};
  const size_t count = 2000, hot = 1300;  // in rank 2's shard of 512 (blocks of 128: shards of 512)
  const int blockSize = 128;
  struct Kind {
    zpDataType_t type;
    float big;
  };
  const Kind kinds[] = {{zpFloat32, 3e38f}, {zpBfloat16, 3e38f}, {zpFloat16, 60000.0f}};
  for (const Shape& sh : shapes) {
    for (const Kind& k : kinds) {
      for (int bits : {4, 8}) {
        SCOPED_TRACE(std::string(sh.name) + ", " + zp::typeName(k.type) + ", int" + std::to_string(bits));
        runHostRanks(
            sh.nranks, [&](int, zpConfig_t* c) { c->ranksPerNode = sh.ranksPerNode; },
            [&](int rank, zpComm_t comm) {
              const size_t es = bytesOf(k.type);
              Buffer send(count * es), recv(count * es);
              for (size_t i = 0; i < count; ++i) {
                const float small = 0.01f * static_cast<float>((i + rank) % 7) - 0.03f;
                zpcheck::storeValue(k.type, send.data(), i, i == hot ? k.big : small);
              }
              zpGradOptions_t o = ZP_GRAD_OPTIONS_INITIALIZER;
              o.bits = bits;
              o.blockSize = blockSize;
              ASSERT_EQ(zpQuantAllReduceEx(send.data(), recv.data(), count, k.type, zpSum, &o, comm, nullptr),
                        zpSuccess)
                  << zpGetLastError(comm);
              const size_t begin = hot / blockSize * blockSize, end = begin + blockSize;
              for (size_t i = 0; i < count; ++i) {
                const uint32_t b = zpcheck::loadBits(k.type, recv.data(), i);
                if (i >= begin && i < end) {
                  ASSERT_TRUE(zpcheck::isNaNBits(k.type, b)) << "rank " << rank << " element " << i;
                } else {
                  ASSERT_TRUE(std::isfinite(zpcheck::loadValue(k.type, recv.data(), i)))
                      << "rank " << rank << " element " << i;
                }
              }
            });
      }
    }
  }
}

// Avg rounds the mean, not the sum, to the type: fp16 inputs whose sum leaves fp16's range but whose mean does not
// give a finite block within the bound, on one hop and two. The division follows the fp32 sum, so inputs whose sum
// leaves fp32's range give a NaN block under Avg too (include/zpccl.h: "some fp32 sum in it overflows").
TEST(AllReduceOverflow, AvgIsFiniteWhereTheMeanFitsTheTypeNaNWhereTheFp32SumOverflows) {
  const int shapes[] = {4, 1, 2};  // ranks per node of 4 ranks: one node, four nodes, two nodes of two
  const size_t count = 700, hot = 300;
  for (int perNode : shapes) {
    for (const auto& k : {std::make_pair(zpFloat16, 60000.0f), std::make_pair(zpBfloat16, 2e38f)}) {
      SCOPED_TRACE(std::string(zp::typeName(k.first)) + ", " + std::to_string(perNode) + " ranks a node");
      Spec s;
      s.type = k.first;
      s.count = count;
      s.bits = 8;
      s.blockSize = 64;
      s.op = zpAvg;
      s.seed = 61;
      for (int r = 0; r < 4; ++r) s.inj.push_back(Injection{r, hot, k.second});
      const Expected e = reference(zpcheck::refTopo(4, perNode, {}), s);
      const size_t begin = hot / s.blockSize * s.blockSize, end = begin + s.blockSize;
      const bool fp32Overflows = 4.0 * k.second > std::numeric_limits<float>::max();
      runHostRanks(
          4, [&](int, zpConfig_t* c) { c->ranksPerNode = perNode; },
          [&](int rank, zpComm_t comm) {
            Buffer send(count * 2), recv(count * 2);
            makeInput(s, rank, send.data());
            zpGradOptions_t o = ZP_GRAD_OPTIONS_INITIALIZER;
            o.bits = s.bits;
            o.blockSize = s.blockSize;
            ASSERT_EQ(zpQuantAllReduceEx(send.data(), recv.data(), count, s.type, zpAvg, &o, comm, nullptr), zpSuccess)
                << zpGetLastError(comm);
            EXPECT_TRUE(sameBits(recv.data(), e.out.data(), count, s.type)) << "rank " << rank;
            if (fp32Overflows) {
              for (size_t i = begin; i < end; ++i) {
                ASSERT_TRUE(zpcheck::isNaNBits(s.type, zpcheck::loadBits(s.type, recv.data(), i))) << "element " << i;
              }
              EXPECT_TRUE(withinBound(s, e, recv.data(), begin, end)) << "rank " << rank;
            } else {
              EXPECT_GT(zpcheck::loadValue(s.type, recv.data(), hot), 59000.0) << "rank " << rank;
              EXPECT_TRUE(withinBound(s, e, recv.data())) << "rank " << rank;
            }
          });
    }
  }
}

// ---- gradient rounding ----------------------------------------------------------------------------------------

// Stochastic rounding and error feedback, on one-hop, two-hop and uneven layouts and a count whose last shards are
// partial or empty: the all-reduce equals, bit for bit (output and both residuals), qgZ (zpQuantReduceScatterA2AEx2)
// with the same options and sequence on the input padded with zeros to n shards, followed by qwZ's gather of the
// reduced shard (zpQuantAllGatherEx, in place) and cut back to count. Zeros change no block's scale, quantize to
// code 0 whatever the draw, and keep a zero residual: the padding adds nothing. And the all-reduce takes its sequence
// number from qgZ's count.
class AllReduceGrad : public ::testing::TestWithParam<Layout> {};

TEST_P(AllReduceGrad, EqualsQgzOnZeroPaddedShardsThenQwz) {
  const Layout L = GetParam();
  const int n = L.nranks;
  runHostRanks(
      n, [&](int rank, zpConfig_t* c) { configure(L, rank, c); },
      [&](int rank, zpComm_t comm) {
        for (zpDataType_t type : {zpBfloat16, zpFloat32}) {
          for (int bits : {4, 8}) {
            const size_t count = 1000 + 37 * bits;
            const int blockSize = 64;
            const size_t es = bytesOf(type);
            size_t shard = 0, hop = 0;
            ASSERT_EQ(zpQuantAllReduceShardCount(count, blockSize, &shard, comm), zpSuccess);
            ASSERT_EQ(zpGradHopResidualCount(shard, &hop, comm), zpSuccess);
            SCOPED_TRACE("rank " + std::to_string(rank) + " " + zp::typeName(type) + " int" + std::to_string(bits));
            Buffer send(count * es), recv(count * es), padded(n * shard * es), shardOut(n * shard * es);
            zpcheck::fillRandom(type, send.data(), count, 40 + bits, rank);
            std::memset(padded.data(), 0, padded.size());
            std::memcpy(padded.data(), send.data(), count * es);
            // Residuals: the all-reduce's (count, hop) and qgZ's (n * shard, hop), from the same nonzero start.
            std::vector<uint16_t> res(count), hopRes(std::max<size_t>(hop, 1)), qres(n * shard, 0),
                qhop(std::max<size_t>(hop, 1));
            for (size_t i = 0; i < count; ++i) res[i] = qres[i] = zp::floatToBf16BitsRn(0.001f * ((i * 7 + rank) % 5));
            // The hop residual's slice b is destination (b, this local rank)'s shard: nonzero where it has elements
            // (ranks numbered node by node on these layouts), zero on the padding, as the sender's.
            int localRank = 0, localSize = 1;
            ASSERT_EQ(zpCommLocalRank(comm, &localRank), zpSuccess);
            ASSERT_EQ(zpCommLocalSize(comm, &localSize), zpSuccess);
            for (size_t i = 0; i < hop; ++i) {
              const size_t dest = (i / shard) * localSize + localRank, j = i % shard;
              const bool held = dest * shard + j < count;
              hopRes[i] = qhop[i] = held ? zp::floatToBf16BitsRn(0.002f * (i % 3)) : 0;
            }
            zpGradOptions_t o = ZP_GRAD_OPTIONS_INITIALIZER;
            o.bits = bits;
            o.blockSize = blockSize;
            o.rounding = zpRoundStochastic;
            o.seed = 11;
            o.sequence = 5;
            o.residual = res.data();
            o.residualCount = count;
            o.hopResidual = hop ? hopRes.data() : nullptr;
            o.hopResidualCount = hop;
            ASSERT_EQ(zpQuantAllReduceEx(send.data(), recv.data(), count, type, zpAvg, &o, comm, nullptr), zpSuccess)
                << zpGetLastError(comm);
            zpGradOptions_t q = o;
            q.residual = qres.data();
            q.residualCount = qres.size();
            q.hopResidual = hop ? qhop.data() : nullptr;
            ASSERT_EQ(zpQuantReduceScatterA2AEx2(padded.data(), shardOut.data() + rank * shard * es, shard, type, zpAvg,
                                                 &q, comm, nullptr),
                      zpSuccess)
                << zpGetLastError(comm);
            const zpQuantOptions_t g{bits, blockSize};
            ASSERT_EQ(zpQuantAllGatherEx(shardOut.data() + rank * shard * es, shardOut.data(), shard, type, &g, comm,
                                         nullptr),
                      zpSuccess)
                << zpGetLastError(comm);
            EXPECT_TRUE(sameBits(recv.data(), shardOut.data(), count, type)) << "output";
            EXPECT_TRUE(sameBits(res.data(), qres.data(), count, 2)) << "residual";
            for (size_t i = count; i < qres.size(); ++i) ASSERT_EQ(qres[i], 0) << "padding residual " << i;
            EXPECT_TRUE(sameBits(hopRes.data(), qhop.data(), hop, 2)) << "hop residual";
          }
        }
        // Sequence numbers: the eight gradient calls above took 0-7, two all-reduces (plain and Ex) take 8 and 9,
        // so qgZ draws as sequence 10.
        const size_t count = 512;
        Buffer send(count * 4 * n), a(count * 4), b(count * 4), ar(count * 4);
        zpcheck::fillRandom(zpFloat32, send.data(), count * n, 77, rank);
        zpGradOptions_t st = ZP_GRAD_OPTIONS_INITIALIZER;
        st.rounding = zpRoundStochastic;
        ASSERT_EQ(zpQuantAllReduce(send.data(), ar.data(), count, zpFloat32, zpSum, comm, nullptr), zpSuccess);
        ASSERT_EQ(zpQuantAllReduceEx(send.data(), ar.data(), count, zpFloat32, zpSum, &st, comm, nullptr), zpSuccess);
        ASSERT_EQ(zpQuantReduceScatterA2AEx2(send.data(), a.data(), count, zpFloat32, zpSum, &st, comm, nullptr),
                  zpSuccess);
        st.sequence = 10;
        ASSERT_EQ(zpQuantReduceScatterA2AEx2(send.data(), b.data(), count, zpFloat32, zpSum, &st, comm, nullptr),
                  zpSuccess);
        EXPECT_TRUE(sameBits(a.data(), b.data(), count, zpFloat32)) << "the all-reduces took sequences 8 and 9";
      });
}

INSTANTIATE_TEST_SUITE_P(AllReduce, AllReduceGrad,
                         ::testing::Values(Layout{"n1x3", 3, 3, {}}, Layout{"n2x1", 2, 1, {}}, Layout{"n2x2", 4, 2, {}},
                                           Layout{"n3x2", 6, 2, {}}, Layout{"uneven2p1", 3, 0, {0, 0, 1}}),
                         layoutName);

// ---- bad input -------------------------------------------------------------------------------------------------

TEST(AllReduceBadInput, RefusedWithTheCallAndArgumentNamedAndTheCommStaysUsable) {
  const int n = 4;
  const size_t count = 1000;
  runHostRanks(
      n, [](int, zpConfig_t* c) { c->ranksPerNode = 2; },
      [&](int rank, zpComm_t comm) {
        Buffer send(count * 4), recv(count * 4), big(count * 8);
        zpcheck::fillRandom(zpFloat32, send.data(), count, 13, rank);
        size_t shard = 0, hop = 0;
        ASSERT_EQ(zpQuantAllReduceShardCount(count, 0, &shard, comm), zpSuccess);
        ASSERT_EQ(zpGradHopResidualCount(shard, &hop, comm), zpSuccess);
        ASSERT_EQ(hop, 2 * shard);
        Spec s;
        s.count = count;
        s.seed = 13;
        const Expected e = reference(zpcheck::refTopo(n, 2, {}), s);
        // After each refusal a matching call works and equals the reference.
        auto goodCallWorks = [&](const std::string& after) {
          recv.poison();
          ASSERT_EQ(zpQuantAllReduce(send.data(), recv.data(), count, zpFloat32, zpSum, comm, nullptr), zpSuccess)
              << "after " << after << ": " << zpGetLastError(comm);
          EXPECT_STREQ(zpGetLastError(comm), "") << "after " << after;
          EXPECT_TRUE(sameBits(recv.data(), e.out.data(), count, zpFloat32)) << "after " << after;
        };
        auto expectBad = [&](const std::string& name, zpResult_t res, const char* call, const char* mention) {
          EXPECT_EQ(res, zpInvalidArgument) << name;
          const std::string msg = zpGetLastError(comm);
          EXPECT_TRUE(mentions(msg.c_str(), (std::string(call) + " : ").c_str())) << name << ": " << msg;
          EXPECT_TRUE(mentions(msg.c_str(), mention)) << name << ": " << msg;
          goodCallWorks(name);
        };
        const void* sb = send.data();
        void* rb = recv.data();
        auto ar = [&](const void* snd, void* rcv, size_t c, zpDataType_t t, zpRedOp_t op) {
          return zpQuantAllReduce(snd, rcv, c, t, op, comm, nullptr);
        };
        const char* kAr = "zpQuantAllReduce";
        expectBad("prod", ar(sb, rb, count, zpFloat32, zpProd), kAr, "op prod");
        expectBad("max", ar(sb, rb, count, zpFloat32, zpMax), kAr, "op max");
        expectBad("min", ar(sb, rb, count, zpFloat32, zpMin), kAr, "op min");
        expectBad("op 99", ar(sb, rb, count, zpFloat32, static_cast<zpRedOp_t>(99)), kAr, "invalid op 99");
        expectBad("int8", ar(sb, rb, count, zpInt8, zpSum), kAr, "type int8");
        expectBad("float64", ar(sb, rb, count, zpFloat64, zpSum), kAr, "type double");
        expectBad("type 99", ar(sb, rb, count, static_cast<zpDataType_t>(99), zpSum), kAr, "invalid type 99");
        expectBad("NULL sendbuff", ar(nullptr, rb, count, zpFloat32, zpSum), kAr, "sendbuff is NULL");
        expectBad("NULL recvbuff", ar(sb, nullptr, count, zpFloat32, zpSum), kAr, "recvbuff is NULL");
        expectBad("misaligned", ar(send.data() + 2, rb, count - 1, zpFloat32, zpSum), kAr, "not aligned");
        expectBad("SIZE_MAX/4+1", ar(sb, rb, SIZE_MAX / 4 + 1, zpFloat32, zpSum), kAr, "overflow");
        expectBad("stream", zpQuantAllReduce(sb, rb, count, zpFloat32, zpSum, comm, zpcheck::bogusStream()), kAr,
                  "stream");
        unsigned char* g = big.data();
        expectBad("overlap +1", ar(g, g + 4, count, zpFloat32, zpSum), kAr, "overlap");
        expectBad("overlap -1", ar(g + 4, g, count, zpFloat32, zpSum), kAr, "overlap");
        // Overlapping by the last element only, either way; adjacent buffers are fine.
        expectBad("overlap tail", ar(g, g + (count - 1) * 4, count, zpFloat32, zpSum), kAr, "overlap");
        expectBad("overlap head", ar(g + (count - 1) * 4, g, count, zpFloat32, zpSum), kAr, "overlap");
        EXPECT_EQ(ar(g, g + count * 4, count, zpFloat32, zpSum), zpSuccess) << zpGetLastError(comm);
        // The options, by field.
        const char* kEx = "zpQuantAllReduceEx";
        auto ex = [&](const zpGradOptions_t& o) {
          return zpQuantAllReduceEx(sb, rb, count, zpFloat32, zpSum, &o, comm, nullptr);
        };
        zpGradOptions_t o = ZP_GRAD_OPTIONS_INITIALIZER;
        o.bits = 6;
        expectBad("bits 6", ex(o), kEx, "options->bits 6");
        o = ZP_GRAD_OPTIONS_INITIALIZER;
        o.blockSize = 48;
        expectBad("block 48", ex(o), kEx, "options->blockSize 48");
        // Every width but 4 and 8, every block size outside the powers of two of [32, 8192], named with its value;
        // the bounds themselves pass.
        for (int bits : {-1, 1, 2, 3, 5, 7, 16, 32, INT32_MAX}) {
          o = ZP_GRAD_OPTIONS_INITIALIZER;
          o.bits = bits;
          const std::string want = "options->bits " + std::to_string(bits) + " must be 4 or 8";
          expectBad("bits " + std::to_string(bits), ex(o), kEx, want.c_str());
        }
        for (int block : {-1, 1, 16, 31, 33, 4097, 8193, 16384, 1 << 30}) {
          o = ZP_GRAD_OPTIONS_INITIALIZER;
          o.blockSize = block;
          const std::string want =
              "options->blockSize " + std::to_string(block) + " must be a power of two in [32, 8192]";
          expectBad("block " + std::to_string(block), ex(o), kEx, want.c_str());
        }
        for (int block : {32, 8192}) {
          o = ZP_GRAD_OPTIONS_INITIALIZER;
          o.bits = 8;
          o.blockSize = block;
          EXPECT_EQ(ex(o), zpSuccess) << "block " << block << ": " << zpGetLastError(comm);
        }
        o = ZP_GRAD_OPTIONS_INITIALIZER;
        o.magic = 0;
        expectBad("magic", ex(o), kEx, "bad magic");
        o = ZP_GRAD_OPTIONS_INITIALIZER;
        o.size = sizeof(o) - 8;
        expectBad("size", ex(o), kEx, "options size");
        o = ZP_GRAD_OPTIONS_INITIALIZER;
        o.rounding = 7;
        expectBad("rounding", ex(o), kEx, "options->rounding 7");
        o = ZP_GRAD_OPTIONS_INITIALIZER;
        o.seed = -3;
        expectBad("seed", ex(o), kEx, "options->seed -3");
        std::vector<uint16_t> res(count + 1), hopRes(hop);
        o = ZP_GRAD_OPTIONS_INITIALIZER;
        o.residual = res.data();
        o.residualCount = count * n;  // qgZ's count, not the all-reduce's
        expectBad("residualCount", ex(o), kEx, "options->residualCount 4000 must be 1000 for count 1000");
        o.residualCount = count;
        o.residualType = zpFloat16;
        expectBad("residualType", ex(o), kEx, "options->residualType half");
        o = ZP_GRAD_OPTIONS_INITIALIZER;
        o.residual = send.data();
        o.residualCount = count;
        expectBad("residual on sendbuff", ex(o), kEx, "overlaps sendbuff");
        o = ZP_GRAD_OPTIONS_INITIALIZER;
        o.hopResidual = hopRes.data();
        o.hopResidualCount = count;
        expectBad("hopResidualCount", ex(o), kEx, "options->hopResidualCount 1000 must be");
        // Both residuals in one array, one element apart.
        std::vector<uint16_t> both(hop + count + 1);
        o.hopResidual = both.data();
        o.hopResidualCount = hop;
        o.residual = both.data() + 1;
        o.residualCount = count;
        expectBad("residuals overlap", ex(o), kEx, "overlaps options->residual");
        // Every rank refused the same calls: the good calls matched up. A good Ex call with both residuals works.
        o = ZP_GRAD_OPTIONS_INITIALIZER;
        o.residual = res.data();
        o.residualCount = count;
        o.hopResidual = hopRes.data();
        o.hopResidualCount = hop;
        EXPECT_EQ(ex(o), zpSuccess) << zpGetLastError(comm);
      });
}

// ---- ranks that disagree ----------------------------------------------------------------------------------------

// Rank 1 calls otherwise than the others: every rank returns zpInvalidUsage naming the argument and both values,
// its recvbuff untouched; matching calls right after equal the reference.
TEST(AllReduceMismatch, RefusedOnEveryRankNamingTheArgument) {
  const int n = 4;
  struct Odd {
    const char* what;
    size_t count;
    zpDataType_t type;
    zpRedOp_t op;
    int bits, blockSize;  // Ex when either is set
    bool qgz;             // rank 1 calls zpQuantReduceScatterA2A instead
    const char* message;
  };
  const Odd odds[] = {
      {"count", 999, zpFloat32, zpSum, 0, 0, false, "count: rank 0 passed 1000, rank 1 passed 999"},
      {"datatype", 1000, zpBfloat16, zpSum, 0, 0, false, "datatype: rank 0 passed float, rank 1 passed bfloat16"},
      {"op", 1000, zpFloat32, zpAvg, 0, 0, false, "op: rank 0 passed sum, rank 1 passed avg"},
      {"bits", 1000, zpFloat32, zpSum, 8, 0, false, "bits: rank 0 passed 4, rank 1 passed 8"},
      {"blockSize", 1000, zpFloat32, zpSum, 0, 64, false, "blockSize: rank 0 passed 256, rank 1 passed 64"},
      {"collective", 250, zpFloat32, zpSum, 0, 0, true,
       "the collective: rank 0 called zpQuantAllReduce, rank 1 called zpQuantReduceScatterA2A"},
      // Count 0 alone would return at once: the ranks still meet, so the others are told too.
      {"count 0", 0, zpFloat32, zpSum, 0, 0, false, "count: rank 0 passed 1000, rank 1 passed 0"},
  };
  runHostRanks(
      n, [](int, zpConfig_t* c) { c->ranksPerNode = 2; },
      [&](int rank, zpComm_t comm) {
        for (const Odd& odd : odds) {
          SCOPED_TRACE(std::string(odd.what) + " on rank " + std::to_string(rank));
          Buffer send(4000 * 4), recv(4000 * 4);
          zpcheck::fillRandom(zpFloat32, send.data(), 4000, 21, rank);
          recv.poison(0x5a);
          zpResult_t res;
          if (rank != 1) {
            res = zpQuantAllReduce(send.data(), recv.data(), 1000, zpFloat32, zpSum, comm, nullptr);
          } else if (odd.qgz) {
            res = zpQuantReduceScatterA2A(send.data(), recv.data(), odd.count, odd.type, odd.op, comm, nullptr);
          } else if (odd.bits || odd.blockSize) {
            zpGradOptions_t o = ZP_GRAD_OPTIONS_INITIALIZER;
            if (odd.bits) o.bits = odd.bits;
            if (odd.blockSize) o.blockSize = odd.blockSize;
            res = zpQuantAllReduceEx(send.data(), recv.data(), odd.count, odd.type, odd.op, &o, comm, nullptr);
          } else {
            res = zpQuantAllReduce(send.data(), recv.data(), odd.count, odd.type, odd.op, comm, nullptr);
          }
          EXPECT_EQ(res, zpInvalidUsage);
          EXPECT_TRUE(mentions(zpGetLastError(comm), "ranks disagree on")) << zpGetLastError(comm);
          EXPECT_TRUE(mentions(zpGetLastError(comm), odd.message)) << zpGetLastError(comm);
          EXPECT_TRUE(zpcheck::allBytesAre(recv.data(), recv.size(), 0x5a));
          // A matching call right after.
          Spec s;
          s.count = 1000;
          s.seed = 21;
          ASSERT_EQ(zpQuantAllReduce(send.data(), recv.data(), 1000, zpFloat32, zpSum, comm, nullptr), zpSuccess)
              << zpGetLastError(comm);
          EXPECT_TRUE(sameBits(recv.data(), reference(zpcheck::refTopo(n, 2, {}), s).out.data(), 1000, zpFloat32));
        }
      });
}

}  // namespace
