// The memory event: one fixed-size plain record, the unit the ring stores and the archive writes.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>

#include "oomflight/api.h"

namespace oomflight {

/// What happened. The first nine values are PyTorch's `TraceEntry` actions
/// (c10/cuda/CUDACachingAllocator.h, `TraceEntry::Action`), with the same names and meanings; `step` is ours
/// and marks the start of a batch. The numeric values are the archive's enumeration values (schema v1):
/// never renumber, only append.
enum class Action : std::uint8_t {
  alloc = 0,           ///< a block was handed out; addr, size of the block
  free_requested = 1,  ///< the program freed the block; its memory may still be in use by a stream
  free_completed = 2,  ///< the block went back to the allocator's cache
  segment_alloc = 3,   ///< the allocator reserved a segment from the device (cudaMalloc)
  segment_free = 4,    ///< the allocator returned a segment to the device (cudaFree)
  segment_map = 5,     ///< expandable segments: pages mapped into a segment
  segment_unmap = 6,   ///< expandable segments: pages unmapped
  oom = 7,             ///< an allocation failed: size = requested bytes, addr = device free bytes (as PyTorch)
  snapshot = 8,        ///< a snapshot was taken here
  step = 9,            ///< oomflight: a batch started; batch = its number
};

/// Number of Action values; valid values are 0 .. kActionCount - 1.
inline constexpr int kActionCount = 10;

/// The action's name as PyTorch spells it ("alloc", "free_requested", ...), or "step".
/// Thread-safe; the view points at static storage.
OOMFLIGHT_API std::string_view action_name(Action action);

/// Parses an action name (exact, lower case). Returns nothing for an unknown name.
OOMFLIGHT_API std::optional<Action> action_from_name(std::string_view name);

/// A stack id meaning "no stack was captured". Exports write no `frames` key for it, as PyTorch writes none for a
/// trace entry or block recorded without context (torch/csrc/cuda/memory_snapshot.cpp); an empty stack (interned
/// with no frames) is written as `frames: []`.
inline constexpr std::int32_t kNoStack = -1;

/// Event::flags bits (schema v1, archive member `flags`, since 0.2.1; absent in older files, read as 0).
/// The event stands for allocator state that existed before recording began (a segment or block already there when
/// the history starts: an imported snapshot's blocks that predate its trace, a replay's start state). Analyses count
/// it like any event; the memory_viz export leaves it out of `device_traces` and shows it in the end state only,
/// as PyTorch's own snapshot does.
inline constexpr std::uint8_t kEventPredatesHistory = 1;

/// One memory event. 48 bytes, trivially copyable, no padding holes.
/// Units: t_ns in nanoseconds of CLOCK_MONOTONIC; addr is a device address; size in bytes;
/// stream is the CUDA stream handle as an integer (PyTorch's trace does the same).
struct Event {
  std::int64_t t_ns = 0;           ///< monotonic clock, ns (see clock.hpp)
  std::uint64_t addr = 0;          ///< device address; for oom: device free bytes
  std::uint64_t size = 0;          ///< bytes; for oom: the requested allocation; for step: 0
  std::uint64_t stream = 0;        ///< stream handle
  std::int64_t batch = -1;         ///< batch counter when the event was recorded; -1 before the first batch
  /// id in the recorder's StackTable, or kNoStack; in the ring also a deferred id (<= -2) until the freeze
  std::int32_t stack_id = kNoStack;
  std::int16_t device = 0;         ///< device ordinal
  Action action = Action::alloc;   ///< what happened
  std::uint8_t flags = 0;          ///< kEvent* bits; zero for an event recorded live
};

static_assert(sizeof(Event) == 48, "Event is part of the archive format; its size must not change");
static_assert(std::is_trivially_copyable_v<Event>);

}  // namespace oomflight
