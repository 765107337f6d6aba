// The leave agreement's rule (leave_rule.hpp).
#include "leave_rule.hpp"

#include <fmt/format.h>

#include "oomflight/base/units.hpp"

namespace oomflight {

LeaveStep next_leave_step(const LeaveTally& tally, bool past_deadline) {
  if (tally.all_ended) return LeaveStep::together;
  if (tally.ended) {
    if (*tally.ended + tally.gone >= tally.world_size) return LeaveStep::together;
  } else if (tally.gone > 0) {
    return LeaveStep::without_the_gone;
  }
  return past_deadline ? LeaveStep::deadline : LeaveStep::wait;
}

std::string leaving_without_them_text(const LeaveTally& tally, std::chrono::milliseconds dump_timeout) {
  const std::string count =
      tally.ended ? fmt::format(" ({} of {} did)", *tally.ended + tally.gone, tally.world_size) : std::string();
  return fmt::format(
      "not every rank ended its oomflight session within {} (OOMFLIGHT_DUMP_TIMEOUT) of this one{}; leaving without "
      "them: a dump they ask for now does not wait for this rank",
      format_seconds(static_cast<double>(dump_timeout.count()) / 1000.0), count);
}

}  // namespace oomflight
