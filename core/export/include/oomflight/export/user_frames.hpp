// Which frames of a stack say who allocated: the rule every rendering (text, HTML, folded stacks, whatif's failing
// allocation) shares, over an archive's frames or any other source's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "oomflight/api.h"
#include "oomflight/format/archive_reader.hpp"

namespace oomflight {

/// A frame as text (views, not owned): a source's own (a snapshot pickle's StackTable) or an archive's.
struct FrameText {
  std::string_view function;
  std::string_view file;
  std::int32_t line = 0;  ///< 0: unknown
};

/// True for the allocator's own frames, which sit on top of every stack and say nothing about who allocated
/// (memory_viz hides them the same way): the caching allocator, the unwinder, the empty-tensor factories,
/// PyTorch's memory module, and oomflight's own hooks. Pure.
OOMFLIGHT_API bool allocator_frame(std::string_view function, std::string_view file);
OOMFLIGHT_API bool allocator_frame(const Archive& a, const FrameRow& f);

/// At most `n` frames of a stack worth showing, innermost first, as indices into `frames` (innermost first): its
/// Python frames that are not the allocator's own (the user's code); when it has none, any frame with a known file
/// that is not the allocator's own. Pure.
OOMFLIGHT_API std::vector<std::size_t> frames_to_show(std::span<const FrameText> frames, std::size_t n);

/// The same over an archive's stack. Empty for kNoStack. Pure; the pointers point into `a`.
OOMFLIGHT_API std::vector<const FrameRow*> frames_to_show(const Archive& a, std::int32_t stack_id, std::size_t n);

/// Those frames as a terminal report prints them, one per line after `indent`: "function (file:line)", the function
/// cut at 120 characters ("..."), every text made printable (printable.hpp). Empty for kNoStack. Pure.
OOMFLIGHT_API std::string frame_lines(const Archive& a, std::int32_t stack_id, std::size_t n,
                                      std::string_view indent);

}  // namespace oomflight
