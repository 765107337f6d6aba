// When a rank that ends normally stops answering dumps (internal to the control wing): the leave agreement's rule,
// once for both transports. The transports keep the mechanics of saying "I end" and of counting who did (MPI: an
// MPI_Ibarrier and LEFT messages, leave_agreement.hpp; the store: its `ending` and `left_early` counters).
#pragma once

#include <chrono>
#include <optional>
#include <string>

namespace oomflight {

/// What a rank waiting at its normal end knows of the others.
struct LeaveTally {
  int world_size = 1;
  /// The ranks that said they end normally, this one included, where the transport can count them (the store's
  /// `ending`); nullopt where it can only tell that all did (MPI's barrier: `all_ended`).
  std::optional<int> ended;
  bool all_ended = false;  ///< every rank said it ends normally (MPI: the barrier completed)
  int gone = 0;            ///< ranks that left without the agreement: on an error, after their wait, or in silence
};

/// What the waiting rank does next.
enum class LeaveStep {
  wait,              ///< keep answering dumps: a rank may still ask for one that needs this rank's history
  together,          ///< every rank ended or left: nobody can ask for a dump any more
  without_the_gone,  ///< a rank is gone and the transport cannot count who ended: "all ended" can never be seen
  deadline,          ///< OOMFLIGHT_DUMP_TIMEOUT passed: leave without those still running
};

/// The rule. Every rank is accounted for when all ended, or when those that ended and those gone make the world
/// (a transport that counts): then `together`. A transport that cannot count cannot see that once a rank is gone,
/// so it leaves at once (`without_the_gone`): waiting would only reach the deadline, and a dump asked for now would
/// not hold the gone rank anyway. Otherwise `deadline` once `past_deadline`, else `wait`. Pure.
LeaveStep next_leave_step(const LeaveTally& tally, bool past_deadline);

/// The words of a rank that leaves at its deadline, the same on both transports: "not every rank ended its
/// oomflight session within 10 s (OOMFLIGHT_DUMP_TIMEOUT) of this one (3 of 4 did); leaving without them: a dump
/// they ask for now does not wait for this rank". The count is said where the tally has one (ended + gone).
/// Never throws but std::bad_alloc.
std::string leaving_without_them_text(const LeaveTally& tally, std::chrono::milliseconds dump_timeout);

}  // namespace oomflight
