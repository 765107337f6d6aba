// Retention (retention.hpp).
#include "retention.hpp"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "oomflight/base/log.hpp"
#include "oomflight/base/units.hpp"
#include "oomflight/format/archive_reader.hpp"

namespace oomflight {

void prune_archives(const std::string& written, const std::string& run_name, const std::string& job_id,
                    const Config& config) {
  if (!config.max_dumps && !config.max_total_bytes) return;
  namespace fs = std::filesystem;
  struct Candidate {
    fs::path path;
    std::string created;  // UTC to the second
    fs::file_time_type modified;  // finer: orders archives of the same second
    std::uint64_t bytes;
  };
  std::vector<Candidate> archives;
  std::error_code ec;
  const fs::path folder = fs::path(written).parent_path();
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    if (!entry.is_regular_file(ec) || entry.path().extension() != ".h5") continue;
    try {
      const ArchiveHeader h = read_archive_header(entry.path().string());
      const bool whole = h.ranks_present.size() > 1 || h.world_size == 1;
      if (h.run_name != run_name || h.job_id != job_id || !whole) continue;
      archives.push_back({entry.path(), h.created_at_utc, entry.last_write_time(ec),
                          static_cast<std::uint64_t>(entry.file_size(ec))});
    } catch (const std::exception&) {
      continue;  // not an archive of ours: never touched
    }
  }
  std::sort(archives.begin(), archives.end(), [](const Candidate& a, const Candidate& b) {
    if (a.created != b.created) return a.created < b.created;
    return a.modified != b.modified ? a.modified < b.modified : a.path.filename() < b.path.filename();
  });
  std::uint64_t total = 0;
  for (const auto& a : archives) total += a.bytes;
  std::size_t kept = archives.size();
  const fs::path just = fs::path(written);
  for (const auto& a : archives) {
    const bool too_many = config.max_dumps && kept > *config.max_dumps;
    const bool too_big = config.max_total_bytes && total > *config.max_total_bytes;
    if (!too_many && !too_big) break;
    if (fs::equivalent(a.path, just, ec)) continue;
    if (!fs::remove(a.path, ec)) {
      log().warn("retention: cannot remove {}: {}", a.path.string(), ec ? ec.message() : "gone");
      continue;
    }
    --kept;
    total -= a.bytes;
    log().info("retention: removed {} ({}; {} archives of this job, {} in all, remain)", a.path.string(),
               too_many ? fmt::format("OOMFLIGHT_MAX_DUMPS={}", *config.max_dumps)
                        : fmt::format("OOMFLIGHT_MAX_TOTAL_MB={}", *config.max_total_bytes / 1000000),
               kept, format_bytes(total));
  }
}

}  // namespace oomflight
