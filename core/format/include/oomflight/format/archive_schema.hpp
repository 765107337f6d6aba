// The archive's schema (v1): the one definition shared by the writer, the reader, the analysis, the exporters
// and the tests (as Darshan shares its log-format headers between writer and reader). docs/archive-format.md is
// the contract this header implements. It depends on the event alone: no HDF5, no MPI, no recorder.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "oomflight/api.h"
#include "oomflight/record/collective.hpp"
#include "oomflight/record/event.hpp"

namespace oomflight {

/// Thrown when an archive cannot be written or read; the message names the file and what failed.
struct ArchiveError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Schema version written into the root attribute `schema_version`. Bump on any incompatible change.
inline constexpr int kSchemaVersion = 1;

/// Root attribute written last, value 1: a file without it never finished (see archive_writer.hpp). Files of
/// oomflight 0.1.x predate it and carry final names only when complete, so readers accept them without it.
inline constexpr const char* kCompleteAttribute = "complete";

/// Dataset names at the root of the file.
namespace dataset {
inline constexpr const char* events = "events";              ///< Event rows, rank after rank
inline constexpr const char* ranks = "ranks";                ///< RankRow, one per rank present, by rank
inline constexpr const char* stacks = "stacks";              ///< StackRecord, global frame_offset
inline constexpr const char* stack_frames = "stack_frames";  ///< uint32 global frame index, innermost first
inline constexpr const char* frames = "frames";              ///< FrameRecord, global string ids
inline constexpr const char* strings = "strings";            ///< StringRow: offset, length into string_data
inline constexpr const char* string_data = "string_data";    ///< uint8: UTF-8 bytes, not terminated
inline constexpr const char* batches = "batches";            ///< BatchRow, by rank then batch (optional: 0.3.0 on)
inline constexpr const char* context = "context";            ///< ContextRow, by rank (optional: 0.3.0 on)
inline constexpr const char* state_segments = "state_segments";  ///< StateSegmentRow, by rank (optional)
inline constexpr const char* state_blocks = "state_blocks";      ///< StateBlockRow, by rank (optional)
inline constexpr const char* collectives = "collectives";        ///< CollectiveRow, by rank (optional, 0.2.1 on)
inline constexpr const char* communicators = "communicators";    ///< CommunicatorRow, by rank (optional, 0.2.1 on)
}  // namespace dataset

/// Why an archive was written: the root attribute `kind`. One dump path serves every kind.
enum class DumpKind : std::uint8_t {
  oom = 0,       ///< a rank ran out of memory
  snapshot = 1,  ///< a schedule's window closed (skip_batches / interval)
  signal = 2,    ///< asked for on demand (SIGUSR1, or the API)
  exit = 3,      ///< the job is being torn down
  headroom = 4,  ///< a rank's reserved memory crossed OOMFLIGHT_HEADROOM_DUMP's share of its limit (issue 42)
};

/// Number of DumpKind values; valid values are 0 .. kDumpKindCount - 1.
inline constexpr int kDumpKindCount = 5;

/// The kind's name as the archive's `kind` attribute and the {kind} filename placeholder spell it: "oom",
/// "snapshot", "signal", "exit", "headroom" ("unknown" for a value out of range). Thread-safe; static storage.
OOMFLIGHT_API std::string_view dump_kind_name(DumpKind kind);

/// Parses a kind's name (exact, lower case). Returns nothing for an unknown name.
OOMFLIGHT_API std::optional<DumpKind> dump_kind_from_name(std::string_view name);

/// One row of /stacks: frames /stack_frames[frame_offset .. frame_offset + frame_count), innermost first.
struct StackRow {
  std::uint64_t frame_offset = 0;
  std::uint32_t frame_count = 0;
  std::uint32_t reserved = 0;  ///< padding, not a member of the HDF5 type
};

/// One row of /frames: function and file are rows of /strings; line 0 means unknown, -1 PyTorch's own "unknown"
/// ((size_t)-1, which its snapshots write as 2^64 - 1, and the memory_viz export gives back so).
struct FrameRow {
  std::uint32_t function = 0;
  std::uint32_t file = 0;
  std::int32_t line = 0;
};

/// One string of the string table: bytes string_data[offset .. offset + length).
struct StringRow {
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

/// One row of /ranks: a rank's state at the trigger and where its rows lie in the shared datasets.
/// All ids inside the shared datasets are global (already offset), so readers need these offsets only to
/// select one rank's rows.
struct RankRow {
  std::int32_t rank = 0;
  std::int32_t local_rank = 0;
  std::int32_t device = 0;
  std::int32_t is_origin = 0;               ///< 1 when this rank ran out of memory (or asked for the dump)
  std::int64_t pid = 0;
  std::int64_t batch = -1;                  ///< batch at the trigger
  std::uint64_t allocated_bytes = 0;        ///< at the trigger
  std::uint64_t reserved_bytes = 0;
  std::uint64_t peak_allocated_bytes = 0;
  std::uint64_t peak_reserved_bytes = 0;
  std::uint64_t device_capacity_bytes = 0;  ///< 0: unknown
  std::uint64_t device_free_bytes = 0;      ///< at the trigger; 0: unknown
  std::uint64_t oom_requested_bytes = 0;    ///< origin: the allocation that failed; else 0
  std::uint64_t event_offset = 0;           ///< first row of this rank in /events
  std::uint64_t event_count = 0;
  std::uint64_t events_recorded = 0;        ///< events ever offered to the ring
  std::uint64_t overwritten = 0;            ///< pushed out of the ring by newer events
  std::uint64_t dropped = 0;                ///< refused: more live recording threads than the ring's writers
  std::uint64_t unreadable = 0;             ///< 0 since the chunked ring; older archives: being written during the freeze
  std::uint64_t stack_offset = 0;
  std::uint64_t stack_count = 0;
  std::uint64_t frame_offset = 0;
  std::uint64_t frame_count = 0;
  std::uint64_t string_offset = 0;
  std::uint64_t string_count = 0;
  std::int64_t freeze_t_ns = 0;             ///< monotonic ns when the ring was copied
  std::int64_t anchor_monotonic_ns = 0;     ///< CLOCK_MONOTONIC and CLOCK_REALTIME read back to back:
  std::int64_t anchor_realtime_ns = 0;      ///< utc_ns(t) = t - anchor_monotonic_ns + anchor_realtime_ns
  char host[64] = {};                       ///< NUL-padded
  char reason[256] = {};                    ///< origin: why it dumped (the error message); NUL-padded
  /// The collective history (since 0.2.1; archives before it lack the three members, read as 0): records offered
  /// to the rank's collective ring up to the freeze, pushed out of its bound by newer ones, and being written at
  /// the copy. recorded = rows in /collectives + overwritten + in flight.
  std::uint64_t collectives_recorded = 0;
  std::uint64_t collectives_overwritten = 0;
  std::uint64_t collectives_in_flight = 0;
  /// The process's own limit on its device memory, below the device's capacity (PyTorch's
  /// torch.cuda.set_per_process_memory_fraction: the caching allocator fails an allocation that would reserve more);
  /// 0: none known. device_capacity_bytes and device_free_bytes stay the device's, as the driver gives them
  /// (issue 30: a 4 GiB cap on a 139.80 GiB H200 was shown as "4.00 GiB of which 133.65 GiB is free"). Since
  /// 0.2.1 (archives before it lack this member and the next, read as 0).
  std::uint64_t memory_cap_bytes = 0;
  /// Which of the origin's figures were read from the error's own message rather than given by the allocator
  /// (kFromMessage* bits; 0: all from the allocator, or not an origin).
  std::uint32_t numbers_from_message = 0;
  std::uint32_t reserved1 = 0;              ///< padding, not a member of the HDF5 type
  /// The device memory this process held outside the caching allocator at the freeze: the driver's count of the
  /// process (NVML, summed over the node's GPUs) less the allocator's reserved bytes, as last sampled (at most a
  /// second before a batch's end; issue 42). -1: unknown (no NVML, this process not in its list, or a figure it does
  /// not give), never 0 for unknown. Since 0.3 (archives before it lack the member: read as -1).
  std::int64_t outside_allocator_bytes = -1;
};

/// RankRow::numbers_from_message bits. An OutOfMemoryError that no allocator hook saw (a CPU job, a hook that could
/// not attach) still states its figures in torch's message ("Tried to allocate 2.00 GiB. GPU 0 has a total
/// capacity of 79.19 GiB of which 1.23 GiB is free. ... 4.00 GiB allowed; ..."): they are taken from there, and the
/// row says so (issue 30). Units in the message are rounded to two decimals: the figures are as exact as that.
inline constexpr std::uint32_t kFromMessageRequested = 1;  ///< oom_requested_bytes
inline constexpr std::uint32_t kFromMessageDevice = 2;     ///< device_capacity_bytes and device_free_bytes
inline constexpr std::uint32_t kFromMessageCap = 4;        ///< memory_cap_bytes

/// One row of /batches: one batch of one rank (BatchStats, in record/batch_table.hpp, says what each field is).
/// Rows are ordered by rank (the order of /ranks), then oldest batch first; the last row of a rank is the batch
/// running at the freeze (end_t_ns 0). Optional: archives written before 0.3.0 have no /batches, and readers
/// take that as no rows.
struct BatchRow {
  std::int32_t rank = 0;
  std::int32_t device = 0;
  std::int64_t batch = -1;
  std::int64_t start_t_ns = 0;              ///< monotonic ns (the rank's anchors turn it into UTC)
  std::int64_t end_t_ns = 0;                ///< 0: still running at the freeze
  std::uint64_t allocated_bytes = 0;        ///< at the end of the batch (or the freeze)
  std::uint64_t reserved_bytes = 0;
  std::uint64_t peak_allocated_bytes = 0;   ///< the batch's own peak
  std::uint64_t peak_reserved_bytes = 0;
  std::uint64_t device_capacity_bytes = 0;  ///< 0: unknown
  std::uint64_t device_free_bytes = 0;      ///< 0: unknown
  std::uint64_t alloc_events = 0;
  std::uint64_t free_events = 0;            ///< free_completed events
  std::uint64_t oom_events = 0;
  std::int64_t outside_allocator_bytes = -1;  ///< RankRow's figure at the batch's end; -1 unknown (since 0.3)
};

/// One row of /context: a key/value pair of a rank's context (ContextEntry): its environment (kind 0), captured at
/// start, metadata the job set (kind 1) at `batch`, or what an imported PyTorch snapshot carried besides its
/// segments and traces (kinds 2 and 3, see ContextEntry::Kind), written back by the memory_viz export. key and value are rows of /strings, inside the rank's own
/// strings. Rows are grouped by rank in the order of /ranks. Optional: no /context reads as no rows.
struct ContextRow {
  std::int32_t rank = 0;
  std::uint8_t kind = 0;
  std::uint8_t reserved[3] = {};  ///< padding, not a member of the HDF5 type
  std::int64_t batch = -1;
  std::uint32_t key = 0;
  std::uint32_t value = 0;
};

/// A block's state in the allocator state (/state_blocks), PyTorch's BlockInfo states
/// (torch/cuda/memory.py `_snapshot`: "active_allocated", "active_pending_free", "inactive").
enum class BlockState : std::uint8_t { active_allocated = 0, active_pending_free = 1, inactive = 2 };
inline constexpr int kBlockStateCount = 3;

/// Which of PyTorch's two pools a segment belongs to (its `segment_type`: the small pool holds blocks of 1 MiB and
/// less in 2 MiB segments, the large pool the rest; c10/cuda/CUDACachingAllocator.cpp). unknown: the source did
/// not say (an archive of 0.2.0, or a live job's state): readers then apply PyTorch's sizing rule (a segment of
/// exactly 2 MiB that is not expandable is small).
enum class SegmentType : std::uint8_t { large = 0, small = 1, unknown = 255 };

/// One row of /state_segments: a segment of a rank's allocator state at the freeze, as the source gave it (an
/// import: the snapshot's `segments`). Its blocks are the rank's /state_blocks rows inside [address, address +
/// total_size), in address order. Rows are grouped by rank in the order of /ranks, each rank's in the source's
/// order. Optional: an archive whose source gave no state has no rows for the rank (readers then rebuild the
/// state from /events). 56 bytes; archives of 0.2.0 hold the first six members only (40-byte rows), which
/// readers take as segment_type unknown, stack_id -1 and pool (0, 0).
struct StateSegmentRow {
  std::int32_t rank = 0;
  std::int32_t device = 0;
  std::uint64_t address = 0;
  std::uint64_t total_size = 0;       ///< bytes
  std::uint64_t stream = 0;
  std::uint8_t is_expandable = 0;
  SegmentType segment_type = SegmentType::unknown;  ///< since 0.2.1
  std::uint8_t reserved[2] = {};      ///< padding, not a member of the HDF5 type
  std::int32_t stack_id = kNoStack;   ///< the segment's `frames` (where it was cudaMalloc'd): a global id, as in
                                      ///< /events; -1: none (no `frames` key). Since 0.2.1
  std::uint64_t segment_pool_id[2] = {};  ///< PyTorch's `segment_pool_id` (a CUDA graph's memory pool; (0, 0):
                                          ///< the default pools). Since 0.2.1
};

/// A segment row as 0.2.0 wrote it: the first 40 bytes of StateSegmentRow. Readers convert it.
struct StateSegmentRowV0 {
  std::int32_t rank = 0;
  std::int32_t device = 0;
  std::uint64_t address = 0;
  std::uint64_t total_size = 0;
  std::uint64_t stream = 0;
  std::uint8_t is_expandable = 0;
  std::uint8_t reserved[7] = {};
};

/// One row of /state_blocks: a block of a rank's allocator state at the freeze, with PyTorch's sizes (`size` the
/// block as the allocator rounded it, `requested_size` what was asked for) and the stack of its alloc (a global
/// id, as in /events; -1 for none). Grouped by rank like /state_segments.
struct StateBlockRow {
  std::int32_t rank = 0;
  std::int32_t stack_id = kNoStack;
  std::uint64_t address = 0;
  std::uint64_t size = 0;             ///< bytes
  std::uint64_t requested_size = 0;   ///< bytes
  BlockState state = BlockState::inactive;
  std::uint8_t reserved[7] = {};      ///< padding, not a member of the HDF5 type
};

/// One row of /collectives: one start or end of a collective or point-to-point operation on one rank (Collective,
/// in record/collective.hpp, says what each field is). Rows are grouped by rank in the order of /ranks, each
/// rank's oldest first. 72 bytes. Optional: archives before 0.2.1, and ranks that recorded none, have no rows.
struct CollectiveRow {
  std::int32_t rank = 0;
  std::int32_t peer = -1;             ///< root or peer, a rank of the communicator; -1: none
  std::int64_t t_ns = 0;              ///< monotonic ns, as /events
  std::uint64_t comm_id = 0;          ///< /communicators' comm_id
  std::uint64_t seq = 0;              ///< the rank's sequence number of the operation on the communicator
  std::uint64_t count = 0;            ///< elements
  std::uint64_t bytes = 0;            ///< this rank's buffer
  std::uint64_t stream = 0;
  std::int64_t batch = -1;
  CollectiveOp op = CollectiveOp::other;
  DataType datatype = DataType::other;
  CollectivePhase phase = CollectivePhase::start;
  std::uint8_t flags = 0;             ///< kCollectiveDeviceCompletion, kCollectiveUntracked
  std::uint8_t reserved[4] = {};      ///< padding, not a member of the HDF5 type
};

/// The row of one rank's record.
inline CollectiveRow collective_row(std::int32_t rank, const Collective& c) {
  return CollectiveRow{rank,        c.peer,   c.t_ns,     c.comm_id, c.seq,   c.count, c.bytes,
                       c.stream,    c.batch,  c.op,       c.datatype, c.phase, c.flags, {}};
}

/// One row of /communicators: a communicator one rank registered (its id as in /collectives, its name, the rank's
/// rank in it, its size). Grouped by rank like /collectives. Optional.
struct CommunicatorRow {
  std::int32_t rank = 0;
  std::int32_t comm_rank = 0;
  std::int32_t comm_size = 1;
  std::int32_t reserved = 0;          ///< padding, not a member of the HDF5 type
  std::uint64_t comm_id = 0;
  char name[48] = {};                 ///< NUL-padded; "world" for MPI_COMM_WORLD, NCCL's commName, or empty
};

/// Root attributes.
struct ArchiveHeader {
  int schema_version = kSchemaVersion;
  std::string producer;                 ///< "oomflight 0.2.0"
  std::string run_name;
  /// The job that wrote it: 12 hex digits drawn by rank 0 at start-up, the same on every rank; root attribute
  /// `job_id` (string, since 0.2.1). Two jobs with one run name in one folder tell their files apart by it
  /// (retention removes only its own job's archives; a name another job holds is not taken). Empty: an older file,
  /// a merge of files of several jobs, an import.
  std::string job_id;
  std::string kind;                     ///< dump_kind_name() of a DumpKind; readers keep unknown names as text
  std::string created_at_utc;           ///< ISO 8601, e.g. "2026-11-21T10:15:02Z"
  std::string reason;                   ///< one line per origin: "rank 2: CUDA out of memory. ..."
  std::vector<std::int32_t> origin_ranks;
  std::int32_t world_size = 1;
  std::vector<std::int32_t> ranks_present;
  /// Snapshots (kind "snapshot"): the window's first and last batch, root attributes `window_first_batch` and
  /// `window_last_batch` (int64). -1 and not written for every other kind.
  std::int64_t window_first_batch = -1;
  std::int64_t window_last_batch = -1;
  /// Snapshots: windows every rank skipped since the previous snapshot archive of the job (or its start), because
  /// writes were slower than the windows and a rank had no place to keep another (at most 2 wait per rank);
  /// root attribute `snapshot_windows_skipped` (int64 >= 0, since 0.2.1). Absent: none skipped, or an older file.
  std::optional<std::int64_t> snapshot_windows_skipped;
  /// The batch the dump is named after ({batch} in its file names: the first origin's batch at the trigger, a
  /// snapshot window's first batch), root attribute `dump_batch` (int64, since 0.2.1). Absent in older files; merge
  /// refuses files of one run and kind whose dump batches differ.
  std::optional<std::int64_t> dump_batch;
  /// Which of the job's coordinated dumps this file belongs to: every rank counts the dumps it took part in, from 0
  /// (snapshots are not counted); root attribute `dump_number` (int64, since 0.2.1). Two dumps of one batch (a
  /// signal dump, then an OOM in the same batch) differ here; merge refuses files whose numbers differ. Absent in
  /// older files, single-process archives and imports.
  std::optional<std::int64_t> dump_number;
};

/// Copies `text` into a fixed NUL-padded field, cutting it if it is too long.
template <std::size_t N>
void set_fixed_string(char (&field)[N], std::string_view text) {
  const std::size_t n = text.size() < N - 1 ? text.size() : N - 1;
  for (std::size_t i = 0; i < N; ++i) field[i] = i < n ? text[i] : '\0';
}

/// Reads a fixed NUL-padded field.
template <std::size_t N>
std::string fixed_string(const char (&field)[N]) {
  std::size_t n = 0;
  while (n < N && field[n] != '\0') ++n;
  return std::string(field, n);
}

}  // namespace oomflight
