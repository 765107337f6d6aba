// Interned call stacks: strings, frames and stacks stored once and referred to by id.
//
// A stack is a run of frame ids in `stack_frames`, innermost frame first (PyTorch's order); a frame names its
// function and file by string id. This is the recorder's own in-memory layout; the archive's rows
// (oomflight/format/archive_schema.hpp) have the same shape, and the writer converts one into the other.
#pragma once

#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "oomflight/api.h"

namespace oomflight {

/// A frame as a source gives it (a view, not owned). line 0 means unknown (as in PyTorch's C++ frames).
struct FrameRef {
  std::string_view function;
  std::string_view file;
  std::int32_t line = 0;
};

/// A frame in the table: string ids into StackTableCopy::strings.
struct InternedFrame {
  std::uint32_t function = 0;
  std::uint32_t file = 0;
  std::int32_t line = 0;  ///< 0: unknown
};

/// A stack in the table: frames stack_frames[frame_offset .. frame_offset + frame_count), innermost first.
struct InternedStack {
  std::uint64_t frame_offset = 0;
  std::uint32_t frame_count = 0;
};

/// A self-contained copy of a StackTable: ids are indices into these vectors.
struct StackTableCopy {
  std::vector<std::string> strings;
  std::vector<InternedFrame> frames;
  std::vector<std::uint32_t> stack_frames;  ///< frame ids, stack after stack
  std::vector<InternedStack> stacks;
};

/// Interns stacks. Not on the hot path: stacks are captured only when asked, and interning hashes every frame.
/// Thread-safety: all members are safe to call from any thread (one mutex).
class OOMFLIGHT_API StackTable {
 public:
  /// Interns the stack (innermost frame first) and returns its id (0, 1, 2, ...). The same frames give the same
  /// id. An empty span is a valid (empty) stack. Allocates only for strings, frames and stacks not seen before.
  /// Throws std::length_error when the table already holds 2^31 - 1 stacks, std::bad_alloc when memory runs out.
  std::int32_t intern(std::span<const FrameRef> frames);

  /// Interns one frame and returns its id (an index into StackTableCopy::frames). For sources that see the same
  /// frame many times (a PyTorch snapshot shares each frame dict among every stack that holds it): intern each
  /// once, then intern stacks by id. Throws std::bad_alloc.
  std::uint32_t intern_frame(const FrameRef& frame);

  /// Interns a stack given by frame ids (from intern_frame), innermost first; the same id as intern() gives for
  /// the same frames. Throws std::invalid_argument for an id that intern_frame() never returned, and as intern().
  std::int32_t intern_frame_ids(std::span<const std::uint32_t> frame_ids);

  /// Copies the whole table (for a dump). Thread-safe with concurrent intern(). Throws std::bad_alloc.
  StackTableCopy copy() const;

  /// Number of distinct stacks interned so far.
  std::size_t size() const;

 private:
  std::uint32_t intern_string(std::string_view s);
  std::uint32_t intern_frame_locked(const FrameRef& f);
  std::int32_t intern_scratch_locked();  // the stack of frame ids in scratch_

  // Heterogeneous lookup: a string_view finds a std::string key without building one.
  struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };

  struct FrameKey {
    std::uint32_t function, file;
    std::int32_t line;
    bool operator==(const FrameKey&) const = default;
  };
  struct FrameKeyHash {
    std::size_t operator()(const FrameKey& k) const noexcept {
      return (static_cast<std::size_t>(k.function) * 0x9E3779B97F4A7C15ull) ^ (static_cast<std::size_t>(k.file) << 21) ^
             static_cast<std::size_t>(k.line);
    }
  };

  mutable std::mutex mutex_;
  StackTableCopy table_;
  std::unordered_map<std::string, std::uint32_t, StringHash, std::equal_to<>> string_ids_;
  std::unordered_map<FrameKey, std::uint32_t, FrameKeyHash> frame_ids_;
  std::unordered_map<std::string, std::int32_t, StringHash, std::equal_to<>> stack_ids_;  // key: the ids' bytes
  std::vector<std::uint32_t> scratch_;
};

}  // namespace oomflight
