// The PyTorch plugin's tracker (plugins/pytorch/trace_tracker.hpp) against stand-in TraceEntry types shaped like
// torch 2.4's (c10/cuda/CUDACachingAllocator.h: stream_ a cudaStream_t, no USER_DEFINED) and the newest layout
// (c10/core/CachingDeviceAllocator.h: a class template over the stream type, stream_ a void*, USER_DEFINED),
// forwarding through the real C API into a real archive. torch's action order is not oomflight's (SNAPSHOT and
// OOM are swapped), so a cast instead of the by-name mapping fails these tests.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "oomflight/format/archive_reader.hpp"
#include "oomflight/oomflight.h"
#include "test_support.hpp"
#include "linked_c_api.hpp"
#include "trace_tracker.hpp"

namespace tp = oomflight::torch_plugin;

// The plugin's mirror of the C ABI is the header's: values and layouts.
static_assert(tp::abi::kVersion == OOMFLIGHT_ABI_VERSION);
static_assert(tp::abi::kAlloc == OOMFLIGHT_ALLOC && tp::abi::kFreeRequested == OOMFLIGHT_FREE_REQUESTED &&
              tp::abi::kFreeCompleted == OOMFLIGHT_FREE_COMPLETED && tp::abi::kSegmentAlloc == OOMFLIGHT_SEGMENT_ALLOC &&
              tp::abi::kSegmentFree == OOMFLIGHT_SEGMENT_FREE && tp::abi::kSegmentMap == OOMFLIGHT_SEGMENT_MAP &&
              tp::abi::kSegmentUnmap == OOMFLIGHT_SEGMENT_UNMAP && tp::abi::kOom == OOMFLIGHT_OOM &&
              tp::abi::kSnapshot == OOMFLIGHT_SNAPSHOT);
static_assert(tp::abi::kDumpOom == OOMFLIGHT_DUMP_OOM && tp::abi::kLogWarn == OOMFLIGHT_LOG_WARN);
static_assert(sizeof(tp::abi::Memory) == sizeof(oomflight_memory) &&
              offsetof(tp::abi::Memory, device_free_bytes) == offsetof(oomflight_memory, device_free_bytes));
// The plugin passes the 0.3 request (with the allocator state), laid out as the header's.
static_assert(sizeof(tp::abi::DumpRequest) == sizeof(oomflight_dump_request) &&
              offsetof(tp::abi::DumpRequest, batch) == offsetof(oomflight_dump_request, batch) &&
              offsetof(tp::abi::DumpRequest, device) == offsetof(oomflight_dump_request, device) &&
              offsetof(tp::abi::DumpRequest, segments) == offsetof(oomflight_dump_request, segments) &&
              offsetof(tp::abi::DumpRequest, block_count) == offsetof(oomflight_dump_request, block_count));
static_assert(sizeof(tp::abi::SegmentState) == sizeof(oomflight_segment_state) &&
              offsetof(tp::abi::SegmentState, device) == offsetof(oomflight_segment_state, device) &&
              offsetof(tp::abi::SegmentState, is_expandable) == offsetof(oomflight_segment_state, is_expandable));
static_assert(sizeof(tp::abi::BlockState) == sizeof(oomflight_block_state) &&
              offsetof(tp::abi::BlockState, stack_id) == offsetof(oomflight_block_state, stack_id) &&
              offsetof(tp::abi::BlockState, state) == offsetof(oomflight_block_state, state));
static_assert(sizeof(tp::abi::Frame) == sizeof(oomflight_frame) &&
              offsetof(tp::abi::Frame, line) == offsetof(oomflight_frame, line));
static_assert(sizeof(tp::abi::DumpResult) == sizeof(oomflight_dump_result));

namespace torch24 {  // torch 2.4: c10::cuda::CUDACachingAllocator::TraceEntry
struct CUstream_st;
using cudaStream_t = CUstream_st*;
struct TraceEntry {
  enum Action { ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP,
                SNAPSHOT, OOM };
  Action action_;
  std::int8_t device_;  // c10::DeviceIndex
  std::int64_t addr_;   // for OOM: the device's free bytes
  std::shared_ptr<void> context_;
  cudaStream_t stream_;
  std::int64_t size_;
};
}  // namespace torch24

namespace torch211 {  // newest: c10::CachingDeviceAllocator::TraceEntry<StreamT>, StreamT = void*
template <typename StreamT>
struct TraceEntry {
  enum class Action { ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP,
                      SNAPSHOT, OOM, USER_DEFINED };
  Action action_;
  std::int8_t device_;
  std::size_t addr_;
  std::shared_ptr<void> context_;
  StreamT stream_{};
  std::size_t size_;
};
}  // namespace torch211

