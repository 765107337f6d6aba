// Byte sizes and durations.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>

#include "oomflight/base/units.hpp"

namespace oomflight {
namespace {

TEST(Units, ParsesByteSizes) {
  EXPECT_EQ(parse_bytes("4096"), 4096u);
  EXPECT_EQ(parse_bytes("40GiB"), 40ull << 30);
  EXPECT_EQ(parse_bytes("40 gib"), 40ull << 30);
  EXPECT_EQ(parse_bytes("1.5GB"), 1500000000u);
  EXPECT_EQ(parse_bytes("512M"), 512ull << 20);
  EXPECT_EQ(parse_bytes("2TiB"), 2ull << 40);
}

TEST(Units, RejectsBadByteSizesNamingThem) {
  for (const char* bad : {"", "GiB", "-1GiB", "12 parsecs", "1e3", "99999999999TiB"}) {
    try {
      parse_bytes(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(Units, FormatsBytes) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(40ull << 30), "40.00 GiB");
}

TEST(Units, ParsesDurations) {
  EXPECT_EQ(parse_duration("30").count(), 30000);
  EXPECT_EQ(parse_duration("30s").count(), 30000);
  EXPECT_EQ(parse_duration("500ms").count(), 500);
  EXPECT_EQ(parse_duration("2m").count(), 120000);
  EXPECT_THROW(parse_duration("soon"), std::invalid_argument);
  EXPECT_THROW(parse_duration("3 fortnights"), std::invalid_argument);
}

// Times from a damaged archive: the difference wraps instead of being undefined (the fuzz target's finding).
TEST(Units, SecondsBetweenWrapsOnHostileTimes) {
  EXPECT_DOUBLE_EQ(seconds_between(1'000'000'000, 3'500'000'000), 2.5);
  EXPECT_DOUBLE_EQ(seconds_between(3'500'000'000, 1'000'000'000), -2.5);
  const double wrapped = seconds_between(INT64_MIN, 411056191004);  // the fuzz input's pair
  EXPECT_TRUE(std::isfinite(wrapped));
}

}  // namespace
}  // namespace oomflight
