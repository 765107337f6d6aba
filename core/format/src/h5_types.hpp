// HDF5 types of the archive's datasets (internal to the format wing): used by both the writer and the reader.
#pragma once

#include <cstddef>

#include "h5_handle.hpp"
#include "oomflight/format/archive_schema.hpp"

namespace oomflight::h5 {

/// Bytes of a /ranks row before 0.2.1: RankRow up to its collective counts.
inline constexpr std::size_t kRankRowV0Bytes = offsetof(RankRow, collectives_recorded);
/// Bytes of a /ranks row of 0.2.1 before the memory cap (issue 30): RankRow up to memory_cap_bytes.
inline constexpr std::size_t kRankRowV1Bytes = offsetof(RankRow, memory_cap_bytes);
/// Bytes of a /ranks row before 0.3 (issue 42): RankRow up to outside_allocator_bytes.
inline constexpr std::size_t kRankRowV2Bytes = offsetof(RankRow, outside_allocator_bytes);
/// Bytes of a /batches row before 0.3: BatchRow up to outside_allocator_bytes.
inline constexpr std::size_t kBatchRowV0Bytes = offsetof(BatchRow, outside_allocator_bytes);

/// Enumeration over uint8 whose member names are the Action names (alloc, free_requested, ...).
Handle action_enum_type();
/// Compound type of Event (48 bytes), `flags` included (since 0.2.1).
Handle event_type();
/// Event's type as 0.2.0 wrote it: the same layout without `flags` (readers take flags as 0).
Handle event_type_v0();
/// RankRow as written now; rank_row_type_v2: without the memory outside the allocator (kRankRowV2Bytes, before 0.3);
/// rank_row_type_v1: without the memory cap and the figures' source either (kRankRowV1Bytes);
/// rank_row_type_v0: the rows before 0.2.1, kRankRowV0Bytes (RankRow's prefix, without the collective counts).
Handle rank_row_type();
Handle rank_row_type_v2();
Handle rank_row_type_v1();
Handle rank_row_type_v0();
/// Enumeration over uint8 whose member names are the CollectiveOp names.
Handle collective_op_enum_type();
Handle collective_row_type();
Handle communicator_row_type();
Handle stack_row_type();
Handle frame_row_type();
Handle string_row_type();
/// BatchRow as written now; batch_row_type_v0: before 0.3, without outside_allocator_bytes (kBatchRowV0Bytes).
Handle batch_row_type();
Handle batch_row_type_v0();
Handle context_row_type();
/// StateSegmentRow (56 bytes) since 0.2.1; state_segment_row_type_v0: StateSegmentRowV0, 0.2.0's 40 bytes.
Handle state_segment_row_type();
Handle state_segment_row_type_v0();
Handle state_block_row_type();
/// Fixed-length NUL-padded string of `size` bytes (at least 1).
Handle fixed_string_type(std::size_t size);

}  // namespace oomflight::h5
