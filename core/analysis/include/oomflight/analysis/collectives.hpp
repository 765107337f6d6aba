// Which collective every rank was in when the job died: the archive's /collectives paired into operations per rank,
// and per communicator the newest operation any rank entered, with the ranks inside it, past it and short of it.
// Analysis only: the text report, the HTML page and the Perfetto export render it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "oomflight/api.h"
#include "oomflight/format/archive_reader.hpp"

namespace oomflight {

/// One operation on one rank: its start record with its end. Times in monotonic ns of the rank's host.
struct RankOperation {
  std::uint64_t comm_id = 0;
  std::uint64_t seq = 0;
  CollectiveOp op = CollectiveOp::other;
  DataType datatype = DataType::other;
  std::uint64_t count = 0;           ///< elements
  std::uint64_t bytes = 0;
  std::int32_t peer = -1;            ///< root or peer; -1 none
  std::int64_t batch = -1;           ///< the batch it started in
  std::int64_t start_t_ns = 0;       ///< 0: the start is not in the history (overwritten), only the end
  std::int64_t end_t_ns = 0;         ///< 0: not finished at the freeze
  bool device_completion = false;    ///< the end is the device finishing it (else the host call returning)
  /// Its source did not follow it to its end (kCollectiveUntracked on its start, or on an end that came before any
  /// other): whether it finished is not known. Never finished(), never in flight.
  bool untracked = false;
  bool finished() const { return end_t_ns != 0; }
};

/// One rank's operations and where it stood at the freeze.
struct RankCollectiveState {
  int rank = 0;
  bool is_origin = false;
  std::int64_t batch = -1;           ///< the rank's batch at the freeze
  std::int64_t freeze_t_ns = 0;
  std::vector<RankOperation> operations;  ///< oldest first (in the order the rank entered them)
  int in_flight = -1;                ///< index of the newest operation started, not finished, not untracked; -1: none
  int last_entered = -1;             ///< index of the newest operation, whatever its state; -1: none
  std::uint64_t untracked = 0;       ///< operations whose end is not known (RankOperation::untracked)
  /// Index of the newest operation (in the order entered) with an end, whichever end; -1: none. Not the one whose
  /// end came last: a device end (NCCL's kernel finishing) comes after the host ends of the operations enqueued
  /// behind it, and DDP's three bucket all-reduces of a step were named by the first (issue 30).
  int last_finished = -1;
  /// One entry per communicator the rank has an operation on, ascending by comm_id: the index of the newest
  /// operation on it with an end (-1: none yet), and of the newest whose end is the device's (-1: none).
  struct OnCommunicator {
    std::uint64_t comm_id = 0;
    int last_finished = -1;
    int last_device_finished = -1;
    int last_entered = -1;           ///< the newest operation on it, whatever its state
    std::uint64_t untracked = 0;     ///< operations on it whose end is not known
  };
  std::vector<OnCommunicator> by_communicator;
  /// by_communicator's entry of `comm_id`, or nullptr. O(log communicators).
  OOMFLIGHT_API const OnCommunicator* on(std::uint64_t comm_id) const;
};

/// One operation of one communicator (NCCL numbers each operation separately: allreduce #3 and broadcast #3 are
/// two) at its frontier: the highest sequence number of it any rank entered.
struct CommunicatorVerdict {
  std::uint64_t comm_id = 0;
  std::string name;                  ///< as registered ("world", NCCL's commName); empty when none
  int size = 0;                      ///< as registered; 0 when not registered
  std::vector<int> members;          ///< job ranks present that registered it or recorded on it, ascending
  std::uint64_t seq = 0;             ///< the frontier
  CollectiveOp op = CollectiveOp::other;  ///< the operation whose sequence this is
  std::uint64_t bytes = 0;
  std::vector<int> waiting;          ///< inside it at the freeze (entered, not finished)
  std::vector<int> entered_untracked;  ///< entered it, and whether they finished it is not known (untracked)
  std::vector<int> finished;         ///< past it
  std::vector<int> short_of_it;      ///< never entered it, one operation short (their newest is seq - 1)
  std::vector<int> behind;           ///< never entered it, more than one short (or never entered any)
  std::vector<int> different_op;     ///< short of it while waiting in another operation on the communicator
  /// The newest sequence number each member entered, -1 for none, in the order of `members`.
  std::vector<std::int64_t> newest_seq;
  /// Operations on the communicator (any operation) whose end is not known, summed over its members.
  std::uint64_t untracked = 0;
};

/// Every rank's operations and every communicator's verdict.
struct CollectiveAnalysis {
  std::vector<RankCollectiveState> ranks;         ///< every rank present, ascending by rank
  std::vector<CommunicatorVerdict> communicators;  ///< (communicator, operation) pairs with records, by comm_id, op
  bool empty() const { return communicators.empty(); }
  /// A verdict of `comm_id` (its name and size are the same in all of them), or nullptr. O(log communicators):
  /// the page and Perfetto name the communicator of every operation.
  OOMFLIGHT_API const CommunicatorVerdict* communicator(std::uint64_t comm_id) const;
  /// The state of `rank`, or nullptr when it is not present. O(log ranks): the report and the exporters ask once
  /// per rank, and a linear search made that quadratic in the world size.
  OOMFLIGHT_API const RankCollectiveState* rank_state(int rank) const;
};

/// Pairs each rank's records (a start with the end of the same communicator, operation and sequence number; the
/// device's end is preferred to the host's) and judges every operation of every communicator. Pure; thread-safe.
/// O(n log n) in the archive's collective and communicator rows, whatever they hold (hostile archives included).
OOMFLIGHT_API CollectiveAnalysis analyze_collectives(const Archive& archive);

/// The communicator's name for a sentence: "the world communicator", "communicator 'pg0'", or "communicator
/// 0x1234..." when none was registered. The name is the job's text, made printable (printable.hpp: no control
/// character, no bidirectional override, no byte that is not UTF-8).
OOMFLIGHT_API std::string communicator_label(const CommunicatorVerdict& verdict);

/// The verdict in sentences, the first being the one line that says what happened, e.g. "ranks 0, 1 wait in
/// allreduce #0 on the world communicator (4 ranks; 8 B), which rank 2 never entered: it ran out of memory in
/// batch 0", followed by a sentence for each rank still short of it, behind or waiting in another operation, and,
/// when operations on the communicator are untracked, one that counts them. Ranks whose operation at the frontier
/// is untracked "entered" it, never "wait in" or "finished" it. Empty when every member finished the frontier and
/// nothing on the communicator is untracked.
OOMFLIGHT_API std::vector<std::string> describe_verdict(const Archive& archive, const CollectiveAnalysis& analysis,
                                                        const CommunicatorVerdict& verdict);

/// "allreduce #3 (8.00 MiB)" for an operation.
OOMFLIGHT_API std::string describe_operation(const RankOperation& operation);

/// The newest operation `state` finished on `comm_id`, truthfully: "allreduce #17 (25.00 MiB) in batch 5", and when
/// its end is the host call's return while the communicator reports device ends (so the device may still run it),
/// "allreduce #17 (25.00 MiB) in batch 5 (its host call returned; no device end reported yet; the last with a device
/// end: allreduce #15 (25.00 MiB) in batch 5)". "none" when it finished none.
OOMFLIGHT_API std::string describe_last_finished(const RankCollectiveState& state, std::uint64_t comm_id);

}  // namespace oomflight
