// qgZ (zpQuantReduceScatterA2A) on the host backend, against a reference written here from the plan that
// host/qgz_plan.h documents (not from the backend's code): the result is bit-equal to it on one-hop, two-hop,
// interleaved and uneven layouts, deterministic, the same in place, within the error bound of two
// quantization round trips of the float64 sum; Avg is the fp32 Sum divided by the rank count; a NaN or Inf
// poisons exactly one output block; bad input is refused with a message, leaving the communicator usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
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

constexpr size_t kLarge = 100003;

// ---- layouts ---------------------------------------------------------------------------------------------------

using zpcheck::RefTopo;
using zptest::configure;
using zptest::labels;
using zptest::Layout;
using zptest::layoutName;
using zptest::refTopo;

// ---- inputs ----------------------------------------------------------------------------------------------------

// One value overridden in one rank's sendbuff (NaN or Inf injection).
struct Injection {
  int rank = -1;
  size_t index = 0;  // element of that rank's sendbuff (nranks * recvcount elements)
  float value = 0.0f;
};

struct Spec {
  zpDataType_t type;
  size_t count;  // recvcount
  int bits, blockSize;
  zpRedOp_t op;
  uint64_t seed;
  Injection inj;
};

// Elements [offset, offset + n) of rank's sendbuff.
void makeInput(const Spec& s, int rank, size_t offset, size_t n, void* dst) {
  zpcheck::fillRandom(s.type, dst, n, s.seed, rank, offset);
  if (s.inj.rank == rank && s.inj.index >= offset && s.inj.index < offset + n) {
    zpcheck::storeValue(s.type, dst, s.inj.index - offset, s.inj.value);
  }
}

// ---- the reference -----------------------------------------------------------------------------------------------

float element(const unsigned char* payload, const Spec& s, size_t i) {
  return s.bits == 8 ? zp::payloadElement<8>(payload, s.count, s.blockSize, i)
                     : zp::payloadElement<4>(payload, s.count, s.blockSize, i);
}

float scaleOfElement(const unsigned char* payload, const Spec& s, size_t i) {
  float scale;
  std::memcpy(&scale, payload + (i / s.blockSize) * sizeof(float), sizeof(float));
  return scale;
}

void finishInto(const Spec& s, float sum, float divisor, void* out, size_t i) {
  switch (s.type) {
    case zpFloat16: {
      const uint16_t b = zp::finishReduction<zp::Fp16Type>(sum, divisor);
      std::memcpy(static_cast<unsigned char*>(out) + 2 * i, &b, 2);
      break;
    }
    case zpBfloat16: {
      const uint16_t b = zp::finishReduction<zp::Bf16Type>(sum, divisor);
      std::memcpy(static_cast<unsigned char*>(out) + 2 * i, &b, 2);
      break;
    }
    default: {
      const uint32_t b = zp::finishReduction<zp::Fp32Type>(sum, divisor);
      std::memcpy(static_cast<unsigned char*>(out) + 4 * i, &b, 4);
      break;
    }
  }
}

struct Expected {
  Buffer out;                 // count elements: the expected recvbuff, bit for bit
  std::vector<float> sum;     // the fp32 sum before Avg's division and the output rounding
  std::vector<double> exact;  // float64 sum of the original inputs
  std::vector<double> err;    // bound on |sum - exact|
};

