// Live memory as folded stacks, the input of flame-graph tools (Brendan Gregg's flamegraph.pl, speedscope,
// inferno): `oomflight export --format folded`.
#pragma once

#include <string>

#include "oomflight/api.h"
#include "oomflight/format/archive_reader.hpp"

namespace oomflight {

/// One line per distinct stack of live blocks at the freeze: "rank N;outermost frame;...;innermost frame BYTES",
/// frames as "function (file:line)", the allocator's own frames left out (user_frames rule), ';' inside a name
/// replaced by ':', control characters, bidirectional overrides and bytes that are not UTF-8 shown as escapes
/// (printable.hpp). Live blocks are those allocated in the history and not freed (free_completed), as the
/// report counts them. A block without a stack gets the frame "<no stack recorded>". Lines sorted, counts in
/// bytes. Pure; thread-safe.
OOMFLIGHT_API std::string render_folded(const Archive& archive);

}  // namespace oomflight
