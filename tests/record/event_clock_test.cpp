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

TEST(TickConversion, StaysWithinOneNanosecondOfTheExactLineAndHitsBothAnchors) {
  // Lines like a 1 - 5 GHz TSC's over spans of 20 ms to a day, stamps from before the first anchor to a year
  // after it; the exact value is the line's rational value rounded down (what one 128-bit division per stamp gave).
  __extension__ using I128 = __int128;
  std::uint64_t seed = 12345;
  auto next = [&] { return seed = seed * 6364136223846793005ull + 1442695040888963407ull; };
  for (int line = 0; line < 200; ++line) {
    const ClockAnchor first{static_cast<std::int64_t>(next() >> 8), static_cast<std::int64_t>(next() >> 12)};
    const std::int64_t span_ns = 20'000'000 + static_cast<std::int64_t>(next() % 86'400'000'000'000ull);
    const double ghz = 1.0 + static_cast<double>(next() % 4000) / 1000.0;
    const ClockAnchor later{first.ticks + static_cast<std::int64_t>(static_cast<double>(span_ns) * ghz),
                           first.monotonic_ns + span_ns};
    const TickConversion to_ns(first, later);
    EXPECT_EQ(to_ns(first.ticks), first.monotonic_ns);
    EXPECT_EQ(to_ns(later.ticks), later.monotonic_ns);
    for (int i = 0; i < 100; ++i) {
      const std::int64_t delta = static_cast<std::int64_t>(next() % 100'000'000'000'000'000ull) - 1'000'000'000'000;
      const std::int64_t raw = first.ticks + delta;
      const I128 exact_num = static_cast<I128>(delta) * span_ns;
      const I128 ticks = later.ticks - first.ticks;
      I128 exact = exact_num / ticks;
      if (exact_num % ticks != 0 && exact_num < 0) exact -= 1;  // rounded down, as the fixed point truncates
      const std::int64_t want = first.monotonic_ns + static_cast<std::int64_t>(exact);
      const std::int64_t got = to_ns(raw);
      EXPECT_LE(got - want, 1) << "line " << line << " stamp " << i;
      EXPECT_GE(got - want, -1) << "line " << line << " stamp " << i;
    }
  }
  EXPECT_EQ(TickConversion()(987654321), 987654321);  // the identity
  EXPECT_EQ(TickConversion({100, 5}, {100, 9})(12345), 9);  // no slope: the later anchor
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
