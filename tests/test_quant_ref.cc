// Host reference of the block quantization format (host/quant_ref.h) against float64 math: scales, codes, error
// bounds, special blocks, layout and padding, over a cross product of type x bits x block size x count x
// alignment.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "host/dtype.h"
#include "host/quant_format.h"
#include "host/quant_math.h"
#include "host/quant_ref.h"
#include "tests/quant_test_util.h"
#include "tests/stochastic_threshold.h"

namespace {

using zptest::AlignedBuffer;
using zptest::BlockKind;

constexpr size_t kGuard = 64;  // poisoned bytes after each buffer, which must stay untouched

struct Case {
  zpDataType_t type;
  int bits;
  int blockSize;
  size_t count;
  size_t offset;  // input/output start, in elements past a 16-byte boundary

  std::string name() const {
    return std::string(zp::typeName(type)) + " bits=" + std::to_string(bits) + " G=" + std::to_string(blockSize) +
           " count=" + std::to_string(count) + " offset=" + std::to_string(offset);
  }
};

// Quantizes and dequantizes `input` (count elements of c.type), checking every property of the format against
// float64 math. Returns the number of failures (reporting the first few).
int checkRoundTrip(const Case& c, const unsigned char* input) {
  const size_t esize = zptest::elemSize(c.type);
  const size_t payloadBytes = zp::quantPayloadBytes(c.count, c.bits, c.blockSize);
  const size_t scaleBytes = zp::quantScaleBytes(c.count, c.blockSize);
  const size_t blocks = zp::quantBlockCount(c.count, c.blockSize);
  const double qmax = zp::quantMax(c.bits);
  AlignedBuffer payloadBuf(payloadBytes + kGuard), outBuf((c.count + c.offset) * esize + kGuard);
  unsigned char* payload = payloadBuf.data();
  unsigned char* out = outBuf.data() + c.offset * esize;
  zp::quantizeRef(input, c.type, c.count, c.bits, c.blockSize, payload);
  zp::dequantizeRef(payload, c.type, c.count, c.bits, c.blockSize, out);
  const unsigned char* codes = payload + scaleBytes;

  int failures = 0;
  auto fail = [&](const std::string& what) {
    if (++failures <= 5) ADD_FAILURE() << c.name() << ": " << what;
  };

  // Layout: padding zero, nothing written past the payload or the output.
  for (size_t k = blocks * sizeof(float); k < scaleBytes; ++k) {
    if (payload[k] != 0) fail("scale padding byte " + std::to_string(k) + " not zero");
  }
  for (size_t k = scaleBytes + (c.count * c.bits + 7) / 8; k < payloadBytes; ++k) {
    if (payload[k] != 0) fail("code padding byte " + std::to_string(k) + " not zero");
  }
  if (c.bits == 4 && c.count % 2 == 1 && (codes[c.count / 2] >> 4) != 0) fail("odd count: last high nibble not 0");
  for (size_t k = 0; k < kGuard; ++k) {
    if (payload[payloadBytes + k] != 0xff) fail("write past the payload");
    if (out[c.count * esize + k] != 0xff) fail("write past the output");
  }

  for (size_t b = 0; b < blocks; ++b) {
    const size_t begin = b * c.blockSize;
    const size_t end = begin + c.blockSize < c.count ? begin + c.blockSize : c.count;
    double absmax = 0.0;
    bool nonFinite = false;
    for (size_t i = begin; i < end; ++i) {
      const double x = zptest::loadElem(c.type, input, i);
      if (!std::isfinite(x)) nonFinite = true;
      absmax = std::fmax(absmax, std::fabs(x));
    }
    float scale;
    std::memcpy(&scale, payload + b * sizeof(float), sizeof(float));
    const std::string where = " (block " + std::to_string(b) + ")";

    if (nonFinite) {  // NaN scale, codes 0, every output the type's quiet NaN
      if (zp::floatBits(scale) != zp::kF32QuietNaN) fail("non-finite block: scale is not the quiet NaN" + where);
      for (size_t i = begin; i < end; ++i) {
        if (zptest::loadCode(codes, i, c.bits) != 0) fail("non-finite block: code not 0" + where);
        const uint32_t want = c.type == zpFloat32
                                  ? zp::Fp32Type::kQuietNaN
                                  : (c.type == zpFloat16 ? zp::Fp16Type::kQuietNaN : zp::Bf16Type::kQuietNaN);
        if (zptest::loadElemBits(c.type, out, i) != want) fail("non-finite block: output not NaN" + where);
      }
      continue;
    }

    // scale == absmax / qmax rounded once to fp32 (a float64 quotient of floats rounds correctly to fp32).
    const float wantScale = static_cast<float>(absmax / qmax);
    if (zp::floatBits(scale) != zp::floatBits(wantScale)) {
      fail("scale " + std::to_string(scale) + " != absmax/qmax " + std::to_string(wantScale) + where);
      continue;
    }
    const bool normalScale = scale >= std::numeric_limits<float>::min();
    for (size_t i = begin; i < end; ++i) {
      const double x = zptest::loadElem(c.type, input, i);
      const int q = zptest::loadCode(codes, i, c.bits);
      const double y = zptest::loadElem(c.type, out, i);
      if (std::abs(q) > qmax) fail("code out of range" + where);
      if (scale == 0.0f) {  // all zero (or absmax below qmax * 2^-150): codes 0, outputs +0
        if (q != 0 || zptest::loadElemBits(c.type, out, i) != 0) fail("zero-scale block: not +0" + where);
        continue;
      }
      // The block maximum is never clipped: its code is +-qmax (exact when the scale is a normal number).
      if (normalScale && std::fabs(x) == absmax && std::abs(q) != qmax) {
        fail("absmax element has code " + std::to_string(q) + where);
      }
      // |x - q scale| <= scale/2 (+ the division's rounding); a subnormal scale may clip by qmax * 2^-150 more.
      const double prod = q * static_cast<double>(scale);  // exact
      const double bound = scale * (0.5 + 0x1p-16) + (normalScale ? 0.0 : qmax * 0x1p-150);
      if (!(std::fabs(x - prod) <= bound)) fail("|x - q*scale| above scale/2 at element " + std::to_string(i) + where);
      // x' = q * scale rounded to fp32, then to the type, saturated to the largest finite value.
      double want = zptest::roundToType(static_cast<float>(prod), c.type);
      if (std::isinf(want)) want = std::copysign(zptest::typeLimits(c.type).maxFinite, want);
      if (y != want || std::signbit(y) != std::signbit(want)) {
        fail("output " + std::to_string(y) + " != " + std::to_string(want) + " at element " + std::to_string(i) +
             where);
      }
      // And the combined bound of the issue: scale/2 plus the output's rounding.
      const double outBound =
          bound + zptest::halfUlp(prod, zpFloat32) + zptest::halfUlp(y, c.type) +
          (std::fabs(want) < std::fabs(prod) && std::fabs(want) == zptest::typeLimits(c.type).maxFinite
               ? std::fabs(prod) - std::fabs(want)
               : 0.0);
      if (!(std::fabs(y - x) <= outBound)) fail("|x' - x| above bound at element " + std::to_string(i) + where);
    }
  }
  return failures;
}

// The input of a case: count fresh pseudo-random elements at the case's offset in an aligned buffer.
struct Input {
  AlignedBuffer buf;
  unsigned char* data;
  Input(const Case& c, uint32_t seed, bool specials)
      : buf((c.count + c.offset) * zptest::elemSize(c.type) + kGuard),
        data(buf.data() + c.offset * zptest::elemSize(c.type)) {
    zptest::fillData(c.type, data, c.count, c.blockSize, c.bits, seed, specials);
  }
};

// ---- conversions: the bit-level host conversions against float64 ---------------------------------------------

TEST(QuantRef, HalfAndBf16WideningIsExact) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
    const float f = zp::halfBitsToFloat(static_cast<uint16_t>(h));
    if (e == 0x1f) {
      ASSERT_EQ(std::isnan(f), m != 0) << std::hex << h;
      if (m != 0) {
        ASSERT_TRUE(zp::floatBits(f) & 0x00400000u) << "NaN not quiet " << std::hex << h;
      }
      continue;
    }
    const double want =
        (e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, static_cast<int>(e) - 25)) * ((h & 0x8000) ? -1 : 1);
    ASSERT_EQ(static_cast<double>(f), want) << std::hex << h;
    ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;
    ASSERT_EQ(zp::floatToHalfBitsRn(f), h) << "round trip " << std::hex << h;  // narrowing an exact value
    const float g = zp::bf16BitsToFloat(static_cast<uint16_t>(h));
    ASSERT_EQ(zp::floatBits(g), h << 16);
  }
}