// The output of destination d, step by step as qgz_plan.h states it.
//
// Error bound (float64, per element i, against exact = the float64 sum of the n original inputs x_r):
//  - one quantization round trip of a value v with block scale s = absmax / qmax (fp32 division) gives
//    v' = fl32(q * s) with q = clamp(rint(fl32(v / s))): |q - v / s| <= 1/2 + 2^-17 (the quotient, |v / s| <= 128,
//    is rounded by at most 128 * 2^-24) and fl32 adds at most 2^-24 |v'|, so
//        |v' - v| <= s (1/2 + 2^-16) + 2^-23 |v'|;
//  - an fp32 sum of k terms t_j in a fixed order is within (k - 1) 2^-24 sum |t_j| of their exact sum (the
//    usual gamma_(k-1) bound, with a little slack);
//  - one hop: err = sum_r [s1_r (1/2 + 2^-16) + 2^-23 |x'_r|] + (n - 1) 2^-24 (1 + 2^-20) sum_r |x'_r|;
//  - two hops: the same first-round term over all n contributions, plus, per node a, the hop-1 sum of its L
//    contributions ((L - 1) 2^-24 sum_l |x'_l|), the requantization of that partial p_a with its own scale s2_a
//    (s2_a (1/2 + 2^-16) + 2^-23 |p'_a|) and the hop-2 sum of the N requantized partials ((N - 1) 2^-24 sum_a
//    |p'_a|).
//  The output then adds, for Sum, the rounding to the type (half an ulp of the type at the output); for Avg, the
//  bound divided by n, plus the fp32 division (2^-24 |sum / n|) and the rounding to the type.
Expected reference(const RefTopo& topo, const Spec& s, int d) {
  int n = 0;
  for (const auto& node : topo.nodeRanks) n += static_cast<int>(node.size());
  const size_t count = s.count, es = bytesOf(s.type);
  const size_t pb = zp::quantPayloadBytes(count, s.bits, s.blockSize);
  const double u = 0x1p-24, slack = 1.0 + 0x1p-20;
  // First round trip: every rank quantizes its slice for destination d on its own.
  std::vector<Buffer> first(n);
  Expected e;
  e.exact.assign(count, 0.0);
  e.err.assign(count, 0.0);
  std::vector<double> absFirst(count, 0.0);  // sum over r of |x'_r|
  Buffer slice(count * es);
  for (int r = 0; r < n; ++r) {
    makeInput(s, r, static_cast<size_t>(d) * count, count, slice.data());
    first[r].resize(pb);
    zp::quantizeRef(slice.data(), s.type, count, s.bits, s.blockSize, first[r].data());
    for (size_t i = 0; i < count; ++i) {
      e.exact[i] += zpcheck::loadValue(s.type, slice.data(), i);
      const double v = element(first[r].data(), s, i);
      absFirst[i] += std::fabs(v);
      e.err[i] += scaleOfElement(first[r].data(), s, i) * (0.5 + 0x1p-16) + 0x1p-23 * std::fabs(v);
    }
  }
  e.sum.assign(count, 0.0f);
  // Sums `terms` (payloads, in the order given) element by element in fp32, with the block rule.
  auto sumPayloads = [&](const std::vector<const unsigned char*>& terms, std::vector<float>* out) {
    out->assign(count, 0.0f);
    for (size_t i = 0; i < count; ++i) {
      float acc = element(terms[0], s, i);
      for (size_t k = 1; k < terms.size(); ++k) acc = zp::addRn(acc, element(terms[k], s, i));
      (*out)[i] = acc;
    }
    zpcheck::applyBlockRule(out, s.blockSize);
  };
  if (!topo.twoHop) {
    // One hop: slot d of every rank, summed in rank order.
    std::vector<const unsigned char*> terms;
    for (int r = 0; r < n; ++r) terms.push_back(first[r].data());
    sumPayloads(terms, &e.sum);
    for (size_t i = 0; i < count; ++i) e.err[i] += (n - 1) * u * slack * absFirst[i];
  } else {
    // Two hops: d = (node b, local m). On every node a, local rank m sums the contributions of the node's ranks
    // in local order and requantizes the partial; destination d sums the N partials in node order.
    const int N = static_cast<int>(topo.nodeRanks.size());
    const int L = static_cast<int>(topo.nodeRanks[0].size());
    for (size_t i = 0; i < count; ++i) e.err[i] += (L - 1) * u * slack * absFirst[i];
    std::vector<Buffer> second(N);
    std::vector<float> partial;
    std::vector<double> absSecond(count, 0.0);
    for (int a = 0; a < N; ++a) {
      std::vector<const unsigned char*> terms;
      for (int l = 0; l < L; ++l) terms.push_back(first[topo.nodeRanks[a][l]].data());
      sumPayloads(terms, &partial);
      second[a].resize(pb);
      zp::quantizeRef(partial.data(), zpFloat32, count, s.bits, s.blockSize, second[a].data());
      for (size_t i = 0; i < count; ++i) {
        const double v = element(second[a].data(), s, i);
        absSecond[i] += std::fabs(v);
        e.err[i] += scaleOfElement(second[a].data(), s, i) * (0.5 + 0x1p-16) + 0x1p-23 * std::fabs(v);
      }
    }
    std::vector<const unsigned char*> terms;
    for (int a = 0; a < N; ++a) terms.push_back(second[a].data());
    sumPayloads(terms, &e.sum);
    for (size_t i = 0; i < count; ++i) e.err[i] += (N - 1) * u * slack * absSecond[i];
  }
  const float divisor = s.op == zpAvg ? static_cast<float>(n) : 1.0f;
  e.out.resize(count * es);
  for (size_t i = 0; i < count; ++i) finishInto(s, e.sum[i], divisor, e.out.data(), i);
  return e;
}

