// One rank's rows in the archive's layout (internal to the format wing): every id a global one, and where among
// all ranks' rows each table's rows go. Shared by the one-process writer and the collective one.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "oomflight/format/archive_writer.hpp"

namespace oomflight::format_detail {

/// The archive's datasets, in the order their rows are counted, laid out and written.
enum Table : int {
  kRanks, kEvents, kStacks, kStackFrames, kFrames, kStrings, kStringData, kBatches, kContext, kStateSegments,
  kStateBlocks, kCollectives, kCommunicators, kTables
};

/// Rows per dataset (bytes for kStringData).
using Counts = std::array<std::uint64_t, kTables>;

/// The dataset's name (dataset::events, ...).
const char* table_name(Table t);

/// Bytes per row: the C++ row's size, which is also the file type's (h5_types builds each compound type from the
/// row's own layout, so the bytes in memory are the bytes in the file).
std::size_t row_bytes(Table t);

/// How many rows of each dataset one rank writes: one /ranks row, its events, stack table, ... Throws
/// std::invalid_argument when dump.stacks is null.
Counts local_counts(const RankDump& dump);

/// One rank's rows with global ids. The events are not copied: they are the frozen history itself, and their
/// stack ids are shifted by `event_stack_shift` as they are written (events_with_global_stacks).
struct RankRows {
  Counts count{};
  RankRow rank;
  std::span<const Event> events;
  std::int32_t event_stack_shift = 0;
  std::vector<StackRow> stacks;
  std::vector<std::uint32_t> stack_frames;
  std::vector<FrameRow> frames;
  std::vector<StringRow> strings;
  std::vector<std::uint8_t> string_data;
  std::vector<BatchRow> batches;
  std::vector<ContextRow> context;
  std::vector<StateSegmentRow> state_segments;
  std::vector<StateBlockRow> state_blocks;
  std::vector<CollectiveRow> collectives;
  std::vector<CommunicatorRow> communicators;

  /// The rows of table `t` as bytes (for kEvents, the events as recorded: see event_stack_shift).
  std::span<const std::uint8_t> bytes(Table t) const;
};

/// `dump`'s rows placed at `at` (the rows of every earlier rank, per dataset): ids turned into global ones, the
/// /ranks row's offsets and counts filled in.
RankRows global_rows(const RankDump& dump, const Counts& at);

/// Copies `events` into `out` (same size) with every stack id moved by `shift` (kNoStack stays).
void events_with_global_stacks(std::span<const Event> events, std::int32_t shift, std::span<Event> out);

}  // namespace oomflight::format_detail
