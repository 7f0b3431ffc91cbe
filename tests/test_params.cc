// The environment tunables' parsing (src/params.h): a bad value is refused and the default used, never taken.
#include <gtest/gtest.h>

#include <cstdint>

#include "src/params.h"

namespace zp {
namespace {

TEST(Params, UnsetOrEmptyGivesTheDefault) {
  EXPECT_EQ(parseParam("ZP_T", nullptr, 7, 0, 10), 7);
  EXPECT_EQ(parseParam("ZP_T", "", 7, 0, 10), 7);
}

TEST(Params, IntegersInRangeAreTaken) {
  EXPECT_EQ(parseParam("ZP_T", "0", 7, 0, 10), 0);
  EXPECT_EQ(parseParam("ZP_T", "10", 7, 0, 10), 10);
  EXPECT_EQ(parseParam("ZP_T", "-1", 7, -1, 10), -1);
  EXPECT_EQ(parseParam("ZP_T", "0x10", 7, 0, 100), 16);
  EXPECT_EQ(parseParam("ZP_T", "268435456", 7, 0, INT64_MAX), 268435456);
}

TEST(Params, OutOfRangeOrNotAnIntegerGivesTheDefault) {
  EXPECT_EQ(parseParam("ZP_PAIR_ALLGATHER", "3", 2, 0, 2), 2);
  EXPECT_EQ(parseParam("ZP_PAIR_ALLGATHER", "-1", 2, 0, 2), 2);
  EXPECT_EQ(parseParam("ZP_T", "16M", 7, 0, INT64_MAX), 7);
  EXPECT_EQ(parseParam("ZP_T", "yes", 7, 0, 10), 7);
  EXPECT_EQ(parseParam("ZP_T", "1.5", 7, 0, 10), 7);
  EXPECT_EQ(parseParam("ZP_T", "99999999999999999999999", 7, 0, INT64_MAX), 7);  // overflows
}

}  // namespace
}  // namespace zp
