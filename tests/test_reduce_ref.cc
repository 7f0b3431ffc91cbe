// qgZ's host reduction (host/reduce_ref.h): the order of the sums, element ranges, the finish into each type.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "host/quant_format.h"
#include "host/quant_math.h"
#include "host/quant_ref.h"
#include "host/reduce_ref.h"

// Element 0 of the three sources is exact in int8 (each block's absmax is 127 times a power of two): 127 * 2^20, 4
// and 4. fp32 spaces 127 * 2^20 by 8, so adding a 4 to it ties to the even neighbour, itself: summed in the order
// given the element stays 127 * 2^20, summed the other way it is 127 * 2^20 + 8. Element 1 is 0, 127 and 127.
TEST(ReduceRef, SumsInTheOrderGivenOverAnyRange) {
  constexpr size_t kCount = 100;
  constexpr int kBlock = 32;
  const float big = 127.0f * 1048576.0f;
  std::vector<std::vector<unsigned char>> payloads;
  for (float first : {big, 4.0f, 4.0f}) {
    std::vector<float> x(kCount, 0.0f);
    x[0] = first;
    x[1] = first == big ? 0.0f : 127.0f;  // 127 gives the small sources' block the scale 1
    for (size_t i = kBlock; i < kCount; ++i) x[i] = static_cast<float>(static_cast<int>(i % 255) - 127);
    payloads.emplace_back(zp::quantPayloadBytes(kCount, 8, kBlock));
    zp::quantizeRef(x.data(), zpFloat32, kCount, 8, kBlock, payloads.back().data());
  }
  const std::vector<const unsigned char*> inOrder{payloads[0].data(), payloads[1].data(), payloads[2].data()};
  const std::vector<const unsigned char*> reversed{payloads[2].data(), payloads[1].data(), payloads[0].data()};

  std::vector<float> whole(kCount, -1.0f), pieces(kCount + 1, -1.0f), back(kCount, -1.0f);
  zp::sumPayloadsRef(inOrder, kCount, 8, kBlock, 0, kCount, whole.data());
  zp::sumPayloadsRef(reversed, kCount, 8, kBlock, 0, kCount, back.data());
  EXPECT_EQ(whole[0], big);
  EXPECT_EQ(back[0], big + 8.0f);
  EXPECT_EQ(whole[1], 254.0f);
  EXPECT_EQ(back[1], whole[1]);

  // Split ranges give the same sums and write nothing outside [begin, end).
  for (size_t split : {size_t(0), size_t(1), size_t(31), size_t(32), size_t(99)}) {
    std::fill(pieces.begin(), pieces.end(), -1.0f);
    zp::sumPayloadsRef(inOrder, kCount, 8, kBlock, split, kCount, pieces.data());
    for (size_t i = 0; i < split; ++i) ASSERT_EQ(pieces[i], -1.0f) << "split " << split << " element " << i;
    zp::sumPayloadsRef(inOrder, kCount, 8, kBlock, 0, split, pieces.data());
    for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(zp::floatBits(pieces[i]), zp::floatBits(whole[i])) << i;
    ASSERT_EQ(pieces[kCount], -1.0f);
  }

  // The finish: divisor, rounding to the type, NaN made quiet, only [begin, end) written.
  const float sums[] = {3.0f, -5.0f, std::numeric_limits<float>::quiet_NaN(), 1.0f};
  uint16_t bf16[4] = {0xdead, 0xdead, 0xdead, 0xdead};
  zp::finishRef(sums, zpBfloat16, 2.0f, 0, 3, bf16);
  EXPECT_EQ(bf16[0], 0x3fc0);  // 1.5
  EXPECT_EQ(bf16[1], 0xc020);  // -2.5
  EXPECT_EQ(bf16[2], 0x7fc0);  // bf16's quiet NaN
  EXPECT_EQ(bf16[3], 0xdead);
  uint16_t fp16[4] = {0xdead, 0xdead, 0xdead, 0xdead};
  zp::finishRef(sums, zpFloat16, 1.0f, 1, 4, fp16);
  EXPECT_EQ(fp16[0], 0xdead);
  EXPECT_EQ(fp16[1], 0xc500);  // -5
  EXPECT_EQ(fp16[2], 0x7e00);  // fp16's quiet NaN
  EXPECT_EQ(fp16[3], 0x3c00);  // 1
  float fp32[2] = {0.0f, 0.0f};
  zp::finishRef(sums, zpFloat32, 4.0f, 0, 2, fp32);
  EXPECT_EQ(fp32[0], 0.75f);
  EXPECT_EQ(fp32[1], -1.25f);
}

// The block rule (host/reduce_math.h): element 40 of two sources sums beyond FLT_MAX, so its block [32, 64) is NaN
// in every element, whatever range the sum is asked for; the blocks around it keep their finite sums.
TEST(ReduceRef, ABlockWithAnOverflowingSumIsNaNOverAnyRange) {
  constexpr size_t kCount = 100;
  constexpr int kBlock = 32;
  // Small integers, and 127 first in every other block: those blocks have the scale 1 and dequantize exactly.
  auto value = [](size_t i) { return i % kBlock == 0 ? 127.0f : static_cast<float>(static_cast<int>(i % 9) - 4); };
  std::vector<std::vector<unsigned char>> payloads;
  for (int s = 0; s < 2; ++s) {
    std::vector<float> x(kCount);
    for (size_t i = 0; i < kCount; ++i) x[i] = value(i);
    x[40] = 3e38f;
    payloads.emplace_back(zp::quantPayloadBytes(kCount, 8, kBlock));
    zp::quantizeRef(x.data(), zpFloat32, kCount, 8, kBlock, payloads.back().data());
  }
  const std::vector<const unsigned char*> sources{payloads[0].data(), payloads[1].data()};
  for (size_t split : {size_t(0), size_t(33), size_t(40), size_t(41), size_t(64), size_t(100)}) {
    std::vector<float> sum(kCount, -1.0f);
    zp::sumPayloadsRef(sources, kCount, 8, kBlock, 0, split, sum.data());
    zp::sumPayloadsRef(sources, kCount, 8, kBlock, split, kCount, sum.data());
    for (size_t i = 0; i < kCount; ++i) {
      if (i >= 32 && i < 64) {
        ASSERT_EQ(zp::floatBits(sum[i]), zp::kF32QuietNaN) << "split " << split << " element " << i;
      } else {
        ASSERT_EQ(sum[i], 2.0f * value(i)) << "split " << split << " element " << i;
      }
    }
  }
}