// out within the bound of the float64 result (Sum, or Sum / n for Avg), element by element, skipping [skipBegin,
// skipEnd); every checked element finite. *worst (if given) receives the largest error / bound seen.
::testing::AssertionResult withinBound(const Spec& s, int n, const Expected& e, const void* out, size_t skipBegin = 0,
                                       size_t skipEnd = 0, double* worst = nullptr) {
  for (size_t i = 0; i < s.count; ++i) {
    if (i >= skipBegin && i < skipEnd) continue;
    const double o = zpcheck::loadValue(s.type, out, i);
    if (!std::isfinite(o)) return ::testing::AssertionFailure() << "element " << i << " is not finite: " << o;
    double target = e.exact[i], bound = e.err[i];
    if (s.op == zpAvg) {
      target /= n;
      bound = bound / n + 0x1p-24 * std::fabs(static_cast<double>(e.sum[i])) / n;
    }
    bound += zpcheck::halfUlp(o, s.type);
    if (worst != nullptr) *worst = std::max(*worst, std::fabs(o - target) / bound);
    if (!(std::fabs(o - target) <= bound)) {
      return ::testing::AssertionFailure() << "element " << i << ": out " << o << ", float64 result " << target
                                           << ", error " << std::fabs(o - target) << " > bound " << bound;
    }
  }
  return ::testing::AssertionSuccess();
}

// ---- calls -------------------------------------------------------------------------------------------------------

struct Setting {
  const char* name;
  bool ex;
  zpQuantOptions_t opt;  // 0 fields keep the communicator's value
};

const Setting kSettings[] = {
    {"plain", false, {0, 0}},
    {"ex{8,32}", true, {8, 32}},
    {"ex{4,8192}", true, {4, 8192}},
    {"ex{8,-}", true, {8, 0}},
};

zpResult_t callQgz(const Setting& st, const void* send, void* recv, const Spec& s, zpComm_t comm) {
  if (!st.ex) return zpQuantReduceScatterA2A(send, recv, s.count, s.type, s.op, comm, nullptr);
  return zpQuantReduceScatterA2AEx(send, recv, s.count, s.type, s.op, &st.opt, comm, nullptr);
}

Spec makeSpec(const Layout& L, const Setting& st, zpDataType_t type, size_t count, zpRedOp_t op, uint64_t seed) {
  const int commBits = L.configBits ? L.configBits : 4, commBlock = L.configBlock ? L.configBlock : 256;
  Spec s;
  s.type = type;
  s.count = count;
  s.bits = st.ex && st.opt.bits ? st.opt.bits : commBits;
  s.blockSize = st.ex && st.opt.blockSize ? st.opt.blockSize : commBlock;
  s.op = op;
  s.seed = seed;
  return s;
}

std::string describe(const Spec& s, const Setting& st) {
  return std::string(zp::typeName(s.type)) + " count " + std::to_string(s.count) + " " + st.name + " (bits " +
         std::to_string(s.bits) + ", block " + std::to_string(s.blockSize) + ") " + zp::opName(s.op);
}

const std::vector<Layout>& allLayouts() {
  static const std::vector<Layout> layouts = {
      {"n1x1", 1, 1, {}},
      {"n1x2", 2, 2, {}},
      {"n2x1", 2, 1, {}},
      {"n1x4", 4, 4, {}},
      {"n4x1", 4, 1, {}},
      {"n2x2", 4, 2, {}, true},
      {"n2x4", 8, 4, {}, true},
      {"n4x4", 16, 4, {}},
      {"n3x2", 6, 2, {}},
      {"n8x2", 16, 2, {}},
      {"interleaved2x4", 8, 0, labels(8, 2)},
      {"interleaved4x2", 8, 0, labels(8, 4), true},
      {"interleaved3x2", 6, 0, labels(6, 3)},
      {"uneven3p1", 4, 0, {0, 0, 0, 1}, true},
      {"uneven2p1", 3, 0, {7, 3, 7}},
      {"n2x4_config8bits_block32", 8, 4, {}, false, 8, 32},
  };
  return layouts;
}

