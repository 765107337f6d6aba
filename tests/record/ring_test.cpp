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
      // Exact while writers write: every event recorded up to the copy is kept or counted as overwritten.
      ASSERT_EQ(c.events.size() + c.overwritten + c.dropped, c.recorded);
      ASSERT_EQ(c.in_flight, 0u);
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
  EXPECT_EQ(c.dropped, 0u);
  EXPECT_EQ(c.events.size() + c.overwritten, c.recorded);
  EXPECT_EQ(c.events.size(), ring.max_entries());  // the writers' unfinished chunks never cost history
  for (const Event& e : c.events) EXPECT_TRUE(intact(e));
}

TEST(Ring, ACopyIsOneTimeLineAcrossWriters) {
  // Stamps interleave across two threads; slots do not (each thread fills its own chunks). The copy must
  // come out in stamp order, and keep the newest max_entries by stamp.
  Ring ring(300);
  std::atomic<std::int64_t> clock{0};
  auto write = [&](std::uint64_t writer) {
    for (std::uint64_t n = 0; n < 1000; ++n) {
      Event e = numbered(n, writer);
      e.t_ns = clock.fetch_add(1);  // one shared clock: a total order across threads
      ring.push(e);
    }
  };
  std::thread a(write, 0), b(write, 1);
  a.join();
  b.join();
  const RingCopy c = ring.copy();
  ASSERT_EQ(c.events.size(), 300u);
  EXPECT_EQ(c.overwritten, 1700u);
  for (std::size_t k = 0; k < c.events.size(); ++k) EXPECT_EQ(c.events[k].t_ns, static_cast<std::int64_t>(1700 + k));
}

TEST(Ring, AnIdleWritersLappedChunkIsNeitherResurrectedNorMiscounted) {
  Ring ring(100);
  std::atomic<std::int64_t> clock{0};
  auto stamped = [&](std::uint64_t n, std::uint64_t writer) {
    Event e = numbered(n, writer);
    e.batch = clock.fetch_add(1);  // the order of pushes across threads; t_ns stays the checksum
    e.t_ns = e.batch;
    return e;
  };
  std::atomic<int> phase{0};
  // Thread A writes 5 events and waits with its chunk unfinished while the main thread laps the ring three
  // times; then A writes 5 more, which must land in a fresh chunk and be among the newest events.
  std::thread a([&] {
    for (std::uint64_t n = 0; n < 5; ++n) ring.push(stamped(n, 1));
    phase = 1;
    while (phase.load() != 2) std::this_thread::yield();
    for (std::uint64_t n = 5; n < 10; ++n) ring.push(stamped(n, 1));
  });
  while (phase.load() != 1) std::this_thread::yield();
  const std::uint64_t lap = ring.slot_count();
  for (std::uint64_t n = 0; n < 3 * lap; ++n) ring.push(stamped(n, 0));
  phase = 2;
  a.join();
  const RingCopy c = ring.copy();
  ASSERT_EQ(c.recorded, 3 * lap + 10);
  ASSERT_EQ(c.events.size(), 100u);
  EXPECT_EQ(c.events.size() + c.overwritten, c.recorded);
  std::vector<std::uint64_t> from_a, from_main;
  for (const Event& e : c.events) (e.stream == 1 ? from_a : from_main).push_back(e.size);
  EXPECT_EQ(from_a, (std::vector<std::uint64_t>{5, 6, 7, 8, 9}));
  ASSERT_EQ(from_main.size(), 95u);
  EXPECT_EQ(from_main.front(), 3 * lap - 95);
  EXPECT_EQ(from_main.back(), 3 * lap - 1);
}

TEST(Ring, ExitedThreadsGiveTheirWritersBack) {
  // Far more short-lived threads than writers, one after another: none is refused, nothing is lost.
  Ring ring(10000);
  constexpr std::uint64_t kThreads = 4 * Ring::kMaxWriters;
  for (std::uint64_t t = 0; t < kThreads; ++t) {
    std::thread([&] {
      for (std::uint64_t n = 0; n < 10; ++n) ring.push(numbered(n, t));
    }).join();
  }
  const RingCopy c = ring.copy();
  EXPECT_EQ(c.recorded, kThreads * 10);
  EXPECT_EQ(c.dropped, 0u);
  EXPECT_EQ(c.events.size(), kThreads * 10);
}

TEST(Ring, ThreadsBeyondTheWritersAreDroppedAndCounted) {
  Ring ring(10000);
  constexpr std::size_t kThreads = Ring::kMaxWriters + 6;
  std::atomic<std::size_t> arrived{0}, refused{0};
  std::atomic<bool> release{false};
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      if (!ring.push(numbered(0, t))) refused.fetch_add(1);
      arrived.fetch_add(1);
      while (!release.load()) std::this_thread::yield();  // alive, so it keeps its writer
    });
  }
  while (arrived.load() != kThreads) std::this_thread::yield();
  const RingCopy c = ring.copy();
  release = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(refused.load(), 6u);
  EXPECT_EQ(c.dropped, 6u);
  EXPECT_EQ(c.recorded, kThreads);
  EXPECT_EQ(c.events.size(), Ring::kMaxWriters);
  // Once they exited, a new thread gets a writer again.
  std::thread([&] { EXPECT_TRUE(ring.push(numbered(1, 0))); }).join();
}

TEST(Ring, AThreadWritingToTwoRingsKeepsOneWriterInEach) {
  Ring a(100), b(100);
  for (std::uint64_t n = 0; n < 50; ++n) {
    ASSERT_TRUE(a.push(numbered(n)));
    ASSERT_TRUE(b.push(numbered(n)));
  }
  const RingCopy ca = a.copy(), cb = b.copy();
  ASSERT_EQ(ca.events.size(), 50u);
  ASSERT_EQ(cb.events.size(), 50u);
  for (std::uint64_t n = 0; n < 50; ++n) EXPECT_EQ(ca.events[n].size, n);
}

}  // namespace
}  // namespace oomflight
