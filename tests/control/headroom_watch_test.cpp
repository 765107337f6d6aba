// HeadroomWatch: OOMFLIGHT_HEADROOM_DUMP's check (issue 42, item 1). A crossing is kept once per arming, against the
// cap where one is set, re-armed only 5 points below the threshold, and its request names the figures. Over both
// transports, with real mpirun and torchrun jobs: python/tests/test_transport_parity.py (the headroom scenario).
#include "headroom_watch.hpp"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace oomflight {
namespace {

constexpr std::uint64_t MiB = 1ull << 20, GiB = 1ull << 30;

MemoryStats figures(std::uint64_t reserved, std::uint64_t capacity, std::uint64_t cap = 0) {
  MemoryStats m;
  m.allocated_bytes = reserved;
  m.reserved_bytes = reserved;
  m.device_capacity_bytes = capacity;
  m.memory_cap_bytes = cap;
  return m;
}

TEST(HeadroomWatch, TheFirstCrossingIsKeptWithItsFiguresAndTheNextOnlyAfterAFall) {
  HeadroomWatch w(900000);
  w.observe(0, figures(7 * GiB, 8 * GiB), 3);  // 87.5%: below
  EXPECT_FALSE(w.pending());
  w.observe(0, figures(7 * GiB + 256 * MiB, 8 * GiB), 4);  // 90.6%
  ASSERT_TRUE(w.pending());
  const auto r = w.take();
  ASSERT_TRUE(r.has_value());
  EXPECT_FALSE(w.pending());
  EXPECT_EQ(r->kind, DumpKind::headroom);
  EXPECT_EQ(r->device, 0);
  EXPECT_EQ(r->batch, 4);
  EXPECT_EQ(r->device_capacity_bytes, 8 * GiB);
  EXPECT_EQ(r->reason,
            "device 0: reserved 7.25 GiB of its 8.00 GiB capacity, over OOMFLIGHT_HEADROOM_DUMP=90% (7.20 GiB)");
  // Still over, higher, then just below (89%: within 5 points): no second crossing.
  w.observe(0, figures(7 * GiB + 512 * MiB, 8 * GiB), 5);
  w.observe(0, figures(7 * GiB + 128 * MiB, 8 * GiB), 6);
  w.observe(0, figures(7 * GiB + 512 * MiB, 8 * GiB), 7);
  EXPECT_FALSE(w.pending());
  // 84%: more than 5 points below 90%, armed again; the next crossing is kept.
  w.observe(0, figures(6 * GiB + 700 * MiB, 8 * GiB), 8);
  w.observe(0, figures(7 * GiB + 300 * MiB, 8 * GiB), 9);
  ASSERT_TRUE(w.pending());
  EXPECT_EQ(w.take()->batch, 9);
}

TEST(HeadroomWatch, TheCapIsTheLimitWhereOneIsSetBelowTheCapacity) {
  HeadroomWatch w(500000);
  w.observe(2, figures(3 * GiB, 80 * GiB, 4 * GiB), 1);  // 75% of the 4 GiB cap, 3.75% of the device
  const auto r = w.take();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->device, 2);
  EXPECT_EQ(r->memory_cap_bytes, 4 * GiB);
  EXPECT_EQ(r->reason,
            "device 2: reserved 3.00 GiB of its 4.00 GiB per-process cap, over OOMFLIGHT_HEADROOM_DUMP=50% (2.00 GiB)");
  EXPECT_TRUE(memory_limit(figures(0, 80 * GiB, 4 * GiB)).cap);
  EXPECT_FALSE(memory_limit(figures(0, 80 * GiB, 80 * GiB)).cap);  // a cap of the whole device is no cap
  EXPECT_EQ(memory_limit(figures(0, 0, 4 * GiB)).bytes, 4 * GiB);
}

TEST(HeadroomWatch, OutsideTheAllocatorCountsAndAnUnknownLimitIsNeverCrossed) {
  HeadroomWatch w(900000);
  w.observe(0, figures(70 * GiB, 0), 0);  // no capacity published: nothing to measure against
  w.observe(-1, figures(70 * GiB, 8 * GiB), 0);
  w.observe(kMaxDevices, figures(70 * GiB, 8 * GiB), 0);
  EXPECT_FALSE(w.pending());
  w.observe(1, figures(6 * GiB, 8 * GiB), 0, 2 * GiB);  // 6 GiB reserved + 2 GiB outside: 100%
  const auto r = w.take();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->reason, "device 1: reserved 6.00 GiB and 2.00 GiB outside the caching allocator of its 8.00 GiB "
                       "capacity, over OOMFLIGHT_HEADROOM_DUMP=90% (7.20 GiB)");
  // Against a cap, only the allocator's reserved counts: the cap bounds it alone.
  w.observe(2, figures(3 * GiB, 80 * GiB, 4 * GiB), 0, 2 * GiB);  // 75% of the cap, whatever lies outside
  EXPECT_FALSE(w.pending());
}

TEST(HeadroomWatch, ACrossingWhileAnotherWaitsIsKeptOnceThatOneIsTaken) {
  HeadroomWatch w(900000);
  w.observe(0, figures(8 * GiB, 8 * GiB), 1);
  w.observe(1, figures(8 * GiB, 8 * GiB), 1);  // device 0's waits: device 1 stays armed
  EXPECT_EQ(w.take()->device, 0);
  EXPECT_FALSE(w.pending());
  w.observe(1, figures(8 * GiB, 8 * GiB), 2);  // the same figures again: tried again, kept now
  EXPECT_EQ(w.take()->device, 1);
  w.observe(0, figures(8 * GiB, 8 * GiB), 3);  // device 0 is disarmed
  EXPECT_FALSE(w.pending());
}

TEST(HeadroomWatch, ThreadsPublishingAtOnceKeepOneCrossingADevice) {
  HeadroomWatch w(900000);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&w, t] {
      for (int i = 0; i < 10000; ++i) {
        w.observe(0, figures(7 * GiB + static_cast<std::uint64_t>(i % 64 + t) * 16 * MiB, 8 * GiB), i);
      }
    });
  }
  for (auto& t : threads) t.join();
  int crossings = 0;
  while (w.take()) ++crossings;
  EXPECT_EQ(crossings, 1);  // the figures never fell 5 points below the threshold: one crossing in all
}

TEST(HeadroomWatch, SharesAreExactAndSaidAsUsersWriteThem) {
  EXPECT_EQ(share_of(8 * GiB, 900000), 7730941132u);  // floor(0.9 * 2^33)
  EXPECT_EQ(share_of(UINT64_MAX, 1000000), UINT64_MAX);
  EXPECT_EQ(share_of(UINT64_MAX, 500000), UINT64_MAX / 2);
  EXPECT_EQ(percent_text(900000), "90%");
  EXPECT_EQ(percent_text(925000), "92.5%");
  EXPECT_EQ(percent_text(1000000), "100%");
  EXPECT_EQ(percent_text(1), "0.0001%");
}

}  // namespace
}  // namespace oomflight
