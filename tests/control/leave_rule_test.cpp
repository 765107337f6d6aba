// next_leave_step and leaving_without_them_text (leave_rule.hpp): when a rank that ends normally stops answering
// dumps, one rule for both transports (issue 40): the store counts who ended, MPI's barrier only says that all did.
#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <string>

#include "../../core/control/src/leave_rule.hpp"

namespace oomflight {
namespace {

// A transport that counts who ended (the store), and one whose barrier only says that all did (MPI).
LeaveTally tally(int world_size, std::optional<int> ended, bool all_ended, int gone) {
  LeaveTally t;
  t.world_size = world_size;
  t.ended = ended;
  t.all_ended = all_ended;
  t.gone = gone;
  return t;
}
LeaveTally counted(int world_size, int ended, int gone) { return tally(world_size, ended, false, gone); }
LeaveTally barrier(int world_size, bool all_ended, int gone) { return tally(world_size, std::nullopt, all_ended, gone); }

TEST(LeaveRule, ACountingTransportWaitsUntilThoseThatEndedAndThoseGoneMakeTheWorld) {
  EXPECT_EQ(next_leave_step(counted(4, 1, 0), false), LeaveStep::wait);
  EXPECT_EQ(next_leave_step(counted(4, 3, 0), false), LeaveStep::wait);
  // A rank gone does not end the wait: a slower rank may still fail, and its dump holds this rank's history.
  EXPECT_EQ(next_leave_step(counted(4, 2, 1), false), LeaveStep::wait);
  EXPECT_EQ(next_leave_step(counted(4, 3, 1), false), LeaveStep::together);
  EXPECT_EQ(next_leave_step(counted(4, 4, 0), false), LeaveStep::together);
  EXPECT_EQ(next_leave_step(counted(4, 1, 3), false), LeaveStep::together);
  EXPECT_EQ(next_leave_step(counted(1, 1, 0), false), LeaveStep::together);
  // Accounted for beats the deadline: nobody is left behind, whatever the clock says.
  EXPECT_EQ(next_leave_step(counted(4, 4, 0), true), LeaveStep::together);
  EXPECT_EQ(next_leave_step(counted(4, 3, 0), true), LeaveStep::deadline);
  EXPECT_EQ(next_leave_step(counted(4, 2, 1), true), LeaveStep::deadline);
}

TEST(LeaveRule, ATransportThatCannotCountLeavesAtTheFirstRankGone) {
  EXPECT_EQ(next_leave_step(barrier(4, false, 0), false), LeaveStep::wait);
  EXPECT_EQ(next_leave_step(barrier(4, true, 0), false), LeaveStep::together);
  // Its barrier can never complete now: waiting would only reach the deadline.
  EXPECT_EQ(next_leave_step(barrier(4, false, 1), false), LeaveStep::without_the_gone);
  EXPECT_EQ(next_leave_step(barrier(4, false, 1), true), LeaveStep::without_the_gone);
  EXPECT_EQ(next_leave_step(barrier(4, false, 0), true), LeaveStep::deadline);
  EXPECT_EQ(next_leave_step(barrier(4, true, 2), true), LeaveStep::together);
}

TEST(LeaveRule, TheDeadlineIsSaidInOneWordingWithTheCountWhereThereIsOne) {
  const std::string with_count = leaving_without_them_text(counted(4, 2, 1), std::chrono::milliseconds(10'000));
  EXPECT_EQ(with_count,
            "not every rank ended its oomflight session within 10.000 s (OOMFLIGHT_DUMP_TIMEOUT) of this one (3 of 4 "
            "did); leaving without them: a dump they ask for now does not wait for this rank");
  const std::string without = leaving_without_them_text(barrier(4, false, 0), std::chrono::milliseconds(2'500));
  EXPECT_EQ(without,
            "not every rank ended its oomflight session within 2.500 s (OOMFLIGHT_DUMP_TIMEOUT) of this one; leaving "
            "without them: a dump they ask for now does not wait for this rank");
}

}  // namespace
}  // namespace oomflight
