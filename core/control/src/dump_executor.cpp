// Dump execution: rows, root attributes, paths and the fallbacks of rank-local files.
#include "dump_executor.hpp"

#include "oomflight/control/oom_message.hpp"

#include "oomflight/format/archive_naming.hpp"

#include <cstdlib>
#include <filesystem>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "oomflight/base/log.hpp"
#include "oomflight/base/units.hpp"
#include "oomflight/base/utc_time.hpp"
#include "oomflight/version.h"

namespace oomflight {
RankDump DumpExecutor::dump_of(const RankRow& row, const FrozenHistory& h, const AllocatorStateRows* state) {
  return RankDump{.row = row, .events = h.ring.events, .stacks = &h.stacks, .batches = h.batches.rows,
                  .context = h.context,
                  .state_segments = state ? std::span<const StateSegmentRow>(state->segments)
                                          : std::span<const StateSegmentRow>(),
                  .state_blocks = state ? std::span<const StateBlockRow>(state->blocks) : std::span<const StateBlockRow>(),
                  .collectives = h.collectives.records, .communicators = h.communicators};
}


RankRow DumpExecutor::rank_row(const FrozenHistory& h, bool is_origin, const DumpRequest& request) const {
  RankRow row;
  row.rank = id_.rank;
  row.local_rank = id_.local_rank;
  row.device = h.device;
  row.is_origin = is_origin ? 1 : 0;
  row.pid = id_.pid;
  row.batch = h.batch;
  row.allocated_bytes = h.memory.allocated_bytes;
  row.reserved_bytes = h.memory.reserved_bytes;
  row.peak_allocated_bytes = h.memory.peak_allocated_bytes;
  row.peak_reserved_bytes = h.memory.peak_reserved_bytes;
  row.outside_allocator_bytes = h.outside_allocator_bytes;
  row.device_capacity_bytes = is_origin && request.device_capacity_bytes ? request.device_capacity_bytes
                                                                          : h.memory.device_capacity_bytes;
  row.device_free_bytes =
      is_origin && request.device_free_bytes ? request.device_free_bytes : h.memory.device_free_bytes;
  // The cap an allocator hook published wins over the one a message states (the torch observer's reason states the
  // cap it published, and the figure is then the allocator's, not the message's).
  const bool published_cap = h.memory.memory_cap_bytes != 0;
  row.memory_cap_bytes = published_cap ? h.memory.memory_cap_bytes : is_origin ? request.memory_cap_bytes : 0;
  row.oom_requested_bytes = is_origin ? request.requested_bytes : 0;
  row.numbers_from_message = is_origin ? request.numbers_from_message & ~(published_cap ? kFromMessageCap : 0u) : 0;
  row.events_recorded = h.ring.recorded;
  row.overwritten = h.ring.overwritten;
  row.collectives_recorded = h.collectives.recorded;
  row.collectives_overwritten = h.collectives.overwritten;
  row.collectives_in_flight = h.collectives.in_flight;
  row.dropped = h.ring.dropped;
  row.unreadable = h.ring.in_flight;
  row.freeze_t_ns = h.freeze_t_ns;
  row.anchor_monotonic_ns = h.anchor_monotonic_ns;
  row.anchor_realtime_ns = h.anchor_realtime_ns;
  set_fixed_string(row.host, id_.host);
  if (is_origin) set_fixed_string(row.reason, request.reason);
  return row;
}

ArchiveHeader DumpExecutor::header(DumpKind kind, std::int64_t batch, std::string reason,
                                   std::vector<std::int32_t> origins, std::vector<std::int32_t> ranks_present) const {
  ArchiveHeader h;
  h.dump_batch = batch;
  h.producer = "oomflight " OOMFLIGHT_VERSION_STRING;
  h.run_name = id_.run_name;
  h.job_id = id_.job_id;
  h.kind = std::string(dump_kind_name(kind));
  h.created_at_utc = utc_now_iso8601();
  h.reason = std::move(reason);
  h.origin_ranks = std::move(origins);
  h.world_size = id_.world_size;
  h.ranks_present = std::move(ranks_present);
  return h;
}

TemplateValues DumpExecutor::template_values(DumpKind kind, std::int64_t batch) const {
  return TemplateValues{id_.run_name, id_.rank,    id_.local_rank, id_.world_size,
                        batch,        id_.pid,     id_.host,       std::string(dump_kind_name(kind))};
}

std::string DumpExecutor::prepare_path(const FilenameTemplate& folder_template, const FilenameTemplate& name,
                                       const TemplateValues& values) const {
  return prepare_rendered_path(folder_template.render(values), name.render(values));
}

std::string DumpExecutor::prepare_rendered_path(const std::filesystem::path& folder_name,
                                                const std::filesystem::path& file_name) const {
  namespace fs = std::filesystem;
  // The name may hold subfolders too (OOMFLIGHT_FILENAME=by-batch/{batch}/oom.h5): create the whole parent.
  fs::path path = fs::absolute(folder_name / file_name);
  const fs::path folder = path.parent_path();
  std::error_code ec;
  fs::create_directories(folder, ec);
  if (ec) throw std::runtime_error(fmt::format("cannot create folder '{}': {}", folder.string(), ec.message()));
  if (config_.overwrite) return path.string();
  // A free name now: STEM-1.h5 after this job's own archive, STEM.JOB.h5 after another job's (archive_naming.hpp).
  // The writer's rename claims it, and takes the next one if another process got there first.
  return format_detail::free_name(path.string(), id_.job_id);
}

std::string DumpExecutor::archive_path(DumpKind kind, std::int64_t batch) const {
  return prepare_path(config_.folder, config_.filename, template_values(kind, batch));
}

std::string DumpExecutor::write_rank_local(const ArchiveHeader& header, const RankRow& row, const FrozenHistory& h,
                                           std::int64_t batch, Durability durability,
                                           const AllocatorStateRows* state) const {
  const auto kind = dump_kind_from_name(header.kind).value_or(DumpKind::oom);
  return write_rank_local(header, dump_of(row, h, state), kind, batch, durability);
}

std::string DumpExecutor::write_rank_local(const ArchiveHeader& header, const RankDump& dump, DumpKind kind,
                                           std::int64_t batch, Durability durability) const {
  const TemplateValues values = template_values(kind, batch);
  std::string first_error;
  try {
    const std::string path = prepare_path(config_.folder, config_.rank_filename, values);
    return write_archive(path, header, dump, durability, naming());
  } catch (const std::exception& e) {
    first_error = e.what();
  }
  // The configured folder failed: keep the history anyway, somewhere that is almost always writable.
  // An absolute OOMFLIGHT_RANK_FILENAME would make the fallback the same failed path: its path goes under the
  // fallback folder instead, as a relative one would (/mnt/full/r0.h5 -> $TMPDIR/oomflight-RUN/mnt/full/r0.h5).
  const char* tmp = std::getenv("TMPDIR");
  const std::filesystem::path fallback_folder =
      std::filesystem::path(tmp && *tmp ? tmp : "/tmp") / ("oomflight-" + id_.run_name);
  const std::filesystem::path name(config_.rank_filename.render(values));
  try {
    const std::string path = write_archive(
        prepare_rendered_path(fallback_folder, name.is_absolute() ? name.relative_path() : name), header, dump,
        durability, naming());
    log().warn("{}; wrote the rank-local file to {} instead", first_error, path);
    return path;
  } catch (const std::exception& e) {
    throw ArchiveError(fmt::format("{}; fallback failed too: {}", first_error, e.what()));
  }
}

DumpResult DumpExecutor::write_single_rank(const ArchiveHeader& header, const RankRow& row, const FrozenHistory& h,
                                           std::int64_t batch, const AllocatorStateRows* state) const {
  DumpResult r;
  r.kind = dump_kind_from_name(header.kind).value_or(DumpKind::oom);
  r.origin_ranks.assign(header.origin_ranks.begin(), header.origin_ranks.end());
  r.world_size = id_.world_size;
  r.batch = batch;
  r.ranks_written = 1;
  std::string archive_error;
  if (id_.world_size == 1) {
    try {
      r.path = write_archive(archive_path(r.kind, batch), header, dump_of(row, h, state), Durability::verified,
                             naming());
      r.status = DumpResult::Status::archive;
      return r;
    } catch (const std::exception& e) {
      archive_error = e.what();  // the rank-local writer has a fallback folder
    }
  }
  try {
    r.path = write_rank_local(header, row, h, batch, Durability::verified, state);
    r.status = DumpResult::Status::rank_local;
    r.error = archive_error;
  } catch (const std::exception& e) {
    r.path.clear();
    r.status = DumpResult::Status::failed;
    r.error = archive_error.empty() ? e.what() : fmt::format("{}; {}", archive_error, e.what());
  }
  return r;
}

DumpRequest complete_from_message(DumpRequest r, bool device_published) {
  if (r.kind != DumpKind::oom) return r;
  const OomMessageFigures f = parse_oom_message(r.reason);
  if (r.requested_bytes == 0 && f.requested_bytes) {
    r.requested_bytes = *f.requested_bytes;
    r.numbers_from_message |= kFromMessageRequested;
  }
  // Capacity and free memory come as a pair from one sentence of the message, and go together.
  if (!device_published && r.device_free_bytes == 0 && r.device_capacity_bytes == 0 && f.device_free_bytes &&
      f.device_capacity_bytes) {
    r.device_free_bytes = *f.device_free_bytes;
    r.device_capacity_bytes = *f.device_capacity_bytes;
    r.numbers_from_message |= kFromMessageDevice;
  }
  if (r.memory_cap_bytes == 0 && f.memory_cap_bytes) {
    r.memory_cap_bytes = *f.memory_cap_bytes;
    r.numbers_from_message |= kFromMessageCap;
  }
  return r;
}

std::string dump_summary(DumpKind kind, const std::vector<std::int32_t>& origins, std::int64_t batch,
                         std::uint64_t requested_bytes, std::uint64_t device_free_bytes, std::uint32_t from_message,
                         std::string_view reason) {
  const std::string who = fmt::format("{} {}", origins.size() == 1 ? "rank" : "ranks", fmt::join(origins, ", "));
  if (kind == DumpKind::oom) {
    const bool requested_read = (from_message & kFromMessageRequested) != 0;
    const bool free_read = (from_message & kFromMessageDevice) != 0;
    const char* source = requested_read && free_read ? ", as the error's message states them"
                         : requested_read            ? "; the request as the error's message states it"
                         : free_read                 ? "; the free memory as the error's message states it"
                                                     : "";
    return fmt::format("{} out of memory at batch {} (requested {}, {} free{})", who, batch,
                       format_bytes(requested_bytes), format_bytes(device_free_bytes), source);
  }
  if (kind == DumpKind::headroom) {
    return fmt::format("{} crossed the headroom threshold at batch {}{}{}", who, batch, reason.empty() ? "" : ": ",
                       reason);
  }
  const std::string_view name = dump_kind_name(kind);
  const bool vowel = !name.empty() && std::string_view("aeiou").find(name.front()) != std::string_view::npos;
  return fmt::format("{} asked for {} {} dump at batch {}", who, vowel ? "an" : "a", name, batch);
}

DumpRequest request_from_oom_event(const FrozenHistory& h) {
  for (auto it = h.ring.events.rbegin(); it != h.ring.events.rend(); ++it) {
    if (it->action == Action::oom) {
      DumpRequest r;
      r.reason = fmt::format("out of memory at batch {}: tried to allocate {} with {} free", it->batch,
                             format_bytes(it->size), format_bytes(it->addr));
      r.requested_bytes = it->size;
      r.device_free_bytes = it->addr;
      r.device = it->device;
      return r;
    }
  }
  DumpRequest r;
  r.reason = "out of memory (the oom event is no longer in the ring)";
  return r;
}

void announce_dump(const DumpRequest& request, int rank, std::int64_t batch) {
  const std::string what = dump_summary(request.kind, {rank}, batch, request.requested_bytes,
                                        request.device_free_bytes, request.numbers_from_message);
  const std::string reason = request.reason.empty() ? std::string() : fmt::format(": {}", request.reason);
  if (request.kind == DumpKind::oom) {
    log().error("{}, writing the history of every rank{}", what, reason);
  } else {
    log().info("{}, writing the history of every rank{}", what, reason);
  }
}

}  // namespace oomflight
