// Helpers of the quantization suites: typed element access, deterministic test data (never zeros only, with
// NaN/Inf/zero/denormal/tie blocks) and a float64 oracle of the format that shares no code with
// host/quant_math.h beyond the exact widening conversions (those are tested exhaustively on their own).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "host/quant_math.h"
#include "include/zpccl.h"

namespace zptest {

inline const zpDataType_t kQuantTypes[] = {zpFloat16, zpBfloat16, zpFloat32};

inline size_t elemSize(zpDataType_t type) { return type == zpFloat32 ? 4 : 2; }

// Element i of a buffer of `type`, its bits in the low bits.
inline uint32_t loadElemBits(zpDataType_t type, const unsigned char* p, size_t i) {
  if (type == zpFloat32) {
    uint32_t u;
    std::memcpy(&u, p + 4 * i, 4);
    return u;
  }
  uint16_t b;
  std::memcpy(&b, p + 2 * i, 2);
  return b;
}

// Element i of a buffer of `type`, exactly, as a double.
inline double loadElem(zpDataType_t type, const unsigned char* p, size_t i) {
  const uint32_t bits = loadElemBits(type, p, i);
  if (type == zpFloat32) {
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  const uint16_t b = static_cast<uint16_t>(bits);
  return type == zpFloat16 ? zp::halfBitsToFloat(b) : zp::bf16BitsToFloat(b);
}

// Stores element i of a buffer of `type` from its bits (the low bits of `bits`).
inline void storeElemBits(zpDataType_t type, unsigned char* p, size_t i, uint32_t bits) {
  if (type == zpFloat32) {
    std::memcpy(p + 4 * i, &bits, 4);
  } else {
    const uint16_t b = static_cast<uint16_t>(bits);
    std::memcpy(p + 2 * i, &b, 2);
  }
}

// Stores v rounded to `type` (nearest even).
inline void storeElem(zpDataType_t type, unsigned char* p, size_t i, float v) {
  uint32_t bits;
  if (type == zpFloat32) {
    std::memcpy(&bits, &v, 4);
  } else {
    bits = type == zpFloat16 ? zp::floatToHalfBitsRn(v) : zp::floatToBf16BitsRn(v);
  }
  storeElemBits(type, p, i, bits);
}

struct TypeLimits {
  int precision;  // significand bits, the implicit one included
  int minExp;     // exponent of the smallest normal
  double maxFinite;
};

inline TypeLimits typeLimits(zpDataType_t type) {
  switch (type) {
    case zpFloat16:
      return {11, -14, 65504.0};
    case zpBfloat16:
      return {8, -126, std::ldexp(255.0 / 128.0, 127)};
    default:
      return {24, -126, static_cast<double>(std::numeric_limits<float>::max())};
  }
}

// v rounded to nearest even in `type`, computed in float64 (an implementation independent of quant_math.h):
// the quantum is 2^(max(exponent, minExp) - precision + 1); beyond the largest finite value, +-Inf.
inline double roundToType(double v, zpDataType_t type) {
  if (v == 0.0 || !std::isfinite(v)) return v;
  const TypeLimits t = typeLimits(type);
  int e;
  std::frexp(v, &e);  // |v| in [2^(e-1), 2^e)
  const int exp = (e - 1) < t.minExp ? t.minExp : (e - 1);
  const double quantum = std::ldexp(1.0, exp - t.precision + 1);
  const double r = std::nearbyint(v / quantum) * quantum;
  if (std::fabs(r) > t.maxFinite) return std::copysign(std::numeric_limits<double>::infinity(), v);
  return r;
}

// Half an ulp of `type` at |v| (at least half the smallest subnormal).
inline double halfUlp(double v, zpDataType_t type) {
  const TypeLimits t = typeLimits(type);
  int e = t.minExp + 1;
  if (v != 0.0 && std::isfinite(v)) std::frexp(v, &e);
  const int exp = (e - 1) < t.minExp ? t.minExp : (e - 1);
  return std::ldexp(1.0, exp - t.precision);
}

// The signed code of element i of a payload's code region.
inline int loadCode(const unsigned char* codes, size_t i, int bits) {
  if (bits == 8) return static_cast<int8_t>(codes[i]);
  const int nibble = (codes[i / 2] >> (4 * (i & 1))) & 0xf;
  return nibble >= 8 ? nibble - 16 : nibble;
}

// Kinds of test block.
enum class BlockKind { kRandom, kTies, kZero, kEqual, kSingle, kDenormal, kNearMax, kNaN, kPosInf, kNegInf };

// Fills block [begin, end) of `type` elements with data of the given kind (never all zeros unless kZero).
inline void fillBlock(zpDataType_t type, unsigned char* p, size_t begin, size_t end, BlockKind kind, int bits,
                      std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t n = end - begin;
  const size_t pick = begin + rng() % n;
  const TypeLimits lim = typeLimits(type);
  switch (kind) {
    case BlockKind::kRandom: {
      // A per-block magnitude: the scales spread over many binades of the type's range.
      const int span = type == zpFloat16 ? 10 : 30;
      const float mag = std::ldexp(1.0f, static_cast<int>(rng() % (2 * span + 1)) - span);
      for (size_t i = begin; i < end; ++i) storeElem(type, p, i, normal(rng) * mag);
      break;
    }
    case BlockKind::kTies: {
      // absmax == qmax makes the scale exactly 1: half-integers are rounding ties (nearest even).
      const int qmax = zp::quantMax(bits);
      for (size_t i = begin; i < end; ++i) {
        storeElem(type, p, i, static_cast<float>(static_cast<int>(rng() % (4 * qmax + 1)) - 2 * qmax) * 0.5f);
      }
      storeElem(type, p, pick, (rng() & 1) ? static_cast<float>(qmax) : -static_cast<float>(qmax));
      break;
    }
    case BlockKind::kZero:
      for (size_t i = begin; i < end; ++i) storeElem(type, p, i, (i & 1) ? -0.0f : 0.0f);
      break;
    case BlockKind::kEqual: {
      const float v = normal(rng) * 3.0f + 0.25f;
      for (size_t i = begin; i < end; ++i) storeElem(type, p, i, v);
      break;
    }
    case BlockKind::kSingle:
      for (size_t i = begin; i < end; ++i) storeElem(type, p, i, 0.0f);
      storeElem(type, p, pick, normal(rng) + 2.0f);
      break;
    case BlockKind::kDenormal: {
      // Subnormals of the type only: fp32 ones for fp32 and bf16, fp16 ones for fp16.
      const int minSub = lim.minExp - lim.precision + 1;
      for (size_t i = begin; i < end; ++i) {
        const double units = static_cast<double>(rng() % (1u << (lim.precision - 1)));
        const double v = std::ldexp(units, minSub) * ((rng() & 1) ? 1.0 : -1.0);
        storeElem(type, p, i, static_cast<float>(v));
      }
      break;
    }
    case BlockKind::kNearMax:
      for (size_t i = begin; i < end; ++i) {
        const float f = static_cast<float>(lim.maxFinite * (0.5 + 0.5 * std::ldexp(rng() >> 8, -24)));
        storeElem(type, p, i, (rng() & 1) ? f : -f);
      }
      storeElem(type, p, pick, static_cast<float>(lim.maxFinite));
      break;
    case BlockKind::kNaN:
    case BlockKind::kPosInf:
    case BlockKind::kNegInf:
      for (size_t i = begin; i < end; ++i) storeElem(type, p, i, normal(rng));
      storeElem(type, p, pick,
                kind == BlockKind::kNaN
                    ? std::numeric_limits<float>::quiet_NaN()
                    : (kind == BlockKind::kPosInf ? 1.0f : -1.0f) * std::numeric_limits<float>::infinity());
      break;
  }
}

// Random blocks, with a sprinkling of every special kind when `specials`.
inline void fillData(zpDataType_t type, unsigned char* p, size_t count, int blockSize, int bits, uint32_t seed,
                     bool specials) {
  std::mt19937 rng(seed);
  static const BlockKind kSpecial[] = {BlockKind::kTies,   BlockKind::kZero,     BlockKind::kEqual,
                                       BlockKind::kSingle, BlockKind::kDenormal, BlockKind::kNearMax,
                                       BlockKind::kNaN,    BlockKind::kPosInf,   BlockKind::kNegInf};
  for (size_t begin = 0; begin < count; begin += blockSize) {
    const size_t end = begin + blockSize < count ? begin + blockSize : count;
    BlockKind kind = BlockKind::kRandom;
    if (specials && rng() % 4 == 0) kind = kSpecial[rng() % (sizeof(kSpecial) / sizeof(kSpecial[0]))];
    fillBlock(type, p, begin, end, kind, bits, rng);
  }
}

// A byte buffer whose data() is 16-byte aligned, with room for an offset and guard bytes.
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t bytes, unsigned char fill = 0xff) : storage_(bytes + 16, fill) {}
  unsigned char* data() {
    const uintptr_t a = reinterpret_cast<uintptr_t>(storage_.data());
    return storage_.data() + ((16 - a % 16) % 16);
  }
  void fill(unsigned char v) { std::memset(storage_.data(), v, storage_.size()); }

 private:
  std::vector<unsigned char> storage_;
};

}  // namespace zptest