// ---- reference, determinism, in place, bound ----------------------------------------------------------------

class QgzLayout : public ::testing::TestWithParam<Layout> {};

TEST_P(QgzLayout, BitEqualToReferenceDeterministicInPlaceAndWithinBound) {
  const Layout L = GetParam();
  const RefTopo topo = refTopo(L);
  const int n = L.nranks;
  struct Case {
    Spec spec;
    const Setting* setting;
  };
  std::vector<Case> cases;
  uint64_t seed = 4242 + 1000 * n;
  const size_t counts[] = {1, 7, 255, 256, 257};
  for (zpDataType_t type : zpcheck::kQuantTypes) {
    for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ++ci) {
      for (size_t si = 0; si < sizeof(kSettings) / sizeof(kSettings[0]); ++si) {
        const zpRedOp_t op = (ci + si) % 2 ? zpAvg : zpSum;
        cases.push_back({makeSpec(L, kSettings[si], type, counts[ci], op, ++seed), &kSettings[si]});
      }
    }
  }
  if (L.large) {
    cases.push_back({makeSpec(L, kSettings[0], zpBfloat16, kLarge, zpSum, ++seed), &kSettings[0]});
    cases.push_back({makeSpec(L, kSettings[1], zpFloat32, kLarge, zpAvg, ++seed), &kSettings[1]});
  }
  std::atomic<int> finished{0};
  std::vector<double> worst(n, 0.0);  // per rank, the largest error / bound
  runHostRanks(
      n, [&](int rank, zpConfig_t* c) { configure(L, rank, c); },
      [&](int rank, zpComm_t comm) {
        for (const Case& c : cases) {
          const Spec& s = c.spec;
          SCOPED_TRACE("rank " + std::to_string(rank) + " " + describe(s, *c.setting));
          const size_t es = bytesOf(s.type), slice = s.count * es;
          Buffer send(slice * n), recv(slice);
          makeInput(s, rank, 0, s.count * n, send.data());
          ASSERT_EQ(callQgz(*c.setting, send.data(), recv.data(), s, comm), zpSuccess) << zpGetLastError(comm);
          EXPECT_STREQ(zpGetLastError(comm), "");
          const Expected e = reference(topo, s, rank);
          EXPECT_TRUE(sameBits(recv.data(), e.out.data(), s.count, s.type)) << "differs from the reference";
          EXPECT_TRUE(withinBound(s, n, e, recv.data(), 0, 0, &worst[rank]));
          // The same call again: the same bits.
          Buffer again(slice);
          ASSERT_EQ(callQgz(*c.setting, send.data(), again.data(), s, comm), zpSuccess) << zpGetLastError(comm);
          EXPECT_TRUE(sameBits(again.data(), recv.data(), s.count, s.type)) << "not deterministic";
          // In place: recvbuff = sendbuff + rank * recvcount.
          Buffer inplace(slice * n);
          std::memcpy(inplace.data(), send.data(), slice * n);
          ASSERT_EQ(callQgz(*c.setting, inplace.data(), inplace.data() + rank * slice, s, comm), zpSuccess)
              << zpGetLastError(comm);
          EXPECT_TRUE(sameBits(inplace.data() + rank * slice, recv.data(), s.count, s.type)) << "in place differs";
        }
        finished++;
      });
  EXPECT_EQ(finished.load(), n);
  // The bound is a worst case that the data come close to (a block where one contribution dominates the others
  // errs by nearly its scale / 2): far below it, the check would have no teeth.
  const double worstAll = *std::max_element(worst.begin(), worst.end());
  EXPECT_GT(worstAll, 0.5) << "the error bound is never approached: is it too loose?";
  EXPECT_LE(worstAll, 1.0);
}

