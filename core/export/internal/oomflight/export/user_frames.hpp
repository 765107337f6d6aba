// Which frames of a stack say who allocated: the rule every rendering (text, HTML, folded stacks) shares.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "oomflight/format/archive_reader.hpp"

namespace oomflight {

/// True for the allocator's own frames, which sit on top of every stack and say nothing about who allocated
/// (memory_viz hides them the same way): the caching allocator, the unwinder, the empty-tensor factories,
/// PyTorch's memory module, and oomflight's own hooks. Pure.
bool allocator_frame(const Archive& a, const FrameRow& f);

/// At most `n` frames of a stack worth showing, innermost first: its Python frames that are not the allocator's
/// own (the user's code); when it has none, any frame with a known file that is not the allocator's own. Empty
/// for kNoStack. Pure; the pointers point into `a`.
std::vector<const FrameRow*> frames_to_show(const Archive& a, std::int32_t stack_id, std::size_t n);

}  // namespace oomflight
