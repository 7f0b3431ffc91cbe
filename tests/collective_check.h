// Helpers of the collective suites (qwZ, hpZ, qgZ on the host backend): aligned poisoned buffers, deterministic
// random inputs addressable element by element (so that any rank can regenerate any peer's data), exact reads
// of fp16/bf16/fp32 elements as float64, half-ulp bounds, and bit comparisons with a readable first mismatch.
// Conversions come from host/quant_math.h (exact widening, round-to-nearest-even narrowing).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "host/dtype.h"
#include "host/quant_math.h"
#include "include/zpccl.h"
#include "tests/quant_test_util.h"

namespace zpcheck {

using zptest::kQuantTypes;

inline size_t bytesOf(zpDataType_t type) { return zp::typeSize(type); }

// A 64-byte aligned byte buffer, poisoned with 0xFF (a NaN pattern for every float type) on creation.
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t bytes) { resize(bytes); }
  void resize(size_t bytes) {
    bytes_ = bytes;
    const size_t alloc = (bytes + 64) / 64 * 64;  // never 0
    data_.reset(static_cast<unsigned char*>(std::aligned_alloc(64, alloc)));
    poison();
  }
  void poison(unsigned char v = 0xff) {
    if (data_) std::memset(data_.get(), v, bytes_);
  }
  unsigned char* data() { return data_.get(); }
  const unsigned char* data() const { return data_.get(); }
  size_t size() const { return bytes_; }

 private:
  struct Free {
    void operator()(unsigned char* p) const { std::free(p); }
  };
  std::unique_ptr<unsigned char, Free> data_;
  size_t bytes_ = 0;
};

// ---- deterministic data -----------------------------------------------------------------------------------

inline uint64_t mix64(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
inline uint64_t hash3(uint64_t seed, uint64_t a, uint64_t b) { return mix64(seed ^ mix64(a ^ mix64(b + 0x51ed))); }

// Elements come in runs of kRun (not a power of two, so runs straddle blocks): each run is all zeros (1 in 16)
// or uniform in (-1, 1) times 2^e, e drawn per run from a range that suits the type (fp16 stays far from its
// overflow and its subnormals, so sums of 16 ranks stay finite and every block scale is a normal fp32).
constexpr size_t kRun = 48;

inline void exponentRange(zpDataType_t type, int* lo, int* hi) {
  if (type == zpFloat16) {
    *lo = -6;
    *hi = 5;
  } else {
    *lo = -30;
    *hi = 30;
  }
}

// The value (as fp32, before rounding to the type) of element `index` of the tensor of `rank` under `seed`.
inline float randomValue(zpDataType_t type, uint64_t seed, int rank, size_t index) {
  const uint64_t run = hash3(seed, static_cast<uint64_t>(rank), index / kRun);
  if ((run & 15) == 0) return 0.0f;
  int lo, hi;
  exponentRange(type, &lo, &hi);
  const int e = lo + static_cast<int>((run >> 8) % static_cast<uint64_t>(hi - lo + 1));
  const uint64_t h = hash3(seed + 1, static_cast<uint64_t>(rank), index);
  const double u = (static_cast<double>(h >> 11) + 0.5) * std::ldexp(1.0, -53) * 2.0 - 1.0;  // (-1, 1)
  return static_cast<float>(std::ldexp(u, e));
}

// Typed element access, over any pointer (tests/quant_test_util.h holds the conversions).
inline uint32_t loadBits(zpDataType_t type, const void* base, size_t i) {
  return zptest::loadElemBits(type, static_cast<const unsigned char*>(base), i);
}
// Element i of a fp16/bf16/fp32 buffer, exactly, as a double.
inline double loadValue(zpDataType_t type, const void* base, size_t i) {
  return zptest::loadElem(type, static_cast<const unsigned char*>(base), i);
}
// Stores v rounded to nearest even in the type.
inline void storeValue(zpDataType_t type, void* base, size_t i, float v) {
  zptest::storeElem(type, static_cast<unsigned char*>(base), i, v);
}

// Elements [offset, offset + count) of rank's tensor (a quantizable type) into dst[0, count).
inline void fillRandom(zpDataType_t type, void* dst, size_t count, uint64_t seed, int rank, size_t offset = 0) {
  for (size_t i = 0; i < count; ++i) storeValue(type, dst, i, randomValue(type, seed, rank, offset + i));
}

// Random bytes (any type, NaN patterns included: exact collectives must move them as they are).
inline void fillBytes(void* dst, size_t bytes, uint64_t seed, int rank, size_t offset = 0) {
  unsigned char* p = static_cast<unsigned char*>(dst);
  for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(hash3(seed, rank, offset + i) >> 24);
}

// ---- bounds -----------------------------------------------------------------------------------------------

using zptest::halfUlp;  // half an ulp of a type at |v|
using zptest::TypeLimits;
using zptest::typeLimits;

inline bool isNaNBits(zpDataType_t type, uint32_t b) {
  switch (type) {
    case zpFloat16:
      return (b & 0x7fffu) > 0x7c00u;
    case zpBfloat16:
      return (b & 0x7fffu) > 0x7f80u;
    default:
      return (b & 0x7fffffffu) > 0x7f800000u;
  }
}

// ---- comparisons ------------------------------------------------------------------------------------------

// qgZ's block rule (host/reduce_math.h), written again for the tests' own references: every sum of a block of
// blockSize elements of which one is not finite (an fp32 overflow, or NaN) becomes NaN.
inline void applyBlockRule(std::vector<float>* sum, int blockSize) {
  for (size_t first = 0; first < sum->size(); first += blockSize) {
    const size_t last = std::min(sum->size(), first + blockSize);
    bool finite = true;
    for (size_t i = first; i < last; ++i) finite = finite && std::isfinite((*sum)[i]);
    if (!finite) std::fill(sum->begin() + first, sum->begin() + last, std::numeric_limits<float>::quiet_NaN());
  }
}

inline std::string hexBytes(const unsigned char* p, size_t n) {
  std::string s = "0x";
  char buf[4];
  for (size_t k = n; k-- > 0;) {  // little endian: most significant byte first
    std::snprintf(buf, sizeof(buf), "%02x", p[k]);
    s += buf;
  }
  return s;
}

// Byte-exact equality of count elements of elemBytes each; on failure names the first differing element (with
// both values in hex) and how many differ.
inline ::testing::AssertionResult sameBits(const void* actual, const void* expected, size_t count, size_t elemBytes) {
  const unsigned char* a = static_cast<const unsigned char*>(actual);
  const unsigned char* e = static_cast<const unsigned char*>(expected);
  if (std::memcmp(a, e, count * elemBytes) == 0) return ::testing::AssertionSuccess();
  size_t first = count, differ = 0;
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(a + i * elemBytes, e + i * elemBytes, elemBytes) != 0) {
      if (first == count) first = i;
      ++differ;
    }
  }
  return ::testing::AssertionFailure() << differ << " of " << count << " elements differ; first at " << first
                                       << ": got " << hexBytes(a + first * elemBytes, elemBytes) << ", expected "
                                       << hexBytes(e + first * elemBytes, elemBytes);
}