INSTANTIATE_TEST_SUITE_P(Qgz, QgzLayout, ::testing::ValuesIn(allLayouts()), layoutName);

// The reference itself: one hop on two ranks with a recvcount of one element, worked by hand from the format.
TEST(QgzReference, OneHopTwoRanksByHand) {
  Layout L{"n1x2", 2, 2, {}};
  Spec s;
  s.type = zpFloat32;
  s.count = 1;
  s.bits = 4;
  s.blockSize = 32;
  s.op = zpSum;
  s.seed = 1;
  // Inputs are random; a one-element block quantizes to +-qmax * (|x| / qmax): x' = q * scale = x up to rounding.
  const Expected e = reference(refTopo(L), s, 1);
  float x0, x1;
  Buffer in(8);
  makeInput(s, 0, 1, 1, in.data());
  std::memcpy(&x0, in.data(), 4);
  makeInput(s, 1, 1, 1, in.data());
  std::memcpy(&x1, in.data(), 4);
  const float d0 = (x0 < 0 ? -7.0f : 7.0f) * (std::fabs(x0) / 7.0f);
  const float d1 = (x1 < 0 ? -7.0f : 7.0f) * (std::fabs(x1) / 7.0f);
  float got;
  std::memcpy(&got, e.out.data(), 4);
  EXPECT_EQ(zp::floatBits(got), zp::floatBits(d0 + d1));
}

// ---- Avg -----------------------------------------------------------------------------------------------------------

// Avg is Sum's fp32 result divided by nranks (IEEE), then rounded to the type. The fp32 sum is observed as the
// output of Sum on the same inputs widened to fp32 (widening is exact, so the codes and the sums are the same).
TEST(QgzAvg, IsTheFp32SumDividedByTheRankCountThenRounded) {
  const std::vector<Layout> layouts = {
      {"n1x3", 3, 3, {}}, {"n2x4", 8, 4, {}}, {"n3x2", 6, 2, {}}, {"uneven2p1", 3, 0, {0, 1, 0}}};
  for (const Layout& L : layouts) {
    const int n = L.nranks;
    runHostRanks(
        n, [&](int rank, zpConfig_t* c) { configure(L, rank, c); },
        [&](int rank, zpComm_t comm) {
          for (zpDataType_t type : zpcheck::kQuantTypes) {
            for (const Setting& st : kSettings) {
              const size_t count = 300;
              Spec s = makeSpec(L, st, type, count, zpAvg, 900 + type);
              SCOPED_TRACE(std::string(L.name) + " rank " + std::to_string(rank) + " " + describe(s, st));
              const size_t es = bytesOf(type);
              Buffer send(count * n * es), wide(count * n * 4), avg(count * es), sum32(count * 4);
              makeInput(s, rank, 0, count * n, send.data());
              for (size_t i = 0; i < count * n; ++i) {
                zpcheck::storeValue(zpFloat32, wide.data(), i,
                                    static_cast<float>(zpcheck::loadValue(type, send.data(), i)));
              }
              ASSERT_EQ(callQgz(st, send.data(), avg.data(), s, comm), zpSuccess) << zpGetLastError(comm);
              Spec s32 = s;
              s32.type = zpFloat32;
              s32.op = zpSum;
              ASSERT_EQ(callQgz(st, wide.data(), sum32.data(), s32, comm), zpSuccess) << zpGetLastError(comm);
              Buffer expected(count * es);
              for (size_t i = 0; i < count; ++i) {
                float sum;
                std::memcpy(&sum, sum32.data() + 4 * i, 4);
                zpcheck::storeValue(type, expected.data(), i, zp::divRn(sum, static_cast<float>(n)));
              }
              EXPECT_TRUE(sameBits(avg.data(), expected.data(), count, type));
              // And equal to the reference.
              EXPECT_TRUE(sameBits(avg.data(), reference(refTopo(L), s, rank).out.data(), count, type));
            }
          }
        });
  }
}

// ---- NaN and Inf
// -----------------------------------------------------------------------------------------------------

// A NaN or +-Inf in one element of one rank's sendbuff: the output block that holds that element on its
// destination is all NaN (the source block dequantizes to NaN; with two hops the partial that sums it has a NaN
// in the same block, which requantizes to all NaN again: same block index, same destination); every other output
// element, on every rank, is finite and within the bound.
class QgzSpecials : public ::testing::TestWithParam<Layout> {};

