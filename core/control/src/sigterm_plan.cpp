// What a caught SIGTERM does on a rank (sigterm_plan.hpp).
#include "sigterm_plan.hpp"

namespace oomflight {

SigtermPlan plan_sigterm(bool exit_dumped, bool leaving, bool dump_on_exit, bool coordinated) {
  if (exit_dumped) return {false, "after the exit dump"};
  if (leaving) return {false, "while leaving at the end of the job"};
  if (dump_on_exit && coordinated) return {true, "the dump asked for by SIGTERM is done"};
  return {false, "after the dump under way"};
}

}  // namespace oomflight