TEST(QuantRef, NarrowingRoundsToNearestEven) {
  std::mt19937 rng(7);
  std::vector<float> values = {0.0f,
                               -0.0f,
                               65504.0f,
                               65519.99f,
                               65520.0f,
                               -65520.0f,
                               0x1p-24f,
                               0x1p-25f,
                               0x1.000002p-25f,
                               0x1.8p-24f,
                               0x1p-14f,
                               0x1.ffcp-15f,
                               std::numeric_limits<float>::max(),
                               std::numeric_limits<float>::min(),
                               std::numeric_limits<float>::denorm_min(),
                               0x1.fffffep-127f,
                               std::numeric_limits<float>::infinity(),
                               1.0009765625f,
                               1.00048828125f};
  for (int k = 0; k < 200000; ++k) values.push_back(zp::bitsFloat(rng()));  // every binade, subnormals included
  for (int k = 0; k < 200000; ++k) {
    values.push_back(zp::bitsFloat(0x33000000u + rng() % (0x47800000u - 0x33000000u)));  // fp16's range
    values.push_back(zp::bitsFloat((rng() & 0xffff0000u) | 0x8000u));                    // bf16 ties
  }
  for (float v : values) {
    for (zpDataType_t type : {zpFloat16, zpBfloat16}) {
      const uint16_t b = type == zpFloat16 ? zp::floatToHalfBitsRn(v) : zp::floatToBf16BitsRn(v);
      unsigned char raw[4] = {0, 0, 0, 0};
      std::memcpy(raw, &b, 2);
      const double got = zptest::loadElem(type, raw, 0);
      if (std::isnan(v)) {
        ASSERT_TRUE(std::isnan(got)) << v;
        continue;
      }
      const double want = zptest::roundToType(v, type);
      ASSERT_EQ(got, want) << zp::typeName(type) << " " << std::hexfloat << v;
      ASSERT_EQ(std::signbit(got), std::signbit(v)) << std::hexfloat << v;
    }
  }
  // NaN stays a quiet NaN, sign kept.
  for (uint32_t nan : {0x7f800001u, 0x7fc00000u, 0xffa00000u, 0x7fffffffu}) {
    const float f = zp::bitsFloat(nan);
    const uint16_t h = zp::floatToHalfBitsRn(f), b = zp::floatToBf16BitsRn(f);
    EXPECT_EQ(h & 0x7e00u, 0x7e00u);
    EXPECT_EQ(b & 0x7fc0u, 0x7fc0u);
    EXPECT_EQ((h >> 15) != 0, (nan >> 31) != 0);
    EXPECT_EQ((b >> 15) != 0, (nan >> 31) != 0);
  }
}

