// The post-mortem's what-if line (issue 41, item 4): whether an OOM origin's recorded history fits its limit with
// expandable_segments:True, replayed through the allocator model. The text report and the HTML page say it alike.
#pragma once

#include <string>

#include "oomflight/analysis/post_mortem.hpp"
#include "oomflight/format/archive_reader.hpp"

namespace oomflight {

/// "with expandable_segments:True (the allocator model; ...): still short by 342.00 MiB when 998.05 MiB is asked
/// for (entry 2197)", or "... it fits, 1.20 GiB to spare at its peak", or, for a job that ran with expandable
/// segments already, that it did. Empty when nothing can be said: no limit known, no trace, a trace without the
/// failed request (its oom entry), a history whose segments the export had to make up (its allocator state is not
/// in the archive), or one the model cannot replay. Never throws.
std::string expandable_what_if_text(const Archive& archive, const RankSummary& origin);

}  // namespace oomflight
