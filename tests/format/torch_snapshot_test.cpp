// Decoding the real snapshots: action counts as published with the fixtures, stacks, old and new formats.
#include <gtest/gtest.h>

#include <map>

#include "oomflight/format/torch_snapshot.hpp"
#include "test_support.hpp"

namespace oomflight {
namespace {

std::map<Action, std::size_t> count_actions(const TorchSnapshot& s) {
  std::map<Action, std::size_t> counts;
  for (const auto& e : s.device_traces.at(0)) ++counts[e.action];
  return counts;
}

struct Expected {
  const char* file;
  std::size_t events;
  std::map<Action, std::size_t> actions;
  bool allocator_settings;
};

void expect_decoded(const std::string& path, const Expected& x) {
  StackTable stacks;
  const TorchSnapshot s = read_torch_snapshot(path, stacks);
  ASSERT_EQ(s.device_traces.size(), 1u) << x.file;
  EXPECT_EQ(s.device_traces[0].size(), x.events) << x.file;
  EXPECT_EQ(count_actions(s), x.actions) << x.file;
  EXPECT_EQ(s.has_allocator_settings, x.allocator_settings) << x.file;
  EXPECT_TRUE(s.has_time_us) << x.file;
  EXPECT_EQ(s.skipped_unknown_actions, 0u);
  EXPECT_FALSE(s.segments.empty());
  EXPECT_GT(stacks.size(), 10u) << x.file;
}

// Counted with Python's pickle: collections.Counter(e["action"] for e in snapshot["device_traces"][0]).
TEST(TorchSnapshot, DecodesTheProjectsOwnSnapshot) {
  expect_decoded(test::own_snapshot(),
                 {"h200-transformer-lm-step1.pickle", 3600,
                  {{Action::alloc, 1332}, {Action::free_requested, 1101}, {Action::free_completed, 1101},
                   {Action::segment_alloc, 66}},
                  true});
}

TEST(TorchSnapshot, DecodesEverySharedSnapshot) {
  const std::vector<Expected> expected = {
      {"cnn-train-eor.pickle", 5803,
       {{Action::alloc, 1935}, {Action::free_requested, 1926}, {Action::free_completed, 1926},
        {Action::segment_alloc, 7}, {Action::snapshot, 9}},
       false},
      {"transformer-lm-fullstep-ctx128.pickle", 19342,
       {{Action::alloc, 6771}, {Action::free_requested, 5894}, {Action::free_completed, 5894},
        {Action::segment_alloc, 783}},
       true},
      {"transformer-lm-forward-mixed-ctx128.pickle", 5992,
       {{Action::alloc, 2703}, {Action::free_requested, 1414}, {Action::free_completed, 1414},
        {Action::segment_alloc, 461}},
       true},
  };
  for (const auto& x : expected) {
    OOMFLIGHT_SHARED_SNAPSHOT_OR_SKIP(path, x.file);
    expect_decoded(path, x);
  }
}

TEST(TorchSnapshot, FramesBecomeInternedStacksInnermostFirst) {
  StackTable stacks;
  const TorchSnapshot s = read_torch_snapshot(test::own_snapshot(), stacks);
  const TraceEntry& first = s.device_traces[0][0];
  ASSERT_NE(first.stack_id, kNoStack);
  const StackTableCopy t = stacks.copy();
  const InternedStack& rec = t.stacks.at(static_cast<std::size_t>(first.stack_id));
  ASSERT_GT(rec.frame_count, 3u);
  const InternedFrame& innermost = t.frames.at(t.stack_frames.at(rec.frame_offset));
  EXPECT_EQ(t.strings.at(innermost.function), "torch::unwind::unwind()");
}

TEST(TorchSnapshot, SnapshotEntriesCarryNoStack) {
  // The CNN's trace holds 9 `snapshot` entries (torch's marker of a _snapshot call), which have no frames.
  OOMFLIGHT_SHARED_SNAPSHOT_OR_SKIP(cnn, "cnn-train-eor.pickle");
  StackTable stacks;
  const TorchSnapshot s = read_torch_snapshot(cnn, stacks);
  std::size_t snapshots = 0;
  for (const auto& e : s.device_traces[0]) {
    if (e.action == Action::snapshot) {
      EXPECT_EQ(e.stack_id, kNoStack);
      ++snapshots;
    }
  }
  EXPECT_EQ(snapshots, 9u);
}

TEST(TorchSnapshot, NotASnapshotNamesTheField) {
  // {"segments": []}: a valid pickle without device_traces.
  const std::string p = std::string("\x80\x04}\x8c\x08segments]s.", 16);
  const auto doc = pickle::Document::parse(p);
  StackTable stacks;
  try {
    decode_torch_snapshot(doc, stacks);
    FAIL();
  } catch (const SnapshotError& e) {
    EXPECT_NE(std::string(e.what()).find("'device_traces' is missing"), std::string::npos) << e.what();
  }
}

// {"segments": [], "device_traces": [T] * 1000} with T = [E] * 1000 and E one entry dict: 13 values and 4 KB
// that a naive decoder turns into a million trace entries.
TEST(TorchSnapshot, EntriesSharedThroughTheMemoAreRefusedBeforeTheyMultiply) {
  static constexpr char head[] = "\x80\x04}\x94(\x8c\x08segments]\x8c\x0d" "device_traces]\x94(]\x94(}\x94(";
  static constexpr char entry[] = "\x8c\x06" "action\x8c\x05" "alloc\x8c\x04" "addrK\x01\x8c\x04sizeK\x02u";
  std::string p(head, sizeof head - 1);
  p += std::string(entry, sizeof entry - 1);
  for (int i = 0; i < 999; ++i) p += std::string("h\x03", 2);
  p += 'e';
  for (int i = 0; i < 999; ++i) p += std::string("h\x02", 2);
  p += "eu.";
  const auto doc = pickle::Document::parse(p);
  ASSERT_EQ(doc.value_count(), 13u);
  ASSERT_EQ(doc.root().get("device_traces")->size(), 1000u);
  StackTable stacks;
  try {
    decode_torch_snapshot(doc, stacks);
    FAIL();
  } catch (const SnapshotError& e) {
    EXPECT_NE(std::string(e.what()).find("device_traces[0]: decodes to more segments, blocks and trace entries than "
                                         "the pickle holds values (13)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace oomflight
