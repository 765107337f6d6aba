// Reads an archive (schema v1) into memory, for the report, the exporters and the tests.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "oomflight/archive_format.hpp"
#include "oomflight/archive_writer.hpp"
#include "oomflight/export.hpp"

namespace oomflight {

/// A whole archive. Ids are global: events[i].stack_id indexes stacks, stack_frames holds indices into frames,
/// frames name strings by index.
struct OOMFLIGHT_API Archive {
  std::string path;
  ArchiveHeader header;
  std::vector<RankRow> ranks;
  std::vector<Event> events;
  std::vector<StackRecord> stacks;
  std::vector<std::uint32_t> stack_frames;
  std::vector<FrameRecord> frames;
  std::vector<std::string> strings;

  /// The row of `rank`, or nullptr when that rank is not present.
  const RankRow* rank_row(int rank) const;
  /// The events of one rank, oldest first.
  std::span<const Event> events_of(const RankRow& row) const;
  /// The frames of a stack, innermost first; empty for kNoStack or an id out of range.
  std::vector<const FrameRecord*> stack(std::int32_t stack_id) const;
  /// A string by id; "" when out of range.
  std::string_view string(std::uint32_t id) const;
};

/// Reads `path`. Throws ArchiveError with a message naming the file: it does not exist, is not HDF5, is not an
/// oomflight archive (no schema_version attribute), was written by a newer schema, or a dataset is missing or
/// inconsistent (offsets out of range). Uses serial HDF5; call from one thread at a time.
OOMFLIGHT_API Archive read_archive(const std::string& path);

}  // namespace oomflight
