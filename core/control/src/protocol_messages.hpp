// The trigger protocol's wire format (internal to the control wing): what ranks send each other during a dump.
// Every rank runs the same liboomflight, so these are plain fixed-size structs exchanged as bytes.
// docs/protocol.md describes the exchange.
#pragma once

#include <cstdint>

namespace oomflight::protocol {

/// Message tags on the recorder's own duplicated communicator (never the application's).
inline constexpr int kTagTrigger = 0x00F1;  ///< TriggerMessage: origin -> every other rank
inline constexpr int kTagDone = 0x00F2;     ///< one int64 epoch: a rank's rank-local file is written -> origins

/// "Dump now": sent point to point by an origin to every other rank. `epoch` numbers the dumps of this job
/// (every rank counts the dumps it completed), so a late trigger for a dump already written is recognised.
/// `batch` and `kind` let a rank that never hears the agreement still name its rank-local file alike.
struct TriggerMessage {
  std::int64_t epoch;
  std::int64_t batch;
  std::int32_t origin;
  std::int32_t kind;  ///< DumpKind
};
static_assert(sizeof(TriggerMessage) == 24);

/// One rank's contribution to the agreement (MPI_Iallgather): whether it is an origin and what it asked for.
/// The lowest origin's kind and batch name the archive.
struct Vote {
  std::int32_t is_origin = 0;
  std::int32_t rank = 0;
  std::int64_t batch = -1;
  std::uint64_t requested_bytes = 0;
  std::uint64_t device_free_bytes = 0;
  std::int32_t device = 0;
  std::int32_t kind = 0;     ///< DumpKind
  /// NUL-padded, cut at 735 bytes (the origin prints its whole reason itself). PyTorch's OOM message, with its
  /// PYTORCH_CUDA_ALLOC_CONF advice, runs to about 600 bytes; 224 cut it mid-sentence. Every rank gathers every
  /// vote: 776 bytes a rank (0.4 MB per rank at 512 ranks, once per dump).
  char reason[736] = {};
};
static_assert(sizeof(Vote) == 776);

}  // namespace oomflight::protocol
