// The collective ring: bounded, exact counts, never a torn record while threads write.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "oomflight/record/collective_ring.hpp"
#include "oomflight/record/recorder.hpp"

namespace oomflight {
namespace {

Collective record(std::int64_t t, std::uint64_t seq) {
  Collective c;
  c.t_ns = t;
  c.comm_id = 7;
  c.seq = seq;
  c.count = seq * 3;
  c.bytes = seq * 12;
  c.op = CollectiveOp::allreduce;
  c.datatype = DataType::float32;
  return c;
}

TEST(CollectiveRing, KeepsTheNewestAndCountsTheOverwritten) {
  CollectiveRing ring(8);
  EXPECT_EQ(ring.capacity(), 8u);
  for (std::uint64_t i = 0; i < 5; ++i) ring.push(record(static_cast<std::int64_t>(i), i));
  CollectiveRingCopy c = ring.copy();
  EXPECT_EQ(c.records.size(), 5u);
  EXPECT_EQ(c.recorded, 5u);
  EXPECT_EQ(c.overwritten, 0u);
  for (std::uint64_t i = 5; i < 21; ++i) ring.push(record(static_cast<std::int64_t>(i), i));
  c = ring.copy();
  ASSERT_EQ(c.records.size(), 8u);
  EXPECT_EQ(c.recorded, 21u);
  EXPECT_EQ(c.overwritten, 13u);
  EXPECT_EQ(c.in_flight, 0u);
  for (std::size_t k = 0; k < 8; ++k) {  // oldest first: 13 .. 20, every field whole
    EXPECT_EQ(c.records[k].seq, 13 + k);
    EXPECT_EQ(c.records[k].bytes, (13 + k) * 12);
  }
}

TEST(CollectiveRing, SizeOutOfRangeIsAnError) {
  EXPECT_THROW(CollectiveRing(0), std::invalid_argument);
  EXPECT_THROW(CollectiveRing((std::size_t{1} << 24) + 1), std::invalid_argument);
  EXPECT_EQ(CollectiveRing(100).capacity(), 128u);
}

// Four threads write while a reader copies: every copied record is one a writer wrote (its fields agree with each
// other), and at the end every record is counted.
TEST(CollectiveRing, ConcurrentWritersNeverGiveATornRecord) {
  CollectiveRing ring(256);
  std::atomic<bool> stop{false};
  constexpr int kThreads = 4, kEach = 20000;
  std::atomic<std::size_t> copies{0};
  std::thread reader([&] {
    while (!stop.load()) {
      for (const Collective& c : ring.copy().records) {
        ASSERT_EQ(c.count, c.seq * 3);
        ASSERT_EQ(c.bytes, c.seq * 12);
      }
      ++copies;
    }
  });
  std::vector<std::thread> writers;
  for (int t = 0; t < kThreads; ++t) {
    writers.emplace_back([&, t] {
      while (copies.load() == 0) std::this_thread::yield();  // the reader copies while they write
      for (int i = 0; i < kEach; ++i) {
        const auto seq = static_cast<std::uint64_t>(t) * 1'000'000 + static_cast<std::uint64_t>(i);
        ring.push(record(i, seq));
      }
    });
  }
  for (auto& w : writers) w.join();
  stop = true;
  reader.join();
  const CollectiveRingCopy c = ring.copy();
  EXPECT_EQ(c.recorded, static_cast<std::uint64_t>(kThreads * kEach));
  EXPECT_EQ(c.records.size() + c.overwritten + c.in_flight, c.recorded);
  EXPECT_EQ(c.in_flight, 0u);
  EXPECT_GT(copies.load(), 1u);  // at least one copy after the writers began
}

TEST(CollectiveRing, TheRecorderStampsWithTheEventsClockAndTheBatch) {
  Recorder recorder(1000, false);
  recorder.mark_batch(3);
  Collective c = record(0, 42);
  c.batch = 99;  // ignored: the recorder's batch is stamped
  recorder.record_collective(c);
  recorder.register_communicator({7, std::string(60, 'n'), 1, 4});
  const FrozenHistory h = recorder.freeze();
  ASSERT_EQ(h.collectives.records.size(), 1u);
  EXPECT_EQ(h.collectives.records[0].batch, 3);
  EXPECT_EQ(h.collectives.records[0].seq, 42u);
  ASSERT_FALSE(h.ring.events.empty());  // the step event
  EXPECT_GE(h.collectives.records[0].t_ns, h.ring.events.back().t_ns);
  EXPECT_LE(h.collectives.records[0].t_ns, h.anchor_monotonic_ns);
  ASSERT_EQ(h.communicators.size(), 1u);
  EXPECT_EQ(h.communicators[0].name.size(), CommunicatorTable::kMaxNameBytes);
}

}  // namespace
}  // namespace oomflight