inline ::testing::AssertionResult sameBits(const void* actual, const void* expected, size_t count, zpDataType_t type) {
  return sameBits(actual, expected, count, bytesOf(type));
}

// Every byte of [p, p + bytes) equals v.
inline ::testing::AssertionResult allBytesAre(const void* p, size_t bytes, unsigned char v) {
  const unsigned char* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < bytes; ++i) {
    if (b[i] != v) return ::testing::AssertionFailure() << "byte " << i << " is " << int(b[i]) << ", not " << int(v);
  }
  return ::testing::AssertionSuccess();
}

inline bool mentions(const char* message, const char* what) {
  return message != nullptr && std::strstr(message, what) != nullptr;
}

// The node layout as an independent reference sees it, from per-rank node labels alone (rank / ranksPerNode
// when ranksPerNode > 0, else nodeIds[rank]): nodes in order of their lowest rank, ranks ascending inside a
// node; qgZ takes two hops when there are several nodes, all of the same size L > 1. Not the library's
// host/topology.h: the suites check that one against this.
struct RefTopo {
  std::vector<std::vector<int>> nodeRanks;
  std::vector<int> nodeOf, localOf;  // per rank
  bool twoHop = false;
};

inline RefTopo refTopo(int nranks, int ranksPerNode, const std::vector<int>& nodeIds) {
  RefTopo t;
  std::vector<int> labels;
  for (int r = 0; r < nranks; ++r) {
    const int label = ranksPerNode > 0 ? r / ranksPerNode : nodeIds[r];
    const size_t node = std::find(labels.begin(), labels.end(), label) - labels.begin();
    if (node == labels.size()) {
      labels.push_back(label);
      t.nodeRanks.emplace_back();
    }
    t.nodeOf.push_back(static_cast<int>(node));
    t.localOf.push_back(static_cast<int>(t.nodeRanks[node].size()));
    t.nodeRanks[node].push_back(r);
  }
  bool even = true;
  for (const auto& n : t.nodeRanks) even = even && n.size() == t.nodeRanks[0].size();
  t.twoHop = even && t.nodeRanks.size() > 1 && t.nodeRanks[0].size() > 1;
  return t;
}

// A stream handle that is not NULL (never dereferenced: the host backend must refuse it first).
inline cudaStream_t bogusStream() { return reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(0x40)); }

}  // namespace zpcheck
