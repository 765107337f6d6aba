// The simulated caching allocator: OOM at the right event, cache release, start-state reconstruction, rewind.
#include <gtest/gtest.h>

#include "oomflight/sim/simulated_device.hpp"
#include "oomflight/base/units.hpp"
#include "test_support.hpp"

namespace oomflight::sim {
namespace {

using test::CollectingSink;

TraceEntry entry(Action a, std::uint64_t addr, std::uint64_t size) {
  TraceEntry e;
  e.action = a;
  e.addr = addr;
  e.size = size;
  return e;
}

TorchSnapshot snapshot_of(std::vector<TraceEntry> trace) {
  TorchSnapshot s;
  s.device_traces.push_back(std::move(trace));
  return s;
}

TEST(SimulatedDevice, OutOfMemoryAtTheSegmentThatDoesNotFit) {
  const auto snap = snapshot_of({entry(Action::segment_alloc, 1000, 40), entry(Action::alloc, 1000, 30),
                                 entry(Action::segment_alloc, 2000, 40), entry(Action::alloc, 2000, 30),
                                 entry(Action::segment_alloc, 3000, 40), entry(Action::alloc, 3000, 25)});
  SimulatedDevice device(snap, 100);
  CollectingSink sink;
  const auto oom = device.replay(sink);
  ASSERT_TRUE(oom.has_value());
  EXPECT_EQ(oom->trace_index, 4u);
  EXPECT_EQ(oom->requested_bytes, 25u);  // the alloc the segment was for, not the segment
  EXPECT_EQ(oom->device_free_bytes, 20u);
  ASSERT_EQ(sink.events.size(), 5u);
  EXPECT_EQ(sink.events.back().action, Action::oom);
  EXPECT_EQ(sink.events.back().size, 25u);
  EXPECT_EQ(sink.events.back().addr, 20u);
  EXPECT_EQ(sink.last.reserved_bytes, 80u);
  EXPECT_EQ(sink.last.allocated_bytes, 2u * 512u);  // PyTorch's allocated: two blocks of at least 512 bytes
  // PyTorch quotes what it tried to cudaMalloc (the segment), and its oom trace entry carries the request.
  EXPECT_EQ(oom->segment_bytes, 40u);
  EXPECT_NE(oom->message.find("CUDA out of memory. Tried to allocate 40 B"), std::string::npos);
}

TEST(SimulatedDevice, ReleasesUnusedCachedSegmentsBeforeFailing) {
  const auto snap = snapshot_of({entry(Action::segment_alloc, 1000, 40), entry(Action::alloc, 1000, 30),
                                 entry(Action::free_requested, 1000, 30), entry(Action::free_completed, 1000, 30),
                                 entry(Action::segment_alloc, 2000, 40), entry(Action::alloc, 2000, 30),
                                 entry(Action::segment_alloc, 3000, 40), entry(Action::alloc, 3000, 30),
                                 // The real run still had segment 1000 cached; the model released it.
                                 entry(Action::alloc, 1000, 10)});
  SimulatedDevice device(snap, 100);
  CollectingSink sink;
  const auto oom = device.replay(sink);
  // Segment 1000 was released to make room for 3000 ...
  bool released = false;
  for (std::size_t i = 0; i < sink.events.size(); ++i) {
    if (sink.events[i].action == Action::segment_free && sink.events[i].addr == 1000) {
      released = true;
      EXPECT_EQ(sink.events.at(i + 1).action, Action::segment_alloc);
      EXPECT_EQ(sink.events.at(i + 1).addr, 3000u);
    }
  }
  EXPECT_TRUE(released);
  // ... and reserving it again for the last alloc does not fit: 80 + 40 > 100 with nothing left to release.
  ASSERT_TRUE(oom.has_value());
  EXPECT_EQ(oom->trace_index, 8u);
  EXPECT_EQ(oom->requested_bytes, 10u);
}

TEST(SimulatedDevice, ReconstructsStateThatPredatesTheTrace) {
  TorchSnapshot snap = snapshot_of({entry(Action::free_requested, 1000, 16), entry(Action::free_completed, 1000, 16),
                                    entry(Action::alloc, 1100, 8)});
  SnapshotSegment seg;
  seg.address = 1000;
  seg.total_size = 256;
  seg.blocks.push_back(SnapshotBlock{1000, 16, 16, "inactive", kNoStack});
  seg.blocks.push_back(SnapshotBlock{1100, 8, 8, "active_allocated", kNoStack});
  seg.blocks.push_back(SnapshotBlock{1200, 32, 32, "active_allocated", kNoStack});  // allocated before the trace
  snap.segments.push_back(seg);
  SimulatedDevice device(snap, 1024);
  EXPECT_EQ(device.start_reserved_bytes(), 256u);
  // The freed block (the trace gives its request: a 512-byte block) and the untouched one (the snapshot's own size).
  EXPECT_EQ(device.start_allocated_bytes(), 512u + 32u);
  CollectingSink sink;
  EXPECT_FALSE(device.replay(sink).has_value());
  EXPECT_EQ(device.stats().allocated_bytes, 512u + 32u);
  EXPECT_EQ(device.anomalies().free_of_unknown_block, 0u);
  EXPECT_THROW(SimulatedDevice(snap, 255), std::invalid_argument);  // the start state alone does not fit
}

// A trace that starts with more reserved than the device replayed: a segment cached by the real run (no live
// block) is released first, as PyTorch's allocator would, so the trace still replays to its out-of-memory error.
TEST(SimulatedDevice, StartOverCapacityReleasesCachedSegmentsFirst) {
  TorchSnapshot snap = snapshot_of({entry(Action::alloc, 1050, 20), entry(Action::segment_alloc, 3000, 100),
                                    entry(Action::alloc, 3000, 90)});
  snap.device_traces[0][2].stack_id = 7;
  SnapshotSegment live;
  live.address = 1000;
  live.total_size = 100;
  live.blocks.push_back(SnapshotBlock{1000, 50, 48, "active_allocated", 3});  // predates the trace
  live.blocks.push_back(SnapshotBlock{1050, 20, 20, "active_allocated", kNoStack});
  live.blocks.push_back(SnapshotBlock{1070, 30, 30, "inactive", kNoStack});
  SnapshotSegment cached;
  cached.address = 2000;
  cached.total_size = 100;
  cached.blocks.push_back(SnapshotBlock{2000, 100, 100, "inactive", kNoStack});
  snap.segments = {live, cached};

  SimulatedDevice as_recorded(snap, 250);  // fits as it was: nothing released
  EXPECT_EQ(as_recorded.start_reserved_bytes(), 200u);
  EXPECT_EQ(as_recorded.start_released_bytes(), 0u);

  SimulatedDevice device(snap, 150);  // refused to start before: 200 reserved at the start
  EXPECT_EQ(device.start_released_bytes(), 100u);
  EXPECT_EQ(device.start_reserved_bytes(), 100u);
  EXPECT_EQ(device.start_allocated_bytes(), 50u);  // the snapshot's own block size, not a rounding of the request
  CollectingSink sink;
  device.emit_start_state(sink);
  ASSERT_EQ(sink.events.size(), 2u);  // the live segment and its predating block, with the block's frames
  EXPECT_EQ(sink.events[0].action, Action::segment_alloc);
  EXPECT_EQ(sink.events[0].addr, 1000u);
  EXPECT_EQ(sink.events[1].action, Action::alloc);
  EXPECT_EQ(sink.events[1].size, 48u);  // as a trace's alloc: the request; the 50-byte block counts in allocated
  EXPECT_EQ(sink.events[1].stack_id, 3);
  const auto oom = device.replay(sink);
  ASSERT_TRUE(oom.has_value());
  EXPECT_EQ(oom->requested_bytes, 90u);
  EXPECT_EQ(oom->segment_bytes, 100u);
  EXPECT_EQ(sink.events.back().action, Action::oom);
  EXPECT_EQ(sink.events.back().stack_id, 7);  // the failing allocation's frames
  EXPECT_NE(oom->message.find("Tried to allocate 100 B"), std::string::npos);

  // Live blocks that cannot fit still make the start impossible, and the message says what was released.
  try {
    SimulatedDevice too_small(snap, 90);
    FAIL() << "a start state whose live segments exceed the capacity was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("100 B of segments holding live blocks"), std::string::npos) << e.what();
  }
}

// Allocated counts blocks as PyTorch does (the request rounded up to 512 bytes); events keep the request.
TEST(SimulatedDevice, AllocatedCountsBlocksRoundedTo512BytesEventsKeepTheRequest) {
  const auto snap = snapshot_of({entry(Action::segment_alloc, 0, 1 << 20), entry(Action::alloc, 0, 1),
                                 entry(Action::alloc, 512, 512), entry(Action::alloc, 1024, 513)});
  SimulatedDevice device(snap, 2 << 20);
  CollectingSink sink;
  ASSERT_FALSE(device.replay(sink).has_value());
  EXPECT_EQ(device.stats().allocated_bytes, 512u + 512u + 1024u);
  EXPECT_EQ(sink.events.back().size, 513u);
}

struct TraceCounts {
  std::size_t allocs, free_requested, free_completed;
};

// A device with room for the whole step: every alloc and free of the trace is emitted, the peak stays within the
// capacity (and above `least_peak`), nothing is out of place, and a second loop starts from the first one's state.
void expect_fits_and_emits_every_event(const TorchSnapshot& snap, std::uint64_t capacity, TraceCounts want,
                                       std::uint64_t least_peak) {
  SimulatedDevice device(snap, capacity);
  CollectingSink sink;
  ASSERT_FALSE(device.replay(sink).has_value());
  TraceCounts got{0, 0, 0};
  for (const auto& e : sink.events) {
    got.allocs += e.action == Action::alloc;
    got.free_requested += e.action == Action::free_requested;
    got.free_completed += e.action == Action::free_completed;
  }
  EXPECT_EQ(got.allocs, want.allocs);
  EXPECT_EQ(got.free_requested, want.free_requested);
  EXPECT_EQ(got.free_completed, want.free_completed);
  EXPECT_LE(device.stats().peak_reserved_bytes, capacity);
  EXPECT_GT(device.stats().peak_reserved_bytes, least_peak);
  const auto& a = device.anomalies();
  EXPECT_EQ(a.alloc_outside_segments + a.free_of_unknown_block + a.free_of_unknown_segment, 0u);
  // A second loop starts from the same state as the first.
  ASSERT_FALSE(device.rewind(sink).has_value());
  EXPECT_EQ(device.stats().allocated_bytes, device.start_allocated_bytes());
  EXPECT_EQ(device.stats().reserved_bytes, device.start_reserved_bytes());
  ASSERT_FALSE(device.replay(sink).has_value());
}

// A device too small for the step: out of memory within the capacity until then, every alloc before the failing
// entry emitted in order; more memory (`bigger`) fails later or not at all; a device the size of the start state
// fails at the first segment.
void expect_runs_out_within_capacity(const TorchSnapshot& snap, std::uint64_t capacity, std::uint64_t bigger_capacity) {
  SimulatedDevice device(snap, capacity);
  CollectingSink sink;
  const auto oom = device.replay(sink);
  ASSERT_TRUE(oom.has_value());
  EXPECT_LE(device.stats().peak_reserved_bytes, capacity);
  EXPECT_LT(oom->device_free_bytes, parse_bytes("2MiB") + oom->requested_bytes);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> trace_allocs, emitted;
  for (std::size_t i = 0; i < oom->trace_index; ++i) {
    const auto& e = snap.device_traces[0][i];
    if (e.action == Action::alloc) trace_allocs.emplace_back(e.addr, e.size);
  }
  for (const auto& e : sink.events) {
    if (e.action == Action::alloc) emitted.emplace_back(e.addr, e.size);
  }
  EXPECT_EQ(emitted, trace_allocs);
  SimulatedDevice bigger(snap, bigger_capacity);
  CollectingSink sink2;
  const auto later = bigger.replay(sink2);
  if (later) {
    EXPECT_GT(later->trace_index, oom->trace_index);
  } else {
    EXPECT_LE(bigger.stats().peak_reserved_bytes, bigger_capacity);
  }
  SimulatedDevice tight(snap, device.start_reserved_bytes());
  CollectingSink sink3;
  const auto first = tight.replay(sink3);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(snap.device_traces[0][first->trace_index].action, Action::segment_alloc);
}

// The project's own H200 step (the demo's): 6.93 GiB reserved at its peak.
TEST(SimulatedDevice, OwnStepFitsIn8GiBAndEveryTraceEventIsEmitted) {
  StackTable stacks;
  const auto snap = read_torch_snapshot(test::own_snapshot(), stacks);
  expect_fits_and_emits_every_event(snap, parse_bytes("8GiB"), {1332, 1101, 1101}, parse_bytes("6656MiB"));
}

TEST(SimulatedDevice, OwnStepRunsOutOfMemoryIn6GiBWithinCapacityUntilThen) {
  StackTable stacks;
  const auto snap = read_torch_snapshot(test::own_snapshot(), stacks);
  // Its 998 MiB logits block fails on any device under the 6.93 GiB peak; 7 GiB holds the whole step.
  expect_runs_out_within_capacity(snap, parse_bytes("6GiB"), parse_bytes("7GiB"));
}

TEST(SimulatedDevice, SharedFullStepFitsIn64GiBAndEveryTraceEventIsEmitted) {
  OOMFLIGHT_SHARED_SNAPSHOT_OR_SKIP(path, "transformer-lm-fullstep-ctx128.pickle");
  StackTable stacks;
  const auto snap = read_torch_snapshot(path, stacks);
  expect_fits_and_emits_every_event(snap, parse_bytes("64GiB"), {6771, 5894, 5894}, parse_bytes("56GiB"));
}

TEST(SimulatedDevice, SharedFullStepRunsOutOfMemoryIn40GiBWithinCapacityUntilThen) {
  OOMFLIGHT_SHARED_SNAPSHOT_OR_SKIP(path, "transformer-lm-fullstep-ctx128.pickle");
  StackTable stacks;
  const auto snap = read_torch_snapshot(path, stacks);
  expect_runs_out_within_capacity(snap, parse_bytes("40GiB"), parse_bytes("48GiB"));
}

}  // namespace
}  // namespace oomflight::sim
