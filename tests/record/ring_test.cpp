// The ring: order, overwrite counting, and consistent copies while several threads write.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "oomflight/record/ring.hpp"

namespace oomflight {
namespace {

Event numbered(std::uint64_t n, std::uint64_t writer = 0) {
  Event e;
  e.addr = (writer << 40) | n;
  e.size = n;
  e.stream = writer;
  e.t_ns = static_cast<std::int64_t>(n * 7 + writer);  // a checksum of the other fields
  e.action = Action::alloc;
  return e;
}

bool intact(const Event& e) {
  const std::uint64_t writer = e.stream, n = e.size;
  return e.addr == ((writer << 40) | n) && e.t_ns == static_cast<std::int64_t>(n * 7 + writer);
}

TEST(Ring, KeepsEventsInOrderBelowCapacity) {
  Ring ring(100);
  for (std::uint64_t i = 0; i < 60; ++i) ASSERT_TRUE(ring.push(numbered(i)));
  const RingCopy c = ring.copy();
  ASSERT_EQ(c.events.size(), 60u);
  for (std::uint64_t i = 0; i < 60; ++i) EXPECT_EQ(c.events[i].size, i);
  EXPECT_EQ(c.recorded, 60u);
  EXPECT_EQ(c.overwritten, 0u);
  EXPECT_EQ(c.dropped, 0u);
}

TEST(Ring, OverwritesOldestAndCountsThem) {
  Ring ring(1000);  // not a power of two: the bound is still 1000 events
  for (std::uint64_t i = 0; i < 2500; ++i) ring.push(numbered(i));
  const RingCopy c = ring.copy();
  ASSERT_EQ(c.events.size(), 1000u);
  EXPECT_EQ(c.events.front().size, 1500u);
  EXPECT_EQ(c.events.back().size, 2499u);
  EXPECT_EQ(c.recorded, 2500u);
  EXPECT_EQ(c.overwritten, 1500u);
}

TEST(Ring, RejectsSizesOutOfRange) {
  EXPECT_THROW(Ring(0), std::invalid_argument);
  EXPECT_THROW(Ring((std::size_t{1} << 30) + 1), std::invalid_argument);
}

TEST(Ring, ManyWritersAndAReaderSeeNoTornRecords) {
  constexpr int kWriters = 4;
  constexpr std::uint64_t kPerWriter = 200000;
  Ring ring(1 << 14);
  std::atomic<bool> done{false};
  std::atomic<std::uint64_t> copies{0};
  std::thread reader([&] {
    while (!done.load()) {
      const RingCopy c = ring.copy();
      std::vector<std::int64_t> last(kWriters, -1);
      for (const Event& e : c.events) {
        ASSERT_TRUE(intact(e)) << "torn record";
        ASSERT_LT(e.stream, static_cast<std::uint64_t>(kWriters));
        // Each writer's events appear in the order it wrote them.
        ASSERT_GT(static_cast<std::int64_t>(e.size), last[e.stream]);
        last[e.stream] = static_cast<std::int64_t>(e.size);
      }
      ASSERT_LE(c.events.size(), ring.max_entries());
      copies.fetch_add(1);
    }
  });
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      for (std::uint64_t i = 0; i < kPerWriter; ++i) ring.push(numbered(i, static_cast<std::uint64_t>(w)));
    });
  }
  for (auto& t : writers) t.join();
  done = true;
  reader.join();
  EXPECT_GT(copies.load(), 0u);
  const RingCopy c = ring.copy();
  EXPECT_EQ(c.recorded, kWriters * kPerWriter);
  // Every event is accounted for: kept, overwritten, dropped, or unreadable.
  EXPECT_EQ(c.events.size() + c.overwritten + c.in_flight, c.recorded);
  EXPECT_EQ(c.events.size(), ring.max_entries() - c.in_flight);
  for (const Event& e : c.events) EXPECT_TRUE(intact(e));
}

}  // namespace
}  // namespace oomflight