// ---- layout ------------------------------------------------------------------------------------------------------

TEST(QuantRef, PayloadSize) {
  EXPECT_EQ(zp::quantPayloadBytes(0, 8, 256), 0u);
  EXPECT_EQ(zp::quantPayloadBytes(1, 8, 256), 16u + 16u);
  EXPECT_EQ(zp::quantPayloadBytes(1, 4, 32), 16u + 16u);
  EXPECT_EQ(zp::quantPayloadBytes(256, 8, 256), 16u + 256u);
  EXPECT_EQ(zp::quantPayloadBytes(257, 8, 256), 16u + 272u);
  EXPECT_EQ(zp::quantPayloadBytes(257, 4, 256), 16u + 144u);
  EXPECT_EQ(zp::quantPayloadBytes(13 * 32, 4, 32), 64u + 208u);  // 13 scales -> 52 bytes -> 64
  EXPECT_EQ(zp::quantPayloadBytes(4 * 32 + 1, 8, 32), 32u + 144u);
  for (size_t count : {1ul, 31ul, 255ul, 4097ul, 100003ul}) {
    for (int bits : {4, 8}) {
      for (int g : {32, 256, 8192}) {
        const size_t bytes = zp::quantPayloadBytes(count, bits, g);
        EXPECT_EQ(bytes % 16, 0u);
        EXPECT_GE(bytes, zp::quantBlockCount(count, g) * 4 + (count * bits + 7) / 8);
        EXPECT_LT(bytes, zp::quantBlockCount(count, g) * 4 + (count * bits + 7) / 8 + 32);
      }
    }
  }
}

