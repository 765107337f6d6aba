// An archive as one Chrome trace (JSON), the format Perfetto (ui.perfetto.dev) and chrome://tracing open:
// `oomflight export --format perfetto`.
#pragma once

#include <string>

#include "oomflight/api.h"
#include "oomflight/format/archive_reader.hpp"

namespace oomflight {

/// Renders every rank of `archive` as one trace on one time axis (the ranks' clock anchors applied; ts in
/// microseconds from the earliest event of any rank). Format: Chrome's Trace Event Format ("JSON Object
/// Format": {"traceEvents": [...]}). Per rank: one process (pid = rank, named "rank N", sorted by rank, the
/// origins' names end in "(out of memory)" or "(asked for the dump)"); a counter track "memory" with
/// "allocated" and "reserved" bytes after every event that changes them, anchored on the archive's figures: at
/// the end of every batch of /batches the counter is that row's figures, at the trigger the rank's (the history's
/// sums, which count requests rather than the allocator's blocks, are shifted batch by batch to meet them); each
/// batch as a complete slice ("batch N", from /batches, else from the step
/// markers) on thread 0; each oom event as a process-scoped instant event with the request and the device's free
/// bytes. Pure; thread-safe.
OOMFLIGHT_API std::string render_perfetto(const Archive& archive);

}  // namespace oomflight
