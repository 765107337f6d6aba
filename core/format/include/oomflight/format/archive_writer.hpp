// Writes an archive (schema v1) from one process: a rank-local file, the archive of a job of one rank, or an
// archive assembled later from several ranks' rows. The file is laid out with HDF5 and the rows are written with
// pwrite() at their datasets' addresses. The collective writer that all ranks of a job call together lives inside
// liboomflight (it needs MPI); both share every step but the messages between ranks.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "oomflight/api.h"
#include "oomflight/format/archive_schema.hpp"
#include "oomflight/record/batch_table.hpp"
#include "oomflight/record/collective.hpp"
#include "oomflight/record/communicator_table.hpp"
#include "oomflight/record/context_log.hpp"
#include "oomflight/record/stack_table.hpp"

namespace oomflight {

/// One rank's share of an archive. Stack ids inside `events` are the rank's own (ids into `stacks`, as its
/// recorder gave them); the writer turns them into global ids.
struct RankDump {
  RankRow row;                          ///< offsets and counts are filled in by the writer
  std::span<const Event> events;        ///< oldest first
  const StackTableCopy* stacks = nullptr;  ///< required
  std::span<const BatchStats> batches;     ///< per-batch figures, oldest first (written as /batches rows)
  std::span<const ContextEntry> context;   ///< environment and metadata (/context rows; strings after the stacks')
  /// The allocator's state at the freeze, when the source gave it (/state_segments, /state_blocks): stack ids are
  /// this dump's own (`stacks`), `rank` fields are ignored (the row's rank is written).
  std::span<const StateSegmentRow> state_segments;
  std::span<const StateBlockRow> state_blocks;
  /// The collective history, oldest first (/collectives; its counts are the row's collectives_* members), and the
  /// communicators the rank registered (/communicators).
  std::span<const Collective> collectives;
  std::span<const CommunicatorInfo> communicators;
};

/// How much write_archive() does to prove that a file reached the disk before it gets its name.
enum class Durability : std::uint8_t {
  /// Every write checked, fsync of the rows and of the marked file, and the reopened file's mark and dataset sizes
  /// checked: what an archive's name promises.
  verified,
  /// Every write, flush and close checked, the `complete` mark written last and the rename done, but no fsync and
  /// no reopening: the file survives the death of any process, not a crash of the node before writeback. For a
  /// rank's safety copy, which a verified archive replaces a moment later (and which is synced when it does not).
  handed_to_kernel,
};

/// What write_archive() does when its name is taken.
enum class Naming : std::uint8_t {
  /// Never replaces a file: the rename that gives the file its name fails on a taken name, and the next free name
  /// is taken instead (`STEM-1.h5` after an archive of the same job_id, `STEM.JOB.h5` after anything else: another
  /// job's archive; docs/archive-format.md, "File names"). The name got is returned.
  keep_others,
  /// Replaces a file of that name (OOMFLIGHT_OVERWRITE=1, or an output path given on purpose).
  replace,
};

/// Writes `path` holding one rank: `header` as the root attributes, `dump` as the rows. The file is written as
/// partial_archive_path(path, header.job_id), its root attribute `complete` (= 1) is the last write, and after the
/// close it is synced and checked (Durability::verified); only then is it renamed, to `path` or, when another
/// process took that name meanwhile, as `naming` says. Returns the name it got. On any failure the partial file is
/// removed and nothing carries the name `path`.
/// Throws std::invalid_argument when dump.stacks is null, ArchiveError naming the file and the step that failed
/// (folder missing or not writable, disk full: the dataset, offset and errno's text of the failed write). Not thread-safe with other
/// HDF5 use in the process (Debian's parallel HDF5 is not built thread-safe): call it from one thread.
OOMFLIGHT_API std::string write_archive(const std::string& path, const ArchiveHeader& header, const RankDump& dump,
                                        Durability durability = Durability::verified,
                                        Naming naming = Naming::keep_others);

/// fsync()s `path` (a file written with Durability::handed_to_kernel that has become the result). Throws
/// ArchiveError naming the file and the error. Thread-safe.
OOMFLIGHT_API void sync_file(const std::string& path);

/// Writes `path` holding several ranks from one process, in the order given (row i of /ranks is dumps[i]), like
/// write_archive(), replacing a file of that name (its callers write to an output path given on purpose: merge,
/// import). Used to join rank-local files (merge_archives). header.ranks_present must list the ranks in the same
/// order. Throws as write_archive().
OOMFLIGHT_API void write_archive_ranks(const std::string& path, const ArchiveHeader& header,
                                       std::span<const RankDump> dumps);

/// The name an archive has while it is written: `path` + ".partial", or `path` + "." + job_id + ".partial" for a
/// job's file (two jobs writing one name at once never share a partial file). Such a file is never an archive.
OOMFLIGHT_API std::string partial_archive_path(const std::string& path, const std::string& job_id = {});

}  // namespace oomflight
