// The text report: the post-mortem of an archive rendered for a terminal (`oomflight report`).
#pragma once

#include <cstddef>
#include <string>

#include "oomflight/analysis/post_mortem.hpp"
#include "oomflight/api.h"
#include "oomflight/format/archive_reader.hpp"

namespace oomflight {

/// Renders the post-mortem as text: origins, the failed request, a per-rank table, the largest live allocations
/// of each origin with their top `frames` frames (Python frames first), and every other rank's headroom.
/// Pure; thread-safe; allocates the result.
OOMFLIGHT_API std::string render_report(const Archive& archive, const PostMortem& pm, std::size_t frames = 6);

}  // namespace oomflight
