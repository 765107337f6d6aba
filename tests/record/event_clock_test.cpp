// EventClock and the recorder's stamps: whichever source stamps the events (the invariant TSC here when the CPU
// has one, CLOCK_MONOTONIC when asked or when it has none), the frozen history carries CLOCK_MONOTONIC ns that lie
// between clock reads taken around each record. The bounds are generous (a conversion error, not a speed).
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "oomflight/record/event_clock.hpp"
#include "oomflight/record/recorder.hpp"

namespace oomflight {
namespace {

TEST(EventClock, UsesTheTscOnlyWhereItIsInvariantAndAllowed) {
  EXPECT_EQ(EventClock(false).source(), EventClock::Source::monotonic);
  EXPECT_EQ(EventClock(true).source(),
            EventClock::invariant_tsc() ? EventClock::Source::tsc : EventClock::Source::monotonic);
  const EventClock identity(false);
  EXPECT_EQ(identity.to_monotonic_ns(12345, identity.anchor()), 12345);
}

TEST(EventClock, ASecondAnchorIsTakenAfterTheMinimumSpan) {
  const EventClock clock(true);
  const ClockAnchor later = clock.anchor();
  if (clock.source() == EventClock::Source::tsc) {
    EXPECT_GE(later.monotonic_ns - clock.first_anchor().monotonic_ns, EventClock::kMinAnchorSpanNs);
    EXPECT_GT(later.ticks, clock.first_anchor().ticks);
  }
  // The anchors themselves map onto themselves.
  EXPECT_EQ(clock.to_monotonic_ns(clock.first_anchor().ticks, later), clock.first_anchor().monotonic_ns);
  EXPECT_EQ(clock.to_monotonic_ns(later.ticks, later), later.monotonic_ns);
}

class RecorderStamps : public ::testing::TestWithParam<bool> {};

TEST_P(RecorderStamps, FrozenStampsAreMonotonicNsBetweenTheReadsAroundEachRecord) {
  Recorder recorder(64, /*allow_tsc=*/GetParam());
  std::vector<std::pair<std::int64_t, std::int64_t>> windows;
  for (int i = 0; i < 6; ++i) {
    const std::int64_t before = monotonic_ns();
    recorder.record(Action::alloc, 0, 4096u * i, 512, 0);
    const std::int64_t after = monotonic_ns();
    windows.emplace_back(before, after);
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
  }
  const FrozenHistory h = recorder.freeze();
  ASSERT_EQ(h.ring.events.size(), 6u);
  constexpr std::int64_t kSlackNs = 200'000;  // 0.2 ms: a line fitted over >= 20 ms, far more than its error
  for (std::size_t i = 0; i < windows.size(); ++i) {
    const std::int64_t t = h.ring.events[i].t_ns;
    EXPECT_GE(t, windows[i].first - kSlackNs) << "event " << i;
    EXPECT_LE(t, windows[i].second + kSlackNs) << "event " << i;
    if (i > 0) {
      EXPECT_GT(t, h.ring.events[i - 1].t_ns) << "event " << i;
    }
  }
  EXPECT_LE(h.ring.events.back().t_ns, h.anchor_monotonic_ns);
}

INSTANTIATE_TEST_SUITE_P(BothSources, RecorderStamps, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "TscWhereInvariant" : "Monotonic"; });

}  // namespace
}  // namespace oomflight
