// Deferred stack ids: a source records events with ids <= -2 and a resolver turns them into interned stacks at the
// freeze (the PyTorch plugin's Python contexts). What reaches the frozen copy is an interned id or -1, never a
// deferred id, never an id the table does not hold.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <vector>

#include "oomflight/record/recorder.hpp"

namespace oomflight {
namespace {

struct Calls {
  Recorder* recorder = nullptr;
  std::vector<std::vector<std::int32_t>> asked;  // the deferred ids of each call
  std::uint32_t timeout_ms = 0;
  std::map<std::int32_t, int> line_of;  // deferred id -> the line of its one frame; absent: unresolved
  std::int32_t bogus = -1;              // an answer to give for every id instead (a resolver's bug)
};

int resolve(void* user, const std::int32_t* deferred, std::size_t count, std::int32_t* ids, std::uint32_t timeout) {
  auto& calls = *static_cast<Calls*>(user);
  calls.asked.emplace_back(deferred, deferred + count);
  calls.timeout_ms = timeout;
  for (std::size_t i = 0; i < count; ++i) {
    if (calls.bogus != -1) {
      ids[i] = calls.bogus;
      continue;
    }
    const auto it = calls.line_of.find(deferred[i]);
    if (it == calls.line_of.end()) continue;  // left at -1
    const FrameRef frame{"forward", "model.py", it->second};
    ids[i] = calls.recorder->intern_stack({&frame, 1});
  }
  return 0;
}

TEST(DeferredStacks, TheResolverTurnsEachDistinctIdIntoAnInternedStackOnceAtTheFreeze) {
  Recorder recorder(100);
  Calls calls;
  calls.recorder = &recorder;
  calls.line_of = {{-2, 10}, {-3, 20}};
  recorder.set_stack_resolver(&resolve, &calls);
  recorder.set_resolve_timeout(123);
  const FrameRef existing{"main", "train.py", 1};
  const std::int32_t interned = recorder.intern_stack({&existing, 1});
  recorder.record(Action::alloc, 0, 0x100, 512, 0, -2);
  recorder.record(Action::alloc, 0, 0x200, 512, 0, -3);
  recorder.record(Action::free_requested, 0, 0x100, 512, 0, -2);  // the same context twice: asked once
  recorder.record(Action::alloc, 0, 0x300, 512, 0, -4);            // the resolver cannot: no stack
  recorder.record(Action::alloc, 0, 0x400, 512, 0, interned);      // an interned id passes untouched
  recorder.record(Action::alloc, 0, 0x500, 512, 0, kNoStack);
  const FrozenHistory h = recorder.freeze();
  ASSERT_EQ(calls.asked.size(), 1u);
  EXPECT_EQ(calls.asked[0], (std::vector<std::int32_t>{-4, -3, -2}));
  EXPECT_EQ(calls.timeout_ms, 123u);
  ASSERT_EQ(h.ring.events.size(), 6u);
  const auto line = [&](const Event& e) {
    const InternedStack& s = h.stacks.stacks.at(static_cast<std::size_t>(e.stack_id));
    return h.stacks.frames.at(h.stacks.stack_frames.at(s.frame_offset)).line;
  };
  EXPECT_EQ(line(h.ring.events[0]), 10);
  EXPECT_EQ(line(h.ring.events[1]), 20);
  EXPECT_EQ(h.ring.events[2].stack_id, h.ring.events[0].stack_id);
  EXPECT_EQ(h.ring.events[3].stack_id, kNoStack);
  EXPECT_EQ(h.ring.events[4].stack_id, interned);
  EXPECT_EQ(h.ring.events[5].stack_id, kNoStack);
  EXPECT_EQ(h.unresolved_stacks, 1u);
  EXPECT_EQ(h.stacks.stacks.size(), 3u);  // the stack interned before, and the two the resolver interned
}

TEST(DeferredStacks, WithoutAResolverOrWithABadAnswerDeferredIdsBecomeNoStack) {
  Recorder recorder(100);
  recorder.record(Action::alloc, 0, 0x100, 512, 0, -2);
  recorder.record(Action::alloc, 0, 0x200, 512, 0, -2000000000);
  FrozenHistory h = recorder.freeze();
  EXPECT_EQ(h.ring.events[0].stack_id, kNoStack);
  EXPECT_EQ(h.ring.events[1].stack_id, kNoStack);
  EXPECT_EQ(h.unresolved_stacks, 2u);
  Calls calls;
  calls.recorder = &recorder;
  calls.bogus = 7;  // no stack 7 in the table
  recorder.set_stack_resolver(&resolve, &calls);
  h = recorder.freeze();
  EXPECT_EQ(calls.asked.size(), 1u);
  EXPECT_EQ(h.ring.events[0].stack_id, kNoStack);
  EXPECT_EQ(h.unresolved_stacks, 2u);
  recorder.set_stack_resolver(nullptr, nullptr);
  h = recorder.freeze();
  EXPECT_EQ(calls.asked.size(), 1u);
}

}  // namespace
}  // namespace oomflight
