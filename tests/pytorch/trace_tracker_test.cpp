// The PyTorch plugin's tracker (plugins/pytorch/trace_tracker.hpp) against stand-in TraceEntry types shaped like
// torch 2.4's (c10/cuda/CUDACachingAllocator.h: stream_ a cudaStream_t, no USER_DEFINED) and the newest layout
// (c10/core/CachingDeviceAllocator.h: a class template over the stream type, stream_ a void*, USER_DEFINED),
// forwarding through the real C API into a real archive. torch's action order is not oomflight's (SNAPSHOT and
// OOM are swapped), so a cast instead of the by-name mapping fails these tests.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <thread>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "oomflight/format/archive_reader.hpp"
#include "oomflight/oomflight.h"
#include "test_support.hpp"
#include "linked_c_api.hpp"
#include "trace_tracker.hpp"
#include "context_table.hpp"

namespace tp = oomflight::torch_plugin;

// The plugin's mirror of the C ABI is the header's: values and layouts.
static_assert(tp::abi::kVersion == OOMFLIGHT_ABI_VERSION);
static_assert(tp::abi::kAlloc == OOMFLIGHT_ALLOC && tp::abi::kFreeRequested == OOMFLIGHT_FREE_REQUESTED &&
              tp::abi::kFreeCompleted == OOMFLIGHT_FREE_COMPLETED && tp::abi::kSegmentAlloc == OOMFLIGHT_SEGMENT_ALLOC &&
              tp::abi::kSegmentFree == OOMFLIGHT_SEGMENT_FREE && tp::abi::kSegmentMap == OOMFLIGHT_SEGMENT_MAP &&
              tp::abi::kSegmentUnmap == OOMFLIGHT_SEGMENT_UNMAP && tp::abi::kOom == OOMFLIGHT_OOM &&
              tp::abi::kSnapshot == OOMFLIGHT_SNAPSHOT);
static_assert(tp::abi::kDumpOom == OOMFLIGHT_DUMP_OOM && tp::abi::kDumpSignal == OOMFLIGHT_DUMP_SIGNAL &&
              tp::abi::kLogWarn == OOMFLIGHT_LOG_WARN);
static_assert(sizeof(tp::abi::Memory) == sizeof(oomflight_memory) &&
              offsetof(tp::abi::Memory, device_free_bytes) == offsetof(oomflight_memory, device_free_bytes) &&
              offsetof(tp::abi::Memory, memory_cap_bytes) == offsetof(oomflight_memory, memory_cap_bytes));
// The plugin passes the 0.2.1 request (allocator state and segment details), laid out as the header's.
static_assert(sizeof(tp::abi::DumpRequest) == sizeof(oomflight_dump_request) &&
              offsetof(tp::abi::DumpRequest, batch) == offsetof(oomflight_dump_request, batch) &&
              offsetof(tp::abi::DumpRequest, device) == offsetof(oomflight_dump_request, device) &&
              offsetof(tp::abi::DumpRequest, segments) == offsetof(oomflight_dump_request, segments) &&
              offsetof(tp::abi::DumpRequest, block_count) == offsetof(oomflight_dump_request, block_count) &&
              offsetof(tp::abi::DumpRequest, segment_details) == offsetof(oomflight_dump_request, segment_details));
static_assert(sizeof(tp::abi::SegmentDetail) == sizeof(oomflight_segment_detail) &&
              offsetof(tp::abi::SegmentDetail, stack_id) == offsetof(oomflight_segment_detail, stack_id) &&
              offsetof(tp::abi::SegmentDetail, segment_type) == offsetof(oomflight_segment_detail, segment_type));
static_assert(sizeof(tp::abi::SegmentState) == sizeof(oomflight_segment_state) &&
              offsetof(tp::abi::SegmentState, device) == offsetof(oomflight_segment_state, device) &&
              offsetof(tp::abi::SegmentState, is_expandable) == offsetof(oomflight_segment_state, is_expandable));
static_assert(sizeof(tp::abi::BlockState) == sizeof(oomflight_block_state) &&
              offsetof(tp::abi::BlockState, stack_id) == offsetof(oomflight_block_state, stack_id) &&
              offsetof(tp::abi::BlockState, state) == offsetof(oomflight_block_state, state));