// The bounds' words in every message that states a rule (argument checks, launchers, perf flags, the cost model)
// are the header's values, whatever way the header spells them.
TEST(QuantFormat, RulesWordTheHeadersBounds) {
  EXPECT_EQ(std::string(zp::kBitsRule), std::to_string(ZP_BITS_INT4) + " or " + std::to_string(ZP_BITS_INT8));
  EXPECT_EQ(std::string(zp::kBlockSizeRule),
            "a power of two in [" + std::to_string(ZP_MIN_BLOCK_SIZE) + ", " + std::to_string(ZP_MAX_BLOCK_SIZE) + "]");
  for (int bits = -1; bits <= 2 * ZP_BITS_INT8; ++bits)
    EXPECT_EQ(zp::isValidBits(bits), bits == ZP_BITS_INT4 || bits == ZP_BITS_INT8) << bits;
}

TEST(QuantRef, Int4PacksLowNibbleFirst) {
  // Codes 1, -1, 7, -7, 3 (scale 1: absmax 7): bytes 0xf1, 0x97, 0x03 (odd count: last high nibble 0).
  const float in[] = {1.0f, -1.0f, 7.0f, -7.0f, 3.0f};
  AlignedBuffer payload(zp::quantPayloadBytes(5, 4, 32));
  zp::quantizeRef(in, zpFloat32, 5, 4, 32, payload.data());
  const unsigned char* codes = payload.data() + 16;
  EXPECT_EQ(codes[0], 0xf1);
  EXPECT_EQ(codes[1], 0x97);
  EXPECT_EQ(codes[2], 0x03);
  float scale;
  std::memcpy(&scale, payload.data(), 4);
  EXPECT_EQ(scale, 1.0f);
}

// ---- the sweep ---------------------------------------------------------------------------------------------------

TEST(QuantRef, SweepTypeBitsBlockCountAlignment) {
  int cases = 0;
  for (zpDataType_t type : zptest::kQuantTypes) {
    for (int bits : {4, 8}) {
      for (int g : {32, 64, 128, 256, 1024, 8192}) {
        const size_t counts[] = {
            1, 2, 31, 33, 255, 256, 257, 4097, 13 * static_cast<size_t>(g), 13 * static_cast<size_t>(g) - 5, 100003};
        for (size_t count : counts) {
          for (size_t offset : {0, 1, 3, 7}) {
            const Case c{type, bits, g, count, offset};
            const Input input(c, static_cast<uint32_t>(1000003 * ++cases), /*specials=*/true);
            ASSERT_EQ(checkRoundTrip(c, input.data), 0) << c.name();
          }
        }
      }
    }
  }
}

// ---- special blocks ------------------------------------------------------------------------------------------

