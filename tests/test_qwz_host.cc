// qwZ (zpQuantAllGather) on the host backend: the gathered tensor is bit-identical on every rank and equal to
// the host reference of the block format applied to each shard on its own (the own shard included), within the
// format's error bound of the original, the same in place and out of place; and bad input is refused with a
// message naming the call and the argument, leaving the communicator usable.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include "host/quant_format.h"
#include "host/quant_ref.h"
#include "include/zpccl.h"
#include "tests/collective_check.h"
#include "tests/host_ranks.h"

namespace {

using zpcheck::Buffer;
using zpcheck::bytesOf;
using zpcheck::mentions;
using zpcheck::sameBits;
using zptest::runHostRanks;

const size_t kCounts[] = {1, 7, 255, 257, 1000, 4097};

// How one call picks its quantization settings.
struct CallVariant {
  const char* name;
  bool ex;                  // zpQuantAllGatherEx, else zpQuantAllGather
  zpQuantOptions_t option;  // for Ex; a field left 0 keeps the communicator's value
};

const CallVariant kVariants[] = {
    {"plain", false, {0, 0}},        {"ex{0,0}", true, {0, 0}},   {"ex{4,-}", true, {4, 0}},
    {"ex{8,8192}", true, {8, 8192}}, {"ex{-,32}", true, {0, 32}}, {"ex{4,256}", true, {4, 256}},
};

zpResult_t callQwz(const CallVariant& v, const void* send, void* recv, size_t count, zpDataType_t type, zpComm_t comm) {
  if (!v.ex) return zpQuantAllGather(send, recv, count, type, comm, nullptr);
  return zpQuantAllGatherEx(send, recv, count, type, &v.option, comm, nullptr);
}

uint64_t fnv(const unsigned char* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

// One gather: the ranks' original shards, concatenated, and the expected output, built from the host reference
// of the format: dequantizeRef(quantizeRef(shard r)) at position r.
struct Case {
  zpDataType_t type;
  size_t count;
  const CallVariant* variant;
  int bits, blockSize;  // effective
  Buffer original;      // nranks * count elements
  Buffer expected;      // nranks * count elements
};

void buildExpected(Case* c, int nranks, uint64_t seed) {
  const size_t shard = c->count * bytesOf(c->type);
  c->original.resize(shard * nranks);
  c->expected.resize(shard * nranks);
  Buffer payload(zp::quantPayloadBytes(c->count, c->bits, c->blockSize));
  for (int r = 0; r < nranks; ++r) {
    zpcheck::fillRandom(c->type, c->original.data() + r * shard, c->count, seed, r);
    payload.poison();
    zp::quantizeRef(c->original.data() + r * shard, c->type, c->count, c->bits, c->blockSize, payload.data());
    zp::dequantizeRef(payload.data(), c->type, c->count, c->bits, c->blockSize, c->expected.data() + r * shard);
  }
}

// The format's error bound, in float64, for every element of one shard x and its gathered copy out, per block:
//   scale = absmax(block) / qmax, divided in fp32 (qmax 127 or 7), and
//   |out - x| <= scale / 2 + halfUlp_type(out) + slack,
// where rint(x / scale) may stand 1/2 + 2^-17 codes from x / scale (the fp32 quotient is rounded: |x / scale|
// <= 128, so that rounding is at most 128 * 2^-24 codes) and q * scale is rounded to fp32 before the output
// type (at most 2^-24 |out| more): slack = scale * 2^-16 + 2^-23 |out|. The data keep every scale a normal fp32
// far from the types' overflow, so neither underflow nor saturation enters.
::testing::AssertionResult withinFormatBound(zpDataType_t type, const void* x, const void* out, size_t count, int bits,
                                             int blockSize) {
  const float qmax = static_cast<float>(zp::quantMax(bits));
  for (size_t begin = 0; begin < count; begin += blockSize) {
    const size_t end = std::min(count, begin + blockSize);
    double absmax = 0.0;
    for (size_t i = begin; i < end; ++i) absmax = std::max(absmax, std::fabs(zpcheck::loadValue(type, x, i)));
    const float scale = static_cast<float>(absmax) / qmax;  // exact widening, one fp32 division
    for (size_t i = begin; i < end; ++i) {
      const double xi = zpcheck::loadValue(type, x, i), oi = zpcheck::loadValue(type, out, i);
      const double bound = scale / 2.0 + zpcheck::halfUlp(oi, type) + scale * 0x1p-16 + 0x1p-23 * std::fabs(oi);
      if (!(std::fabs(oi - xi) <= bound)) {
        return ::testing::AssertionFailure()
               << "element " << i << ": x " << xi << ", out " << oi << ", error " << std::fabs(oi - xi) << " > bound "
               << bound << " (scale " << scale << ")";
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// ---- gathers over rank counts, types, counts, bits and block sizes ---------------------------------------------

struct Param {
  int nranks;
  int configBits;   // config.weightBits, 0: default (8)
  int configBlock;  // config.blockSize, 0: default (256)
};

void PrintTo(const Param& p, std::ostream* os) {
  *os << p.nranks << " ranks, config weightBits " << p.configBits << " blockSize " << p.configBlock;
}

std::string paramName(const ::testing::TestParamInfo<Param>& info) {
  const Param& p = info.param;
  return "ranks" + std::to_string(p.nranks) + "_bits" + std::to_string(p.configBits ? p.configBits : 8) + "_block" +
         std::to_string(p.configBlock ? p.configBlock : 256);
}

class QwzGather : public ::testing::TestWithParam<Param> {};

TEST_P(QwzGather, BitIdenticalOnEveryRankEqualToReferenceInAndOutOfPlace) {
  const Param p = GetParam();
  const int n = p.nranks;
  const int commBits = p.configBits ? p.configBits : 8;
  const int commBlock = p.configBlock ? p.configBlock : 256;

  std::vector<Case> cases;
  for (zpDataType_t type : zpcheck::kQuantTypes) {
    for (size_t count : kCounts) {
      for (const CallVariant& v : kVariants) {
        Case c;
        c.type = type;
        c.count = count;
        c.variant = &v;
        c.bits = v.ex && v.option.bits ? v.option.bits : commBits;
        c.blockSize = v.ex && v.option.blockSize ? v.option.blockSize : commBlock;
        cases.push_back(std::move(c));
      }
    }
  }
  for (size_t k = 0; k < cases.size(); ++k) buildExpected(&cases[k], n, 1000 + 17 * k + n);

  // hashes[k][r]: what rank r gathered in case k, to compare the ranks with each other afterwards.
  std::vector<std::vector<uint64_t>> hashes(cases.size(), std::vector<uint64_t>(n, 0));
  std::atomic<int> finished{0};
  runHostRanks(
      n,
      [&](int, zpConfig_t* c) {
        if (p.configBits) c->weightBits = p.configBits;
        if (p.configBlock) c->blockSize = p.configBlock;
      },
      [&](int rank, zpComm_t comm) {
        for (size_t k = 0; k < cases.size(); ++k) {
          const Case& c = cases[k];
          const size_t shard = c.count * bytesOf(c.type);
          SCOPED_TRACE(::testing::Message()
                       << "rank " << rank << " type " << zp::typeName(c.type) << " count " << c.count << " "
                       << c.variant->name << " (bits " << c.bits << ", block " << c.blockSize << ")");
          const unsigned char* mine = c.original.data() + rank * shard;
          // Out of place.
          Buffer send(shard), recv(shard * n);
          std::memcpy(send.data(), mine, shard);
          ASSERT_EQ(callQwz(*c.variant, send.data(), recv.data(), c.count, c.type, comm), zpSuccess)
              << zpGetLastError(comm);
          EXPECT_STREQ(zpGetLastError(comm), "");
          EXPECT_TRUE(sameBits(recv.data(), c.expected.data(), c.count * n, c.type));
          EXPECT_TRUE(sameBits(send.data(), mine, c.count, c.type)) << "sendbuff was modified";
          // The own shard holds the dequantized values, within the format's bound of the original.
          EXPECT_TRUE(withinFormatBound(c.type, mine, recv.data() + rank * shard, c.count, c.bits, c.blockSize));
          hashes[k][rank] = fnv(recv.data(), shard * n);
          // In place: the shard already sits at its place in recvbuff.
          Buffer inplace(shard * n);
          std::memcpy(inplace.data() + rank * shard, mine, shard);
          ASSERT_EQ(callQwz(*c.variant, inplace.data() + rank * shard, inplace.data(), c.count, c.type, comm),
                    zpSuccess)
              << zpGetLastError(comm);
          EXPECT_TRUE(sameBits(inplace.data(), recv.data(), c.count * n, c.type)) << "in place differs";
        }
        finished++;
      });
  ASSERT_EQ(finished.load(), n);
  for (size_t k = 0; k < cases.size(); ++k) {
    for (int r = 1; r < n; ++r) {
      EXPECT_EQ(hashes[k][r], hashes[k][0]) << "case " << k << ": rank " << r << " gathered other bits than rank 0";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Qwz, QwzGather,
                         ::testing::Values(Param{1, 0, 0}, Param{2, 0, 0}, Param{3, 0, 0}, Param{8, 0, 0},
                                           Param{16, 0, 0}, Param{1, 4, 32}, Param{2, 4, 32}, Param{3, 4, 8192},
                                           Param{8, 4, 32}, Param{16, 4, 8192}),
                         paramName);

// The bound itself must be able to fail: the original shard (not quantized) is not what comes back.
TEST(QwzGatherBound, OutputIsQuantizedNotTheOriginal) {
  const size_t count = 1000;
  Buffer x(count * 4), out(count * 4);
  zpcheck::fillRandom(zpFloat32, x.data(), count, 7, 0);
  runHostRanks(
      1, [](int, zpConfig_t* c) { c->weightBits = 4; },
      [&](int, zpComm_t comm) {
        ASSERT_EQ(zpQuantAllGather(x.data(), out.data(), count, zpFloat32, comm, nullptr), zpSuccess);
      });
  EXPECT_FALSE(sameBits(out.data(), x.data(), count, zpFloat32)) << "int4 codes cannot carry fp32 values exactly";
  EXPECT_TRUE(withinFormatBound(zpFloat32, x.data(), out.data(), count, 4, 256));
  // A 4x tighter bound (as if the codes had 8 bits... and more) fails somewhere: the check has teeth.
  Buffer shrunk(count * 4);
  for (size_t i = 0; i < count; ++i) {
    const double xi = zpcheck::loadValue(zpFloat32, x.data(), i), oi = zpcheck::loadValue(zpFloat32, out.data(), i);
    zpcheck::storeValue(zpFloat32, shrunk.data(), i, static_cast<float>(xi + 4.0 * (oi - xi)));
  }
  EXPECT_FALSE(withinFormatBound(zpFloat32, x.data(), shrunk.data(), count, 4, 256));
}

// A shard block holding NaN or Inf arrives as all NaN (on every rank, the own one included); the rest is finite.
TEST(QwzGatherSpecials, NaNOrInfBlockArrivesAllNaN) {
  const int n = 3;
  const size_t count = 1000;  // 4 blocks of 256, the last partial
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()};
  runHostRanks(n, nullptr, [&](int rank, zpComm_t comm) {
    for (zpDataType_t type : zpcheck::kQuantTypes) {
      for (float special : specials) {
        const size_t es = bytesOf(type);
        Buffer send(count * es), recv(count * es * n);
        zpcheck::fillRandom(type, send.data(), count, 99, rank);
        // Rank 1 puts the special value at element 600 (block 2 of its shard).
        if (rank == 1) zpcheck::storeValue(type, send.data(), 600, special);
        ASSERT_EQ(zpQuantAllGather(send.data(), recv.data(), count, type, comm, nullptr), zpSuccess);
        for (size_t i = 0; i < count * n; ++i) {
          const bool inBlock = i >= count + 512 && i < count + 768;
          const uint32_t b = zpcheck::loadBits(type, recv.data(), i);
          if (inBlock) {
            ASSERT_TRUE(zpcheck::isNaNBits(type, b)) << "rank " << rank << " element " << i << " bits " << b;
          } else {
            ASSERT_TRUE(std::isfinite(zpcheck::loadValue(type, recv.data(), i)))
                << "rank " << rank << " element " << i << " type " << zp::typeName(type);
          }
        }
      }
    }
  });
}

TEST(QwzGatherEdge, CountZeroSucceedsAndLeavesRecvbuffUntouched) {
  runHostRanks(3, nullptr, [](int rank, zpComm_t comm) {
    Buffer send(64), recv(64);
    zpcheck::fillRandom(zpFloat16, send.data(), 32, 5, rank);
    recv.poison(0xa5);
    EXPECT_EQ(zpQuantAllGather(send.data(), recv.data(), 0, zpFloat16, comm, nullptr), zpSuccess);
    EXPECT_TRUE(zpcheck::allBytesAre(recv.data(), recv.size(), 0xa5));
    const zpQuantOptions_t opt = {4, 32};
    EXPECT_EQ(zpQuantAllGatherEx(send.data(), recv.data(), 0, zpBfloat16, &opt, comm, nullptr), zpSuccess);
    EXPECT_TRUE(zpcheck::allBytesAre(recv.data(), recv.size(), 0xa5));
    EXPECT_STREQ(zpGetLastError(comm), "");
  });
}

// ---- bad input -------------------------------------------------------------------------------------------------

// Every rank makes the same bad call (argument checks are local: no peer is waited for), then a good one.
TEST(QwzBadInput, RefusedWithNamedArgumentAndCommStaysUsable) {
  const int n = 2;
  const size_t count = 300;
  struct Bad {
    const char* name;
    zpResult_t code;
    const char* mention;
  };
  runHostRanks(n, nullptr, [&](int rank, zpComm_t comm) {
    Buffer send(count * 4), recv(count * 4 * n), big(count * 4 * (n + 1));
    zpcheck::fillRandom(zpFloat32, send.data(), count, 3, rank);
    auto goodCallWorks = [&](const char* after) {
      recv.poison();
      ASSERT_EQ(zpQuantAllGather(send.data(), recv.data(), count, zpFloat32, comm, nullptr), zpSuccess)
          << "after " << after << ": " << zpGetLastError(comm);
      EXPECT_STREQ(zpGetLastError(comm), "") << "after " << after;
      for (size_t i = 0; i < count * n; ++i) {
        ASSERT_TRUE(std::isfinite(zpcheck::loadValue(zpFloat32, recv.data(), i))) << "after " << after;
      }
    };
    auto expectBad = [&](zpResult_t res, const Bad& b) {
      EXPECT_EQ(res, b.code) << b.name;
      const std::string msg = zpGetLastError(comm);
      EXPECT_TRUE(mentions(msg.c_str(), "zpQuantAllGather")) << b.name << ": " << msg;
      EXPECT_TRUE(mentions(msg.c_str(), b.mention)) << b.name << ": " << msg;
      goodCallWorks(b.name);
    };
    const zpQuantOptions_t bits6 = {6, 0}, block48 = {0, 48}, blockBig = {0, 16384};
    unsigned char* r = recv.data();
    expectBad(zpQuantAllGather(nullptr, r, count, zpFloat32, comm, nullptr),
              {"NULL sendbuff", zpInvalidArgument, "sendbuff"});
    expectBad(zpQuantAllGather(send.data(), nullptr, count, zpFloat32, comm, nullptr),
              {"NULL recvbuff", zpInvalidArgument, "recvbuff"});
    expectBad(zpQuantAllGather(send.data(), r, count, zpInt32, comm, nullptr), {"int32", zpInvalidArgument, "type"});
    expectBad(zpQuantAllGather(send.data(), r, count, zpFloat64, comm, nullptr),
              {"float64", zpInvalidArgument, "type"});
    expectBad(zpQuantAllGather(send.data(), r, count, static_cast<zpDataType_t>(99), comm, nullptr),
              {"type 99", zpInvalidArgument, "invalid type 99"});
    expectBad(zpQuantAllGather(send.data(), r, count, static_cast<zpDataType_t>(-1), comm, nullptr),
              {"type -1", zpInvalidArgument, "invalid type -1"});
    expectBad(zpQuantAllGatherEx(send.data(), r, count, zpFloat32, &bits6, comm, nullptr),
              {"bits 6", zpInvalidArgument, "options->bits"});
    expectBad(zpQuantAllGatherEx(send.data(), r, count, zpFloat32, &block48, comm, nullptr),
              {"block 48", zpInvalidArgument, "options->blockSize"});
    expectBad(zpQuantAllGatherEx(send.data(), r, count, zpFloat32, &blockBig, comm, nullptr),
              {"block 16384", zpInvalidArgument, "options->blockSize"});
    expectBad(zpQuantAllGather(send.data(), r, SIZE_MAX / 2, zpFloat16, comm, nullptr),
              {"SIZE_MAX/2", zpInvalidArgument, "overflow"});
    expectBad(zpQuantAllGather(send.data(), r, SIZE_MAX / 4 + 1, zpFloat32, comm, nullptr),
              {"SIZE_MAX/4+1", zpInvalidArgument, "overflow"});
    expectBad(zpQuantAllGather(send.data(), r, SIZE_MAX / (4 * n) + 1, zpFloat32, comm, nullptr),
              {"count x ranks", zpInvalidArgument, "overflow"});
    expectBad(zpQuantAllGather(send.data(), r, count, zpFloat32, comm, zpcheck::bogusStream()),
              {"stream", zpInvalidArgument, "stream"});
    // Overlaps that are not the in-place layout: shifted by one element, or on the peer's place.
    unsigned char* g = big.data();
    expectBad(zpQuantAllGather(g + (rank * count + 1) * 4, g, count, zpFloat32, comm, nullptr),
              {"overlap +1", zpInvalidArgument, "overlap"});
    expectBad(zpQuantAllGather(g + ((rank + 1) % n) * count * 4, g, count, zpFloat32, comm, nullptr),
              {"overlap peer", zpInvalidArgument, "overlap"});
    expectBad(zpQuantAllGather(g, g + 4, count, zpFloat32, comm, nullptr),
              {"recv after send", zpInvalidArgument, "overlap"});
  });
}

TEST(QwzBadInput, NullAndDestroyedCommunicator) {
  Buffer send(64), recv(64);
  EXPECT_EQ(zpQuantAllGather(send.data(), recv.data(), 8, zpFloat32, nullptr, nullptr), zpInvalidArgument);
  EXPECT_TRUE(mentions(zpGetLastError(nullptr), "zpQuantAllGather")) << zpGetLastError(nullptr);
  EXPECT_TRUE(mentions(zpGetLastError(nullptr), "comm")) << zpGetLastError(nullptr);
  zpComm_t dead = nullptr;
  runHostRanks(1, nullptr, [&](int, zpComm_t comm) { dead = comm; });  // destroyed when the body returns
  ASSERT_NE(dead, nullptr);
  EXPECT_EQ(zpQuantAllGather(send.data(), recv.data(), 8, zpFloat32, dead, nullptr), zpInvalidArgument);
  EXPECT_TRUE(mentions(zpGetLastError(nullptr), "zpQuantAllGather")) << zpGetLastError(nullptr);
}

}  // namespace