static_assert(sizeof(tp::abi::Frame) == sizeof(oomflight_frame) &&
              offsetof(tp::abi::Frame, line) == offsetof(oomflight_frame, line));
static_assert(sizeof(tp::abi::DumpResult) == sizeof(oomflight_dump_result));
static_assert(std::is_same_v<tp::CApiTable::StackResolver, oomflight_stack_resolver>);

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

// ---- Python contexts: kept by the tracker, symbolised at the freeze ----

// A stand-in context: the line of the call site torch would have gathered (a CapturedTraceback in the extension).
using StandInContext = std::shared_ptr<void>;
StandInContext context_at(int line) { return std::make_shared<int>(line); }
int line_of(const StandInContext& c) { return *static_cast<const int*>(c.get()); }

TEST(ContextTable, KeepsEachContextUnderADeferredIdUntilTheHistoryNoLongerHoldsItsEvent) {
  tp::ContextTable<StandInContext> table(3);  // 6 slots
  EXPECT_EQ(table.put(nullptr), -1);
  std::vector<std::int32_t> ids;
  for (int line = 1; line <= 6; ++line) ids.push_back(table.put(context_at(line)));
  for (std::size_t i = 0; i < ids.size(); ++i) {
    EXPECT_LE(ids[i], -2);
    const auto found = table.find(ids[i]);
    ASSERT_TRUE(found.found) << i;
    EXPECT_EQ(line_of(found.context), static_cast<int>(i) + 1);
    EXPECT_EQ(found.stack_id, -1);
  }
  // Every slot is full: without a reclaim the next context is refused (no stack), never dropped on this path.
  const StandInContext seventh = context_at(7);
  EXPECT_EQ(table.put(seventh), -1);
  EXPECT_EQ(table.busy(), 1u);
  EXPECT_EQ(seventh.use_count(), 1) << "a refused context must not be kept";
  // The history keeps the newest 3 of the 7 events: the slots of the first 4 (the refused one had none) empty.
  EXPECT_EQ(table.reclaim(), 4u);
  EXPECT_FALSE(table.find(ids[0]).found);
  EXPECT_FALSE(table.find(ids[3]).found);
  EXPECT_TRUE(table.find(ids[4]).found);
  const std::int32_t eighth = table.put(context_at(8));
  ASSERT_LE(eighth, -2);
  EXPECT_NE(eighth, ids[0]) << "a deferred id names one event, not just its slot";
  EXPECT_EQ(line_of(table.find(eighth).context), 8);
  EXPECT_FALSE(table.find(ids[0]).found) << "slot reused: the old id must not find the new context";
  table.remember(eighth, 42);
  EXPECT_EQ(table.find(eighth).stack_id, 42);
  EXPECT_FALSE(table.find(-1).found);
  EXPECT_FALSE(table.find(std::numeric_limits<std::int32_t>::min()).found);
  EXPECT_THROW(tp::ContextTable<StandInContext>(0), std::invalid_argument);
}

TEST(ContextTable, ConcurrentTrackersAndAReclaimerNeverLoseOrDuplicateAContext) {
  tp::ContextTable<StandInContext> table(1000);
  std::atomic<bool> stop{false};
  std::thread reclaimer([&] {
    while (!stop.load()) table.reclaim();
  });
  std::vector<std::thread> devices;
  std::atomic<std::uint64_t> kept{0}, wrong{0};
  for (int device = 0; device < 4; ++device) {
    devices.emplace_back([&, device] {
      for (int i = 0; i < 50000; ++i) {
        const int line = device * 100000 + i;
        const std::int32_t id = table.put(context_at(line));
        if (id == -1) continue;
        ++kept;
        const auto found = table.find(id);  // just put: at most 1000 newer events can have come since
        if (found.found && line_of(found.context) != line) ++wrong;
      }
    });
  }
  for (auto& t : devices) t.join();
  stop = true;
  reclaimer.join();
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_EQ(kept.load() + table.busy(), 200000u);
  EXPECT_EQ(table.kept(), kept.load());
}

