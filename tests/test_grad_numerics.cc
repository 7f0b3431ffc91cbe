// qgZ's gradient rounding (include/zpccl.h, "Gradient rounding") on the host: the Philox generator against
// Random123's known answers; stochastic rounding unbiased (over every draw, exactly, and as the mean of many
// roundings, statistically) and deterministic; the residual's invariant; and the host backend equal, bit for bit,
// to a model of the plan built here from the reference functions, with stochastic rounding and error feedback on
// one-hop, two-hop, interleaved and uneven layouts, over several calls (the sequence number and the residuals
// carried from call to call).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "host/philox.h"
#include "host/quant_format.h"
#include "host/quant_math.h"
#include "host/quant_ref.h"
#include "host/reduce_ref.h"
#include "include/zpccl.h"
#include "tests/collective_check.h"
#include "tests/host_ranks.h"

namespace {

using zpcheck::Buffer;
using zpcheck::bytesOf;
using zpcheck::mentions;
using zpcheck::sameBits;

// ---- Philox ------------------------------------------------------------------------------------------------------

// Random123's kat_vectors (the "philox4x32 10" lines): counter, key, expected output.
struct PhiloxKat {
  uint32_t ctr[4], key[2], out[4];
};
constexpr PhiloxKat kPhiloxKats[] = {
    {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
    {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
     {0xffffffffu, 0xffffffffu},
     {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
    {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
     {0xa4093822u, 0x299f31d0u},
     {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
};

TEST(GradPhilox, KnownAnswersOfRandom123) {
  for (const PhiloxKat& k : kPhiloxKats) {
    const zp::Philox4x32 c{{k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3]}};
    const zp::Philox4x32 r = zp::philox4x32_10(c, k.key[0], k.key[1]);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(r.v[i], k.out[i]) << "word " << i << " of counter " << std::hex << k.ctr[0];
  }
}

// The counter layout of host/philox.h: element j of a slice takes 16 bits of group j / 8's output.
TEST(GradPhilox, ElementBitsFollowTheDocumentedCounter) {
  const zp::GradRandomKey key{12345u, 7u, 3u, 1u};
  const size_t j = (size_t{5} << 35) + 8 * 1000 + 5;  // a group index above 2^32
  const zp::Philox4x32 g = zp::gradRandomGroup(key, 9u, j >> 3);
  const uint64_t group = j >> 3;
  const zp::Philox4x32 c{{static_cast<uint32_t>(group), static_cast<uint32_t>(group >> 32) | (1u << 31), 9u, 3u}};
  const zp::Philox4x32 want = zp::philox4x32_10(c, 12345u, 7u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(g.v[i], want.v[i]);
  EXPECT_EQ(zp::gradRandom16(g, j), (want.v[2] >> 16) & 0xffffu);  // j % 8 = 5: word 2, high half
  EXPECT_EQ(zp::gradRandom16(g, j - 5), want.v[0] & 0xffffu);
}

// ---- stochastic rounding of one value ----------------------------------------------------------------------------

double decoded(uint32_t code, int bits) { return bits == 8 ? zp::decodeCode<8>(code) : zp::decodeCode<4>(code); }

// Over all 2^16 draws the mean code is v up to the threshold grid: |E[q] - v| <= 2^-17 (a step is 1 at scale 1), and
// each code is floor(v) or ceil(v) (in magnitude), integers exact.
TEST(GradRounding, StochasticCodeIsUnbiasedOverEveryDraw) {
  const float values[] = {0.0f, 0.3f,   -0.3f,    0.5f, -2.75f,    6.999f, -6.999f,  7.0f,  -7.0f,
                          3.0f, 1e-30f, -1.5e-7f, 0.1f, 5.123456f, 126.7f, -126.01f, 42.5f, 1.0f / 3.0f};
  for (int bits : {4, 8}) {
    const float qmax = static_cast<float>(zp::quantMax(bits));
    for (float x : values) {
      if (std::fabs(x) > qmax) continue;
      double sum = 0.0;
      const double lo = std::floor(std::fabs(x)), hi = std::ceil(std::fabs(x));
      for (uint32_t r = 0; r < 65536; ++r) {
        const double q = decoded(zp::quantizeCodeStochastic(x, 1.0f, qmax, r), bits);
        ASSERT_TRUE(std::fabs(q) == lo || std::fabs(q) == hi) << x << " -> " << q;
        ASSERT_TRUE(q == 0.0 || (q > 0) == (x > 0)) << x << " -> " << q;
        sum += q;
      }
      EXPECT_LE(std::fabs(sum / 65536.0 - x), std::ldexp(1.0, -17) * 1.0000001) << "bits " << bits << " x " << x;
    }
  }
}

// A block of fixed values quantized many times (the sequence number changes the draw): the mean of the dequantized
// values converges to the input. Bound per element: 5 standard deviations of the mean of N Bernoulli steps,
// scale sqrt(f (1 - f) / N), plus the grid bias 2^-17 scale and the fp32 roundings. Nearest rounding, whose error is
// systematic, fails the same bound: the test can tell the two apart.
TEST(GradRounding, MeanOfManyRoundingsConvergesToTheInput) {
  constexpr int kBlock = 256, kRounds = 4000;
  std::vector<float> x(kBlock);
  for (int i = 0; i < kBlock; ++i) x[i] = zpcheck::randomValue(zpFloat32, 77, 0, i);
  for (int bits : {4, 8}) {
    const size_t pb = zp::quantPayloadBytes(kBlock, bits, kBlock);
    std::vector<unsigned char> payload(pb);
    std::vector<float> out(kBlock);
    for (bool stochastic : {true, false}) {
      std::vector<double> mean(kBlock, 0.0);
      for (int t = 0; t < kRounds; ++t) {
        zp::GradQuant g;
        g.stochastic = stochastic;
        g.key = zp::GradRandomKey{2024u, static_cast<uint32_t>(t), 0u, 0u};
        zp::quantizeGradRef(x.data(), zpFloat32, kBlock, bits, kBlock, g, payload.data());
        zp::dequantizeRef(payload.data(), zpFloat32, kBlock, bits, kBlock, out.data());
        for (int i = 0; i < kBlock; ++i) mean[i] += out[i] / kRounds;
      }
      float scale;
      std::memcpy(&scale, payload.data(), sizeof(scale));
      int outside = 0;
      double worst = 0.0;
      for (int i = 0; i < kBlock; ++i) {
        const double v = x[i] / static_cast<double>(scale);
        const double f = std::fabs(v) - std::floor(std::fabs(v));
        const double sigma = scale * std::sqrt(f * (1.0 - f) / kRounds);
        const double bound = 5.0 * sigma + scale * std::ldexp(1.0, -17) + 1e-6 * std::fabs(x[i]) + 1e-30;
        const double dev = std::fabs(mean[i] - x[i]);
        worst = std::max(worst, dev / bound);
        if (dev > bound) ++outside;
      }
      if (stochastic) {
        EXPECT_EQ(outside, 0) << "bits " << bits << ": worst deviation " << worst << " bounds";
      } else {
        EXPECT_GT(outside, kBlock / 8) << "bits " << bits << ": nearest rounding passed the unbiasedness bound";
      }
    }
  }
}

// ---- determinism -------------------------------------------------------------------------------------------------

std::vector<unsigned char> quantizeWith(const std::vector<float>& x, int bits, const zp::GradQuant& g) {
  std::vector<unsigned char> p(zp::quantPayloadBytes(x.size(), bits, 256));
  zp::quantizeGradRef(x.data(), zpFloat32, x.size(), bits, 256, g, p.data());
  return p;
}

TEST(GradRounding, SameKeySameBitsAnyOtherKeyOtherBits) {
  std::vector<float> x(4096);
  for (size_t i = 0; i < x.size(); ++i) x[i] = zpcheck::randomValue(zpFloat32, 5, 1, i);
  zp::GradQuant g;
  g.stochastic = true;
  g.key = zp::GradRandomKey{1u, 2u, 3u, 0u};
  g.slice = 4;
  const auto base = quantizeWith(x, 4, g);
  EXPECT_EQ(quantizeWith(x, 4, g), base);
  // g with one thing changed draws other bits.
  auto differs = [&](const char* what, void (*change)(zp::GradQuant*)) {
    zp::GradQuant h = g;
    change(&h);
    EXPECT_NE(quantizeWith(x, 4, h), base) << what;
  };
  differs("seed", [](zp::GradQuant* h) { h->key.seed = 9; });
  differs("sequence", [](zp::GradQuant* h) { h->key.sequence = 3; });
  differs("rank", [](zp::GradQuant* h) { h->key.rank = 0; });
  differs("hop", [](zp::GradQuant* h) { h->key.hop = 1; });
  differs("slice", [](zp::GradQuant* h) { h->slice = 5; });
  differs("nearest", [](zp::GradQuant* h) { h->stochastic = false; });
  // A chunk that starts inside the slice draws as the slice does there.
  std::vector<float> tail(x.begin() + 1024, x.end());
  zp::GradQuant t = g;
  t.firstElem = 1024;
  const auto chunk = quantizeWith(tail, 4, t);
  std::vector<float> back(tail.size()), whole(x.size());
  zp::dequantizeRef(chunk.data(), zpFloat32, tail.size(), 4, 256, back.data());
  zp::dequantizeRef(base.data(), zpFloat32, x.size(), 4, 256, whole.data());
  EXPECT_TRUE(sameBits(back.data(), whole.data() + 1024, tail.size(), zpFloat32));
}

// ---- error feedback: the residual's invariant --------------------------------------------------------------------

// x + old residual = dequantized + new residual, up to the new residual's bf16 rounding (2^-8 of what it rounds) and
// the fp32 sum x + residual; the residual stays within a step (stochastic) or half a step (nearest) of the block's
// scale. Over many calls the feedback telescopes: the sum of what was sent plus the last residual is the sum of
// the inputs plus the first residual, up to the same roundings.
TEST(GradRounding, ResidualInvariantAndFeedbackTelescopes) {
  constexpr size_t kCount = 1000;  // a partial last block
  constexpr int kBlock = 128, kCalls = 50;
  for (zpDataType_t type : {zpFloat32, zpBfloat16, zpFloat16}) {
    for (int bits : {4, 8}) {
      for (bool stochastic : {false, true}) {
        SCOPED_TRACE(std::string(zp::typeName(type)) + " bits " + std::to_string(bits) +
                     (stochastic ? " stochastic" : " nearest"));
        const size_t esz = bytesOf(type);
        Buffer in(kCount * esz);
        std::vector<uint16_t> res(kCount), before(kCount);
        for (size_t i = 0; i < kCount; ++i) res[i] = zp::floatToBf16BitsRn(0.01f * std::sin(0.37f * i));
        std::vector<double> sentSum(kCount, 0.0), inSum(kCount, 0.0), res0(kCount);
        for (size_t i = 0; i < kCount; ++i) res0[i] = zp::bf16BitsToFloat(res[i]);
        std::vector<unsigned char> payload(zp::quantPayloadBytes(kCount, bits, kBlock));
        std::vector<float> deq(kCount);
        std::vector<double> slack(kCount, 0.0);
        for (int call = 0; call < kCalls; ++call) {
          zpcheck::fillRandom(type, in.data(), kCount, 100 + call, 0);
          before = res;
          zp::GradQuant g;
          g.stochastic = stochastic;
          g.key = zp::GradRandomKey{7u, static_cast<uint32_t>(call), 0u, 0u};
          g.residual = res.data();
          std::memset(payload.data(), 0xa5, payload.size());
          zp::quantizeGradRef(in.data(), type, kCount, bits, kBlock, g, payload.data());
          zp::dequantizeRef(payload.data(), zpFloat32, kCount, bits, kBlock, deq.data());
          for (size_t i = 0; i < kCount; ++i) {
            const double x = zpcheck::loadValue(type, in.data(), i);
            const double v = x + zp::bf16BitsToFloat(before[i]);  // exact in double
            const double lost = v - deq[i];
            const double r = zp::bf16BitsToFloat(res[i]);
            const double tol = std::ldexp(std::fabs(lost), -8) + std::ldexp(std::fabs(v), -23) + 1e-40;
            ASSERT_LE(std::fabs(lost - r), tol) << "call " << call << " element " << i;
            float scale;
            std::memcpy(&scale, payload.data() + (i / kBlock) * sizeof(float), sizeof(scale));
            ASSERT_LE(std::fabs(r), (stochastic ? 1.0 : 0.5) * scale * (1 + 1e-6) + tol) << "element " << i;
            sentSum[i] += deq[i];
            inSum[i] += x;
            slack[i] += tol;
          }
        }
        for (size_t i = 0; i < kCount; ++i) {
          const double lhs = sentSum[i] + zp::bf16BitsToFloat(res[i]);
          const double rhs = inSum[i] + res0[i];
          EXPECT_LE(std::fabs(lhs - rhs), slack[i] + 1e-6 * std::fabs(rhs)) << "element " << i;
        }
      }
    }
  }
}

TEST(GradRounding, BlockWithNaNKeepsNoResidual) {
  std::vector<float> x(512);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.25f + 0.001f * i;
  x[300] = std::nanf("");
  std::vector<uint16_t> res(512, zp::floatToBf16BitsRn(0.125f));
  zp::GradQuant g;
  g.residual = res.data();
  std::vector<unsigned char> p(zp::quantPayloadBytes(512, 4, 256));
  zp::quantizeGradRef(x.data(), zpFloat32, 512, 4, 256, g, p.data());
  for (size_t i = 256; i < 512; ++i) ASSERT_EQ(res[i], 0u) << i;
  size_t kept = 0;  // the finite block keeps its errors
  for (size_t i = 0; i < 256; ++i) kept += res[i] != 0;
  EXPECT_GT(kept, 200u);
}

// ---- the host backend against a model of the plan ----------------------------------------------------------------

struct GradLayout {
  const char* name;
  int nranks;
  int ranksPerNode;          // > 0: node = rank / ranksPerNode
  std::vector<int> nodeIds;  // else nodeId per rank
};

const GradLayout kLayouts[] = {
    {"one node of 4", 4, 4, {}},
    {"2 nodes x 2", 4, 2, {}},
    {"3 nodes x 2", 6, 2, {}},
    {"2 nodes x 3", 6, 3, {}},
    {"interleaved 2 x 2", 4, 0, {0, 1, 0, 1}},
    {"uneven 3 + 1 (one hop)", 4, 0, {0, 0, 0, 1}},
    {"one rank a node", 3, 1, {}},
};

struct GradCase {
  zpDataType_t type;
  int bits, blockSize;
  zpRedOp_t op;
  bool stochastic, feedback;
  size_t count;
};

struct RankState {
  Buffer in;
  std::vector<uint16_t> res, hop;
  Buffer out;
};

// One call, as host/qgz_plan.h and include/zpccl.h describe it, from the reference functions.
void modelCall(const zpcheck::RefTopo& t, int n, const GradCase& c, uint32_t seed, uint32_t seq,
               std::vector<RankState>* ranks) {
  const size_t pb = zp::quantPayloadBytes(c.count, c.bits, c.blockSize), esz = bytesOf(c.type);
  std::vector<std::vector<unsigned char>> sent(n, std::vector<unsigned char>(pb * n));
  for (int r = 0; r < n; ++r) {
    RankState& s = (*ranks)[r];
    for (int d = 0; d < n; ++d) {
      zp::GradQuant g;
      g.stochastic = c.stochastic;
      g.key = zp::GradRandomKey{seed, seq, static_cast<uint32_t>(r), 0u};
      g.slice = d;
      g.residual = s.res.empty() ? nullptr : s.res.data() + d * c.count;
      zp::quantizeGradRef(s.in.data() + d * c.count * esz, c.type, c.count, c.bits, c.blockSize, g,
                          sent[r].data() + d * pb);
    }
  }
  const float divisor = c.op == zpAvg ? static_cast<float>(n) : 1.0f;
  std::vector<float> sum(c.count);
  if (!t.twoHop) {
    for (int d = 0; d < n; ++d) {
      std::vector<const unsigned char*> src;
      for (int r = 0; r < n; ++r) src.push_back(sent[r].data() + d * pb);
      zp::sumPayloadsRef(src, c.count, c.bits, c.blockSize, 0, c.count, sum.data());
      zp::finishRef(sum.data(), c.type, divisor, 0, c.count, (*ranks)[d].out.data());
    }
    return;
  }
  const int N = static_cast<int>(t.nodeRanks.size()), L = static_cast<int>(t.nodeRanks[0].size());
  std::vector<unsigned char> partials(pb * N);
  for (int b = 0; b < N; ++b) {
    for (int m = 0; m < L; ++m) {
      const int dest = t.nodeRanks[b][m];
      for (int a = 0; a < N; ++a) {
        const int inter = t.nodeRanks[a][m];
        std::vector<const unsigned char*> src;
        for (int l = 0; l < L; ++l) src.push_back(sent[t.nodeRanks[a][l]].data() + dest * pb);
        zp::sumPayloadsRef(src, c.count, c.bits, c.blockSize, 0, c.count, sum.data());
        zp::GradQuant g;
        g.stochastic = c.stochastic;
        g.key = zp::GradRandomKey{seed, seq, static_cast<uint32_t>(inter), 1u};
        g.slice = b;
        RankState& s = (*ranks)[inter];
        g.residual = s.hop.empty() ? nullptr : s.hop.data() + b * c.count;
        zp::quantizeGradRef(sum.data(), zpFloat32, c.count, c.bits, c.blockSize, g, partials.data() + a * pb);
      }
      std::vector<const unsigned char*> src;
      for (int a = 0; a < N; ++a) src.push_back(partials.data() + a * pb);
      zp::sumPayloadsRef(src, c.count, c.bits, c.blockSize, 0, c.count, sum.data());
      zp::finishRef(sum.data(), c.type, divisor, 0, c.count, (*ranks)[dest].out.data());
    }
  }
}

void configureLayout(const GradLayout& L, int rank, zpConfig_t* c) {
  if (L.ranksPerNode > 0) {
    c->ranksPerNode = L.ranksPerNode;
  } else {
    c->nodeId = L.nodeIds[rank];
  }
}

// Runs `calls` calls of case c on layout L with the library and with the model; compares outputs and residuals.
void checkLayout(const GradLayout& L, const GradCase& c, int calls) {
  const zpcheck::RefTopo t = zpcheck::refTopo(L.nranks, L.ranksPerNode, L.nodeIds);
  const int n = L.nranks;
  const size_t esz = bytesOf(c.type), full = c.count * n;
  const size_t hopCount = t.twoHop ? c.count * t.nodeRanks.size() : 0;
  const uint32_t seed = 4242;
  std::vector<RankState> lib(n), model(n);
  for (int r = 0; r < n; ++r) {
    for (auto* s : {&lib[r], &model[r]}) {
      s->in = Buffer(full * esz);
      s->out = Buffer(c.count * esz);
      if (c.feedback) {
        s->res.assign(full, 0);
        s->hop.assign(hopCount, 0);
        // A residual that is not zero from the first call: its addition is exercised at once.
        for (size_t i = 0; i < full; ++i) s->res[i] = zp::floatToBf16BitsRn(0.001f * ((i * 7 + r) % 13) - 0.006f);
      }
    }
  }
  for (int call = 0; call < calls; ++call) {
    for (int r = 0; r < n; ++r) {
      zpcheck::fillRandom(c.type, model[r].in.data(), full, 900 + call, r);
      std::memset(model[r].out.data(), 0x5a, c.count * esz);  // poison (the library's output: 0xa5)
    }
    modelCall(t, n, c, seed, static_cast<uint32_t>(call), &model);
  }
  zptest::runHostRanks(
      n,
      [&](int rank, zpConfig_t* cfg) {
        configureLayout(L, rank, cfg);
        cfg->gradBits = c.bits;
        cfg->blockSize = c.blockSize;
        cfg->gradSeed = static_cast<int>(seed);
      },
      [&](int rank, zpComm_t comm) {
        size_t hq = 0;
        ASSERT_EQ(zpGradHopResidualCount(c.count, &hq, comm), zpSuccess) << zpGetLastError(comm);
        EXPECT_EQ(hq, hopCount);
        RankState& s = lib[rank];
        for (int call = 0; call < calls; ++call) {
          zpcheck::fillRandom(c.type, s.in.data(), full, 900 + call, rank);
          std::memset(s.out.data(), 0xa5, c.count * esz);
          zpGradOptions_t o = ZP_GRAD_OPTIONS_INITIALIZER;
          o.rounding = c.stochastic ? zpRoundStochastic : zpRoundNearest;
          if (c.feedback) {
            o.residual = s.res.data();
            o.residualCount = full;
            o.hopResidual = hopCount ? s.hop.data() : nullptr;
            o.hopResidualCount = hopCount;
          }
          ASSERT_EQ(zpQuantReduceScatterA2AEx2(s.in.data(), s.out.data(), c.count, c.type, c.op, &o, comm, nullptr),
                    zpSuccess)
              << zpGetLastError(comm);
        }
      });
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(sameBits(lib[r].out.data(), model[r].out.data(), c.count, c.type)) << "output of rank " << r;
    if (c.feedback) {
      EXPECT_TRUE(sameBits(lib[r].res.data(), model[r].res.data(), full, 2)) << "residual of rank " << r;
      if (hopCount) {
        EXPECT_TRUE(sameBits(lib[r].hop.data(), model[r].hop.data(), hopCount, 2)) << "hop, rank " << r;
      }
    }
  }
}

TEST(GradQgzHost, BackendEqualsModelBitForBitOnEveryLayout) {
  const GradCase cases[] = {
      {zpBfloat16, 4, 256, zpSum, true, true, 1000}, {zpBfloat16, 4, 256, zpSum, true, false, 700},
      {zpBfloat16, 4, 256, zpAvg, false, true, 700}, {zpFloat32, 8, 64, zpSum, true, true, 333},
      {zpFloat16, 4, 32, zpAvg, true, true, 257},    {zpFloat32, 4, 8192, zpSum, true, true, 9000},
  };
  for (const GradLayout& L : kLayouts) {
    for (const GradCase& c : cases) {
      SCOPED_TRACE(std::string(L.name) + ", " + zp::typeName(c.type) + " bits " + std::to_string(c.bits) + " block " +
                   std::to_string(c.blockSize) + (c.stochastic ? " SR" : "") + (c.feedback ? " EF" : ""));
      checkLayout(L, c, 3);
    }
  }
}

// The model's own sanity: what it predicts for nearest rounding without residuals is the plain call's result.
TEST(GradQgzHost, PlainCallsAreTheNearestRoundingWithoutResidual) {
  const GradLayout& L = kLayouts[1];
  const GradCase c{zpBfloat16, 4, 256, zpSum, false, false, 500};
  const int n = L.nranks;
  std::vector<Buffer> plain(n), ex2(n);
  zptest::runHostRanks(
      n, [&](int rank, zpConfig_t* cfg) { configureLayout(L, rank, cfg); },
      [&](int rank, zpComm_t comm) {
        Buffer in(c.count * n * 2);
        zpcheck::fillRandom(c.type, in.data(), c.count * n, 31, rank);
        plain[rank] = Buffer(c.count * 2);
        ex2[rank] = Buffer(c.count * 2);
        std::memset(plain[rank].data(), 0xa5, c.count * 2);
        std::memset(ex2[rank].data(), 0x5a, c.count * 2);
        ASSERT_EQ(zpQuantReduceScatterA2A(in.data(), plain[rank].data(), c.count, c.type, zpSum, comm, nullptr),
                  zpSuccess);
        ASSERT_EQ(
            zpQuantReduceScatterA2AEx2(in.data(), ex2[rank].data(), c.count, c.type, zpSum, nullptr, comm, nullptr),
            zpSuccess);
      });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(sameBits(plain[r].data(), ex2[r].data(), c.count, c.type)) << r;
}

// Runs `calls` stochastic qgZ calls of the same input on a fresh 2 x 2 communicator; returns rank 0's outputs.
std::vector<std::vector<unsigned char>> stochasticRun(int configSeed, int callSeed, bool configRounding, int calls,
                                                      int sequence = ZP_CONFIG_UNDEF_INT) {
  const GradLayout& L = kLayouts[1];
  const int n = L.nranks;
  constexpr size_t kCount = 2048;
  std::vector<std::vector<unsigned char>> outs(calls);
  zptest::runHostRanks(
      n,
      [&](int rank, zpConfig_t* cfg) {
        configureLayout(L, rank, cfg);
        cfg->gradSeed = configSeed;
        if (configRounding) cfg->gradRounding = zpRoundStochastic;
      },
      [&](int rank, zpComm_t comm) {
        Buffer in(kCount * n * 2), out(kCount * 2);
        zpcheck::fillRandom(zpBfloat16, in.data(), kCount * n, 55, rank);
        for (int call = 0; call < calls; ++call) {
          std::memset(out.data(), 0xa5, kCount * 2);
          zpResult_t res;
          if (configRounding && callSeed < 0) {
            res = zpQuantReduceScatterA2A(in.data(), out.data(), kCount, zpBfloat16, zpSum, comm, nullptr);
          } else {
            zpGradOptions_t o = ZP_GRAD_OPTIONS_INITIALIZER;
            o.rounding = zpRoundStochastic;
            if (callSeed >= 0) o.seed = callSeed;
            o.sequence = sequence;
            res = zpQuantReduceScatterA2AEx2(in.data(), out.data(), kCount, zpBfloat16, zpSum, &o, comm, nullptr);
          }
          ASSERT_EQ(res, zpSuccess) << zpGetLastError(comm);
          if (rank == 0) outs[call].assign(out.data(), out.data() + kCount * 2);
        }
      });
  return outs;
}

TEST(GradQgzHost, DeterministicPerSeedAndSequence) {
  const auto a = stochasticRun(11, -1, false, 3);
  const auto b = stochasticRun(11, -1, false, 3);
  EXPECT_EQ(a, b) << "same seed, same calls: same bits, run after run";
  EXPECT_NE(a[0], a[1]) << "the sequence number advances per call";
  EXPECT_NE(a[1], a[2]);
  const auto c = stochasticRun(12, -1, false, 1);
  EXPECT_NE(a[0], c[0]) << "another seed";
  // The per-call seed overrides the config's; the config's rounding serves plain zpQuantReduceScatterA2A.
  EXPECT_EQ(stochasticRun(99, 11, false, 3), a);
  EXPECT_EQ(stochasticRun(11, -1, true, 3), a);
  // A per-call sequence number replaces the communicator's: every call draws as the one it names.
  const auto fixed = stochasticRun(11, -1, false, 3, 1);
  for (const auto& out : fixed) EXPECT_EQ(out, a[1]);
}

}  // namespace
