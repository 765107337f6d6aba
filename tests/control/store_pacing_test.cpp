// The store path's poll intervals: the floor for small jobs, bounded requests for the whole job at scale.
#include <gtest/gtest.h>

#include "store_pacing.hpp"

namespace oomflight {
namespace {

using std::chrono::milliseconds;

TEST(StorePacing, SmallJobsPollAtTheFloor) {
  for (int world : {1, 2, 8, 16, 20}) {  // 25 ranks would still wait at the floor, 21 would not idle at it
    const StorePacing p = store_pacing(milliseconds(10), world);
    EXPECT_EQ(p.idle, milliseconds(10)) << world;
    EXPECT_EQ(p.wait, milliseconds(5)) << world;
  }
  EXPECT_EQ(store_pacing(milliseconds(1), 2).idle, milliseconds(1));  // a floor set lower is kept
}

TEST(StorePacing, TheWholeJobStaysWithinItsRequestBudget) {
  const StorePacing p512 = store_pacing(milliseconds(10), 512);
  EXPECT_EQ(p512.idle, milliseconds(256));  // 512 ranks x 1000 / 256 = 2,000 requests a second
  EXPECT_EQ(p512.wait, milliseconds(103));  // 512 / 5,000 s, rounded up: two requests a look
  for (int world : {21, 100, 512, 4096, 100000}) {
    const StorePacing p = store_pacing(milliseconds(10), world);
    EXPECT_LE(world * 1000.0 / static_cast<double>(p.idle.count()), kIdleRequestsPerSecond) << world;
    EXPECT_LE(2 * world * 1000.0 / static_cast<double>(p.wait.count()), kWaitRequestsPerSecond) << world;
  }
  EXPECT_EQ(store_pacing(milliseconds(1000), 512).idle, milliseconds(1000));  // a slower floor wins
}

}  // namespace
}  // namespace oomflight