// The extension's resolver, with "symbolising" reading the stand-in's line: the same ContextTable::resolve.
struct StandInPlugin {
  explicit StandInPlugin(std::size_t keep) : table(keep) {}
  tp::ContextTable<StandInContext> table;
  int symbolised = 0;  // contexts symbolised, over all freezes
  static std::int32_t keep(void* sink, const void* context) noexcept {
    return static_cast<StandInPlugin*>(sink)->table.put(*static_cast<const StandInContext*>(context));
  }
  static int resolve(void* user, const std::int32_t* deferred, std::size_t count, std::int32_t* ids, std::uint32_t) {
    auto& p = *static_cast<StandInPlugin*>(user);
    p.table.resolve(deferred, count, ids,
                    [&](const std::vector<StandInContext>& contexts, const std::vector<std::int32_t>&,
                        std::vector<std::int32_t>& stack_ids) {
                      for (std::size_t k = 0; k < contexts.size(); ++k) {
                        const oomflight_frame frames[] = {{"forward", "model.py", line_of(contexts[k])},
                                                          {"train_step", "train.py", 7}};
                        oomflight_intern_stack(frames, 2, &stack_ids[k]);
                        ++p.symbolised;
                      }
                      return true;
                    });
    return 0;
  }
};

TEST_F(TraceTrackerTest, ContextsOfLiveEntriesBecomeTheArchivesStacksAtTheFreeze) {
  using Entry = torch211::TraceEntry<void*>;
  StandInPlugin plugin(100);
  tp::TraceTracker tracker(real_c_api());
  tracker.set_context_sink(&StandInPlugin::keep, &plugin);
  std::uint64_t max_entries = 0;
  ASSERT_EQ(oomflight_set_stack_resolver(&StandInPlugin::resolve, &plugin, &max_entries), OOMFLIGHT_OK);
  EXPECT_EQ(max_entries, 100000u);  // OOMFLIGHT_MAX_ENTRIES' default: the table keeps as many
  const auto entry = [&](Entry::Action action, std::uint64_t addr, std::uint64_t size, StandInContext context) {
    Entry e{};
    e.action_ = action;
    e.addr_ = addr;
    e.size_ = size;
    e.context_ = std::move(context);
    tracker.on_entry(e);
  };
  const StandInContext shared = context_at(12);  // torch gives a block's alloc and free the same context
  entry(Entry::Action::ALLOC, 0x1000, 512, shared);
  entry(Entry::Action::ALLOC, 0x2000, 512, context_at(13));
  entry(Entry::Action::FREE_REQUESTED, 0x1000, 512, shared);
  entry(Entry::Action::ALLOC, 0x3000, 512, nullptr);  // history without contexts: no stack
  ASSERT_EQ(tracker.on_out_of_memory(0, kMiB, 0, 0, nullptr, "CUDA out of memory"), OOMFLIGHT_OK);
  const oomflight::Archive archive = oomflight::read_archive(oomflight_last_dump_path());
  ASSERT_EQ(archive.events.size(), 5u);
  const auto lines = [&](std::size_t i) {
    std::vector<int> out;
    for (const auto* f : archive.stack(archive.events[i].stack_id)) out.push_back(f->line);
    return out;
  };
  EXPECT_EQ(lines(0), (std::vector<int>{12, 7}));
  EXPECT_EQ(lines(1), (std::vector<int>{13, 7}));
  EXPECT_EQ(lines(2), (std::vector<int>{12, 7}));
  EXPECT_EQ(archive.events[3].stack_id, -1);
  EXPECT_EQ(archive.events[4].stack_id, -1);  // the observer's oom event
  EXPECT_EQ(plugin.symbolised, 3);  // one per event with a context (each event keeps its own slot)
  // A second freeze symbolises only what is new: the first ones are remembered.
  entry(Entry::Action::ALLOC, 0x4000, 512, context_at(14));
  ASSERT_EQ(tracker.on_out_of_memory(0, kMiB, 0, 0, nullptr, "CUDA out of memory"), OOMFLIGHT_OK);
  EXPECT_EQ(plugin.symbolised, 4);
  const oomflight::Archive second = oomflight::read_archive(oomflight_last_dump_path());
  ASSERT_EQ(second.events.size(), 7u);
  EXPECT_EQ(second.stack(second.events[5].stack_id).at(0)->line, 14);
  EXPECT_EQ(second.stack(second.events[1].stack_id).at(0)->line, 13);
  oomflight_set_stack_resolver(nullptr, nullptr, nullptr);
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