TEST_P(QgzSpecials, OneBlockOfOneDestinationIsNaNTheRestFinite) {
  const Layout L = GetParam();
  const RefTopo topo = refTopo(L);
  const int n = L.nranks;
  const size_t count = 257;
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()};
  // (source, destination, element of the slice) triples.
  struct Where {
    int src, dst;
    size_t elem;
  };
  const Where wheres[] = {{0, n - 1, 100}, {n - 1, 0, 256}, {n / 2, n / 2, 31}, {n - 1, n / 3, 0}};
  runHostRanks(
      n, [&](int rank, zpConfig_t* c) { configure(L, rank, c); },
      [&](int rank, zpComm_t comm) {
        uint64_t seed = 77;
        for (zpDataType_t type : zpcheck::kQuantTypes) {
          for (float special : specials) {
            for (const Where& w : wheres) {
              for (const Setting* st : {&kSettings[0], &kSettings[1]}) {
                ++seed;
                Spec s = makeSpec(L, *st, type, count, (seed & 1) ? zpAvg : zpSum, seed);
                s.inj.rank = w.src;
                s.inj.index = static_cast<size_t>(w.dst) * count + w.elem;
                s.inj.value = special;
                SCOPED_TRACE("rank " + std::to_string(rank) + " " + describe(s, *st) + " special " +
                             std::to_string(special) + " from " + std::to_string(w.src) + " to " +
                             std::to_string(w.dst) + " element " + std::to_string(w.elem));
                const size_t es = bytesOf(type);
                Buffer send(count * n * es), recv(count * es);
                makeInput(s, rank, 0, count * n, send.data());
                ASSERT_EQ(callQgz(*st, send.data(), recv.data(), s, comm), zpSuccess) << zpGetLastError(comm);
                const Expected e = reference(topo, s, rank);
                EXPECT_TRUE(sameBits(recv.data(), e.out.data(), count, type));
                size_t begin = 0, end = 0;
                if (rank == w.dst) {
                  begin = w.elem / s.blockSize * s.blockSize;
                  end = std::min(count, begin + s.blockSize);
                  for (size_t i = begin; i < end; ++i) {
                    ASSERT_TRUE(zpcheck::isNaNBits(type, zpcheck::loadBits(type, recv.data(), i)))
                        << "element " << i << " of the poisoned block";
                  }
                }
                EXPECT_TRUE(withinBound(s, n, e, recv.data(), begin, end));
              }
            }
          }
        }
      });
}

INSTANTIATE_TEST_SUITE_P(Qgz, QgzSpecials,
                         ::testing::Values(Layout{"n1x1", 1, 1, {}}, Layout{"n1x2", 2, 2, {}}, Layout{"n2x1", 2, 1, {}},
                                           Layout{"n2x2", 4, 2, {}}, Layout{"n2x4", 8, 4, {}}, Layout{"n3x2", 6, 2, {}},
                                           Layout{"interleaved2x3", 6, 0, labels(6, 2)},
                                           Layout{"uneven3p1", 4, 0, {0, 0, 0, 1}}),
                         layoutName);

// ---- overflow
// ----------------------------------------------------------------------------------------------------------

