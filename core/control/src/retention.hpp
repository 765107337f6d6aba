// Retention, as gpumemprof's and Composer's snapshot callbacks have it: after each archive, one rank removes this
// run's oldest archives from the archive's folder beyond OOMFLIGHT_MAX_DUMPS, or beyond OOMFLIGHT_MAX_TOTAL_MB.
#pragma once

#include <string>

#include "oomflight/control/config.hpp"

namespace oomflight {

/// Prunes the folder of `written` (an archive just written and verified). The candidates are the files there
/// that are complete archives (root attributes read, nothing else) of `run_name` and of this job (`job_id`: two
/// jobs of one run name in one folder each keep their own; issue 30: each removed the other's) holding more than
/// one rank, or of a world of one: rank-local files, other jobs' archives and foreign files are never touched. Oldest first by their creation time
/// (created_at_utc, then the file's modification time). `written` is never removed. Each removal is logged; errors are logged
/// and do not throw. Call it from one rank only (the one that logs the archive).
void prune_archives(const std::string& written, const std::string& run_name, const std::string& job_id,
                    const Config& config);

}  // namespace oomflight