namespace {

tp::CApiTable real_c_api() { return tp::linked_c_api(); }

class TraceTrackerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("OOMFLIGHT_FOLDER", dir_.path().c_str(), 1);
    setenv("OOMFLIGHT_RUN_NAME", "tracker", 1);
    ASSERT_EQ(oomflight_init(), OOMFLIGHT_OK) << oomflight_last_error();
  }
  void TearDown() override {
    oomflight_shutdown();
    unsetenv("OOMFLIGHT_FOLDER");
    unsetenv("OOMFLIGHT_RUN_NAME");
  }
  oomflight::test::TempDir dir_;
};

constexpr std::uint64_t kMiB = 1ull << 20;

// One training step's allocator events on `device`, in torch's terms, then an OOM entry and the observer call.
template <typename Entry, typename Stream>
void feed_step(tp::TraceTracker& tracker, std::int8_t device, Stream stream) {
  using A = typename Entry::Action;
  const auto entry = [&](A action, std::uint64_t addr, std::uint64_t size) {
    Entry e{};
    e.action_ = action;
    e.device_ = device;
    e.addr_ = static_cast<decltype(e.addr_)>(addr);
    e.stream_ = stream;
    e.size_ = static_cast<decltype(e.size_)>(size);
    tracker.on_entry(e);
  };
  entry(A::SEGMENT_ALLOC, 0x7f0000000000, 20 * kMiB);
  entry(A::ALLOC, 0x7f0000000000, 8 * kMiB);
  entry(A::ALLOC, 0x7f0000800000, 4 * kMiB);
  entry(A::FREE_REQUESTED, 0x7f0000000000, 8 * kMiB);
  entry(A::FREE_COMPLETED, 0x7f0000000000, 8 * kMiB);
  entry(A::SNAPSHOT, 0, 0);
  entry(A::OOM, 3 * kMiB, 64 * kMiB);  // addr_ = device free bytes, size_ = the block it needed
}

template <typename Entry>
void expect_archive(const std::string& path, std::int16_t device, std::uint64_t stream) {
  const oomflight::Archive archive = oomflight::read_archive(path);
  ASSERT_EQ(archive.events.size(), 7u) << "the observer must not record a second oom event";
  const std::vector<oomflight::Action> expected = {
      oomflight::Action::segment_alloc, oomflight::Action::alloc,    oomflight::Action::alloc,
      oomflight::Action::free_requested, oomflight::Action::free_completed, oomflight::Action::snapshot,
      oomflight::Action::oom};
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(archive.events[i].action, expected[i]) << "event " << i;
    EXPECT_EQ(archive.events[i].device, device) << "event " << i;
  }
  EXPECT_EQ(archive.events[1].stream, stream);
  EXPECT_EQ(archive.events[1].size, 8 * kMiB);
  EXPECT_EQ(archive.events[6].size, 64 * kMiB);
  EXPECT_EQ(archive.events[6].addr, 3 * kMiB);
  const oomflight::RankRow& row = archive.ranks.at(0);
  EXPECT_EQ(row.device, device);
  EXPECT_EQ(row.is_origin, 1);
  EXPECT_EQ(row.oom_requested_bytes, 64 * kMiB);
  EXPECT_EQ(row.device_free_bytes, 3 * kMiB);
}

