// plan_sigterm (sigterm_plan.hpp): what a caught SIGTERM does, one rule for both transports (issue 40, item 3).
#include <gtest/gtest.h>

#include <string>

#include "../../core/control/src/sigterm_plan.hpp"

namespace oomflight {
namespace {

TEST(SigtermPlan, AfterAnExitDumpOrWhileLeavingTheProcessEndsWithNoSecondDump) {
  for (const bool dump_on_exit : {false, true}) {
    for (const bool coordinated : {false, true}) {
      const SigtermPlan dumped = plan_sigterm(true, false, dump_on_exit, coordinated);
      EXPECT_FALSE(dumped.exit_dump);
      EXPECT_EQ(std::string(dumped.why), "after the exit dump");
      const SigtermPlan leaving = plan_sigterm(false, true, dump_on_exit, coordinated);
      EXPECT_FALSE(leaving.exit_dump);
      EXPECT_EQ(std::string(leaving.why), "while leaving at the end of the job");
      // Both at once: the exit dump is what happened, so it is what the line says.
      EXPECT_EQ(std::string(plan_sigterm(true, true, dump_on_exit, coordinated).why), "after the exit dump");
    }
  }
}

TEST(SigtermPlan, AnExitDumpComesFirstOnlyWithDumpOnExitAndCoordinatedRanks) {
  const SigtermPlan dump = plan_sigterm(false, false, true, true);
  EXPECT_TRUE(dump.exit_dump);
  EXPECT_EQ(std::string(dump.why), "the dump asked for by SIGTERM is done");
  for (const auto& [dump_on_exit, coordinated] : {std::pair{false, true}, std::pair{true, false}, std::pair{false, false}}) {
    const SigtermPlan p = plan_sigterm(false, false, dump_on_exit, coordinated);
    EXPECT_FALSE(p.exit_dump) << dump_on_exit << coordinated;
    EXPECT_EQ(std::string(p.why), "after the dump under way");
  }
}

}  // namespace
}  // namespace oomflight
