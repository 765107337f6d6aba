// Rows, headers and file names for dumps; the rank-local fallback writer.
#include "oomflight/dump_files.hpp"

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fmt/format.h>

#include "oomflight/archive_writer.hpp"
#include "oomflight/logging.hpp"

#ifndef OOMFLIGHT_VERSION
#define OOMFLIGHT_VERSION "0.0.0"
#endif

namespace oomflight {

RankRow make_rank_row(const RankIdentity& id, const FrozenHistory& h, bool is_origin, const TriggerInfo& trigger) {
  RankRow row;
  row.rank = id.rank;
  row.local_rank = id.local_rank;
  row.device = id.device;
  row.is_origin = is_origin ? 1 : 0;
  row.pid = id.pid;
  row.batch = h.batch;
  row.allocated_bytes = h.memory.allocated_bytes;
  row.reserved_bytes = h.memory.reserved_bytes;
  row.peak_allocated_bytes = h.memory.peak_allocated_bytes;
  row.peak_reserved_bytes = h.memory.peak_reserved_bytes;
  row.device_capacity_bytes = h.memory.device_capacity_bytes;
  row.device_free_bytes = is_origin && trigger.device_free_bytes ? trigger.device_free_bytes : h.memory.device_free_bytes;
  row.oom_requested_bytes = is_origin ? trigger.requested_bytes : 0;
  row.events_recorded = h.ring.recorded;
  row.overwritten = h.ring.overwritten;
  row.dropped = h.ring.dropped;
  row.unreadable = h.ring.in_flight;
  row.freeze_t_ns = h.freeze_t_ns;
  row.anchor_monotonic_ns = h.anchor_monotonic_ns;
  row.anchor_realtime_ns = h.anchor_realtime_ns;
  set_fixed_string(row.host, id.host);
  if (is_origin) set_fixed_string(row.reason, trigger.reason);
  return row;
}

ArchiveHeader make_header(const RankIdentity& id, std::string reason, std::vector<std::int32_t> origins,
                          std::vector<std::int32_t> ranks_present) {
  ArchiveHeader h;
  h.producer = producer_string();
  h.run_name = id.run_name;
  h.kind = "oom";
  h.created_at_utc = utc_now_iso8601();
  h.reason = std::move(reason);
  h.origin_ranks = std::move(origins);
  h.world_size = id.world_size;
  h.ranks_present = std::move(ranks_present);
  return h;
}

std::string prepare_dump_path(const Config& config, const FilenameTemplate& name, const TemplateValues& values) {
  namespace fs = std::filesystem;
  const fs::path folder = config.folder.render(values);
  std::error_code ec;
  fs::create_directories(folder, ec);
  if (ec) throw std::runtime_error(fmt::format("cannot create folder '{}': {}", folder.string(), ec.message()));
  fs::path path = folder / name.render(values);
  if (config.overwrite || !fs::exists(path)) return path.string();
  const std::string stem = path.stem().string(), ext = path.extension().string();
  for (int i = 1;; ++i) {
    fs::path candidate = folder / fmt::format("{}-{}{}", stem, i, ext);
    if (!fs::exists(candidate)) return candidate.string();
  }
}

std::string write_rank_local(const Config& config, const RankIdentity& id, const ArchiveHeader& header,
                             const RankRow& row, const FrozenHistory& h, std::int64_t batch) {
  TemplateValues values{id.run_name, id.rank, id.local_rank, id.world_size, batch, id.pid, id.host, header.kind};
  RankDump dump{row, &h.ring.events, &h.stacks};
  std::string first_error;
  try {
    const std::string path = prepare_dump_path(config, config.rank_filename, values);
    write_archive(path, header, dump, MPI_COMM_NULL);
    return path;
  } catch (const std::exception& e) {
    first_error = e.what();
  }
  // The configured folder failed: keep the history anyway, somewhere that is almost always writable.
  const char* tmp = std::getenv("TMPDIR");
  Config fallback = config;
  fallback.folder = FilenameTemplate(fmt::format("{}/oomflight-{{run_name}}", tmp && *tmp ? tmp : "/tmp"));
  try {
    const std::string path = prepare_dump_path(fallback, config.rank_filename, values);
    write_archive(path, header, dump, MPI_COMM_NULL);
    log().warn("rank {}: {}; wrote the rank-local file to {} instead", id.rank, first_error, path);
    return path;
  } catch (const std::exception& e) {
    throw ArchiveError(fmt::format("{}; fallback failed too: {}", first_error, e.what()));
  }
}

std::string utc_now(const char* format) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[64];
  return std::string(buf, std::strftime(buf, sizeof(buf), format, &tm));
}

std::string producer_string() { return std::string("oomflight ") + OOMFLIGHT_VERSION; }

}  // namespace oomflight