// Sums that overflow fp32 give the same on every layout, one hop or two: the block that holds the overflowing
// element is NaN as a whole on its destination (with two hops the overflowing partial sum requantizes to a NaN
// block; with one hop the block rule of host/reduce_math.h does the same), every other output element is finite.
// A sum finite in fp32 but beyond fp16's range is +Inf in that element alone, on every layout.
TEST(QgzOverflow, AnOverflowingSumMakesItsBlockNaNOnEveryLayout) {
  struct Shape {
    const char* name;
    int nranks, ranksPerNode;
    bool twoHop;
  };
  const Shape shapes[] = {{"one hop, 1 node of 4", 4, 4, false},
                          {"one hop, 4 nodes of 1", 4, 1, false},
                          {"two hops, 2 nodes of 2", 4, 2, true},
                          {"two hops, 2 nodes of 4", 8, 4, true}};
  const size_t count = 600, hot = 300;  // element `hot` of destination `dst`'s slice overflows
  const int dst = 1, blockSize = 256;
  struct Kind {
    zpDataType_t type;
    float big;      // every rank's value at `hot`: two of them sum beyond the output's range
    bool nanBlock;  // an fp32 overflow; otherwise only fp16's range is exceeded
  };
  const Kind kinds[] = {{zpFloat32, 3e38f, true}, {zpBfloat16, 3e38f, true}, {zpFloat16, 60000.0f, false}};
  for (const Shape& sh : shapes) {
    for (const Kind& k : kinds) {
      for (int bits : {4, 8}) {
        SCOPED_TRACE(std::string(sh.name) + ", " + zp::typeName(k.type) + ", int" + std::to_string(bits));
        int layoutsChecked = 0;
        runHostRanks(
            sh.nranks, [&](int, zpConfig_t* c) { c->ranksPerNode = sh.ranksPerNode; },
            [&](int rank, zpComm_t comm) {
              int nodes = 0;
              ASSERT_EQ(zpCommNodeCount(comm, &nodes), zpSuccess);
              EXPECT_EQ(nodes > 1 && sh.ranksPerNode > 1, sh.twoHop);
              const size_t es = bytesOf(k.type);
              Buffer send(sh.nranks * count * es), recv(count * es);
              for (size_t i = 0; i < sh.nranks * count; ++i) {
                const float small = 0.01f * static_cast<float>((i + rank) % 7) - 0.03f;
                zpcheck::storeValue(k.type, send.data(), i, i == dst * count + hot ? k.big : small);
              }
              const zpQuantOptions_t options{bits, blockSize};
              ASSERT_EQ(
                  zpQuantReduceScatterA2AEx(send.data(), recv.data(), count, k.type, zpSum, &options, comm, nullptr),
                  zpSuccess)
                  << zpGetLastError(comm);
              const size_t begin = hot / blockSize * blockSize, end = begin + blockSize;
              for (size_t i = 0; i < count; ++i) {
                const uint32_t b = zpcheck::loadBits(k.type, recv.data(), i);
                const double v = zpcheck::loadValue(k.type, recv.data(), i);
                if (rank == dst && k.nanBlock && i >= begin && i < end) {
                  ASSERT_TRUE(zpcheck::isNaNBits(k.type, b)) << "element " << i << " of the overflowed block";
                } else if (rank == dst && !k.nanBlock && i == hot) {
                  ASSERT_TRUE(std::isinf(v) && v > 0) << "element " << i << " is " << v;
                } else {
                  ASSERT_TRUE(std::isfinite(v)) << "rank " << rank << " element " << i << " is " << v;
                }
              }
              if (rank == dst) layoutsChecked++;
            });
        EXPECT_EQ(layoutsChecked, 1);
      }
    }
  }
}

// ---- count 0
// -----------------------------------------------------------------------------------------------------------

TEST(QgzEdge, CountZeroSucceedsAndLeavesRecvbuffUntouched) {
  runHostRanks(
      4, [](int, zpConfig_t* c) { c->ranksPerNode = 2; },
      [](int rank, zpComm_t comm) {
        Buffer send(256), recv(64);
        zpcheck::fillRandom(zpFloat32, send.data(), 64, 3, rank);
        recv.poison(0xa5);
        EXPECT_EQ(zpQuantReduceScatterA2A(send.data(), recv.data(), 0, zpFloat32, zpSum, comm, nullptr), zpSuccess);
        EXPECT_TRUE(zpcheck::allBytesAre(recv.data(), recv.size(), 0xa5));
        EXPECT_STREQ(zpGetLastError(comm), "");
      });
}

// ---- bad input
// -----------------------------------------------------------------------------------------------------------