TEST_F(TraceTrackerTest, Torch24LayoutMapsActionsByNameAndDumpsOnce) {
  tp::TraceTracker tracker(real_c_api());
  tracker.seed(0, 100 * kMiB, 200 * kMiB, 80ull << 30);
  auto* stream = reinterpret_cast<torch24::cudaStream_t>(std::uintptr_t{0x5a5a00});
  feed_step<torch24::TraceEntry>(tracker, 0, stream);
  // Gauges as CUDACachingAllocator counts them: allocated falls at FREE_REQUESTED, reserved at segment events.
  EXPECT_EQ(tracker.gauges(0).allocated.load(), static_cast<std::int64_t>(104 * kMiB));
  EXPECT_EQ(tracker.gauges(0).peak_allocated.load(), static_cast<std::int64_t>(112 * kMiB));
  EXPECT_EQ(tracker.gauges(0).reserved.load(), static_cast<std::int64_t>(220 * kMiB));
  EXPECT_TRUE(tracker.gauges(0).oom_entry_seen.load());
  const std::string reason = "CUDA out of memory. Tried to allocate 64.00 MiB. GPU 0 has a total capacity of 80.00 GiB";
  EXPECT_EQ(tracker.on_out_of_memory(0, 64 * kMiB, 80ull << 30, 3 * kMiB, nullptr, reason.c_str()), OOMFLIGHT_OK)
      << oomflight_last_error();
  EXPECT_EQ(tracker.forwarded(), 7u);
  EXPECT_EQ(tracker.unmapped(), 0u);
  EXPECT_EQ(tracker.observer_dumps(), 1u);
  expect_archive<torch24::TraceEntry>(oomflight_last_dump_path(), 0, 0x5a5a00);
  const oomflight::Archive archive = oomflight::read_archive(oomflight_last_dump_path());
  EXPECT_EQ(archive.ranks.at(0).reserved_bytes, 220 * kMiB);
  EXPECT_EQ(archive.ranks.at(0).device_capacity_bytes, 80ull << 30);
}

TEST_F(TraceTrackerTest, NewestLayoutWithVoidStreamsSkipsUserDefinedAndTakesExactStats) {
  using Entry = torch211::TraceEntry<void*>;
  tp::TraceTracker tracker(real_c_api());
  tracker.seed(3, 0, 0, 40ull << 30);
  feed_step<Entry>(tracker, 3, reinterpret_cast<void*>(std::uintptr_t{0x77}));
  Entry user{};
  user.action_ = Entry::Action::USER_DEFINED;
  tracker.on_entry(user);
  EXPECT_EQ(tracker.unmapped(), 1u);
  const tp::ExactStats exact{30 * kMiB, 39ull << 30, 35 * kMiB, 39ull << 30};
  EXPECT_EQ(tracker.on_out_of_memory(3, 64 * kMiB, 40ull << 30, 3 * kMiB, &exact, "CUDA out of memory"), OOMFLIGHT_OK)
      << oomflight_last_error();
  expect_archive<Entry>(oomflight_last_dump_path(), 3, 0x77);
  const oomflight::Archive archive = oomflight::read_archive(oomflight_last_dump_path());
  EXPECT_EQ(archive.ranks.at(0).allocated_bytes, 30 * kMiB);  // torch's exact figure replaces the trace's
  EXPECT_EQ(archive.ranks.at(0).reserved_bytes, 39ull << 30);
}

TEST_F(TraceTrackerTest, ObserverRecordsTheOomEventWhenTheTraceHadNone) {
  // torch before 2.4 emitted the OOM trace entry only with memory history on: the observer fills the gap.
  tp::TraceTracker tracker(real_c_api());
  torch24::TraceEntry alloc{};
  alloc.action_ = torch24::TraceEntry::ALLOC;
  alloc.device_ = 1;
  alloc.addr_ = 0x1000;
  alloc.size_ = 512;
  tracker.on_entry(alloc);
  EXPECT_EQ(tracker.on_out_of_memory(1, 2 * kMiB, 0, 1 * kMiB, nullptr, nullptr), OOMFLIGHT_OK);
  const oomflight::Archive archive = oomflight::read_archive(oomflight_last_dump_path());
  ASSERT_EQ(archive.events.size(), 2u);
  EXPECT_EQ(archive.events[1].action, oomflight::Action::oom);
  EXPECT_EQ(archive.events[1].size, 2 * kMiB);
  EXPECT_EQ(archive.events[1].addr, 1 * kMiB);
  EXPECT_EQ(archive.events[1].device, 1);
}

TEST(TraceTrackerMapping, EveryTorchActionByName) {
  using A24 = torch24::TraceEntry::Action;
  using A = torch211::TraceEntry<void*>::Action;
  static_assert(tp::action_code(A24::OOM) == OOMFLIGHT_OOM && tp::action_code(A24::SNAPSHOT) == OOMFLIGHT_SNAPSHOT);
  static_assert(tp::action_code(A::SEGMENT_UNMAP) == OOMFLIGHT_SEGMENT_UNMAP);
  static_assert(tp::action_code(A::USER_DEFINED) == -1);
  EXPECT_NE(static_cast<int>(A24::OOM), OOMFLIGHT_OOM) << "the stand-in must keep torch's order, not ours";
  EXPECT_EQ(tp::stream_value(static_cast<void*>(nullptr)), 0u);
  EXPECT_EQ(tp::stream_value(std::uint64_t{42}), 42u);
}

}  // namespace