// One block of each kind, 13 blocks in all: each must come out as its kind requires, and its neighbours must be
// quantized exactly as if they were alone (no leak across blocks).
TEST(QuantRef, EdgeBlocks) {
  const BlockKind kinds[] = {BlockKind::kRandom,   BlockKind::kZero,    BlockKind::kEqual,  BlockKind::kSingle,
                             BlockKind::kDenormal, BlockKind::kNearMax, BlockKind::kPosInf, BlockKind::kRandom,
                             BlockKind::kNegInf,   BlockKind::kNaN,     BlockKind::kTies,   BlockKind::kRandom,
                             BlockKind::kZero};
  constexpr size_t kBlocks = sizeof(kinds) / sizeof(kinds[0]);
  for (zpDataType_t type : zptest::kQuantTypes) {
    for (int bits : {4, 8}) {
      for (int g : {32, 256}) {
        for (size_t offset : {0, 3}) {
          const Case c{type, bits, g, kBlocks * g - 3, offset};
          const size_t esize = zptest::elemSize(type);
          AlignedBuffer buf((c.count + offset) * esize + kGuard);
          unsigned char* in = buf.data() + offset * esize;
          std::mt19937 rng(42 + bits + g);
          for (size_t b = 0; b < kBlocks; ++b) {
            const size_t end = (b + 1) * g < c.count ? (b + 1) * g : c.count;
            zptest::fillBlock(type, in, b * g, end, kinds[b], bits, rng);
          }
          ASSERT_EQ(checkRoundTrip(c, in), 0) << c.name();

          AlignedBuffer whole(zp::quantPayloadBytes(c.count, bits, g) + kGuard);
          zp::quantizeRef(in, type, c.count, bits, g, whole.data());
          const size_t scaleBytes = zp::quantScaleBytes(c.count, g);
          for (size_t b = 0; b < kBlocks; ++b) {
            const size_t n = (b + 1) * g < c.count ? g : c.count - b * g;
            AlignedBuffer alone(zp::quantPayloadBytes(n, bits, g) + kGuard);
            zp::quantizeRef(in + b * g * esize, type, n, bits, g, alone.data());
            EXPECT_EQ(std::memcmp(whole.data() + 4 * b, alone.data(), 4), 0) << c.name() << " scale of block " << b;
            EXPECT_EQ(std::memcmp(whole.data() + scaleBytes + b * g * bits / 8, alone.data() + 16, (n * bits + 7) / 8),
                      0)
                << c.name() << " codes of block " << b;
          }
        }
      }
    }
  }
}

TEST(QuantRef, ZeroBlockIsPositiveZero) {
  for (zpDataType_t type : zptest::kQuantTypes) {
    AlignedBuffer in(64 * 4), payload(zp::quantPayloadBytes(64, 8, 64)), out(64 * 4);
    for (size_t i = 0; i < 64; ++i) zptest::storeElem(type, in.data(), i, (i % 3) ? -0.0f : 0.0f);
    zp::quantizeRef(in.data(), type, 64, 8, 64, payload.data());
    zp::dequantizeRef(payload.data(), type, 64, 8, 64, out.data());
    float scale;
    std::memcpy(&scale, payload.data(), 4);
    EXPECT_EQ(zp::floatBits(scale), 0u);
    for (size_t i = 0; i < 64; ++i) EXPECT_EQ(zptest::loadElemBits(type, out.data(), i), 0u) << i;
  }
}

TEST(QuantRef, ExtremesDoNotOverflow) {
  // FLT_MAX: 127 * fl(FLT_MAX / 127) rounds above FLT_MAX in fp32; the output saturates instead of Inf.
  const float fmax = std::numeric_limits<float>::max();
  const float in[] = {fmax, -fmax, fmax / 3, 1.0f};
  AlignedBuffer payload(zp::quantPayloadBytes(4, 8, 32)), out(16);
  zp::quantizeRef(in, zpFloat32, 4, 8, 32, payload.data());
  zp::dequantizeRef(payload.data(), zpFloat32, 4, 8, 32, out.data());
  float y[4];
  std::memcpy(y, out.data(), 16);
  EXPECT_EQ(y[0], fmax);
  EXPECT_EQ(y[1], -fmax);
  EXPECT_TRUE(std::isfinite(y[2]));
  for (zpDataType_t type : {zpFloat16, zpBfloat16}) {
    AlignedBuffer tin(64), tout(64), tpay(zp::quantPayloadBytes(3, 4, 32));
    const float m = static_cast<float>(zptest::typeLimits(type).maxFinite);
    zptest::storeElem(type, tin.data(), 0, m);
    zptest::storeElem(type, tin.data(), 1, -m);
    zptest::storeElem(type, tin.data(), 2, m / 2);
    zp::quantizeRef(tin.data(), type, 3, 4, 32, tpay.data());
    zp::dequantizeRef(tpay.data(), type, 3, 4, 32, tout.data());
    EXPECT_EQ(zptest::loadElem(type, tout.data(), 0), m) << zp::typeName(type);
    EXPECT_EQ(zptest::loadElem(type, tout.data(), 1), -m) << zp::typeName(type);
  }
}

