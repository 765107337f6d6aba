// Dump execution (internal to the control wing): where a dump's files go and how a frozen history is written
// there, collectively or alone, with the fallbacks that keep a frozen history from being lost. The trigger
// protocol decides whether the ranks agreed; the executor decides what is written where. It is the one place for
// paths, names and fallbacks, used by the protocol and by the single-process path alike.
//
// Nothing here needs MPI (issue 40): the store transport builds on it without <mpi.h>; the MPI transport's
// collective write of a dump is collective_dump.hpp's.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "oomflight/control/config.hpp"
#include "oomflight/control/dump_request.hpp"
#include "oomflight/control/rank_identity.hpp"
#include "oomflight/format/archive_schema.hpp"
#include "oomflight/format/archive_writer.hpp"
#include "oomflight/record/recorder.hpp"

namespace oomflight {

class DumpExecutor {
 public:
  /// Keeps references: both must outlive the executor.
  DumpExecutor(const Config& config, const RankIdentity& identity) : config_(config), id_(identity) {}

  /// The /ranks row for a frozen history (offsets and counts are the writer's job). An origin's row carries its
  /// request (requested bytes, its device free bytes when given, its reason).
  RankRow rank_row(const FrozenHistory& h, bool is_origin, const DumpRequest& request) const;

  /// Root attributes of a dump of `kind`, named after `batch`, with the given origins and ranks present.
  ArchiveHeader header(DumpKind kind, std::int64_t batch, std::string reason, std::vector<std::int32_t> origins,
                       std::vector<std::int32_t> ranks_present) const;

  /// The archive's absolute path for (kind, batch): renders OOMFLIGHT_FOLDER and OOMFLIGHT_FILENAME, creates the
  /// folder (like mkdir -p) and, unless OOMFLIGHT_OVERWRITE, picks a name that does not exist yet ("oom.3.h5", then
  /// "oom.3-1.h5", ...). Absolute, so that every rank opens the same file whatever its working directory.
  /// Throws std::runtime_error naming the folder when it cannot be created.
  std::string archive_path(DumpKind kind, std::int64_t batch) const;

  /// How a file of the executor's is named: OOMFLIGHT_OVERWRITE=1 replaces a file of the name; otherwise a taken
  /// name is never replaced.
  Naming naming() const { return config_.overwrite ? Naming::replace : Naming::keep_others; }

  /// What a frozen history writes, with the allocator state its source gave with the request (nullptr or empty:
  /// none; the rows stay empty and readers rebuild the state from the events). The result refers to `row`, `h` and
  /// `state`, which must outlive it.
  static RankDump dump_of(const RankRow& row, const FrozenHistory& h, const AllocatorStateRows* state);

  /// Writes this rank's history alone under OOMFLIGHT_RANK_FILENAME: first in the configured folder, and if that
  /// fails in $TMPDIR/oomflight-{run_name} (or /tmp/...), so that nothing is lost to an unwritable folder or a
  /// full disk. Returns the path written. Throws ArchiveError naming both failures when both fail. A safety copy
  /// (written before the archive, which replaces it) is only handed to the kernel; a file that is the result
  /// is verified (Durability).
  std::string write_rank_local(const ArchiveHeader& header, const RankRow& row, const FrozenHistory& h,
                               std::int64_t batch, Durability durability = Durability::verified,
                               const AllocatorStateRows* state = nullptr) const;

  /// As above, for rows already chosen (a snapshot's window): `dump` is written as it is, named after `kind` and
  /// `batch`.
  std::string write_rank_local(const ArchiveHeader& header, const RankDump& dump, DumpKind kind, std::int64_t batch,
                               Durability durability) const;

  /// The archive of a job of one rank, written with POSIX I/O under OOMFLIGHT_FILENAME; when that fails, the
  /// rank-local file (with its fallback folder). Never throws: the outcome is in the result (status archive,
  /// rank_local or failed, with the error).
  DumpResult write_single_rank(const ArchiveHeader& header, const RankRow& row, const FrozenHistory& h,
                               std::int64_t batch, const AllocatorStateRows* state = nullptr) const;

 private:
  std::string prepare_path(const FilenameTemplate& folder, const FilenameTemplate& name,
                           const TemplateValues& values) const;
  // ... with the folder and the name rendered already (the name may be absolute: then it is the path).
  std::string prepare_rendered_path(const std::filesystem::path& folder, const std::filesystem::path& name) const;
  TemplateValues template_values(DumpKind kind, std::int64_t batch) const;

  const Config& config_;
  const RankIdentity& id_;
};

/// The one line a dump's origin logs: "rank 2 out of memory at batch 7 (requested 2.00 GiB, 1.31 GiB free)" for
/// an oom dump, "rank 0 asked for a signal dump at batch 7" for the others; several origins are listed. With
/// `from_message` (kFromMessage* bits) the figures say they are the error message's: "(requested 2.00 GiB, 1.31 GiB
/// free, as the error's message states them)". A headroom dump says what crossed and where, from its origin's
/// `reason` (HeadroomWatch::take's words): "rank 1 crossed the headroom threshold at batch 5: device 0: reserved
/// 7.25 GiB of its 8.00 GiB capacity, over OOMFLIGHT_HEADROOM_DUMP=90% (7.20 GiB)"; other kinds ignore `reason`.
std::string dump_summary(DumpKind kind, const std::vector<std::int32_t>& origins, std::int64_t batch,
                         std::uint64_t requested_bytes, std::uint64_t device_free_bytes,
                         std::uint32_t from_message = 0, std::string_view reason = {});

/// Logs the root cause on this rank's stderr, before any step another rank could block or a teardown could cut
/// short: "rank 2 out of memory at batch 7 (...), writing the history of every rank: <reason>" (error for an oom
/// dump, info for the others). Both transports' origins call it first.
void announce_dump(const DumpRequest& request, int rank, std::int64_t batch);

/// The request of a rank that is an origin because its frozen history holds an oom event no dump has reported (its
/// failing thread asks later, or during the dump another rank began): an oom dump of the newest oom event's device,
/// with its requested and free bytes and a reason built from them. Both transports use it.
DumpRequest request_from_oom_event(const FrozenHistory& h);

}  // namespace oomflight
