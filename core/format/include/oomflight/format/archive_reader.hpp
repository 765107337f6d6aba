// Reads an archive (schema 1 up to kSchemaVersion) into memory, for the analysis, the exporters and the tests.
// No MPI: a reader needs serial file access only.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "oomflight/api.h"
#include "oomflight/format/archive_schema.hpp"

namespace oomflight {

/// A whole archive. Ids are global: events[i].stack_id indexes stacks, stack_frames holds indices into frames,
/// frames name strings by index.
struct OOMFLIGHT_API Archive {
  std::string path;
  ArchiveHeader header;
  std::vector<RankRow> ranks;
  std::vector<Event> events;
  std::vector<StackRow> stacks;
  std::vector<std::uint32_t> stack_frames;
  std::vector<FrameRow> frames;
  std::vector<std::string> strings;
  std::vector<BatchRow> batches;  ///< empty for archives written before 0.3.0
  std::vector<ContextRow> context;  ///< empty for archives written before 0.3.0
  std::vector<StateSegmentRow> state_segments;  ///< the allocator state at the freeze, where a source gave it
  std::vector<StateBlockRow> state_blocks;
  std::vector<CollectiveRow> collectives;      ///< empty for archives before 0.2.1
  std::vector<CommunicatorRow> communicators;  ///< empty for archives before 0.2.1

  /// The row of `rank`, or nullptr when that rank is not present.
  const RankRow* rank_row(int rank) const;
  /// The events of one rank, oldest first.
  std::span<const Event> events_of(const RankRow& row) const;
  /// The per-batch rows of one rank, oldest first (empty when the archive has none for it).
  std::span<const BatchRow> batches_of(int rank) const;
  /// The context rows of one rank (environment, then metadata in the order set); strings via string().
  std::span<const ContextRow> context_of(int rank) const;
  /// The allocator state of one rank at the freeze (empty when its source gave none: rebuild it from its events).
  std::span<const StateSegmentRow> state_segments_of(int rank) const;
  std::span<const StateBlockRow> state_blocks_of(int rank) const;
  /// The collective records of one rank, oldest first, and the communicators it registered.
  std::span<const CollectiveRow> collectives_of(int rank) const;
  std::span<const CommunicatorRow> communicators_of(int rank) const;
  /// The frames of a stack, innermost first; empty for kNoStack or an id out of range.
  std::vector<const FrameRow*> stack(std::int32_t stack_id) const;
  /// A string by id; "" when out of range.
  std::string_view string(std::uint32_t id) const;
};

/// Reads `path`. Throws ArchiveError with a message naming the file: it does not exist, is not HDF5, is not an
/// oomflight archive (no schema_version attribute), was written by a newer schema (the message names both
/// versions), or a dataset is missing or inconsistent (offsets out of range). Uses serial HDF5: call it from
/// one thread at a time (Debian's parallel HDF5 is not built thread-safe).
OOMFLIGHT_API Archive read_archive(const std::string& path);

/// Reads only the root attributes of `path` (cheap: no dataset is read), checked as read_archive checks them.
/// Throws ArchiveError as read_archive. Same thread rule.
OOMFLIGHT_API ArchiveHeader read_archive_header(const std::string& path);

}  // namespace oomflight
