// The collective record: one start or end of a collective or point-to-point operation on one rank, the unit the
// collective ring stores and the archive's /collectives holds (with the rank).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>

#include "oomflight/api.h"

namespace oomflight {

/// The operation. Values are the archive's enumeration (and the C API's enum oomflight_collective_op): never
/// renumber, only append. Names as NCCL's API spells them, lower case.
enum class CollectiveOp : std::uint8_t {
  allreduce = 0,
  allgather = 1,
  reducescatter = 2,
  broadcast = 3,
  reduce = 4,
  alltoall = 5,
  send = 6,  ///< peer: the receiving rank
  recv = 7,  ///< peer: the sending rank
  gather = 8,
  scatter = 9,
  barrier = 10,
  other = 11,
};
inline constexpr int kCollectiveOpCount = 12;

/// Element types: NCCL's ncclDataType_t values (nccl.h), `other` for anything else.
enum class DataType : std::uint8_t {
  int8 = 0,
  uint8 = 1,
  int32 = 2,
  uint32 = 3,
  int64 = 4,
  uint64 = 5,
  float16 = 6,
  float32 = 7,
  float64 = 8,
  bfloat16 = 9,
  float8e4m3 = 10,
  float8e5m2 = 11,
  other = 255,
};

/// Which end of the operation a record marks.
enum class CollectivePhase : std::uint8_t {
  start = 0,  ///< the rank entered it (called it; NCCL: enqueued it)
  end = 1,    ///< the rank's part finished (kCollectiveDeviceCompletion says how it was seen)
};

/// Collective::flags bit of an end: the device finished the operation (NCCL's kernel, through the profiler's kernel
/// events). Without it the end is the host call returning (blocking MPI: done; NCCL: only enqueued).
inline constexpr std::uint8_t kCollectiveDeviceCompletion = 1;
/// Collective::flags bit of a start or an end: the source does not follow the operation to its end (a start it
/// could not track, an end where it stopped tracking it), so whether it finished is not known. oomflight.h's
/// OOMFLIGHT_COLL_UNTRACKED.
inline constexpr std::uint8_t kCollectiveUntracked = 2;

/// The name of an op ("allreduce", ...; "other" for a value out of range). Static storage; thread-safe.
OOMFLIGHT_API std::string_view collective_op_name(CollectiveOp op);
/// Parses an op's name (exact, lower case, as collective_op_name spells it).
OOMFLIGHT_API std::optional<CollectiveOp> collective_op_from_name(std::string_view name);
/// The name of a data type ("float32", "bfloat16", ...; "other"). Static storage; thread-safe.
OOMFLIGHT_API std::string_view data_type_name(DataType type);
/// Bytes per element of a data type; 0 for `other`.
OOMFLIGHT_API std::uint64_t data_type_size(DataType type);
/// Whether a byte is a DataType value.
OOMFLIGHT_API bool valid_data_type(std::uint8_t value);

/// One start or end of an operation on one rank. 64 bytes, trivially copyable, no padding holes.
/// Units: t_ns in ns of CLOCK_MONOTONIC (raw event-clock ticks while in the ring), count in elements, bytes in
/// bytes; stream is the CUDA stream handle as an integer (0: none).
struct Collective {
  std::int64_t t_ns = 0;
  std::uint64_t comm_id = 0;   ///< the communicator, equal on all its ranks
  std::uint64_t seq = 0;       ///< this rank's sequence number of this op on the communicator, from 0 (NCCL
                               ///< counts each function separately: (comm_id, op, seq) names an operation)
  std::uint64_t count = 0;     ///< elements
  std::uint64_t bytes = 0;     ///< this rank's buffer, bytes
  std::uint64_t stream = 0;
  std::int64_t batch = -1;     ///< the rank's batch when recorded
  std::int32_t peer = -1;      ///< root or peer (a rank of the communicator); -1: none
  CollectiveOp op = CollectiveOp::other;
  DataType datatype = DataType::other;
  CollectivePhase phase = CollectivePhase::start;
  std::uint8_t flags = 0;      ///< kCollective* bits
};

static_assert(sizeof(Collective) == 64, "Collective is part of the archive format; its size must not change");
static_assert(std::is_trivially_copyable_v<Collective>);

}  // namespace oomflight