// A scale that underflows (absmax below qmax * 2^-150) quantizes to zeros; a subnormal scale stays within the
// documented bound (checked by checkRoundTrip for every element).
TEST(QuantRef, DenormalScales) {
  const float tiny = std::numeric_limits<float>::denorm_min();
  for (int bits : {4, 8}) {
    std::vector<float> in(96);
    for (size_t i = 0; i < 32; ++i) in[i] = (i % 2 ? -1.0f : 1.0f) * tiny * static_cast<float>(i % 3);  // scale 0
    for (size_t i = 32; i < 64; ++i) in[i] = tiny * static_cast<float>(190 + i);  // subnormal scale, may clip
    for (size_t i = 64; i < 96; ++i) in[i] = std::numeric_limits<float>::min() * static_cast<float>(i - 70);
    const Case c{zpFloat32, bits, 32, in.size(), 0};
    ASSERT_EQ(checkRoundTrip(c, reinterpret_cast<const unsigned char*>(in.data())), 0);
    AlignedBuffer payload(zp::quantPayloadBytes(in.size(), bits, 32));
    zp::quantizeRef(in.data(), zpFloat32, in.size(), bits, 32, payload.data());
    float scale0;
    std::memcpy(&scale0, payload.data(), 4);
    EXPECT_EQ(scale0, 0.0f);
  }
}

// Payloads that quantizeRef never makes still dequantize by the rules: codes -128 / -8, Inf or huge scales.
TEST(QuantRef, DequantizeForeignPayload) {
  const size_t count = 64;
  for (int bits : {4, 8}) {
    AlignedBuffer payload(zp::quantPayloadBytes(count, bits, 32));
    const float scales[2] = {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::max() / 2};
    std::memcpy(payload.data(), scales, sizeof(scales));
    unsigned char* codes = payload.data() + 16;
    std::memset(codes, bits == 8 ? 0x80 : 0x88, count * bits / 8);  // the most negative code everywhere
    for (zpDataType_t type : zptest::kQuantTypes) {
      AlignedBuffer out(count * 4);
      zp::dequantizeRef(payload.data(), type, count, bits, 32, out.data());
      const double maxFinite = zptest::typeLimits(type).maxFinite;
      for (size_t i = 0; i < 32; ++i) EXPECT_TRUE(std::isnan(zptest::loadElem(type, out.data(), i)));
      for (size_t i = 32; i < count; ++i) EXPECT_EQ(zptest::loadElem(type, out.data(), i), -maxFinite);
    }
  }
}

// The device's quantize computes x / scale as quotientRn (reciprocal, one correction step), not by division.
// Its codes must be quantizeCode's for every element a block can hold: every bf16 x against absmax values of
// every binade (mantissas sampled, powers of two in full: those make exact ties common) and the smallest
// scales it takes, every fp16 x against sampled absmax values, and random fp32 pairs. The quotient itself must
// be the division's wherever it can round to a non-zero code. (The full cross product of bf16 and of fp16
// pairs agrees the same way; it is sampled here to keep the suite fast.) Stochastic rounding's codes from quotientRn
// must be quantizeCodeStochastic's (the division's) at every draw, from its own, higher, bound on the scale up.
struct QuotientMismatches {
  uint64_t codes = 0, quotients = 0, stochastic = 0, stochasticPairs = 0, zeros = 0, roundable = 0;
};

