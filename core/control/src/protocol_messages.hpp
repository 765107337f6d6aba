// The trigger protocol's wire format (internal to the control wing): what ranks send each other during a dump.
// Every rank runs the same liboomflight, so these are plain fixed-size structs exchanged as bytes.
// docs/protocol.md describes the exchange.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <iterator>

#include "oomflight/format/collective_writer.hpp"

namespace oomflight::protocol {

/// Message tags on the recorder's own duplicated communicator (never the application's).
inline constexpr int kTagTrigger = 0x00F1;  ///< TriggerMessage: origin -> every other rank
inline constexpr int kTagDone = 0x00F2;     ///< two int64, the epoch and "I failed during it": a rank is done with a dump -> origins
inline constexpr int kTagLeft = 0x00F3;     ///< one int32: this rank left without the leave agreement -> every rank

/// "Dump now": sent point to point by an origin to every other rank. `epoch` numbers the dumps of this job
/// (every rank counts the dumps it completed), so a late trigger for a dump already written is recognised.
/// `batch` and `kind` let a rank that never hears the agreement still name its rank-local file alike.
struct TriggerMessage {
  std::int64_t epoch;
  std::int64_t batch;
  std::int32_t origin;
  std::int32_t kind;  ///< DumpKind, with kJointTrigger when the origin asks for the joint dump
};
/// In TriggerMessage::kind: the origin failed late in the last dump and asks for the joint dump
/// (DumpLedger::asks_joint), whose rejoining origins take it for the one their ledger expects (heard_is_joint).
inline constexpr std::int32_t kJointTrigger = 1 << 16;
static_assert(sizeof(TriggerMessage) == 24);

/// One rank's contribution to the agreement: whether it is an origin and what it asked for. The votes are not
/// gathered (that would be P votes on every rank): they are reduced into one VoteSummary (vote_summary.hpp), which
/// keeps the lowest origins' votes whole. The lowest origin's kind and batch name the archive.
struct Vote {
  std::int32_t is_origin = 0;
  std::int32_t rank = 0;
  std::int64_t batch = -1;
  std::uint64_t requested_bytes = 0;
  std::uint64_t device_free_bytes = 0;
  std::int32_t device = 0;
  std::int32_t kind = 0;     ///< DumpKind
  /// NUL-padded, cut at 735 bytes (the origin prints its whole reason itself). PyTorch's OOM message, with its
  /// PYTORCH_CUDA_ALLOC_CONF advice, runs to about 600 bytes; 224 cut it mid-sentence.
  char reason[736] = {};
  /// 1: this rank abandoned a snapshot's write (it yielded to this dump): every rank then stops its snapshots, so
  /// that none waits for a window the others will never write (snapshot_writer.hpp).
  std::int32_t snapshots_broken = 0;
  /// 1: this rank rejoins as an origin of a joint dump, and the archive it wrote last is the one this dump
  /// replaces: it names the archive (that name) instead of the lowest origin.
  std::int32_t replaces_archive = 0;
};
static_assert(sizeof(Vote) == 784);

}  // namespace oomflight::protocol
