// The dump's agreement as one reduction (internal to the control wing): every rank's Vote folded into one
// fixed-size summary by MPI_Iallreduce with a user-defined operation, instead of every rank gathering every vote.
// docs/scale.md measured why: the gather put P votes (888 bytes each) on every rank, O(P^2) bytes over the job, and
// Open MPI's nonblocking allgather (libnbc, linear) posts P - 1 sends and P - 1 receives on every rank, each poll
// walking all of them; a reduction is O(log P) messages of a few KB per rank.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <span>
#include <vector>

#include "protocol_messages.hpp"

namespace oomflight::protocol {

/// How many origins' votes the summary keeps whole: the lowest-ranked ones. More origins than this are still all
/// named (the bitmap), and each one's reason is in its own /ranks row; the archive's root `reason` lists these.
inline constexpr int kVotesKept = 4;

/// The fixed part of a summary; `ceil(world_size / 8)` bytes of origin bitmap follow it (bit r of byte r / 8 is
/// set when rank r is an origin). Combined by merge_vote_summaries: origin_count adds up, replacer and
/// snapshots_broken are the least and the greatest, `kept` keeps the lowest-ranked origins' votes in rank order,
/// `first` is the vote of the lowest rank (the archive's batch and kind when no rank is an origin), and
/// `row_totals` adds up every rank's archive_row_counts() (the archive's dataset sizes, so that placing the rows
/// needs no second reduction).
struct VoteSummaryHead {
  std::int32_t world_size = 0;
  std::int32_t origin_count = 0;
  std::int32_t replacer = INT32_MAX;  ///< the lowest origin whose archive this dump replaces; INT32_MAX: none
  std::int32_t snapshots_broken = 0;
  std::int32_t kept_count = 0;
  std::int32_t pad = 0;
  std::uint64_t row_totals[kArchiveTables] = {};
  Vote first;
  Vote kept[kVotesKept];
};

/// A summary in one buffer: the head, then the bitmap; 8-byte aligned storage.
class VoteSummary {
 public:
  /// The summary of one vote (that of `vote.rank`, whose history adds `rows` to the archive) in a job of
  /// `world_size` ranks.
  VoteSummary(const Vote& vote, const ArchiveRowCounts& rows, int world_size);
  /// An empty buffer of the same size, for MPI to reduce into.
  explicit VoteSummary(int world_size);

  /// The bytes exchanged: sizeof(VoteSummaryHead) + ceil(world_size / 8).
  static std::size_t bytes(int world_size);
  void* data() { return storage_.data(); }
  VoteSummaryHead head() const;
  /// The origins, in rank order (from the bitmap: all of them, however many).
  std::vector<std::int32_t> origins() const;

 private:
  std::vector<std::uint64_t> storage_;
};

/// Folds `in` into `inout` (both summaries of one world size, as laid out by VoteSummary). Commutative and
/// associative, as MPI_Op_create(..., commute = 1) requires.
void merge_vote_summaries(const void* in, void* inout);

/// The MPI datatype (one summary of `world_size` ranks, as contiguous bytes) and the operation that reduces it,
/// created once per communicator size and freed with the object (unless MPI is finalized by then).
class VoteReduction {
 public:
  explicit VoteReduction(int world_size);
  ~VoteReduction();
  VoteReduction(const VoteReduction&) = delete;
  VoteReduction& operator=(const VoteReduction&) = delete;
  MPI_Datatype type() const { return type_; }
  MPI_Op op() const { return op_; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
  MPI_Op op_ = MPI_OP_NULL;
};

}  // namespace oomflight::protocol