// Whether stochastic rounding gives the quotients q and d the same code at every draw: each code is a step
// function of the draw with one step (tests/stochastic_threshold.h), so the draws around both steps decide.
bool sameStochasticCodes(float q, float d, float qmax) {
  uint32_t draws[2][4];
  zptest::stochasticStepDraws(std::fmin(std::fabs(q), qmax), draws[0]);
  zptest::stochasticStepDraws(std::fmin(std::fabs(d), qmax), draws[1]);
  for (const auto& some : draws) {
    for (uint32_t r : some) {
      if (zp::stochasticCodeOfQuotient(q, qmax, r) != zp::stochasticCodeOfQuotient(d, qmax, r)) return false;
    }
  }
  return true;
}

void countQuotientMismatches(float x, float absMax, float qmax, QuotientMismatches* bad) {
  const float scale = zp::divRn(absMax, qmax);
  if (!(scale >= zp::kQuotientMinScale)) return;  // the kernel divides
  const float rcp = zp::divRn(1.0f, scale);
  const float q = zp::quotientRn(x, scale, rcp), d = zp::divRn(x, scale);
  if (std::fabs(d) >= 0.25f && zp::floatBits(q) != zp::floatBits(d)) ++bad->quotients;
  bad->codes += zp::floatBits(zp::addRn(q, zp::kRoundMagic)) != zp::quantizeCode(x, scale, qmax);
  if (scale >= zp::kStochasticQuotientMinScale) {
    ++bad->stochasticPairs;
    bad->stochastic += !sameStochasticCodes(q, d, qmax);
    bad->zeros += x == 0.0f;
  }
}

// Stochastic rounding's smallest quotients that a draw can round up, at the smallest scales that take quotientRn:
// there the residual is closest to underflow. The quotients sit within a few ulps of the points where the code's
// step moves ((2k + 1) 2^-17, tests/stochastic_threshold.h), where a quotient an ulp off would change a code.
void countSmallStochasticMismatches(float qmax, std::mt19937_64& rng, QuotientMismatches* bad) {
  for (int i = 0; i < 100000; ++i) {
    const float scale =
        std::ldexp(1.0f + static_cast<float>(rng() % 4096) / 4096.0f, -79 + static_cast<int>(rng() % 4));
    const float rcp = zp::divRn(1.0f, scale);
    const double point = std::ldexp(static_cast<double>(2 * (rng() % 4) + 1), -17);
    float x = static_cast<float>(point * scale) * (rng() & 1 ? -1.0f : 1.0f);
    for (int ulp = 0; ulp < 2; ++ulp) x = std::nextafter(x, 0.0f);
    for (int ulp = 0; ulp < 5; ++ulp, x = std::nextafter(x, x > 0.0f ? 1.0f : -1.0f)) {
      const float q = zp::quotientRn(x, scale, rcp), d = zp::divRn(x, scale);
      ++bad->stochasticPairs;
      bad->roundable += std::fabs(d) > 0x1p-17f;
      bad->stochastic += !sameStochasticCodes(q, d, qmax);
    }
  }
}

// stochasticCodeOfQuotient's integer form is the threshold form (tests/stochastic_threshold.h) over every float in
// [2^-17, 127] (both codes' ranges, at qmax 127 and 7), each at the draws where either form could change its rounding;
// negative quotients, those under 2^-17 (neither form rounds up) and those past qmax (clamped) on samples.
TEST(QuantMath, StochasticIntegerFormIsTheThresholdForm) {
  uint64_t checked = 0, bad = 0;
  auto check = [&](float q, float qmax, uint32_t r) {
    ++checked;
    const uint32_t got = zp::stochasticCodeOfQuotient(q, qmax, r), want = zptest::stochasticCodeByThreshold(q, qmax, r);
    if (got != want && ++bad <= 10)
      ADD_FAILURE() << "quotient " << q << " qmax " << qmax << " draw " << r << ": " << got;
  };
  for (float qmax : {127.0f, 7.0f}) {
    const uint32_t last = zp::floatBits(qmax == 7.0f ? 8.0f : 127.0f);
    for (uint32_t u = zp::floatBits(0x1p-17f); u <= last; ++u) {
      const float a = zp::bitsFloat(u);
      uint32_t draws[4];
      zptest::stochasticStepDraws(std::fmin(a, qmax), draws);
      for (uint32_t r : draws) check(a, qmax, r);
      if (u % 61 == 0) {
        for (uint32_t r : draws) check(-a, qmax, r);
      }
    }
    std::mt19937_64 rng(5);
    for (int i = 0; i < 200000; ++i) {
      const uint32_t r = static_cast<uint32_t>(rng() & 0xffffu);
      const float tiny = zp::bitsFloat(static_cast<uint32_t>(rng() % zp::floatBits(0x1p-17f)));
      const float past = qmax + std::ldexp(static_cast<float>(rng() % 1000000), -10);
      check(tiny, qmax, r);
      check(-tiny, qmax, r);
      check(past, qmax, r);
      check(-past, qmax, r);
    }
  }
  EXPECT_EQ(bad, 0u) << "of " << checked;
  EXPECT_GT(checked, uint64_t{1} << 29);
}

