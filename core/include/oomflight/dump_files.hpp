// Turning a frozen history into archive rows, and choosing where a dump's file goes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "oomflight/archive_format.hpp"
#include "oomflight/config.hpp"
#include "oomflight/dump.hpp"
#include "oomflight/export.hpp"
#include "oomflight/recorder.hpp"

namespace oomflight {

/// Who this process is, for file names and the /ranks row.
struct RankIdentity {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int device = 0;
  std::int64_t pid = 0;
  std::string host;
  std::string run_name;
};

/// The /ranks row for a frozen history (offsets are the writer's job).
OOMFLIGHT_API RankRow make_rank_row(const RankIdentity& id, const FrozenHistory& h, bool is_origin,
                                    const TriggerInfo& trigger);

/// Root attributes for a dump of kind "oom" with the given origins and ranks present.
OOMFLIGHT_API ArchiveHeader make_header(const RankIdentity& id, std::string reason, std::vector<std::int32_t> origins,
                                        std::vector<std::int32_t> ranks_present);

/// Renders folder/name for the given template, creates the folder (like mkdir -p) and, unless overwrite,
/// picks a name that does not exist yet ("oom.3.h5", then "oom.3-1.h5", "oom.3-2.h5", ...).
/// Throws std::runtime_error naming the folder when it cannot be created.
OOMFLIGHT_API std::string prepare_dump_path(const Config& config, const FilenameTemplate& name,
                                            const TemplateValues& values);

/// Writes this rank's history alone: first under the configured folder, and if that fails under
/// $TMPDIR/oomflight-{run_name} (or /tmp), so that nothing is lost to an unwritable folder or a full disk.
/// Returns the path written. Throws ArchiveError when both fail.
OOMFLIGHT_API std::string write_rank_local(const Config& config, const RankIdentity& id, const ArchiveHeader& header,
                                           const RankRow& row, const FrozenHistory& h, std::int64_t batch);

/// Current UTC time formatted with strftime's `format` (at most 63 characters).
OOMFLIGHT_API std::string utc_now(const char* format);

/// Current UTC time as ISO 8601 ("2026-11-21T10:15:02Z").
inline std::string utc_now_iso8601() { return utc_now("%Y-%m-%dT%H:%M:%SZ"); }

/// "oomflight 0.1.0".
OOMFLIGHT_API std::string producer_string();

}  // namespace oomflight