TEST(QgzBadInput, RefusedWithNamedArgumentAndCommStaysUsable) {
  const int n = 4;
  const size_t count = 300;
  runHostRanks(
      n, [](int, zpConfig_t* c) { c->ranksPerNode = 2; },
      [&](int rank, zpComm_t comm) {
        Buffer send(count * 4 * n), recv(count * 4), big(count * 4 * (n + 1));
        zpcheck::fillRandom(zpFloat32, send.data(), count * n, 13, rank);
        auto goodCallWorks = [&](const char* after) {
          recv.poison();
          ASSERT_EQ(zpQuantReduceScatterA2A(send.data(), recv.data(), count, zpFloat32, zpSum, comm, nullptr),
                    zpSuccess)
              << "after " << after << ": " << zpGetLastError(comm);
          EXPECT_STREQ(zpGetLastError(comm), "") << "after " << after;
          for (size_t i = 0; i < count; ++i) {
            ASSERT_TRUE(std::isfinite(zpcheck::loadValue(zpFloat32, recv.data(), i))) << "after " << after;
          }
        };
        auto expectBad = [&](const char* name, zpResult_t res, const char* mention) {
          EXPECT_EQ(res, zpInvalidArgument) << name;
          const std::string msg = zpGetLastError(comm);
          EXPECT_TRUE(mentions(msg.c_str(), "zpQuantReduceScatterA2A")) << name << ": " << msg;
          EXPECT_TRUE(mentions(msg.c_str(), mention)) << name << ": " << msg;
          goodCallWorks(name);
        };
        const void* sb = send.data();
        void* rb = recv.data();
        auto rs = [&](const void* s, void* r, size_t c, zpDataType_t t, zpRedOp_t op) {
          return zpQuantReduceScatterA2A(s, r, c, t, op, comm, nullptr);
        };
        expectBad("prod", rs(sb, rb, count, zpFloat32, zpProd), "prod");
        expectBad("max", rs(sb, rb, count, zpFloat32, zpMax), "max");
        expectBad("min", rs(sb, rb, count, zpFloat32, zpMin), "min");
        expectBad("op 99", rs(sb, rb, count, zpFloat32, static_cast<zpRedOp_t>(99)), "invalid op 99");
        expectBad("op -1", rs(sb, rb, count, zpFloat32, static_cast<zpRedOp_t>(-1)), "invalid op -1");
        expectBad("op zpNumOps", rs(sb, rb, count, zpFloat32, zpNumOps), "invalid op");
        expectBad("int8", rs(sb, rb, count, zpInt8, zpSum), "int8");
        expectBad("float64", rs(sb, rb, count, zpFloat64, zpSum), "double");
        expectBad("int32", rs(sb, rb, count, zpInt32, zpSum), "type");
        expectBad("type 99", rs(sb, rb, count, static_cast<zpDataType_t>(99), zpSum), "invalid type 99");
        expectBad("NULL sendbuff", rs(nullptr, rb, count, zpFloat32, zpSum), "sendbuff");
        expectBad("NULL recvbuff", rs(sb, nullptr, count, zpFloat32, zpSum), "recvbuff");
        expectBad("SIZE_MAX/2", rs(sb, rb, SIZE_MAX / 2, zpFloat16, zpSum), "overflow");
        expectBad("SIZE_MAX/4+1", rs(sb, rb, SIZE_MAX / 4 + 1, zpFloat32, zpSum), "overflow");
        expectBad("count x ranks", rs(sb, rb, SIZE_MAX / (4 * n) + 1, zpFloat32, zpAvg), "overflow");
        const zpQuantOptions_t block48 = {0, 48}, bits6 = {6, 0}, block16 = {4, 16};
        expectBad("block 48", zpQuantReduceScatterA2AEx(sb, rb, count, zpFloat32, zpSum, &block48, comm, nullptr),
                  "options->blockSize");
        expectBad("block 16", zpQuantReduceScatterA2AEx(sb, rb, count, zpFloat32, zpSum, &block16, comm, nullptr),
                  "options->blockSize");
        expectBad("bits 6", zpQuantReduceScatterA2AEx(sb, rb, count, zpFloat32, zpSum, &bits6, comm, nullptr),
                  "options->bits");
        expectBad("stream", zpQuantReduceScatterA2A(sb, rb, count, zpFloat32, zpSum, comm, zpcheck::bogusStream()),
                  "stream");
        // Overlaps that are not the in-place layout: on the next rank's slice, or shifted by one element.
        unsigned char* g = big.data();
        expectBad("overlap peer", rs(g, g + ((rank + 1) % n) * count * 4, count, zpFloat32, zpSum), "overlap");
        expectBad("overlap +1", rs(g, g + (rank * count + 1) * 4, count, zpFloat32, zpSum), "overlap");
      });
}

}  // namespace