TEST(QuantMath, ReciprocalQuotientsGiveTheDivisionsCodes) {
  for (float qmax : {7.0f, 127.0f}) {
    SCOPED_TRACE("qmax " + std::to_string(qmax));
    uint64_t pairs = 0, tiny = 0, tinyStochastic = 0;
    QuotientMismatches bad;
    for (int type = 0; type < 2; ++type) {  // bf16, fp16
      std::vector<float> values;
      for (uint32_t h = 0; h < 65536; ++h) {
        const float v =
            type == 0 ? zp::bf16BitsToFloat(static_cast<uint16_t>(h)) : zp::halfBitsToFloat(static_cast<uint16_t>(h));
        if (std::isfinite(v)) values.push_back(v);
      }
      for (uint32_t h = 1; h < 0x7f80; ++h) {
        const bool powerOfTwo = type == 0 && (h & 0x7f) == 0;
        if (!powerOfTwo && h % (type == 0 ? 61 : 37) != 0) continue;
        const float absMax =
            type == 0 ? zp::bf16BitsToFloat(static_cast<uint16_t>(h)) : zp::halfBitsToFloat(static_cast<uint16_t>(h));
        if (!std::isfinite(absMax)) break;
        tiny += zp::divRn(absMax, qmax) < 0x1p-90f;
        tinyStochastic +=
            zp::divRn(absMax, qmax) < 0x1p-74f && zp::divRn(absMax, qmax) >= zp::kStochasticQuotientMinScale;
        for (float x : values) {
          if (std::fabs(x) > absMax) continue;
          countQuotientMismatches(x, absMax, qmax, &bad);
          ++pairs;
        }
      }
    }
    std::mt19937_64 rng(11);
    for (int i = 0; i < 2000000; ++i) {
      const float absMax = zp::bitsFloat(static_cast<uint32_t>(rng() % 0x7f000000u) | 0x00800000u);
      const float x =
          absMax * std::ldexp(static_cast<float>(static_cast<int64_t>(rng() % (1u << 25)) - (1 << 24)), -24);
      countQuotientMismatches(x, absMax, qmax, &bad);
      ++pairs;
    }
    countSmallStochasticMismatches(qmax, rng, &bad);
    EXPECT_GT(pairs, 40000000u);
    EXPECT_GT(tiny, 0u) << "no absmax reached the smallest fast-path scales";
    EXPECT_GT(tinyStochastic, 0u) << "no absmax reached the smallest stochastic fast-path scales";
    EXPECT_GT(bad.stochasticPairs, pairs / 2);
    EXPECT_EQ(bad.codes, 0u) << "of " << pairs << " pairs";
    EXPECT_EQ(bad.quotients, 0u) << "of " << pairs << " pairs";
    EXPECT_EQ(bad.stochastic, 0u) << "of " << bad.stochasticPairs << " pairs";
    EXPECT_GT(bad.zeros, 0u) << "no zero x";
    EXPECT_GT(bad.roundable, 100000u) << "too few small quotients that a draw can round up";
  }
}

}  // namespace
