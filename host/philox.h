// Philox4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2, 3", SC'11), the
// counter-based generator of Random123 and of cuRAND's curand_Philox4x32_10: four 32-bit words of output from a
// 128-bit counter and a 64-bit key, with no state. Compiled for host and device, integer arithmetic only, so the
// host reference and the kernels draw the same bits (checked against Random123's known-answer vectors and, on a
// GPU, against cuRAND's device function: tests/test_grad_numerics.cc, tests/test_grad_gpu.cc).
//
// qgZ's stochastic rounding (include/zpccl.h, "Gradient rounding") keys it and lays out its counter as
// gradRandom16 says below.
#pragma once

#include <cstddef>
#include <cstdint>

#include "host/quant_format.h"  // ZP_HD

namespace zp {

struct Philox4x32 {
  uint32_t v[4];
};

constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;  // round multipliers
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;  // key schedule (golden ratio, sqrt(3) - 1)

// The high and the low word of a * b.
ZP_HD uint32_t mulHiLo32(uint32_t a, uint32_t b, uint32_t* hi) {
#if defined(__CUDA_ARCH__)
  *hi = __umulhi(a, b);
  return a * b;
#else
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  return static_cast<uint32_t>(p);
#endif
}

// Philox4x32 with 10 rounds of counter c under key (k0, k1): Random123's philox4x32(c, k), cuRAND's
// curand_Philox4x32_10(c, k).
ZP_HD Philox4x32 philox4x32_10(Philox4x32 c, uint32_t k0, uint32_t k1) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, hi1;
    const uint32_t lo0 = mulHiLo32(kPhiloxM0, c.v[0], &hi0);
    const uint32_t lo1 = mulHiLo32(kPhiloxM1, c.v[2], &hi1);
    c = Philox4x32{{hi1 ^ c.v[1] ^ k0, lo1, hi0 ^ c.v[3] ^ k1, lo0}};
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  return c;
}

// ---- qgZ's stochastic rounding: which random bits an element gets -------------------------------------------
//
// Every quantization of qgZ draws from one Philox stream per call, rank and hop:
//   key     = (seed, sequence)            seed: the communicator's gradSeed or the call's; sequence: the call's
//                                         number among the communicator's qgZ calls (mod 2^32), equal on every rank
//   counter = (j / 8 mod 2^32, (j / 8) >> 32 | hop << 31, slice, rank)
// where `rank` is the rank that quantizes, `hop` 0 for the sender's quantization and 1 for the intermediate
// requantize of two hops, `slice` the sender's destination rank (hop 0) or the destination node (hop 1), and j the
// element's index inside that slice (0 .. recvcount - 1). One Philox call serves 8 consecutive elements of a
// slice, 16 bits each: element j takes bits 16 (j mod 2) .. +15 of output word (j mod 8) / 2. The draw depends on
// what is rounded, never on how the work is cut (chunks, grids, threads), so every backend, chunk plan and
// launch geometry gets the same bits.
struct GradRandomKey {
  uint32_t seed = 0;
  uint32_t sequence = 0;
  uint32_t rank = 0;
  uint32_t hop = 0;  // 0: sender, 1: intermediate
};

// The Philox output for elements [8 g, 8 g + 8) of `slice`.
ZP_HD Philox4x32 gradRandomGroup(const GradRandomKey& k, uint32_t slice, size_t group) {
  const uint64_t g = group;
  const Philox4x32 c{{static_cast<uint32_t>(g), static_cast<uint32_t>(g >> 32) | (k.hop << 31), slice, k.rank}};
  return philox4x32_10(c, k.seed, k.sequence);
}

// The 16 random bits of element j (j mod 8 picks them from its group's output).
ZP_HD uint32_t gradRandom16(const Philox4x32& groupBits, size_t j) {
  return (groupBits.v[(j & 7) >> 1] >> (16 * (j & 1))) & 0xffffu;
}

}  // namespace zp
